"""Parameters of the network cost model (docs/costmodel.md): the cost mode, the INA wire
format and the per-step latencies.

Holds :class:`NetParams` (what a plan records as its ``options`` so that it is simulated as
it was priced), the INA lane formats (:class:`LaneFormat`, ``INA_LANES``,
``DEFAULT_INA_LANES``) and the INA packet's payload and framing bytes
(``INA_PAYLOAD_BYTES``, ``INA_OVERHEAD_BYTES``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from agents.ina.packet import DEFAULT_LANE_FORMAT, HEADER_LEN, LANE_FORMATS, VECTOR_BYTES
from controller.errors import InputError
from controller.inputs.flags import option
from controller.topology.costmodes import COST_MODES, PAPER, PIPELINED, ROCE_MTU_BYTES, CostMode

if TYPE_CHECKING:  # the routes (networkx, scipy) are imported when a fabric is made
    import networkx as nx

    from controller.topology.fabric import Fabric

# The INA packet of the project's P4 program (p4/heroserve_ina.p4, docs/dataplane.md): a
# 128-byte vector behind Ethernet (14), IPv4 (20), UDP (8) and the INA header (8), plus on the
# wire the FCS (4), preamble and start delimiter (8) and the inter-frame gap (12).
INA_PAYLOAD_BYTES = VECTOR_BYTES
INA_OVERHEAD_BYTES = 14 + 20 + 8 + HEADER_LEN + 4 + 8 + 12


@dataclass(frozen=True)
class LaneFormat:
    """How the switch aggregates one FP16 element: ``element_bytes`` on the wire plus
    ``scale_bytes`` per element for a block's shared scale."""

    name: str
    element_bytes: int
    scale_bytes: float
    source: str
    # Relative L2 error of a 4-member all-reduce of FP16 activations with outliers
    # (benchmarks/lane_error.py, docs/dataplane.md "Lane formats"): no format is offered
    # without it.
    error: str
    # The members propose each packet's exponent one round ahead on its aggregator slot, so
    # an all-reduce opens with a round of proposals before the data (docs/dataplane.md "How
    # the group agrees the exponent"): priced as ``ina.proposal_phase``.
    proposal_round: bool = False


INA_LANES: dict[str, LaneFormat] = {
    lane.name: lane
    for lane in (
        # SwitchML (NSDI'21): floats scaled to 32-bit fixed point, the switch adds integers;
        # the project's P4 program aggregates 32 int32 lanes per packet.
        LaneFormat(
            "int32",
            LANE_FORMATS["int32"].lane_bits // 8,
            0.0,
            "SwitchML fixed point; p4/heroserve_ina.p4",
            "4.7e-9",
        ),
        # Block floating point, as the switch runs it (agents/ina/packet.py LANE_FORMATS):
        # int16 lanes, 64 per packet, the block's exponent in the header's exp byte (so no
        # payload bytes for the scale: the header is in INA_OVERHEAD_BYTES).
        LaneFormat(
            "bfp16",
            LANE_FORMATS["bfp16"].lane_bits // 8,
            0.0,
            "int16 lanes, per-packet exponent; p4/heroserve_ina.p4",
            "1.0e-3",
            LANE_FORMATS["bfp16"].exponent == "packet",
        ),
        # FPISA (NSDI'22): floating-point addition in a Tofino pipeline, 16-bit lanes.
        LaneFormat("fp16", 2, 0.0, "FPISA 16-bit floating-point lanes (not run here)", "3.3e-4"),
    )
}
InaLanes = Literal["int32", "bfp16", "fp16"]  # the names of INA_LANES
assert get_args(InaLanes) == tuple(INA_LANES)
DEFAULT_INA_LANES: InaLanes = DEFAULT_LANE_FORMAT  # a group's format unless it names one


