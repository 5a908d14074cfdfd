"""The online scheduler (docs/design.md §8, ``controller.scheduler.online``) inside the simulator.

Every group with more than one candidate policy (ring, INA at each switch its planner allows,
hierarchical INA where the plan chose it) gets an
:class:`~controller.scheduler.online.OnlineScheduler` whose table lists those policies, the
plan's choice as policy 0 (so ties keep the plan), all costs 0.
The simulator asks it once per stage iteration with the bytes of the iteration's 2 L/P_pipe
all-reduces (one decision per iteration rather than per all-reduce: a GPU agent decides per
collective, but the 2 L/P all-reduces of one iteration see the same network within a few ms,
and 128 decisions per iteration would make large runs slow); every window ``T_u`` it feeds
each scheduler the measured utilisation of its links (bytes carried in the window over
capacity times ``T_u``, the busier direction of each full-duplex link, at most 1).

Each policy's Eq. 16 time model (``latency_s``, ``bandwidth``) is the option's uncontended
time ``CommOption.time`` made affine at the stage's reference message D_ref (the size the
model priced the options at): per decision of n = 2 L/P_pipe all-reduces, latency_s =
n t_c(0) and bandwidth = D_ref / (t_c(D_ref) - t_c(0)), so an iteration of D_ref-byte
all-reduces (D = n D_ref) costs delta_c = n t_c(D_ref) / T_u, its time alone over the window.
At zero load the scheduler therefore picks the option the cost model prices fastest.

Holds :func:`reference_bytes`, :func:`time_model`, :func:`policy_table` (a group's table,
docs/policy-table.md) and :class:`GroupSchedulers` (one scheduler per group with a choice).
"""

from __future__ import annotations

from controller.planner.reprice import decided_bytes
from controller.scheduler.online import OnlineScheduler
from controller.sim.model import CommOption, PlanModel, StageModel
from controller.sim.network import Links
from controller.topology.graph import link_id


def reference_bytes(model: PlanModel, role: str) -> float:
    """D_ref of a stage of ``role``: the all-reduce message ``build_model`` prices the options
    at (the workload's mean prompt for prefill, the plan's batch for decode)."""
    return decided_bytes(model.evaluator, model.plan, role)


def time_model(opt: CommOption, ref_bytes: float, n_allreduce: float) -> dict[str, float]:
    """Eq. 16 fields of one option for decisions of ``n_allreduce`` all-reduces each:
    latency_s = n t(0), bandwidth = D_ref / (t(D_ref) - t(0)) (absent when t does not grow)."""
    t0 = opt.time(0.0)
    out = {"latency_s": n_allreduce * t0}
    slope = opt.time(ref_bytes) - t0
    if ref_bytes > 0.0 and slope > 0.0:
        out["bandwidth"] = ref_bytes / slope
    return out


def policy_table(
    stage: StageModel, window_s: float, gamma: float, ref_bytes: float | None = None
) -> dict:
    """The table of docs/policy-table.md for one group's candidate policies. With
    ``ref_bytes`` (D_ref) each policy gets latency_s / bandwidth from its option's time for
    a decision of 2 L/P_pipe all-reduces (module docstring); without, Eq. 16 falls back to
    the bottleneck capacity. Link capacities are 0 here: the caller fills them in."""
    caps: dict[str, float] = {}
    for opt in stage.options:
        for lid in opt.link_ids:
            caps.setdefault(lid, 0.0)
    n_ar = stage.allreduces  # all-reduces per decision, as Simulator._iteration asks
    policies = []
    for k, opt in enumerate(stage.options):
        p = {
            "id": k,
            "scheme": opt.scheme,
            "switch": opt.switch or "",
            "rails": [{"shard": k, "switch": sw} for k, sw in opt.rails],
            "links": list(opt.link_ids),
            "cost": 0.0,
        }
        if ref_bytes is not None:
            p.update(time_model(opt, ref_bytes, n_ar))
        policies.append(p)
    return {
        "group_id": stage.group_id,
        "version": 1,
        "apply_from_seq": 0,
        "window_s": window_s,
        "gamma": gamma,
        "links": [{"id": lid, "capacity": caps[lid]} for lid in sorted(caps)],
        "policies": policies,
    }


class GroupSchedulers:
    """One scheduler per group that has a choice; ``choose`` returns an option index."""

    def __init__(self, model: PlanModel, window_s: float, gamma: float) -> None:
        self.window_s = window_s
        self.by_stage: dict[int, OnlineScheduler] = {}
        lk = model.links
        # undirected link id -> its two directed indices, and capacity
        self.dirs: dict[str, list[int]] = {}
        watched: set[str] = set()
        for e, (u, v) in enumerate(lk.ends):
            self.dirs.setdefault(link_id(u, v), []).append(e)
        for inst in model.prefill + model.decode:
            ref = reference_bytes(model, inst.role)
            for st in inst.stages:
                if len(st.options) < 2:
                    continue
                table = policy_table(st, window_s, gamma, ref)
                for link in table["links"]:
                    link["capacity"] = lk.capacity[self.dirs[link["id"]][0]]
                self.by_stage[id(st)] = OnlineScheduler(table)
                watched.update(link["id"] for link in table["links"])
        self.watched = sorted(watched)
        self.watched_dirs = [e for lid in self.watched for e in self.dirs[lid]]
        self.decisions = 0

    def choose(self, stage: StageModel, nbytes: float) -> int:
        s = self.by_stage.get(id(stage))
        if s is None:
            return 0
        self.decisions += 1
        return s.select(nbytes)  # policy ids are option indices

    def close_window(self, links: Links) -> None:
        """End of a window T_u: measured utilisation to every scheduler (Eq. 18 and decay)."""
        util = {}
        span = self.window_s
        for lid in self.watched:
            u = 0.0
            for e in self.dirs[lid]:
                x = links.window_bytes[e] / (links.capacity[e] * span)
                if x > u:
                    u = x
            util[lid] = min(1.0, u)
        for s in self.by_stage.values():
            if s.table is not None:  # a table takes effect at the group's first collective
                s.observe_utilisation(util)
        for e in self.watched_dirs:  # only these are read
            links.window_bytes[e] = 0.0
