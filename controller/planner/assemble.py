"""Turning a search result into a :class:`controller.plan.Plan`: the scheme of each group at
the phase's operating message size, the aggregation switch and its slot range (Alg. 2 line 7:
the cheapest switch that still has room for the group's window of aggregator slots), paths,
KV-transfer pairs, the predicted figures and the GPUs left idle (``idle.idle_gpus``).

Holds ``build_plan`` (the entry point), ``SlotPool`` (the aggregator slots of every switch,
handed out as groups claim them) and ``window_slots`` (the slots one aggregation keeps in
flight)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controller.costmodel.network import CommPattern
from controller.errors import InputError
from controller.plan import (
    Group,
    Instance,
    KVTransfer,
    PhasePlan,
    Plan,
    Predicted,
    Rail,
    SlotRange,
)
from controller.planner.allreduce import GroupEval
from controller.planner.combine import Combination, combine
from controller.planner.deployment import SearchResult, settle_kv
from controller.planner.evaluate import Evaluator
from controller.planner.idle import idle_gpus
from controller.planner.results import InstanceEval, PhaseResult
from controller.planner.ttft import checked_ttft
from controller.topology.fabric import Fabric, Path
from controller.topology.graph import DEFAULT_AGGREGATOR_SLOTS, DEFAULT_SLOT_BYTES, relayed
from controller.units import to_gbps


def window_slots(ev: Evaluator, switch: str, paths: Sequence[Path], fabric: Fabric) -> int:
    """Aggregator slots an aggregation keeps in flight at ``switch``: its bandwidth-delay
    product in slots, ceil(B * RTT / slot_bytes), with B the slowest first hop of its members'
    ``paths`` and RTT twice the longest path's latency (SwitchML sizes its pool the same way)."""
    sw = ev.g.nodes[switch]
    slot_bytes = sw.get("slot_bytes", DEFAULT_SLOT_BYTES)
    table = fabric.link_table
    bw = min(1.0 / table[(p[0], p[1])][0] for p in paths)
    rtt = 2 * max(sum(table[e][1] for e in zip(p, p[1:], strict=False)) for p in paths)
    return max(
        1,
        min(sw.get("aggregator_slots", DEFAULT_AGGREGATOR_SLOTS), math.ceil(bw * rtt / slot_bytes)),
    )


class SlotPool:
    """Aggregator slots per switch handed out as contiguous ranges."""

    def __init__(self, ev: Evaluator) -> None:
        self.free = {
            s: d.get("aggregator_slots", DEFAULT_AGGREGATOR_SLOTS)
            for s, d in ev.g.nodes(data=True)
            if d["kind"] == "switch"
        }
        self.next = dict.fromkeys(self.free, 0)

    def take(self, switch: str, count: int, partial: bool = False) -> SlotRange | None:
        have = self.free[switch]
        if have < count and not (partial and have > 0):
            return None
        n = min(count, have)
        r = SlotRange(self.next[switch], n)
        self.next[switch] += n
        self.free[switch] -= n
        return r

    def take_all(self, wants: Sequence[tuple[str, int]]) -> list[SlotRange] | None:
        """One range per (switch, count), all or none (a hierarchical group's rails)."""
        need: dict[str, int] = {}
        for sw, n in wants:
            need[sw] = need.get(sw, 0) + n
        if any(self.free[sw] < n for sw, n in need.items()):
            return None
        return [self.take(sw, n) for sw, n in wants]  # type: ignore[misc]


def _phase_message(ev: Evaluator, res: PhaseResult, inst: InstanceEval) -> float:
    return ev.prefill_bytes() if res.role == "prefill" else ev.activation_bytes(max(1, inst.batch))


def _us(t: float) -> str:
    return f"{t * 1e6:.1f} us"


@dataclass
class _Wanted:
    """One group of an instance in use, with its schemes priced at the phase's message."""

    instance: int
    stage: int
    members: list[str]
    ge: GroupEval
    nbytes: float
    ring_s: float
    ina_s: float | None  # the cheapest flat INA
    hier_s: float | None

    @property
    def gain(self) -> float:
        best = min(t for t in (self.ina_s, self.hier_s, math.inf) if t is not None)
        return self.ring_s - best