@dataclass(frozen=True)
class NetParams:
    """Cost-mode, wire-format and latency terms of the network model (docs/costmodel.md)."""

    cost_mode: CostMode = option(
        PIPELINED,
        help="network pricing: pipelined (packet by packet) or paper (the paper's Eqs. 7-11 "
        "as written: FP16 bytes, each path alone, no latencies); docs/costmodel.md",
    )
    ina_lanes: InaLanes = option(
        DEFAULT_INA_LANES,
        help="INA lane format on the wire: how the switch adds an FP16 element; relative L2 "
        "error of a 4-member FP16 all-reduce: "
        + ", ".join(f"{v.name} {v.error}" for v in INA_LANES.values())
        + " (docs/dataplane.md, Lane formats)",
        default_help=f"{DEFAULT_INA_LANES}, what p4/heroserve_ina.p4 aggregates",
    )
    # NCCL's per-hop latency of a ring step, LL128 protocol (src/graph/tuning.cc, hwLat):
    ring_step_net_s: float = 4.0e-6  # over the network
    ring_step_nvlink_s: float = 1.9e-6  # on NVLink
    ina_host_s: float = 4e-6  # host overhead of one INA all-reduce (one synchronisation, as a step)
    dtype_bytes: int = 2  # FP16 activations
    packet_bytes: float = ROCE_MTU_BYTES  # a pipelined hop's packet for RDMA flows (ring, KV)
    ina_payload_bytes: int = INA_PAYLOAD_BYTES  # vector bytes per INA packet
    ina_overhead_bytes: int = INA_OVERHEAD_BYTES  # headers and framing per INA packet

    def __post_init__(self) -> None:
        if self.cost_mode not in COST_MODES:
            raise InputError(
                f"cost mode must be one of {', '.join(COST_MODES)}, got {self.cost_mode!r}"
            )
        if self.ina_lanes not in INA_LANES:
            raise InputError(
                f"INA lanes must be one of {', '.join(INA_LANES)}, got {self.ina_lanes!r}"
            )
        for name in ("ring_step_net_s", "ring_step_nvlink_s", "ina_host_s", "ina_overhead_bytes"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise InputError(f"{name} must be a finite number >= 0, got {v!r}")
        for name in ("dtype_bytes", "packet_bytes", "ina_payload_bytes"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise InputError(f"{name} must be a finite number > 0, got {v!r}")

    @property
    def lane(self) -> LaneFormat:
        return INA_LANES[self.ina_lanes]

    @property
    def ina_frame_bytes(self) -> float:
        """An INA packet on the wire: the packet a pipelined hop serialises for INA flows."""
        return self.ina_payload_bytes + self.ina_overhead_bytes

    @property
    def ina_wire_ratio(self) -> float:
        """Bytes on the wire per byte of message for INA: lane width plus block scale over the
        message's element size, times the packet's headers and framing over its payload."""
        lane = self.lane
        per_element = (lane.element_bytes + lane.scale_bytes) / self.dtype_bytes
        return per_element * self.ina_frame_bytes / self.ina_payload_bytes

    @property
    def as_written(self) -> bool:
        """The paper's mode: collectives priced by Eqs. 7-11 as written (docs/costmodel.md
        "Cost modes"): FP16 message bytes, each member's path alone, no latency terms."""
        return self.cost_mode == PAPER

    @property
    def ina_bytes_ratio(self) -> float:
        """Bytes INA moves per byte of message as this cost mode counts them: the paper counts
        the FP16 message itself (Eq. 10's D_col: no lanes wider than 16 bits, no headers);
        pipelined, the wire's bytes (``ina_wire_ratio``)."""
        return 1.0 if self.as_written else self.ina_wire_ratio

    def fabric(self, g: nx.Graph, *, relay: bool = True) -> Fabric:
        """The routes and prices of ``g`` in this cost mode."""
        from controller.topology.fabric import Fabric

        return Fabric(g, relay=relay, cost_mode=self.cost_mode, packet_bytes=self.packet_bytes)

    def plan_options(self) -> dict[str, Any]:
        """What a plan records (``Plan.options``) so that it is simulated as it was priced."""
        return {"cost_mode": self.cost_mode, "ina_lanes": self.ina_lanes}

    @classmethod
    def from_plan_options(cls, options: Mapping[str, Any] | None) -> NetParams:
        """NetParams from a plan's ``options`` (keys ``cost_mode``, ``ina_lanes``; missing:
        the defaults). A plan file is input: a bad value raises InputError naming it."""
        if options is None:
            return cls()
        if not isinstance(options, Mapping):
            raise InputError(f"plan options must be a mapping, got {type(options).__name__}")
        kw = {}
        for key in ("cost_mode", "ina_lanes"):
            if key in options:
                v = options[key]
                if not isinstance(v, str):
                    raise InputError(f"plan option {key} must be a string, got {v!r}")
                kw[key] = v
        return cls(**kw)
