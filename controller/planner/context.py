"""The state every part of the evaluator shares, for one problem and one policy.

``EvalContext`` holds the problem, the policy, the cluster and its fabrics (the ring's, which
may relay over NVLink; the Ethernet-only one; the one INA uses under the policy), the
workload's mean lengths, the groups forced onto the ring when the plan was assembled and, for
a plan already made, its groups with the schemes it chose; and
the small lookups every part uses, each memoised here: message sizes (docs/design.md §5),
compute coefficients per GPU type, the slowest GPU type of a set, ``shape_signature`` of
groups, and the grouping's pod caches.

The parts of the evaluator build on it (``allreduce``, ``pipeline``, ``instances``,
``kvtransfer``); ``evaluate.Evaluator`` joins them.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.costmodel.compute import ComputeCoefficients, default_coefficients
from controller.models.gpus import gpu_spec
from controller.plan import Group
from controller.planner.grouping import shape_signature
from controller.planner.options import Policy, Problem
from controller.topology.graph import servers


class EvalContext:
    """One problem and one policy, with the lookups shared by the evaluator's parts."""

    def __init__(self, problem: Problem, policy: Policy) -> None:
        self.problem = problem
        self.policy = policy
        g = problem.cluster
        self.g = g
        self.net = problem.options.net
        self.ring_fabric = self.net.fabric(g, relay=True)  # NCCL's PXN may relay over NVLink
        self.eth_fabric = self.net.fabric(g, relay=False)  # Ethernet-only routes
        self.ina_fabric = self.ring_fabric if policy.ina_relay else self.eth_fabric
        self.model = problem.model
        # groups that lost INA to the aggregator-slot limit when the plan was assembled
        self.forced_ring: set[tuple[str, ...]] = set()
        # a made plan's groups, each priced with the scheme the plan chose for it (set by
        # ``reprice.evaluator_for_plan``): members -> (group, the message it was decided at)
        self.plan_groups: dict[tuple[str, ...], tuple[Group, float]] = {}
        w = problem.workload
        self.mean_in, self.mean_in2 = w.mean_input, w.mean_input_sq
        self.decode_steps = w.mean_decode_steps  # tokens a decode instance makes per request
        # the KV transfer: the prompt it carries, and the share of requests that make one
        self.kv_tokens, self.kv_share = w.mean_kv_transfer_tokens, w.decode_share
        self._coeffs: dict[str, ComputeCoefficients] = {}
        self._shapes: dict[tuple, tuple] = {}
        self._server_gpus = servers(g)
        # node -> its server (None: not a server's), read in the hot loops as a plain dict
        # (networkx's node views cost a call per lookup)
        self.server_of: dict[str, str | None] = dict(g.nodes(data="server"))
        self._grouping_caches: dict[tuple, dict] = {}

    def grouping_cache(self, key: tuple) -> dict:
        """A pod-signature cache for one way of grouping (``grouping.by_pods``), kept for the
        evaluator's life so the role splits of one search group each distinct pod once."""
        return self._grouping_caches.setdefault(key, {})

    # -- sizes ---------------------------------------------------------------------------
    def activation_bytes(self, tokens: float) -> float:
        """One all-reduce moves tokens * h * dtype bytes per GPU (docs/design.md §5)."""
        return tokens * self.model.hidden * self.model.dtype_bytes

    def prefill_bytes(self) -> float:
        """The all-reduce message of one mean-length prompt."""
        return self.activation_bytes(self.mean_in)

    # -- GPUs ----------------------------------------------------------------------------
    def coeffs(self, gpu_type: str) -> ComputeCoefficients:
        """The compute model's coefficients for ``gpu_type`` (Eqs. 12-13), memoised."""
        if gpu_type not in self._coeffs:
            self._coeffs[gpu_type] = default_coefficients(gpu_type, self.model.dtype_bytes)
        return self._coeffs[gpu_type]

    def slowest_type(self, members: Sequence[str]) -> str:
        """The GPU type of ``members`` with the least FP16 throughput: an instance computes
        at the pace of its slowest GPU."""
        nodes = self.g.nodes
        types = list(dict.fromkeys(nodes[m]["gpu_type"] for m in members))  # first seen first
        return min(types, key=lambda t: gpu_spec(t).fp16_flops) if len(types) > 1 else types[0]

    def shape(self, *parts: Sequence[str]) -> tuple:
        """``shape_signature`` of ``parts``, memoised per exact parts."""
        key = tuple(tuple(p) for p in parts)
        hit = self._shapes.get(key)
        if hit is None:
            hit = self._shapes[key] = shape_signature(self.g, parts, self._server_gpus)
        return hit