def _decide(
    ev: Evaluator, res: PhaseResult, n_used: int, slots: SlotPool, forced: set
) -> list[Group]:
    """Scheme, switch(es) and slots for each group of the instances in use: the fastest
    scheme at the phase's message size that gets its aggregator slots (Alg. 2 line 7), the
    groups that gain most over the ring claiming slots first."""
    used = sorted(res.instances, key=lambda i: -i.rate)[:n_used]
    wanted = []
    for k, inst in enumerate(used):
        nbytes = _phase_message(ev, res, inst)
        for s, members in enumerate(inst.stages):
            ge = ev.group(members, nbytes)
            ring_s = ge.ring.time(ev.ring_fabric, nbytes) if len(members) > 1 else 0.0
            ina_s = ge.ina[0].time(ev.ina_fabric, nbytes) if ge.ina else None
            hier_s = ge.hier.time(ev.ina_fabric, nbytes) if ge.hier else None
            wanted.append(_Wanted(k, s, list(members), ge, nbytes, ring_s, ina_s, hier_s))
    order = sorted(range(len(wanted)), key=lambda i: -wanted[i].gain)
    decided: dict[int, Group] = {}
    for i in order:
        decided[i] = _decide_group(ev, wanted[i], slots, forced)
    return [decided[i] for i in range(len(wanted))]


def _decide_group(ev: Evaluator, w: _Wanted, slots: SlotPool, forced: set) -> Group:
    ge, nbytes, fab = w.ge, w.nbytes, ev.ina_fabric
    group = Group(
        instance=w.instance,
        stage=w.stage,
        gpus=w.members,
        scheme="ring",
        switch=None,
        slots=None,
        paths={m: list(p) for m, p in ge.ring.paths.items()},
        allreduce_s=w.ring_s,
        ina_s=w.ina_s,
        ring_s=w.ring_s,
        reason="",
        hier_s=w.hier_s,
    )
    if len(w.members) == 1:
        group.reason = "TP=1: no all-reduce"
        return group
    # every scheme faster than the ring, fastest first
    faster: list[tuple[float, str, CommPattern]] = []
    if w.hier_s is not None and w.hier_s < w.ring_s:
        faster.append((w.hier_s, "hier", ge.hier))  # type: ignore[arg-type]
    for p in ge.ina:
        t = p.time(fab, nbytes)
        if t < w.ring_s:
            faster.append((t, "ina", p))
    faster.sort(key=lambda x: (x[0], x[1]))
    if not faster:
        alts = [f"hier {_us(w.hier_s)}"] if w.hier_s is not None else []
        if w.ina_s is not None:
            alts.append(f"INA {_us(w.ina_s)} at {ge.ina[0].switch}")
        group.reason = (
            f"ring {_us(w.ring_s)} <= " + ", ".join(alts) if alts else ge.ina_note or "ring only"
        )
        return group
    if tuple(w.members) in forced:
        group.reason = "no aggregator slots left on any candidate switch"
        return group
    for t, scheme, p in faster:
        if scheme == "hier":
            wants = [
                (r.switch, window_slots(ev, r.switch, list(r.paths.values()), fab)) for r in p.rails
            ]
            ranges = slots.take_all(wants)
            if ranges is None:
                continue
            group.rails = [
                Rail(
                    r.switch,
                    r.shard,
                    r.shards,
                    list(r.members),
                    rg,
                    {m: list(q) for m, q in r.paths.items()},
                )
                for r, rg in zip(p.rails, ranges, strict=True)
            ]
            switches = ",".join(sorted({r.switch for r in p.rails}))
            group.reason = (
                f"hier {_us(t)} < ring {_us(w.ring_s)} ({len(p.rails)} rails on {switches}, "
                f"{sum(rg.count for rg in ranges)} slots)"
            )
        else:
            rng = slots.take(
                p.switch,
                window_slots(ev, p.switch, list(p.paths.values()), fab),
                partial=ev.policy.ina == "async",
            )
            if rng is None:
                continue
            relay = any(relayed(ev.g, q) for q in p.paths.values())
            how = "NVLink-assisted" if relay else "Ethernet-only"
            group.switch, group.slots = p.switch, rng
            group.reason = (
                f"INA {_us(t)} < ring {_us(w.ring_s)} ({how} routes to {p.switch}, "
                f"{rng.count} slots)"
            )
        group.scheme = scheme  # type: ignore[assignment]
        group.paths = {m: list(q) for m, q in p.paths.items()}
        group.allreduce_s = t
        return group
    group.reason = "no aggregator slots left on any candidate switch"
    forced.add(tuple(w.members))
    return group


