"""The ladder from DistServe's search to HeroServe's, one change a step: the planners that
``heroserve fidelity``'s ablation plans one after the other (``evaluation.ablation``), and whose
candidates HeroServe's contain (``planner.CONTAINS``).

Each step keeps every change above it:

1. ``distserve``: tensor groups inside a server where they fit, NCCL's ring only, groups
   packed by server (the baseline);
2. ``+ cross-server TP``: the search may also try tensor groups that span servers
   (HeroServe's candidates, still ring only);
3. ``+ flat INA``: SwitchML-style aggregation on a switch, Ethernet routes only, offered to
   every group (DS-SwitchML's scheme, as the paper integrates SwitchML into DistServe; each
   group runs the cheaper of INA and the ring, and inside a server that is NVLink's ring);
4. ``+ NVLink relay``: INA routes may relay over NVLink;
5. ``+ hierarchical INA``: NVLink reduce-scatter, INA per rail, all-gather;
6. ``+ placement``: HeroServe's k-means grouping (Alg. 2) beside the packed one, and
   DistServe's low-affinity layouts: HeroServe as it plans.

Holds ``LADDER``.
"""

from __future__ import annotations

from dataclasses import replace

from controller.planner.baselines import DISTSERVE, packed_grouper
from controller.planner.heroserve import POLICY as HEROSERVE
from controller.planner.heroserve import heroserve_grouper
from controller.planner.options import Policy
from controller.planner.search import Grouper

_CROSS = replace(DISTSERVE, name="+ cross-server TP", prefer_intra_server=False)
_FLAT = replace(_CROSS, name="+ flat INA", ina="sync", ina_cross_server_only=False)
_RELAY = replace(_FLAT, name="+ NVLink relay", ina_relay=True)
_HIER = replace(_RELAY, name="+ hierarchical INA", hier=True)
_PACKED: tuple[Grouper, ...] = (packed_grouper,)

# (step name, policy, groupings priced, planner the simulator prices its plan as): DistServe's
# policy grown one switch at a time until it is HeroServe's (the last step's policy is
# HeroServe's own, checked by the tests). The simulator rebuilds a plan's evaluator from its
# planner's name (``planner.reprice.policy_of``); the named planner's policy has the step's
# INA fields (what the evaluator prices with: ``ina``, ``ina_relay``,
# ``ina_cross_server_only``) and allows hierarchical INA wherever the step does, so the plan
# is simulated as the step priced it (checked by the tests)
LADDER: tuple[tuple[str, Policy, tuple[Grouper, ...], str], ...] = (
    ("distserve", DISTSERVE, _PACKED, "distserve"),
    (_CROSS.name, _CROSS, _PACKED, "distserve"),
    (_FLAT.name, _FLAT, _PACKED, "ds-switchml"),
    (_RELAY.name, _RELAY, _PACKED, "heroserve"),
    (_HIER.name, _HIER, _PACKED, "heroserve"),
    ("+ placement (heroserve)", HEROSERVE, (heroserve_grouper, packed_grouper), "heroserve"),
)
