"""The paper's baselines (§V), as its evaluation describes them:

- ``distserve``: DistServe. Instances kept inside a server where they fit (TP no larger than
  a server; pipeline stages across servers), GPUs packed in server order, NCCL ring over
  whatever links are there (NVLink inside a server; Ethernet with one channel per NIC pair
  and PXN relays between servers). No INA.
- ``ds-switchml``: DistServe's placement with SwitchML's synchronous INA, over Ethernet only
  (no NVLink detours); each group reserves its window of aggregator slots, and a group that
  finds none falls back to the ring. The paper (§V) defines DS-ATP and DS-SwitchML as ATP and
  SwitchML integrated into DistServe, "relying solely on Ethernet for synchronization", with
  no limit to groups that span servers: INA is offered to every group, and each group runs
  the cheaper of INA and NCCL's ring (docs/design.md §6: never handicap a baseline). Inside a
  server the NVLink ring wins (testbed chatbot decode TP 4: ring 21.1 us, INA 719.5 us), and
  DistServe's placement builds no other group on the paper's clusters, so both plan as
  ``distserve`` does there (docs/fidelity.md shows the three as one column).
- ``ds-atp``: the same with ATP's asynchronous, best-effort INA: groups share a switch's
  aggregators without reservation; when they want more slots than the switch has, the
  overflowing share of their traffic goes to the end-host fallback (priced as the ring).

Holds their policies (``DISTSERVE``, ``DS_SWITCHML``, ``DS_ATP``) and ``packed_grouper``,
DistServe's grouping, which HeroServe also prices. DistServe's own low-affinity placement is
``distserve_paper``.
"""

from __future__ import annotations

from controller.planner.evaluate import Evaluator
from controller.planner.grouping import PodGroups, by_pods, packed_groups
from controller.planner.options import Policy

DISTSERVE = Policy(
    "distserve",
    grouping="packed",
    ina="none",
    ina_relay=False,
    ina_cross_server_only=True,
    prefer_intra_server=True,
)
DS_SWITCHML = Policy(
    "ds-switchml",
    grouping="packed",
    ina="sync",
    ina_relay=False,
    ina_cross_server_only=False,  # the paper's integration: INA offered to every group
    prefer_intra_server=True,
)
DS_ATP = Policy(
    "ds-atp",
    grouping="packed",
    ina="async",
    ina_relay=False,
    ina_cross_server_only=False,  # the paper's integration: INA offered to every group
    prefer_intra_server=True,
)


def packed_grouper(
    ev: Evaluator, role: str, pool: list[str], tp: int, pp: int, nbytes: float
) -> list[PodGroups]:
    tag = ("packed", tp)
    cache = ev.grouping_cache(tag)
    return by_pods(
        ev.g, pool, tp, pp, lambda pod: packed_groups(ev.g, pod, tp), ev.problem.say, cache, tag
    )
