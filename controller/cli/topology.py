"""``heroserve topology validate|export``: check a topology file, or print a built-in
topology as the file that would build it (docs/topology.md)."""

from __future__ import annotations

import argparse
import json
import sys


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["validate", "export"])
    p.add_argument("source", help="a built-in name or a topology file")


def run(a: argparse.Namespace) -> int:
    from controller.topology import resolve_topology, topology_to_dict

    g = resolve_topology(a.source)
    if a.action == "validate":
        n = sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu")
        print(
            f"{a.source}: valid ({n} GPUs, {g.number_of_nodes()} nodes, "
            f"{g.number_of_edges()} links)"
        )
    else:
        json.dump(topology_to_dict(g), sys.stdout, indent=1)
        print()
    return 0
