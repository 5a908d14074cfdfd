"""The switch agent's P4Runtime connection, through ``p4runtime-shell`` (docs/design.md §10).

One switch per agent process (p4runtime-shell keeps one global client and P4Info
context). The pipeline (P4Info + device config) is installed only when the switch does
not already run our program: installing resets every table and register, and a restarted
agent must find its entries still there to reconcile them instead. "Our program" is judged
by what the data plane runs (:func:`same_pipeline`): the P4Info's ids, names, tables,
match fields, actions, parameters, counters and registers, and the device config bytes;
not by annotations, documentation or ``type_info``, which differ between p4c's P4Info and
copies of it without changing the program.

Needs ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python`` (set by ``agents.switch.main``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable
from pathlib import Path

import grpc
import p4runtime_sh.shell as sh
from google.protobuf import text_format
from google.protobuf.message import Message
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2
from p4runtime_sh.global_options import global_options
from p4runtime_sh.p4runtime import P4RuntimeClient

from agents.resources import shipped

log = logging.getLogger("heroserve.switch")

DEFAULT_P4INFO = shipped("p4/heroserve_ina.p4info.txtpb")
WRITE_BATCH = 256  # updates per Write RPC

# p4runtime-shell prints every message it builds when verbose (its interactive default).
global_options["verbose"] = False


class SwitchError(RuntimeError):
    """The switch is unreachable or refused a request."""


def load_p4info(path: str | Path) -> p4info_pb2.P4Info:
    info = p4info_pb2.P4Info()
    try:
        text_format.Merge(Path(path).read_text(), info, allow_unknown_field=True)
    except (OSError, text_format.ParseError) as exc:
        raise SwitchError(f"cannot load P4Info {path}: {exc}") from exc
    return info


# Fields that document a P4 object without changing what the switch does with it.
_COSMETIC_FIELDS = frozenset(
    {"annotations", "structured_annotations", "annotation_locations", "doc"}
)


def _repeated(fd) -> bool:  # noqa: ANN001 - a FieldDescriptor
    """Whether a field is repeated (``is_repeated`` in protobuf >= 5, ``label`` before)."""
    flag = getattr(fd, "is_repeated", None)
    return bool(flag) if flag is not None else fd.label == fd.LABEL_REPEATED


def _strip_cosmetic(msg: Message) -> None:
    for fd, value in msg.ListFields():
        if fd.name in _COSMETIC_FIELDS:
            msg.ClearField(fd.name)
        elif fd.type == fd.TYPE_MESSAGE:
            if _repeated(fd):
                if fd.message_type.GetOptions().map_entry:
                    continue
                for item in value:
                    _strip_cosmetic(item)
            else:
                _strip_cosmetic(value)


def _sort_by(repeated, key) -> None:  # noqa: ANN001 - a protobuf repeated field
    items = sorted(repeated, key=key)
    copies = [type(i)() for i in items]
    for c, i in zip(copies, items, strict=True):
        c.CopyFrom(i)
    del repeated[:]
    repeated.extend(copies)


def pipeline_essentials(info: p4info_pb2.P4Info) -> p4info_pb2.P4Info:
    """A canonical copy of ``info`` with what the data plane runs and nothing else:
    annotations, documentation, ``type_info`` and ``pkg_info`` (but its architecture)
    removed, entities sorted by id."""
    out = p4info_pb2.P4Info()
    out.CopyFrom(info)
    out.ClearField("type_info")
    arch = out.pkg_info.arch
    out.ClearField("pkg_info")
    out.pkg_info.arch = arch
    _strip_cosmetic(out)
    for fd, value in out.ListFields():
        if _repeated(fd) and fd.type == fd.TYPE_MESSAGE:
            if "preamble" in fd.message_type.fields_by_name:
                _sort_by(value, lambda e: e.preamble.id)
    for t in out.tables:
        _sort_by(t.match_fields, lambda m: m.id)
        _sort_by(t.action_refs, lambda r: r.id)
    for a in out.actions:
        _sort_by(a.params, lambda p: p.id)
    return out


def same_pipeline(
    ours: p4info_pb2.P4Info,
    our_config: bytes,
    theirs: p4info_pb2.P4Info,
    their_config: bytes,
) -> bool:
    """Whether a switch holding (theirs, their_config) runs our program. An empty
    ``our_config`` (a target that needs none, such as the executable model) matches any."""
    if our_config and our_config != their_config:
        return False
    return pipeline_essentials(ours) == pipeline_essentials(theirs)


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split("."):
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


class SwitchConnection:
    """A primary P4Runtime session to one switch."""

    def __init__(
        self,
        addr: str,
        device_id: int,
        p4info: p4info_pb2.P4Info,
        device_config: bytes = b"",
        election_id: tuple[int, int] = (0, 1),
    ) -> None:
        self.addr = addr
        self.device_id = device_id
        self.p4info = p4info
        self.device_config = device_config
        self.election_id = election_id
        self.client: P4RuntimeClient | None = None
        self.installed_pipeline = False  # whether connect() had to install it
        # P4Runtime 1.4 moved a multicast replica's port to the bytes field ``port``;
        # servers before it know only ``egress_port`` (set by connect()).
        self.replica_port_bytes = False

    def connect(self) -> None:
        """Open the session and make sure our pipeline runs; raises SwitchError."""
        self.close()
        try:
            # The shell prints the arbitration outcome on stdout: keep stdout for callers.
            with contextlib.redirect_stdout(sys.stderr):
                client = P4RuntimeClient(self.device_id, self.addr, self.election_id)
        except SystemExit as exc:  # p4runtime-shell exits when the handshake fails
            raise SwitchError(f"no P4Runtime session with {self.addr}") from exc
        self.client = client
        sh.client = client
        try:
            self.replica_port_bytes = self._api_version() >= (1, 4)
            current = self._current_pipeline()
            if current is None or not same_pipeline(self.p4info, self.device_config, *current):
                if current is not None:
                    self._delete_multicast_groups()
                self._install()
                self.installed_pipeline = True
            else:
                self.installed_pipeline = False
                log.info("switch %s already runs our pipeline: keeping its entries", self.addr)
        except Exception:
            self.close()
            raise
        sh.context.set_p4info(self.p4info)

    def _api_version(self) -> tuple[int, ...]:
        """The server's P4Runtime API version (Capabilities); (0,) when it cannot say."""
        assert self.client is not None
        try:
            resp = self.client.stub.Capabilities(p4runtime_pb2.CapabilitiesRequest(), timeout=10)
        except grpc.RpcError:
            return (0,)
        return _version_tuple(resp.p4runtime_api_version)

    def _current_pipeline(self) -> tuple[p4info_pb2.P4Info, bytes] | None:
        """The switch's P4Info and device config, or None when it has no pipeline."""
        assert self.client is not None
        req = p4runtime_pb2.GetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.ALL,
        )
        try:
            resp = self.client.stub.GetForwardingPipelineConfig(req, timeout=30)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return None  # the executable model before a pipeline is set
            raise SwitchError(f"reading the pipeline of {self.addr} failed: {exc}") from exc
        if not resp.config.HasField("p4info"):
            return None  # BMv2 before a pipeline is set: an empty config
        return resp.config.p4info, resp.config.p4_device_config

    def _delete_multicast_groups(self) -> None:
        """Delete the switch's multicast groups before a new pipeline replaces its own.

        A pipeline push empties PI's view of the groups but leaves them in BMv2's
        replication engine (simple_switch_grpc 1.15.5), so a group the agent inserts after
        the push would replicate every packet twice. Deleted while PI still knows them."""
        ent = p4runtime_pb2.Entity()
        ent.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
        updates = []
        for e in self.read(ent):
            gid = e.packet_replication_engine_entry.multicast_group_entry.multicast_group_id
            u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.DELETE)
            u.entity.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = gid
            updates.append(u)
        if updates:
            self.write(updates)
            log.info("deleted %d multicast groups before installing the pipeline", len(updates))

    def _install(self) -> None:
        assert self.client is not None
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
        )
        req.election_id.high, req.election_id.low = self.election_id
        req.config.p4info.CopyFrom(self.p4info)
        req.config.p4_device_config = self.device_config
        try:
            self.client.stub.SetForwardingPipelineConfig(req, timeout=30)
        except Exception as exc:  # grpc.RpcError
            raise SwitchError(f"installing the pipeline on {self.addr} failed: {exc}") from exc
        log.info("installed pipeline on %s (device %d)", self.addr, self.device_id)

    def close(self) -> None:
        if self.client is not None:
            try:
                self.client.tear_down()
            except Exception as exc:  # noqa: BLE001 - best effort on a broken channel
                log.debug("tear_down: %s", exc)
            self.client = None
            sh.client = None

    def write(self, updates: Iterable[p4runtime_pb2.Update]) -> int:
        """Send ``updates`` in batches; returns how many. Raises SwitchError."""
        if self.client is None:
            raise SwitchError("not connected to the switch")
        batch: list[p4runtime_pb2.Update] = []
        n = 0
        for u in updates:
            batch.append(u)
            if len(batch) == WRITE_BATCH:
                self._write(batch)
                n += len(batch)
                batch = []
        if batch:
            self._write(batch)
            n += len(batch)
        return n

    def _write(self, batch: list[p4runtime_pb2.Update]) -> None:
        assert self.client is not None
        req = p4runtime_pb2.WriteRequest()
        req.updates.extend(batch)
        try:
            self.client.write(req)
        except Exception as exc:  # P4RuntimeWriteException, grpc.RpcError
            raise SwitchError(f"write to {self.addr} failed: {exc}") from exc

    def read(self, entity: p4runtime_pb2.Entity) -> list[p4runtime_pb2.Entity]:
        """All entities a wildcard ``entity`` matches. Raises SwitchError."""
        if self.client is None:
            raise SwitchError("not connected to the switch")
        try:
            return [e for resp in self.client.read_one(entity) for e in resp.entities]
        except Exception as exc:  # P4RuntimeException, grpc.RpcError
            raise SwitchError(f"read from {self.addr} failed: {exc}") from exc


def update(kind: int, **entity: object) -> p4runtime_pb2.Update:
    """``update(INSERT, table_entry=msg)`` -> an Update."""
    u = p4runtime_pb2.Update(type=kind)
    for field, msg in entity.items():
        getattr(u.entity, field).CopyFrom(msg)
    return u


INSERT = p4runtime_pb2.Update.INSERT
MODIFY = p4runtime_pb2.Update.MODIFY
DELETE = p4runtime_pb2.Update.DELETE
