"""What the simulator needs from a plan, priced by the planner's own cost functions.

``PlanModel`` rebuilds the planner's :class:`~controller.planner.evaluate.Evaluator` for the
plan (same problem, same planner policy) and derives from it, per instance and stage, the
compute time (Eqs. 12-13), the pipeline hop (Eq. 6), the candidate all-reduce policies of the
stage's group as flows over directed links (Eqs. 8-11, ``CommPattern``) and, per prefill/decode
instance pair, the KV-cache transfer (Eqs. 14-15). Because these are the evaluator's functions
and routes, a lone request in the simulator takes exactly the time the cost model predicts
(the low-load validation in tests/controller/sim/test_sim_validation.py).

Holds :class:`CommOption` and :func:`comm_option` (a group's candidate all-reduce policy as
link terms), :class:`StageModel`, :class:`InstanceModel`, :class:`KVModel`,
:class:`PlanModel` (the plan priced: compute, hops, KV transfers) and :func:`build_model`
(price and check a plan). A group's planned scheme is ``AllReducePricer.planned``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import networkx as nx
import numpy as np

from controller.costmodel.compute import decode_layer_time, layer_weights, prefill_layer_time
from controller.costmodel.kvcache import kv_route, kv_route_parts, kv_share_terms, kv_shares
from controller.costmodel.network import CommPattern
from controller.errors import InputError
from controller.inputs.plan_checks import check_plan_on_topology
from controller.models.specs import ModelSpec
from controller.plan import Group, Plan
from controller.planner.evaluate import Evaluator
from controller.planner.options import ProfileCompute
from controller.planner.reprice import decided_bytes, evaluator_for_plan
from controller.sim.flows import Envelope, Flow, Work, alone_time, envelope
from controller.sim.network import Links
from controller.topology.fabric import PIPELINED, Fabric
from controller.topology.graph import link_id
from controller.workload import Workload


@dataclass
class CommOption:
    """One way to run a group's all-reduce (a candidate policy of docs/design.md §8): its flows as
    per-byte link terms, grouped by phase, and the table fields the online scheduler needs.

    One all-reduce of D bytes costs
    ``sum over phases p of rounds_p * max_{f in p} (D * K_f + lat_f)  +  const_s``
    (``costmodel.network.CompiledPhase`` on the simulator's link indices)."""

    scheme: str  # "ring", "ina" or "hier"
    switch: str | None
    flows: tuple[Flow, ...]  # k_fe in s per byte of message
    phases: tuple[tuple[float, int, int], ...]  # (rounds, first flow, end flow) per phase
    const_s: float  # per all-reduce: per-round overheads, chain latencies, T_agg, host
    links: tuple[int, ...]  # every directed link it loads
    bytes_per_byte: dict[int, float]  # bytes on each link per byte of message
    link_ids: tuple[str, ...]  # undirected ids, for the policy table
    bottleneck: float  # bytes/s, smallest capacity among its links
    envelopes: tuple[Envelope, ...]  # per phase: undominated (K_f, lat_f) of its flows
    pipelined: bool
    rails: tuple[tuple[int, str], ...] = ()  # hier: (shard, switch) per rail, shard order
    max_phases: tuple[int, ...] = ()  # phases priced at their bottleneck in either mode
    _works: dict[float, Work] = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def use_key(self) -> str:
        """How the run's statistics name it: ``ring``, ``hier`` or ``ina:<switch>``."""
        return f"{self.scheme}:{self.switch}" if self.switch else self.scheme

    def work(self, n_allreduce: float) -> Work:
        """The flows of ``n_allreduce`` all-reduces in a row, as an activity's work (its
        fixed part is ``n_allreduce * const_s``)."""
        hit = self._works.get(n_allreduce)
        if hit is None:
            parts = tuple((n_allreduce * r, lo, hi) for r, lo, hi in self.phases)
            hit = self._works[n_allreduce] = Work(
                self.flows, parts, self.envelopes, self.pipelined, max_parts=self.max_phases
            )
        return hit

    def peak_shares(self, inv_bw: list[float], floor_s: float = 0.0) -> dict[int, float]:
        """The most weight an iteration on this policy can put on each of its links, at any
        message size: bytes_e / B(e) over the iteration's time, which is at least
        ``sum_p rounds_p * max_{f in p} K_f`` per byte of each all-reduce (a link's k is its
        load over B(e), at most K of the flows on it), plus ``floor_s`` per byte of other work
        that grows with the message (the stage's compute, per all-reduce); latency and the
        other flows only lower it. Each is at most 1."""
        worst = floor_s + sum(
            r * max((k for k, _ in env), default=0.0)
            for (r, _, _), env in zip(self.phases, self.envelopes, strict=True)
        )
        if worst <= 0:
            return {}
        return {e: b * inv_bw[e] / worst for e, b in self.bytes_per_byte.items()}

    def time(self, nbytes: float) -> float:
        """Uncontended time of one all-reduce of ``nbytes`` bytes per GPU, s."""
        return alone_time(self.const_s, nbytes, self.phases, self.envelopes)


def comm_option(links: Links, fabric: Fabric, pattern: CommPattern) -> CommOption:
    """Turn a cost-model ``CommPattern`` into link terms: its phases compiled on ``fabric``
    (``costmodel.network.compile_phase``, the cost model's own arithmetic) on directed link
    indices."""
    index = links.index
    flows: list[Flow] = []
    phases = []
    envs = []
    const = 0.0
    per_byte: dict[int, float] = {}
    for cp in pattern.compiled(fabric):
        lo = len(flows)
        for terms, lat in cp.flows:
            flows.append((tuple((index[e], k) for e, k in terms), lat))
        phases.append((cp.rounds, lo, len(flows)))
        envs.append(envelope(flows[lo:], fabric.pipelined or cp.bottleneck))
        const += cp.const_s
        for e, load in cp.loads:
            i = index[e]
            per_byte[i] = per_byte.get(i, 0.0) + cp.rounds * load
    ids = sorted({link_id(*links.ends[e]) for e in per_byte})
    bottleneck = min((links.capacity[e] for e in per_byte), default=math.inf)
    return CommOption(
        pattern.scheme,
        pattern.switch,
        tuple(flows),
        tuple(phases),
        const,
        tuple(sorted(per_byte)),
        per_byte,
        tuple(ids),
        bottleneck,
        tuple(envs),
        fabric.pipelined,
        tuple(sorted((r.shard, r.switch) for r in pattern.rails)),
        tuple(i for i, cp in enumerate(pattern.compiled(fabric)) if cp.bottleneck),
    )


@dataclass
class StageModel:
    """One pipeline stage of one instance."""

    gpus: list[str]
    layers: float  # L / P_pipe
    options: list[CommOption]  # options[0] is the plan's choice; empty for TP = 1
    group_id: str  # "<role>/<instance>/<stage>" as in docs/policy-table.md
    next_stage: list[str] | None  # the following stage's GPUs (for the pipeline hop)

    @property
    def allreduces(self) -> float:
        """All-reduces per iteration: two per layer (attention and MLP), 2 L / P_pipe."""
        return 2.0 * self.layers


@dataclass
class InstanceModel:
    role: str
    index: int
    stages: list[StageModel]
    tp: int
    pp: int
    gpu_type: str  # the slowest type in the instance, whose coefficients price compute
    kv_capacity_tokens: float = math.inf  # decode: KV cache room over all its GPUs, tokens
    max_batch: int = 0  # decode: requests per micro-batch (the plan's batch size)
    # Eq. 13 per layer = max(a, b * batch) + c * k_ctx + d
    decode_terms: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    @property
    def gpus(self) -> list[str]:
        return [g for s in self.stages for g in s.gpus]


@dataclass
class KVModel:
    """KV transfer of one request between a prefill and a decode instance, per input token,
    priced as ``costmodel.kvcache.kv_time``: pipelined, every share at once (as one flow per
    link: a share's slowest hop carries the link's whole load); paper, one flow per prefill
    GPU whose shares go one after the other (Eq. 15: their terms add up)."""

    work: Work
    links: tuple[int, ...]
    bytes_per_token: dict[int, float]

    def time(self, tokens: float) -> float:
        """Uncontended T_f of a request of ``tokens`` input tokens, s (Eqs. 14-15)."""
        return self.work.time_alone(0.0, tokens)


@dataclass
class PlanModel:
    plan: Plan
    cluster: nx.Graph
    model: ModelSpec
    evaluator: Evaluator
    links: Links
    prefill: list[InstanceModel]
    decode: list[InstanceModel]
    pipelined: bool = True  # the plan's cost mode (``Plan.options``)
    _kv: dict[tuple[int, int], KVModel] = field(default_factory=dict)
    _kv_heads: dict[int, tuple] = field(default_factory=dict)  # ``_kv_route_links``
    _hops: dict[tuple, float] = field(default_factory=dict)
    _hop_memo: dict[tuple, float] = field(default_factory=dict)
    # what runs of this priced plan derive once and reuse (the fast path's tables)
    derived: dict[str, object] = field(default_factory=dict)

    @property
    def gpus_used(self) -> int:
        return sum(len(i.gpus) for i in self.prefill + self.decode)

    # -- compute (Eqs. 12-13) ------------------------------------------------------------
    def prefill_compute(self, inst: InstanceModel, stage: StageModel, k: float, k2: float) -> float:
        co = self.evaluator.coeffs(inst.gpu_type)
        return stage.layers * prefill_layer_time(co, self.model, inst.tp, k, k2)

    def decode_compute(
        self, inst: InstanceModel, stage: StageModel, batch: int, k_ctx: float
    ) -> float:
        """Eq. 13 over the stage's layers, s. The terms of ``decode_layer_time`` are
        precomputed per instance (the hot path of a run); a test checks they agree."""
        a, b, c, d = inst.decode_terms
        w = a if a > b * batch else b * batch
        return stage.layers * (w + c * k_ctx + d)

    def decode_compute_reference(
        self, inst: InstanceModel, stage: StageModel, batch: int, k_ctx: float
    ) -> float:
        co = self.evaluator.coeffs(inst.gpu_type)
        return stage.layers * decode_layer_time(co, self.model, inst.tp, batch, k_ctx)

    def message_bytes(self, tokens: float) -> float:
        """One all-reduce moves tokens * h * dtype bytes per GPU (docs/design.md §5)."""
        return self.evaluator.activation_bytes(tokens)

    # -- pipeline hop (Eq. 6) ------------------------------------------------------------
    def hop(self, stage: StageModel, nbytes: float) -> float:
        """Eq. 6 for the activation after ``stage``: exact at powers of 2^(1/4) bytes and
        linear in between (a hop is affine in D along any fixed route)."""
        if stage.next_stage is None or nbytes <= 0:
            return 0.0
        key = (id(stage), nbytes)
        hit = self._hop_memo.get(key)
        if hit is not None:
            return hit
        lo = math.floor(4 * math.log2(nbytes)) / 4
        d0, d1 = 2.0**lo, 2.0 ** (lo + 0.25)
        t0, t1 = self._hop_at(stage, d0), self._hop_at(stage, d1)
        hit = t0 + (nbytes - d0) * (t1 - t0) / (d1 - d0)
        if len(self._hop_memo) < 100_000:
            self._hop_memo[key] = hit
        return hit

    def hop_times(self, stage: StageModel, nbytes: np.ndarray) -> np.ndarray:
        """``hop`` at every size of ``nbytes`` at once, by the same interpolation."""
        x = np.asarray(nbytes, dtype=float)
        out = np.zeros(x.shape)
        pos = x > 0
        if stage.next_stage is None or not pos.any():
            return out
        lo = np.floor(4 * np.log2(x[pos])) / 4
        d0, d1 = 2.0**lo, 2.0 ** (lo + 0.25)
        hop = self.evaluator.pipeline_hop_times
        t0 = hop(stage.gpus, stage.next_stage, d0)
        t1 = hop(stage.gpus, stage.next_stage, d1)
        out[pos] = t0 + (x[pos] - d0) * (t1 - t0) / (d1 - d0)
        return out

    def stage_extra_times(self, stage: StageModel, tokens: np.ndarray) -> np.ndarray:
        """Per entry of ``tokens`` (the batch's tokens, prefill; its requests, decode), the
        seconds one iteration of ``stage`` spends besides compute, alone: the pipeline hop
        and the 2 L/P_pipe all-reduces on the plan's policy (as ``Simulator._iteration``)."""
        nbytes = self.message_bytes(np.asarray(tokens, dtype=float))
        out = self.hop_times(stage, nbytes)
        if stage.options:
            opt = stage.options[0]
            n_ar = stage.allreduces
            out += opt.work(n_ar).times_alone(n_ar * opt.const_s, nbytes)
        return out

    def _hop_at(self, stage: StageModel, nbytes: float) -> float:
        key = (id(stage), nbytes)
        hit = self._hops.get(key)
        if hit is None:
            hit = self.evaluator.pipeline_hop_time(stage.gpus, stage.next_stage, nbytes)
            self._hops[key] = hit
        return hit

    # -- KV transfer (Eqs. 14-15) --------------------------------------------------------
    def kv(self, pre: int, dec: int) -> KVModel:
        """The KV transfer from prefill instance ``pre`` to decode instance ``dec``, with the
        evaluator's routes (each flow's cheapest alone at the mean prompt a transfer carries,
        ``kv_tokens``, as the planner routes it)."""
        key = (pre, dec)
        hit = self._kv.get(key)
        if hit is not None:
            return hit
        ev = self.evaluator
        fab = ev.ring_fabric
        kvpt = self.model.kv_bytes_per_token()
        pst = [s.gpus for s in self.prefill[pre].stages]
        dst = [s.gpus for s in self.decode[dec].stages]
        specs = kv_shares(self.model, pst, dst)
        if self.pipelined:
            out = self._kv_pipelined(specs, kvpt)
            self._kv[key] = out
            return out
        routes = [kv_route(fab, s, d, f * kvpt * ev.kv_tokens) for s, d, f in specs]
        lk = self.links
        shares = [(src, r, f * kvpt) for (src, _, f), r in zip(specs, routes, strict=True)]
        load: dict[int, float] = {}
        for _, r, nb in shares:
            for e in lk.path_links(r):
                load[e] = load.get(e, 0.0) + nb
        inv = lk.inv_bw
        # the paper's mode (Eq. 15): a GPU's shares one after the other, one flow per GPU
        per_src: dict[str, tuple[dict[int, float], float]] = {}
        for src, counted, fixed in kv_share_terms(fab, shares):
            terms = [(lk.index[e], b * inv[lk.index[e]]) for e, b in counted]
            merged, lat = per_src.get(src, ({}, 0.0))
            for e, k in terms:
                merged[e] = merged.get(e, 0.0) + k
            per_src[src] = (merged, lat + fixed)
        flows: list[Flow] = [(tuple(t.items()), lat) for t, lat in per_src.values()]
        out = KVModel(Work.single(flows, False), tuple(sorted(load)), load)
        self._kv[key] = out
        return out

    def _kv_pipelined(self, specs: tuple, kvpt: float) -> KVModel:
        """``kv`` on a pipelined fabric: every share on a link counts the link's whole load
        (``kv_share_terms``), so the slowest share is the slowest (link, latest share on it):
        one flow per link, exactly. Each route's links and fixed seconds are taken once per
        route the fabric keeps (``kv_route_parts``), not once per share: a 1,200-server
        plan's 28,764 pairs hold 2.8 million shares over far fewer routes."""
        ev = self.evaluator
        fab, lk = ev.ring_fabric, self.links
        load: dict[int, float] = {}
        on_links: list[tuple[list[int], float]] = []
        for s, d, f in specs:
            nb = f * kvpt
            links, fixed = self._kv_route_links(fab, s, d, nb * ev.kv_tokens)
            for e in links:
                load[e] = load.get(e, 0.0) + nb
            on_links.append((links, fixed))
        inv = lk.inv_bw
        per_link: dict[int, tuple[float, float]] = {}
        for links, fixed in on_links:
            for e in links:
                if fixed > per_link.get(e, (0.0, -1.0))[1]:
                    per_link[e] = (load[e] * inv[e], fixed)
        flows: list[Flow] = [(((e, k),), lat) for e, (k, lat) in per_link.items()]
        return KVModel(Work.single(flows, True), tuple(sorted(load)), load)

    def _kv_route_links(
        self, fab: Fabric, src: str, dst: str, nbytes: float
    ) -> tuple[list[int], float]:
        """(link indices, ``Fabric.fixed_s``) of ``kv_route(src, dst, nbytes)``. The route is
        a list the fabric keeps, shared by every destination behind one switch, and a last
        hop (``kv_route_parts``): the list's links and ``Fabric.hop_sums`` are kept per list
        (held here, so its id stays its own) and carried over the last hop, the same floats
        as pricing the whole route."""
        head, last = kv_route_parts(fab, src, dst, nbytes)
        hit = self._kv_heads.get(id(head))
        if hit is None:
            edges = list(zip(head, head[1:], strict=False))
            hit = ([self.links.index[e] for e in edges], fab.hop_sums(edges), head)
            if len(self._kv_heads) < 1_000_000:  # a fallback route is a new list each time
                self._kv_heads[id(head)] = hit
        links, sums, _ = hit
        if last is None:
            return links, fab.fixed_from_sums(sums)
        hop = (head[-1], last)
        return [*links, self.links.index[hop]], fab.fixed_from_sums(fab.hop_sums((hop,), sums))


def _check_plan(plan: Plan, g: nx.Graph) -> None:
    """The plan against its cluster (``plan_checks.check_plan_on_topology``), then only what
    ``controller/inputs/plan_checks.py`` leaves to the simulator: a phase with no instance
    (the controller serves such partial plans; a simulation needs both phases) and a decode
    batch below 1 (the plan schema refuses it in files; a plan built in code skips it)."""
    check_plan_on_topology(plan, g)
    for phase in (plan.prefill, plan.decode):
        if not phase.instances:
            raise InputError(f"plan has no {phase.role} instance")
    if plan.decode.batch_size < 1:
        raise InputError("plan's decode batch size is below 1")


def build_model(
    plan: Plan, cluster: nx.Graph, workload: Workload, compute: ProfileCompute = ((), "")
) -> PlanModel:
    """Price ``plan`` on ``cluster``; raise InputError when the plan does not fit it.
    ``compute``: the engine profile's fit (``--profile``), which a plan priced with one
    needs (``evaluator_for_plan``)."""
    _check_plan(plan, cluster)
    ev = evaluator_for_plan(plan, cluster, workload, compute)  # simulated as it was priced
    model, net = ev.problem.model, ev.problem.options.net
    links = Links(cluster)
    out = PlanModel(plan, cluster, model, ev, links, [], [], net.cost_mode == PIPELINED)
    kvpt = model.kv_bytes_per_token()
    for phase, dest in ((plan.prefill, out.prefill), (plan.decode, out.decode)):
        groups = {(gr.instance, gr.stage): gr for gr in phase.groups}
        for k, inst in enumerate(phase.instances):
            ref = decided_bytes(ev, plan, phase.role)
            stages = []
            for s, members in enumerate(inst.stages):
                gr = groups.get((k, s))
                opts = _options(ev, links, members, ref, gr)
                nxt = inst.stages[s + 1] if s + 1 < len(inst.stages) else None
                stages.append(
                    StageModel(
                        list(members),
                        model.layers / len(inst.stages),
                        opts,
                        f"{phase.role}/{k}/{s}",
                        list(nxt) if nxt else None,
                    )
                )
            all_gpus = [x for st in inst.stages for x in st]
            im = InstanceModel(
                phase.role,
                k,
                stages,
                len(inst.stages[0]),
                len(inst.stages),
                ev.slowest_type(all_gpus),
            )
            co = ev.coeffs(im.gpu_type)
            w = layer_weights(model)
            im.decode_terms = (
                co.c4 * w / im.tp,
                co.decode_c1 * w / im.tp,
                co.c5 / im.tp * 3 * model.kv_dim,
                co.c6,
            )
            if phase.role == "decode":
                room = ev.kv_room_bytes(all_gpus, im.tp, im.pp)
                im.kv_capacity_tokens = max(0.0, room) * im.tp * im.pp / kvpt
                im.max_batch = max(1, phase.batch_size)
            dest.append(im)
    _mark_risky_links(out)
    return out


def _mark_risky_links(m: PlanModel) -> None:
    """Flag the links whose load can ever exceed 1, the only ones the fluid network must
    account for (``Links.risky``). A stage runs one iteration at a time, so its weight on a
    link is at most the largest ``peak_shares`` among its options; a link whose stages' peaks
    sum to 1 or less is never stretched. An iteration's compute grows with its message at
    least as Eq. 12's and Eq. 13's compute-bound term, C1 W / TP per token and layer, so that
    much per byte bounds its time from below too (a pipelined flow keeps all its links busy
    while it communicates: without the compute, every shared link would look risky). KV
    routes are added as the simulator first uses them (any number of transfers may share
    one). Decode TP groups inside a server thus cost no link accounting at all."""
    inv = m.links.inv_bw
    share = [0.0] * len(m.links)
    per_token = m.message_bytes(1.0)  # bytes of one all-reduce per token of the batch
    for inst in m.prefill + m.decode:
        for st in inst.stages:
            # compute seconds per byte of each of the iteration's all-reduces
            floor = st.layers * inst.decode_terms[1] / (per_token * st.allreduces)
            peak: dict[int, float] = {}
            for opt in st.options:
                for e, w in opt.peak_shares(inv, floor).items():
                    if w > peak.get(e, 0.0):
                        peak[e] = w
            for e, w in peak.items():
                share[e] += w
    m.links.risky_at_start = [x > 1.0 for x in share]
    m.links.risky = list(m.links.risky_at_start)


def _options(
    ev: Evaluator, links: Links, members: list[str], ref: float, gr: Group | None
) -> list[CommOption]:
    """Candidate all-reduce policies of a group, the plan's choice first (hierarchical INA
    where the plan chose it), then the ring and flat INA at every switch the planner's policy
    allows (Alg. 2 line 7), so the online scheduler can choose among the three schemes."""
    planned = ev.planned(members, ref, gr)
    if planned is None:
        return []
    ge = ev.group(members, ref)
    first = comm_option(links, planned[1], planned[0])
    others = [(ge.ring, ev.ring_fabric)] + [(p, ev.ina_fabric) for p in ev.all_ina(members, ref)]
    return [first] + [comm_option(links, f, p) for p, f in others if p is not planned[0]]
