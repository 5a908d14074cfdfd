"""The input files every command and the controller read, behind one door.

- topologies: :func:`load_topology` / :func:`topology_from_dict` (``controller/topology/io.py``)
- plans: :func:`load_plan` / :func:`parse_plan` / :func:`validate_plan_dict`, and
  :func:`check_plan_on_topology` / :func:`cluster_for_plan` against a cluster
  (``controller/inputs/plan_checks.py``)
- traces: :func:`load_trace` (``controller/workload/traces.py``)

Each raises :class:`controller.errors.InputError` naming the file and the offending item;
the bounds are in ``controller/inputs/limits.py`` and docs/topology.md. ``heroserve validate
FILE`` runs the same functions on any of the three and prints a one-line summary.
"""

from __future__ import annotations

from pathlib import Path

import networkx as nx

from controller.errors import InputError
from controller.inputs.limits import MAX_PLAN_BYTES, MAX_TOPOLOGY_JSON_BYTES
from controller.inputs.plan_checks import (
    check_plan_on_topology,
    load_plan,
    parse_plan,
    validate_plan_dict,
)
from controller.inputs.schema import parse_json, read_text
from controller.plan import Plan
from controller.topology import load_topology, resolve_topology, topology_from_dict
from controller.workload.traces import load_trace

KINDS = ("topology", "plan", "trace")


def cluster_for_plan(plan: Plan, topology: str | None = None, source: str = "plan") -> nx.Graph:
    """The cluster a plan runs on (``topology``, else the plan's own, a built-in name or a
    file), with the plan (read from ``source``) checked against it."""
    spec = topology or plan.topology
    try:
        g = resolve_topology(spec)
    except InputError as e:
        if topology is None:
            raise InputError(
                f"plan's topology {spec!r} cannot be resolved ({e}): pass --topology"
            ) from None
        raise
    try:
        check_plan_on_topology(plan, g)
    except InputError as e:
        raise InputError(f"{source}: {e}") from None
    return g


def kind_of(path: str | Path) -> str:
    """What a file holds, from its extension and, for JSON, its first character and keys:
    a list is a trace, a mapping with ``links`` a topology, any other mapping a plan."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".csv":
        return "trace"
    if suffix in (".yaml", ".yml"):
        return "topology"
    if suffix != ".json":
        raise InputError(
            f"{p}: cannot tell what it is from {suffix or 'no extension'!r}: pass --as"
        )
    if not p.is_file():
        read_text(p, "input", 0)  # names what is wrong: missing, or not a regular file
    try:
        with p.open("rb") as f:
            head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None
    return "trace" if head[:1] == b"[" else "mapping"


def validate_file(path: str | Path, kind: str | None = None, topology: str | None = None) -> str:
    """Check one input file as every command would; returns a one-line summary."""
    p = Path(path)
    kind = kind or kind_of(p)
    if kind == "mapping":  # a JSON plan or topology: parse once, then tell them apart
        doc = parse_json(read_text(p, "plan or topology", MAX_PLAN_BYTES), str(p))
        kind = "topology" if isinstance(doc, dict) and "links" in doc else "plan"
        if kind == "topology":
            size = p.stat().st_size
            if size > MAX_TOPOLOGY_JSON_BYTES:
                raise InputError(
                    f"{p}: {size} bytes, a topology file may have at most {MAX_TOPOLOGY_JSON_BYTES}"
                )
            g = topology_from_dict(doc, str(p))
        else:
            plan = validate_plan_dict(doc, str(p))
    elif kind == "topology":
        g = load_topology(p)
    elif kind == "plan":
        plan = load_plan(p)
    elif kind == "trace":
        w = load_trace(p)
        timed = "with arrival times" if w.arrivals is not None else "no arrival times"
        return (
            f"{p}: valid trace ({len(w.inputs)} requests, mean input {w.mean_input:.1f} and "
            f"output {w.mean_output:.1f} tokens, {timed})"
        )
    else:
        raise InputError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
    if kind == "topology":
        n = sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu")
        return (
            f"{p}: valid topology ({n} GPUs, {g.number_of_nodes()} nodes, "
            f"{g.number_of_edges()} links)"
        )
    g = cluster_for_plan(plan, topology, str(p))
    return (
        f"{p}: valid plan by {plan.planner} ({len(plan.all_gpus())} GPUs, prefill "
        f"{plan.prefill.tp}x{plan.prefill.pp}, decode {plan.decode.tp}x{plan.decode.pp}), "
        f"fits topology {g.name}"
    )


__all__ = [
    "KINDS",
    "check_plan_on_topology",
    "cluster_for_plan",
    "kind_of",
    "load_plan",
    "load_topology",
    "load_trace",
    "parse_plan",
    "topology_from_dict",
    "validate_file",
    "validate_plan_dict",
]
