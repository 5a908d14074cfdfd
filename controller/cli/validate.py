"""``heroserve validate FILE``: check a topology, plan or trace file with the very functions
every command reads it with, and print a one-line summary.

- topologies: ``controller.topology.load_topology`` / ``topology_from_dict``
- plans: ``controller.inputs.plan_checks`` on their own, and against their cluster
  (:func:`controller.cli.common.cluster_for_plan`)
- traces: ``controller.workload.traces.load_trace``

Each raises :class:`controller.errors.InputError` naming the file and the offending item;
the bounds are in ``controller/inputs/limits.py`` and docs/topology.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from controller.errors import InputError
from controller.inputs.documents import parse_json, read_text
from controller.inputs.limits import MAX_PLAN_BYTES, MAX_TOPOLOGY_JSON_BYTES

KINDS = ("topology", "plan", "trace")


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
    """Check one input file as every command would; returns a one-line summary. Imports
    what the kind needs: networkx for a topology or a plan (a plan is checked on its
    cluster's graph), numpy for a trace (a workload's arrays)."""
    from controller.cli.common import cluster_for_plan
    from controller.inputs.plan_checks import load_plan, validate_plan_dict
    from controller.topology import load_topology, topology_from_dict

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
        from controller.workload.traces import load_trace

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
    from controller.export.check import check_plan

    check_plan(plan, g)  # what export refuses (an unknown model, a shard that does not fit)
    return (
        f"{p}: valid plan by {plan.planner} ({len(plan.all_gpus())} GPUs, prefill "
        f"{plan.prefill.tp}x{plan.prefill.pp}, decode {plan.decode.tp}x{plan.decode.pp}), "
        f"fits topology {g.name}"
    )


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a topology (.yaml/.yml/.json), plan (.json) or trace (.csv/.json)")
    p.add_argument(
        "--as",
        dest="kind",
        choices=["topology", "plan", "trace"],
        help="what the file holds (default: told by its extension; a JSON list is a trace, "
        "a mapping with 'links' a topology, another mapping a plan)",
    )
    p.add_argument(
        "--topology",
        help="a plan is checked against this cluster (default: the plan's own topology)",
    )


def run(a: argparse.Namespace) -> int:
    print(validate_file(a.file, a.kind, a.topology))
    return 0
