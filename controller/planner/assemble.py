"""Turning a search result into a :class:`controller.plan.Plan`: the scheme of each group at
the phase's operating message size, the aggregation switch and its slot range (Alg. 2 line 7:
the cheapest switch that still has room for the group's window of aggregator slots), paths,
KV-transfer pairs and the predicted figures."""

from __future__ import annotations

import math

from controller.costmodel.network import CommPattern
from controller.plan import Group, Instance, KVTransfer, PhasePlan, Plan, Predicted, SlotRange
from controller.planner.evaluate import Evaluator, InstanceEval, PhaseResult, combine
from controller.planner.grouping import PodGroups
from controller.planner.search import SearchResult
from controller.topology.fabric import Fabric
from controller.topology.graph import DEFAULT_AGGREGATOR_SLOTS, DEFAULT_SLOT_BYTES


def window_slots(ev: Evaluator, pattern: CommPattern, fabric: Fabric) -> int:
    """Aggregator slots a group keeps in flight: its bandwidth-delay product in slots,
    ceil(B * RTT / slot_bytes), with B the slowest first hop and RTT twice the longest route's
    latency (SwitchML sizes its pool the same way)."""
    sw = ev.g.nodes[pattern.switch]
    slot_bytes = sw.get("slot_bytes", DEFAULT_SLOT_BYTES)
    bw = min(1.0 / fabric.link_table[(p[0], p[1])][0] for p, _ in pattern.flows)
    rtt = 2 * pattern.max_path_latency(fabric)
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


def _phase_message(ev: Evaluator, res: PhaseResult, inst: InstanceEval) -> float:
    return ev.prefill_bytes() if res.role == "prefill" else ev.activation_bytes(max(1, inst.batch))


def _decide(
    ev: Evaluator, res: PhaseResult, n_used: int, slots: SlotPool, forced: set
) -> list[Group]:
    """Scheme, switch and slots for each group of the instances in use."""
    groups = []
    used = sorted(res.instances, key=lambda i: -i.rate)[:n_used]
    wanted = []
    for k, inst in enumerate(used):
        nbytes = _phase_message(ev, res, inst)
        for s, members in enumerate(inst.stages):
            ge = ev.group(members, nbytes)
            ring_s = ge.ring.time(ev.ring_fabric, nbytes)
            ina_s = ge.ina[0].time(ev.ina_fabric, nbytes) if ge.ina else None
            wanted.append((k, s, members, ge, nbytes, ring_s, ina_s))
    # groups that gain most from INA claim slots first
    order = sorted(range(len(wanted)), key=lambda i: -(wanted[i][5] - (wanted[i][6] or math.inf)))
    decided: dict[int, Group] = {}
    for i in order:
        k, s, members, ge, nbytes, ring_s, ina_s = wanted[i]
        choice, reason, rng_, pattern = None, "", None, ge.ring
        if len(members) == 1:
            reason = "TP=1: no all-reduce"
        elif ina_s is None:
            reason = ge.ina_note
        elif ina_s >= ring_s:
            reason = f"ring {ring_s * 1e6:.1f} us <= INA {ina_s * 1e6:.1f} us at {ge.ina[0].switch}"
        elif tuple(members) in forced:
            reason = "no aggregator slots left on any candidate switch"
        else:
            for p in ge.ina:
                t = p.time(ev.ina_fabric, nbytes)
                if t >= ring_s:
                    break
                w = window_slots(ev, p, ev.ina_fabric)
                rng_ = slots.take(p.switch, w, partial=ev.policy.ina == "async")
                if rng_ is not None:
                    choice, pattern = p, p
                    relay = any(
                        ev.g.nodes[n]["kind"] == "nvswitch" for q in p.paths.values() for n in q
                    )
                    how = "NVLink-assisted" if relay else "Ethernet-only"
                    reason = (
                        f"INA {t * 1e6:.1f} us < ring {ring_s * 1e6:.1f} us "
                        f"({how} routes to {p.switch}, {rng_.count} slots)"
                    )
                    break
            if choice is None:
                reason = "no aggregator slots left on any candidate switch"
                forced.add(tuple(members))
        chosen_s = (
            (choice.time(ev.ina_fabric, nbytes) if choice else ring_s) if len(members) > 1 else 0.0
        )
        decided[i] = Group(
            instance=k,
            stage=s,
            gpus=list(members),
            scheme="ina" if choice else "ring",
            switch=choice.switch if choice else None,
            slots=rng_ if choice else None,
            paths={m: list(p) for m, p in pattern.paths.items()},
            allreduce_s=chosen_s,
            ina_s=ina_s,
            ring_s=ring_s if len(members) > 1 else 0.0,
            reason=reason,
        )
    groups = [decided[i] for i in range(len(wanted))]
    return groups


def _phase_plan(ev: Evaluator, res: PhaseResult, n_used: int, groups: list[Group]) -> PhasePlan:
    used = sorted(res.instances, key=lambda i: -i.rate)[:n_used]
    n = max(1, len(used))
    return PhasePlan(
        role=res.role,
        tp=res.tp,
        pp=res.pp,
        gpu_type=res.gpu_type,
        instances=[Instance(stages=[list(s) for s in i.stages]) for i in used],
        groups=groups,
        comm_s=sum(i.comm_s for i in used) / n,
        compute_s=sum(i.compute_s for i in used) / n,
        batch_size=min((i.batch for i in used), default=0),
        rate_per_instance=sum(i.rate for i in used) / n,
    )


def _one_pod(res: PhaseResult) -> PodGroups:
    groups = [s for i in res.groups for s in i]
    return PodGroups(None, [x for grp in groups for x in grp], groups)


def build_plan(result: SearchResult, planner: str, topology: str, workload: str) -> Plan:
    ev = result.evaluator
    problem = ev.problem
    comb = result.combination
    pre, dec = result.prefill, result.decode
    slots = SlotPool(ev)
    forced = ev.forced_ring
    pre_groups = _decide(ev, pre, comb.n_prefill, slots, forced)
    dec_groups = _decide(ev, dec, comb.n_decode, slots, forced)
    notes = []
    if forced:  # some groups lost INA to the slot limit: price them as rings again
        notes.append(f"{len(forced)} group(s) fell back to ring: aggregator slots exhausted")
        pre = ev.prefill_phase(pre.tp, pre.pp, [_one_pod(pre)])
        dec = ev.decode_phase(dec.tp, dec.pp, [_one_pod(dec)], result.t_f)
        comb = combine(pre, dec, problem.sla.ttft_s) or comb
    pred = Predicted(
        ttft_s=comb.ttft_s,
        tpot_s=comb.tpot_s,
        kv_transfer_s=result.t_f,
        rate=comb.rate,
        rate_per_gpu=comb.rate_per_gpu,
        gpus_used=comb.gpus_used,
    )
    kv = [KVTransfer(f.src, f.dst, f.nbytes, list(f.path), f.time_s) for f in result.kv_flows]
    notes.append(f"{result.candidates_tried} candidate pair(s) priced with KV transfer")
    return Plan(
        planner=planner,
        topology=topology,
        model=problem.model.name,
        workload=workload,
        sla=problem.sla.to_dict(),
        prefill=_phase_plan(ev, pre, comb.n_prefill, pre_groups),
        decode=_phase_plan(ev, dec, comb.n_decode, dec_groups),
        kv_transfer=kv,
        predicted=pred,
        notes=notes,
        options=problem.options.net.plan_options(),  # the simulator prices it the same way
    )
