"""The online scheduler (DESIGN.md §8, ``controller.scheduler.online``) inside the simulator.

Every group with more than one candidate policy (ring, INA at each switch its planner allows)
gets an :class:`~controller.scheduler.online.OnlineScheduler` whose table lists those policies,
the plan's choice as policy 0 (so ties, and the very first choice, keep the plan), all costs 0.
The simulator asks it once per stage iteration with the bytes of the iteration's 2 L/P_pipe
all-reduces (one decision per iteration rather than per all-reduce: a GPU agent decides per
collective, but the 2 L/P all-reduces of one iteration see the same network within a few ms,
and 128 decisions per iteration would make large runs slow); every window ``T_u`` it feeds
each scheduler the measured utilisation of its links (bytes carried in the window over
capacity times ``T_u``, the busier direction of each full-duplex link, at most 1).
"""

from __future__ import annotations

from controller.scheduler.online import OnlineScheduler
from controller.sim.model import PlanModel, StageModel
from controller.sim.network import Links
from controller.topology.graph import link_id


def policy_table(stage: StageModel, window_s: float, gamma: float) -> dict:
    """The table of docs/policy-table.md for one group's candidate policies."""
    caps: dict[str, float] = {}
    for opt in stage.options:
        for lid in opt.link_ids:
            caps.setdefault(lid, 0.0)
    return {
        "group_id": stage.group_id,
        "version": 1,
        "apply_from_seq": 0,
        "window_s": window_s,
        "gamma": gamma,
        "links": [{"id": lid, "capacity": caps[lid]} for lid in sorted(caps)],
        "policies": [
            {
                "id": k,
                "scheme": opt.scheme,
                "switch": opt.switch or "",
                "links": list(opt.link_ids),
                "cost": 0.0,
            }
            for k, opt in enumerate(stage.options)
        ],
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
            for st in inst.stages:
                if len(st.options) < 2:
                    continue
                table = policy_table(st, window_s, gamma)
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
