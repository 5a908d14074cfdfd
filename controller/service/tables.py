"""The policy tables of docs/policy-table.md, one per group with an all-reduce (docs/design.md
§6, §8).

Holds:

* :func:`build_tables`: every group of two GPUs or more gets a table for the GPU agents of
  its members: policy 0 is the planned scheme with the planned paths; an INA group also gets
  policy 1, a ring through the same switch (member i -> switch -> member i+1); a
  hierarchical group gets policy 1, flat INA on the ``/flat`` group's switch (when
  installed), and then NCCL's ring, so the online scheduler (Eqs. 16-18) has alternatives
  when links are loaded. Initial costs b_c are 0. A group of one GPU (TP=1) has no
  all-reduce and gets no table: NCCL's defaults stand for it. Link capacities come from the
  plan's cluster graph; each table's version comes from the store;
* :func:`table_json` / :func:`check_table`: the JSON form the GPU agent validates, and that
  validator (:func:`controller.scheduler.online.parse_table`) run before a table is
  published: a table the GPU agents would refuse makes the plan an error naming the group
  and the field.

The fourth stage of applying a plan (:func:`controller.service.state.derive`): it takes the
aggregation groups the groups stage installed, prices each table with
:func:`controller.service.pricing.price` and hands the tables to the state stage.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from agents.proto.heroserve.v1 import control_pb2 as pb
from controller.errors import InputError
from controller.plan import Group, Plan
from controller.scheduler.online import TableError, parse_table
from controller.service.groups import AggSpec, flat_name, has_allreduce, role_groups
from controller.service.pricing import Alternatives, PolicyTimer, price
from controller.service.store import Store
from controller.topology.graph import link_id, path_links

if TYPE_CHECKING:
    import networkx as nx

_SCHEME_NAMES = {
    pb.SCHEME_INA: "ina",
    pb.SCHEME_RING: "ring",
    pb.SCHEME_NVLS: "nvls",
    pb.SCHEME_HIER: "hier",
}


def route_links(path: list[str]) -> list[str]:
    """The link ids (docs/policy-table.md) along ``path``, in order."""
    return [link_id(a, b) for a, b in path_links(path)]


def report_quorum(cluster: nx.Graph, g: Group) -> int:
    """How many agents' sequence number reports a group's apply point rests on
    (docs/control-plane.md, "Apply points"): two when its members span servers (an agent
    speaks for one server or one GPU, so two agents serve it at least), else one."""
    servers = {cluster.nodes[gpu].get("server", gpu) for gpu in g.gpus if gpu in cluster}
    return 2 if len(servers) > 1 else 1


def build_tables(
    plan: Plan,
    installed: dict[str, AggSpec],
    cluster: nx.Graph,
    timer: PolicyTimer | None,
    alternatives: Alternatives,
    window_s: float,
    gamma: float,
    store: Store,
    apply_from: Callable[[str, int], int],
) -> tuple[list[pb.PolicyTable], dict[str, list[str]]]:
    """The table of every group of ``plan`` with an all-reduce, and each table's members
    (table name -> GPU ids). ``installed``: the aggregation groups that got slots
    (:func:`controller.service.groups.install`); ``cluster``'s links give the tables'
    capacities (bytes/s); ``timer`` prices the policies for Eq. 16 (None: no latency_s /
    bandwidth); ``alternatives`` routes a hierarchical group's other policies;
    ``apply_from(group, quorum)`` gives the apply_from_seq of a new table version from the
    reports of ``quorum`` agents (:func:`report_quorum`). Raises
    :class:`InputError` when a table names a link the cluster lacks or would not pass
    :func:`check_table`."""
    caps = {link_id(a, b): float(d["capacity"]) for a, b, d in cluster.edges(data=True)}
    tables: list[pb.PolicyTable] = []
    members: dict[str, list[str]] = {}
    for role, name, g in role_groups(plan):
        if not has_allreduce(g):
            continue  # TP=1: no all-reduce, no table (docs/policy-table.md)
        members[name] = list(g.gpus)
        policies: list[pb.Policy] = []
        if g.scheme == "ina":
            assert g.switch is not None
            to_switch = installed[name].paths
            policies.append(_policy(0, pb.SCHEME_INA, g.switch, to_switch))
            ring = {
                gpu: to_switch[gpu] + to_switch[g.gpus[(i + 1) % len(g.gpus)]][-2::-1]
                for i, gpu in enumerate(g.gpus)
            }
            policies.append(_policy(1, pb.SCHEME_RING, "", ring))
        elif g.scheme == "hier":
            policies.append(_hier_policy(name, g, alternatives))
            flat = installed.get(flat_name(name))
            if flat is not None:
                policies.append(_policy(len(policies), pb.SCHEME_INA, flat.switch, flat.paths))
            ring_paths = {m: list(r) for m, r in alternatives.ring(role, g).paths.items()}
            policies.append(_policy(len(policies), pb.SCHEME_RING, "", ring_paths))
        else:
            pol = _policy(0, pb.SCHEME_RING, "", {k: list(v) for k, v in g.paths.items()})
            _add_links(pol, _mesh_ring_links(g, alternatives))
            policies.append(pol)
        if timer is not None:
            price(timer, role, g, policies)
        t = pb.PolicyTable(group_id=name, window_s=window_s, gamma=gamma)
        t.policies.extend(policies)
        for lid in sorted({lk for p in policies for lk in p.links}):
            if lid not in caps:
                raise InputError(
                    f"group {name}: link {lid} is not in topology {cluster.name!r} "
                    "(its capacity is unknown)"
                )
            t.links.add(id=lid, capacity=caps[lid])
        digest = _table_digest(t)
        t.version = store.table_version(name, digest, apply_from(name, report_quorum(cluster, g)))
        t.apply_from_seq = store.table_apply_from(name)
        _check_once(t, digest)
        tables.append(t)
    return tables, members


def _hier_policy(name: str, g: Group, alt: Alternatives) -> pb.Policy:
    """Policy 0 of a hierarchical group: each member's route to its rail's switch, and the
    NVLink links of the reduce-scatter and all-gather inside each server (consecutive
    members of a server in ring order, over NVLink, as NCCL's intra-node ring runs; on a mesh
    board every link the cost model spreads the ring over, ``ring.server_ring``)."""
    from controller.costmodel.ring import ring_order, server_ring

    paths: dict[str, list[str]] = {}
    for r in g.rails:
        for m in r.members:
            paths[m] = r.paths[m][: r.paths[m].index(r.switch) + 1]
    pol = _policy(0, pb.SCHEME_HIER, "", paths)
    fab = alt.ring_fabric
    order = ring_order(fab, g.gpus)
    by_server: dict[str, list[str]] = {}
    for m in order:
        by_server.setdefault(str(fab.g.nodes[m].get("server") or m), []).append(m)
    extra: list[str] = []
    for gpus in by_server.values():
        for u, v in zip(gpus, gpus[1:] + gpus[:1], strict=False):
            route = fab.nvlink_path(u, v) if u != v else None
            if route is None and u != v:
                raise InputError(f"group {name}: {u} and {v} share a server but no NVLink path")
            extra.extend(route_links(route or []))
        if len(gpus) > 1:
            for route, _ in server_ring(fab, gpus, 1.0):
                extra.extend(route_links(route))
    _add_links(pol, extra)
    for r in sorted(g.rails, key=lambda r: r.shard):
        pol.rails.add(shard=r.shard, switch=r.switch)
    return pol


def _mesh_ring_links(g: Group, alt: Alternatives) -> list[str]:
    """The links a ring inside one mesh board is spread over (``ring.server_ring``: every
    pair's direct link), beyond the ring edges the plan records; none for any other ring."""
    from controller.costmodel.ring import ring_order, server_ring

    # every member's ring edge recorded, each GPU to GPU (no fabric node between)
    direct = set(g.paths) == set(g.gpus) and all(len(p) == 2 for p in g.paths.values())
    servers = {alt.cluster.nodes[m].get("server") for m in g.gpus}
    if len(g.gpus) < 3 or not direct or len(servers) != 1:
        return []
    fab = alt.ring_fabric
    return [lk for p, _ in server_ring(fab, ring_order(fab, g.gpus), 1.0) for lk in route_links(p)]


def _add_links(pol: pb.Policy, extra: list[str]) -> None:
    links = sorted(set(pol.links) | set(extra))
    del pol.links[:]
    pol.links.extend(links)


def _policy(pid: int, scheme: int, switch: str, paths: dict[str, list[str]]) -> pb.Policy:
    p = pb.Policy(id=pid, scheme=scheme, switch=switch, cost=0.0)
    links: list[str] = []
    for gpu in sorted(paths):
        p.paths[gpu].nodes.extend(paths[gpu])
        for lk in route_links(paths[gpu]):
            if lk not in links:
                links.append(lk)
    p.links.extend(sorted(links))
    return p


def table_json(t: pb.PolicyTable) -> dict:
    """The JSON form of docs/policy-table.md that the GPU agent validates (its ``TableJson``:
    proto3's bandwidth 0, "absent", left out)."""
    pols = []
    for p in t.policies:
        q: dict = {
            "id": p.id,
            "scheme": _SCHEME_NAMES.get(p.scheme, str(p.scheme)),
            "switch": p.switch,
            "links": list(p.links),
            "paths": {gpu: list(r.nodes) for gpu, r in sorted(p.paths.items())},
            "cost": p.cost,
            "latency_s": p.latency_s,
        }
        if p.bandwidth != 0.0:
            q["bandwidth"] = p.bandwidth
        if p.rails:
            q["rails"] = [{"shard": r.shard, "switch": r.switch} for r in p.rails]
        pols.append(q)
    return {
        "group_id": t.group_id,
        "version": t.version,
        "apply_from_seq": t.apply_from_seq,
        "window_s": t.window_s,
        "gamma": t.gamma,
        "links": [{"id": lk.id, "capacity": lk.capacity} for lk in t.links],
        "policies": pols,
        "utilisation": dict(sorted(t.utilisation.items())),
    }


def check_table(t: pb.PolicyTable) -> None:
    """Raise :class:`InputError` naming the group and the field when the online scheduler's
    validator (the one the GPU agents run) would refuse ``t``."""
    try:
        parse_table(table_json(t))
    except TableError as exc:
        raise InputError(f"group {t.group_id}: invalid policy table: {exc}") from exc


# Digests of table contents that passed check_table: the validator is a pure function of
# the content (version and apply_from_seq come from the store and are in range), so a table
# the previous plan already had is not validated again. Bounded: cleared when full.
_VALIDATED: set[str] = set()
_VALIDATED_MAX = 1 << 16


def _check_once(t: pb.PolicyTable, digest: str) -> None:
    if digest in _VALIDATED:
        return
    check_table(t)
    if len(_VALIDATED) >= _VALIDATED_MAX:
        _VALIDATED.clear()
    _VALIDATED.add(digest)


def _table_digest(t: pb.PolicyTable) -> str:
    # Version and utilisation are not content: a new utilisation snapshot alone does not
    # make a new table version.
    c = pb.PolicyTable()
    c.CopyFrom(t)
    c.version = 0
    c.apply_from_seq = 0
    c.utilisation.clear()
    return hashlib.sha256(c.SerializeToString(deterministic=True)).hexdigest()
