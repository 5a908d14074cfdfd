"""P4Info handling for the model's P4Runtime server: id <-> name maps, and a check that a
P4Info pushed by a client describes the program the model implements.

Imports the p4runtime protobuf stubs: the process must run with
``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python`` (agents/softswitch/__main__.py sets it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

from agents.cliutil import UsageError, read_regular
from agents.resources import shipped

from .pipeline import InaPipeline
from .tables import InvalidArgument

P4INFO_PATH = shipped("p4/heroserve_ina.p4info.txtpb")
# The shipped P4Info is about 6 KB; a program with thousands of tables stays far below this.
MAX_P4INFO_BYTES = 4 << 20


def load_p4info(path: Path = P4INFO_PATH) -> p4info_pb2.P4Info:
    """Parse a text-format P4Info file (a regular UTF-8 file: UsageError otherwise)."""
    data = read_regular(path, "P4Info file", MAX_P4INFO_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"not UTF-8 text (byte {e.start})") from None
    info = p4info_pb2.P4Info()
    text_format.Parse(text, info)
    return info


@dataclass(frozen=True)
class TableInfo:
    id: int
    name: str
    keys: tuple[tuple[int, str, int], ...]  # (field id, name, bitwidth) in id order
    action_ids: frozenset[int]


@dataclass(frozen=True)
class ActionInfo:
    id: int
    name: str
    params: tuple[tuple[int, str, int], ...]  # (param id, name, bitwidth)


class P4InfoIndex:
    """Lookups by id and by name over one P4Info."""

    def __init__(self, info: p4info_pb2.P4Info) -> None:
        self.info = info
        self.tables: dict[int, TableInfo] = {}
        self.actions: dict[int, ActionInfo] = {}
        self.counters: dict[int, str] = {}
        self.counter_ids: dict[str, int] = {}
        self.table_ids: dict[str, int] = {}
        self.action_ids: dict[str, int] = {}
        for a in info.actions:
            params = tuple(sorted((p.id, p.name, p.bitwidth) for p in a.params))
            self.actions[a.preamble.id] = ActionInfo(a.preamble.id, a.preamble.name, params)
            self.action_ids[a.preamble.name] = a.preamble.id
        for t in info.tables:
            keys = tuple(sorted((m.id, m.name, m.bitwidth) for m in t.match_fields))
            refs = frozenset(r.id for r in t.action_refs)
            self.tables[t.preamble.id] = TableInfo(t.preamble.id, t.preamble.name, keys, refs)
            self.table_ids[t.preamble.name] = t.preamble.id
        for c in info.counters:
            self.counters[c.preamble.id] = c.preamble.name
            self.counter_ids[c.preamble.name] = c.preamble.id

    def check_against(self, pipeline: InaPipeline) -> None:
        """Raise InvalidArgument unless every table, action, counter of the model is in the
        P4Info with the same match fields, parameters and widths (and nothing extra)."""
        names = {t.name for t in self.tables.values()}
        if names != set(pipeline.tables):
            raise InvalidArgument(
                f"P4Info tables {sorted(names)} are not the model's {sorted(pipeline.tables)}"
            )
        for t in self.tables.values():
            model = pipeline.tables[t.name]
            if tuple((n, w) for _, n, w in t.keys) != model.KEY:
                raise InvalidArgument(f"P4Info match fields of {t.name} differ from the model")
            for aid in t.action_ids:
                a = self.actions.get(aid)
                if a is None:
                    raise InvalidArgument(f"P4Info table {t.name} refers to unknown action {aid}")
                spec = model.actions.get(a.name)
                if spec is None or tuple((n, w) for _, n, w in a.params) != spec.params:
                    raise InvalidArgument(f"P4Info action {a.name} differs from the model")
        if set(self.counter_ids) != set(pipeline.counters):
            raise InvalidArgument(
                f"P4Info counters {sorted(self.counter_ids)} are not the model's "
                f"{sorted(pipeline.counters)}"
            )
        for name, cid in self.counter_ids.items():
            size = next(c.size for c in self.info.counters if c.preamble.id == cid)
            if size != pipeline.counters[name].size:
                raise InvalidArgument(f"P4Info counter {name} size {size} differs from the model")
