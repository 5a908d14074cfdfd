"""Host-side INA: the wire format of the P4 INA data plane (agents/ina/packet.py)."""
