"""Executable model of p4/heroserve_ina.p4 with a P4Runtime server (DESIGN.md §10)."""