def _phase_plan(ev: Evaluator, res: PhaseResult, n_used: int, groups: list[Group]) -> PhasePlan:
    used = sorted(res.instances, key=lambda i: -i.rate)[:n_used]
    n = max(1, len(used))
    return PhasePlan(
        role=res.role,
        tp=res.tp,
        pp=res.pp,
        gpu_type=res.gpu_type,
        instances=[
            Instance(
                stages=[list(s) for s in i.stages],
                batch=i.batch if res.role == "decode" else 0,
                rate=i.rate,
            )
            for i in used
        ],
        groups=groups,
        comm_s=sum(i.comm_s for i in used) / n,
        compute_s=sum(i.compute_s for i in used) / n,
        batch_size=min((i.batch for i in used), default=0),
        rate_per_instance=sum(i.rate for i in used) / n,
    )


def _kv_note(ev: Evaluator, pre: PhaseResult, dec: PhaseResult, comb: Combination) -> str:
    """The link that the deployment's KV transfers load most at H, and how much: the link
    that bounds H when the network binds (``kvtransfer.KVLoad``)."""
    load = ev.kv_load(pre, dec, comb.n_prefill, comb.n_decode)
    e = load.bottleneck()
    if e is None:
        return ""
    util = comb.rate * load.link_s[e]
    gbps = to_gbps(util / ev.ring_fabric.link_table[e][0])
    return (
        f"KV transfer: busiest link {e[0]} -> {e[1]} at {util:.1%} of its capacity "
        f"({gbps:.3g} Gb/s) at H, {len(load.pairs)} prefill/decode pair(s)"
    )


@dataclass
class _SlotsSettled:
    """One pricing whose groups all got the aggregator slots their scheme needs
    (``_settle_slots``): the phases, the combination deployed, T_f, a function listing the
    KV flows, and the groups of each phase's instances in use."""

    prefill: PhaseResult
    decode: PhaseResult
    combination: Combination
    t_f: float
    kv_flows: Callable[[], list]
    prefill_groups: list[Group]
    decode_groups: list[Group]


def _settle_slots(result: SearchResult) -> _SlotsSettled:
    """The phases, the combination, the KV transfer and the groups of one pricing.

    Groups that find no aggregator slots fall back to the ring (``forced_ring``), which
    slows their instances: the phases are then priced again and the deployment settled
    again on its KV transfer (Eq. 1, Eqs. 14-15, ``settle_kv``), which can reorder the
    instances by rate or deploy others. The groups are decided afresh on that pricing, every
    slot free again, until no further group falls back (``forced_ring`` only grows, so this
    ends). So a group's instance number is the position of its instance in the order
    ``_phase_plan`` lists the same pricing's instances, and the KV transfers join GPUs the
    plan deploys: the plan checks both on reload (``inputs/plan_checks.py``)."""
    ev = result.evaluator
    problem = ev.problem
    pre, dec, comb = result.prefill, result.decode, result.combination
    t_f, flows = result.t_f, result.kv_flows
    # A free-INA plan is a bound (``PlannerOptions.free_ina``): its all-reduces cost nothing
    # whatever the slots, so no group falls back and the search's pricing stands.
    bound = problem.options.free_ina
    forced = set() if bound else set(ev.forced_ring)
    while True:
        before = len(forced)
        slots = SlotPool(ev)
        pre_groups = _decide(ev, pre, comb.n_prefill, slots, forced)
        dec_groups = _decide(ev, dec, comb.n_decode, slots, forced)
        if bound or len(forced) == before:
            return _SlotsSettled(pre, dec, comb, t_f, flows, pre_groups, dec_groups)
        for members in forced:  # priced on the ring from now on
            ev.force_ring(members)
        pre = ev.reevaluate(pre, 0.0)
        dec0 = ev.reevaluate(dec, 0.0)
        first = combine(pre, dec0, problem.sla.ttft_s, problem.options.max_gpus)
        settled = (
            None
            if first is None
            else settle_kv(
                ev, pre, dec0, lambda t, d=dec: ev.reevaluate(d, t), first, kv_contention=True
            )
        )
        if settled is None:
            raise InputError(
                "no deployment meets the SLA once the groups without aggregator slots run as rings"
            )
        comb, dec, t_f, flows = settled.combination, settled.decode, settled.t_f, settled.kv_flows


