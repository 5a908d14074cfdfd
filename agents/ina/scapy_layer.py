"""Scapy layer of the INA header + vector (agents/ina/packet.py's wire format): ``INA``,
bound to UDP destination port ``INA_UDP_PORT`` when this module is imported.

Apart from agents/ina/packet.py because scapy takes about a second to import: the codec
and the wire constants are imported by the controller and the agents, which never need
scapy; tests and packet captures import this module.
"""

from __future__ import annotations

from scapy.fields import (
    BitField,
    ByteField,
    FieldListField,
    IntField,
    ShortField,
    SignedIntField,
)
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers

from agents.ina.packet import INA_UDP_PORT, VECTOR_LEN


class INA(Packet):
    """Scapy layer for the INA header + vector, bound to UDP port ``INA_UDP_PORT``."""

    name = "HeroServeINA"
    fields_desc = [
        ShortField("group_id", 0),
        ShortField("agg_index", 0),
        ByteField("worker_id", 0),
        ByteField("num_workers", 1),
        BitField("version", 0, 1),
        BitField("is_retx", 0, 1),
        BitField("is_result", 0, 1),
        BitField("bfp16", 0, 1),
        BitField("overflow", 0, 1),
        BitField("reserved", 0, 3),
        ByteField("exp", 0),
        IntField("session", 0),
        IntField("generation", 0),
        FieldListField(
            "values",
            [0] * VECTOR_LEN,
            SignedIntField("v", 0),
            count_from=lambda pkt: VECTOR_LEN,
        ),
    ]


bind_layers(UDP, INA, dport=INA_UDP_PORT)
