"""Cluster model (docs/design.md §3): a networkx graph of GPUs, NVLink fabrics and switches.

Layers, each a small module: ``graph`` (node/edge attributes), ``generators`` (built-in
clusters), ``io`` (files and validation), ``fabric`` (shortest paths and routes). Here:
:func:`resolve_topology` (what a command line's ``--topology`` names) and
:func:`plan_topology` (what a plan's own ``topology`` field may name: a built-in only,
else :class:`NotBuiltin`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from controller.errors import InputError

if TYPE_CHECKING:
    import networkx as nx

    from controller.topology.generators import (
        BUILTIN,
        eight_tracks,
        fig2,
        testbed,
        tracks,
        two_tracks,
    )
    from controller.topology.io import load_topology, topology_from_dict, topology_to_dict, validate

# Imported when first named (PEP 562), so that a light module of the package (``costmodes``)
# does not import networkx: the command line's help names cost modes on a bare install.
_LAZY = {
    **dict.fromkeys(("BUILTIN", "eight_tracks", "fig2", "testbed", "tracks", "two_tracks"),
                    "generators"),
    **dict.fromkeys(("load_topology", "topology_from_dict", "topology_to_dict", "validate"), "io"),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve_topology(spec: str):
    """A built-in name (``generators.BUILTIN``) or a topology file path."""
    from controller.topology.generators import BUILTIN
    from controller.topology.io import load_topology

    if spec in BUILTIN:
        return BUILTIN[spec]()
    if (sized := _sized_track_cluster(spec)) is not None:
        return sized
    if spec.endswith((".yaml", ".yml", ".json")) or "/" in spec:
        return load_topology(spec)
    raise InputError(f"unknown topology {spec!r}: use {', '.join(BUILTIN)} or a .yaml/.json file")


def _sized_track_cluster(spec: str) -> nx.Graph | None:
    """``2tracks-N`` / ``8tracks-N``: the track cluster of N servers (what ``--servers`` plans
    and what such a plan names), else None."""
    from controller.topology.generators import TRACK_CLUSTERS, track_cluster

    kind, _, servers = spec.partition("-")
    if kind not in TRACK_CLUSTERS or not servers.isdecimal() or len(servers) > 7:
        return None
    return track_cluster(kind, int(servers))


def plan_topology(
    spec: str, builtins: Mapping[str, Callable[[], nx.Graph]] | None = None
) -> nx.Graph:
    """The cluster a plan's own ``topology`` field names, which must be one of ``builtins``.

    A plan comes from a request or a file someone else wrote: its fields never make the
    controller or a command open a file (docs/design.md §9). The cluster of a plan made on
    a topology file is given by the operator (``--topology``). The InputError does not quote
    the field (it is the plan's content, not the operator's); ``builtins`` defaults to
    ``BUILTIN``."""
    if builtins is None:
        from controller.topology.generators import BUILTIN as builtins
    if spec in builtins:
        return builtins[spec]()
    if (sized := _sized_track_cluster(spec)) is not None:
        return sized
    known = ", ".join(builtins)
    if _names_file(spec):  # a malformed plan
        raise InputError(
            f"the plan's topology names a file: a plan never opens a file; it names a built-in "
            f"({known}) and any other cluster is given with --topology NAME|FILE"
        )
    raise NotBuiltin(
        f"the plan's topology is not a built-in ({known}): give its cluster with "
        "--topology NAME|FILE"
    )


class NotBuiltin(InputError):
    """A plan's topology name that is no built-in: the plan may be fine, its cluster must be
    given with ``--topology``."""


def _names_file(spec: str) -> bool:
    return "/" in spec or "\\" in spec or spec.endswith((".yaml", ".yml", ".json"))


__all__ = [
    "BUILTIN",
    "InputError",
    "NotBuiltin",
    "eight_tracks",
    "fig2",
    "load_topology",
    "plan_topology",
    "resolve_topology",
    "testbed",
    "topology_from_dict",
    "topology_to_dict",
    "tracks",
    "two_tracks",
    "validate",
]
