"""Cluster model (docs/design.md §3): a networkx graph of GPUs, NVLink fabrics and switches.

Layers, each a small module: ``graph`` (node/edge attributes), ``generators`` (built-in
clusters), ``io`` (files and validation), ``fabric`` (shortest paths and routes)."""

from controller.errors import InputError
from controller.topology.generators import BUILTIN, eight_tracks, fig2, testbed, tracks, two_tracks
from controller.topology.io import load_topology, topology_from_dict, topology_to_dict, validate


def resolve_topology(spec: str):
    """A built-in name (testbed, 2tracks, 8tracks, fig2) or a topology file path."""
    if spec in BUILTIN:
        return BUILTIN[spec]()
    if spec.endswith((".yaml", ".yml", ".json")) or "/" in spec:
        return load_topology(spec)
    raise InputError(f"unknown topology {spec!r}: use {', '.join(BUILTIN)} or a .yaml/.json file")


__all__ = [
    "BUILTIN",
    "InputError",
    "eight_tracks",
    "fig2",
    "load_topology",
    "resolve_topology",
    "testbed",
    "topology_from_dict",
    "topology_to_dict",
    "tracks",
    "two_tracks",
    "validate",
]
