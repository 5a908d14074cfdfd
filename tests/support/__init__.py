"""Helpers shared by the test modules (not tests themselves): the BMv2 driver, the INA host
simulation, the test PKI, and what several test modules need alike. pyproject.toml puts
tests/ on sys.path (pytest's ``pythonpath``), so test modules import ``support.x``; a test
file that also runs as a script in a child process gives the child tests/ on its path
(PYTHONPATH, or in its ``__main__`` branch) where that child imports support."""

import os
from pathlib import Path

# The repository root, wherever a test module sits below tests/.
ROOT = Path(__file__).resolve().parents[2]
# The CMake build of csrc/ the tests load (make cxx): $HEROSERVE_CSRC_BUILD, else build/csrc.
CSRC_BUILD = Path(os.environ.get("HEROSERVE_CSRC_BUILD", ROOT / "build" / "csrc"))
