"""Emulation of a cluster on this machine (docs/design.md §12, docs/emulation.md): the network
(Mininet, ``mininet/``), the control plane's real processes, and all-reduces between hosts
with the host INA library (``agents/ina/``)."""