def build_plan(result: SearchResult, planner: str, topology: str, workload: str) -> Plan:
    ev = result.evaluator
    problem = ev.problem
    # the search is over: the assembly's settlements (groups that lost their slots) run to
    # their end, the time limit stops only the search (``Problem.tick``)
    problem.plan_in_hand = False
    s = _settle_slots(result)
    pre, dec, comb, t_f, flows = s.prefill, s.decode, s.combination, s.t_f, s.kv_flows
    pre_groups, dec_groups = s.prefill_groups, s.decode_groups
    notes = []
    # the TTFT at H as the engines serve it, and H lowered where that misses the SLA
    checked = checked_ttft(ev, pre, comb)
    if checked.rate < comb.rate:
        notes.append(
            f"H lowered from {comb.rate:.3f} to {checked.rate:.3f} req/s: there the prefill "
            f"pool meets the TTFT SLA as the engines admit prompts"
        )
    comb = checked
    # the groups of this plan that lost INA (others may have, in a deployment not kept)
    fell = sum(tuple(g.gpus) in ev.forced_ring for g in pre_groups + dec_groups)
    if fell:
        notes.append(f"{fell} group(s) fell back to ring: aggregator slots exhausted")
    pred = Predicted(
        ttft_s=comb.ttft_s,
        tpot_s=comb.tpot_s,
        kv_transfer_s=t_f,
        rate=comb.rate,
        rate_per_gpu=comb.rate_per_gpu,
        gpus_used=comb.gpus_used,
    )
    kv = [KVTransfer(f.src, f.dst, f.nbytes, list(f.path), f.time_s) for f in flows()]
    split = result.split
    idle = idle_gpus(
        ev,
        [
            (pre, comb.n_prefill, split.prefill if split is not None else None),
            (dec, comb.n_decode, split.decode if split is not None else None),
        ],
        comb,
    )
    if problem.timed_out:
        notes.append(
            f"time limit reached ({problem.options.time_limit_s:g} s): the best plan found "
            "by then, not the search's end"
        )
    if not result.kv_contention:
        notes.append(
            "the KV transfers' load on decode groups' links is not priced (the time limit "
            "came first): H is an upper bound on what this deployment serves"
        )
    if result.split is not None:
        notes.append(f"role split {result.split.label}, the best of {result.splits_priced} priced")
    notes.append(f"{result.candidates_tried} candidate pair(s) priced with KV transfer")
    note = _kv_note(ev, pre, dec, comb)
    if note:
        notes.append(note)
    return Plan(
        planner=planner,
        topology=topology,
        model=problem.model.name,
        workload=workload,
        sla=problem.sla,
        prefill=_phase_plan(ev, pre, comb.n_prefill, pre_groups),
        decode=_phase_plan(ev, dec, comb.n_decode, dec_groups),
        kv_transfer=kv,
        predicted=pred,
        notes=notes,
        # the simulator and the controller price the plan the same way
        options={
            **problem.options.net.plan_options(),
            "tpot_mode": problem.options.tpot_mode,
            # an engine profile priced compute: simulate it with the same (cli/simulate.py)
            **(
                {"compute_profile": problem.options.compute_source}
                if problem.options.compute_source
                else {}
            ),
            # what the plan was searched for: export checks it again (docs/export.md)
            **({"engine": problem.options.engine} if problem.options.engine else {}),
        },
        idle=idle,
        time_limit_reached=problem.timed_out,
    )
