"""``control InaEgress`` and ``control InaComputeChecksum`` of p4/heroserve_ina.p4 for the
executable model (agents/softswitch/pipeline.py): :class:`InaEgress` with its table
:class:`ResultRewrite`, and :class:`InaComputeChecksum`.
"""

from __future__ import annotations

from agents.ina.packet import ipv4_checksum

from .headers import NUM_PORTS, Headers, Metadata, StandardMetadata, mark_to_drop
from .tables import ActionSpec, ExactTable, IndirectCounter


class ResultRewrite(ExactTable):
    """``result_rewrite`` (egress): egress_port -> set_result_dst(dmac, dip)."""

    NAME = "InaEgress.result_rewrite"
    KEY = (("egress_port", 9),)
    ACTIONS = (
        ActionSpec("InaEgress.set_result_dst", (("dmac", 48), ("dip", 32))),
        ActionSpec("NoAction", (), default_only=True),
    )
    DEFAULT_ACTION = "NoAction"
    CONST_DEFAULT = True
    SIZE = 512


class InaEgress:
    """``control InaEgress``: no hairpin for floods, result_rewrite, port_tx."""

    def __init__(self) -> None:
        self.port_tx = IndirectCounter("InaEgress.port_tx", NUM_PORTS, "BOTH")
        self.result_rewrite = ResultRewrite()

    def apply(self, hdr: Headers, meta: Metadata, std: StandardMetadata) -> None:
        if meta.l2_flood == 1 and std.egress_port == std.ingress_port:
            mark_to_drop(std)
            return
        if meta.ina_result == 1:
            entry = self.result_rewrite.lookup((std.egress_port,))
            if entry is not None:  # set_result_dst; the miss runs NoAction
                assert hdr.eth is not None and hdr.ipv4 is not None
                hdr.eth[0:6] = entry.params["dmac"].to_bytes(6, "big")
                hdr.ipv4[16:20] = entry.params["dip"].to_bytes(4, "big")
        self.port_tx.count(std.egress_port, std.packet_length)


class InaComputeChecksum:
    """``control InaComputeChecksum``: IPv4 checksum of results this switch produced."""

    @staticmethod
    def apply(hdr: Headers, meta: Metadata) -> None:
        if hdr.ina is not None and hdr.ina.is_result == 1 and meta.ina_result == 1:
            ip = hdr.ipv4
            assert ip is not None
            ip[10] = 0
            ip[11] = 0
            c = ipv4_checksum(bytes(ip))
            ip[10] = c >> 8
            ip[11] = c & 0xFF
