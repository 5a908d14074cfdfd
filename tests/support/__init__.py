"""Helpers shared by the test modules (not tests themselves): the BMv2 driver, the INA host
simulation, the test PKI, and what several test modules need alike. pyproject.toml puts
tests/ on sys.path (pytest's ``pythonpath``), so test modules import ``support.x``; a test
file run as a script puts tests/ on sys.path itself."""

from pathlib import Path

# The repository root, wherever a test module sits below tests/.
ROOT = Path(__file__).resolve().parents[2]
