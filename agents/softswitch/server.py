"""P4Runtime server (``p4.v1.P4Runtime``) in front of the executable model.

Implements what the switch agent uses on BMv2: SetForwardingPipelineConfig /
GetForwardingPipelineConfig, Write (table entries of every table, default action of
``l2_forward``, multicast groups, counter cells), Read (table entries, counters,
multicast groups), StreamChannel arbitration and Capabilities. Registers are not
readable or writable, as with BMv2's P4Runtime server (docs/design.md §10).

Errors follow the P4Runtime spec: a request-level problem is the RPC's status
(NOT_FOUND for a wrong device id, PERMISSION_DENIED for a non-primary writer,
FAILED_PRECONDITION before a pipeline is set, INVALID_ARGUMENT for bad Read entities);
per-update Write failures make the RPC fail with UNKNOWN and a ``grpc-status-details-bin``
trailer listing one ``p4.v1.Error`` per update (canonical codes INVALID_ARGUMENT,
NOT_FOUND, ALREADY_EXISTS, ...), which p4runtime-shell decodes.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from .p4info import P4InfoIndex
from .pipeline import InaPipeline
from .tables import (
    InvalidArgument,
    ModelError,
    NotFound,
    OutOfRange,
    TableEntry,
    Unimplemented,
)

log = logging.getLogger("heroserve.softswitch")

API_VERSION = "1.4.1"
_CODES = {name: getattr(code_pb2, name) for name in code_pb2.Code.keys()}


def to_bytes(value: int, width: int) -> bytes:
    """Canonical P4Runtime bytestring: big-endian, no leading zero bytes (0 -> b'\\x00')."""
    del width
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def from_bytes(data: bytes, width: int, what: str) -> int:
    """Decode a bytestring (canonical or padded) and check it fits ``width`` bits."""
    if not data:
        raise InvalidArgument(f"{what}: empty bytestring")
    if len(data) > (width + 7) // 8:
        raise InvalidArgument(f"{what}: {len(data)} bytes for a {width}-bit field")
    value = int.from_bytes(data, "big")
    if value >> width:
        raise InvalidArgument(f"{what}: value {value} exceeds {width} bits")
    return value


def _eid(e: p4runtime_pb2.Uint128) -> tuple[int, int]:
    return (e.high, e.low)


class _Stream:
    """One StreamChannel: its election id and the queue of messages to send it."""

    def __init__(self, election_id: tuple[int, int] | None = None) -> None:
        self.election_id = election_id
        self.out: queue.Queue[p4runtime_pb2.StreamMessageResponse | None] = queue.Queue()


class SoftSwitchP4Runtime(p4runtime_pb2_grpc.P4RuntimeServicer):
    """The P4Runtime service of one device (the model pipeline)."""

    def __init__(self, pipeline: InaPipeline, device_id: int = 1) -> None:
        self.pipeline = pipeline
        self.device_id = device_id
        self.p4info: P4InfoIndex | None = None
        self.cookie = 0
        self.device_config = b""
        self._streams: list[_Stream] = []
        self._arb_lock = threading.Lock()
        # Per multicast group, how each replica's port was written (see _apply_update).
        self._replica_forms: dict[int, list[int]] = {}

    # ---- arbitration -------------------------------------------------------------------

    def _primary_eid(self) -> tuple[int, int] | None:
        eids = [s.election_id for s in self._streams if s.election_id is not None]
        return max(eids) if eids else None

    def _notify_all(self) -> None:
        """Tell every stream who the primary is (OK to the primary, ALREADY_EXISTS else)."""
        primary = self._primary_eid()
        for s in self._streams:
            if s.election_id is None:
                continue
            msg = p4runtime_pb2.StreamMessageResponse()
            arb = msg.arbitration
            arb.device_id = self.device_id
            if primary is not None:
                arb.election_id.high, arb.election_id.low = primary
            if s.election_id == primary:
                arb.status.code = code_pb2.OK
                arb.status.message = "is primary"
            else:
                arb.status.code = code_pb2.ALREADY_EXISTS
                arb.status.message = "is not primary"
            s.out.put(msg)

    def StreamChannel(self, request_iterator, context) -> Iterator:  # noqa: N802
        stream = _Stream()
        with self._arb_lock:
            self._streams.append(stream)

        def reader() -> None:
            try:
                for req in request_iterator:
                    kind = req.WhichOneof("update")
                    if kind != "arbitration":
                        log.debug("ignored stream message %s", kind)
                        continue
                    arb = req.arbitration
                    if arb.device_id != self.device_id:
                        stream.out.put(
                            grpc.StatusCode.NOT_FOUND  # type: ignore[arg-type]
                        )
                        return
                    eid = _eid(arb.election_id)
                    with self._arb_lock:
                        if any(s is not stream and s.election_id == eid for s in self._streams):
                            stream.out.put(grpc.StatusCode.INVALID_ARGUMENT)  # type: ignore[arg-type]
                            return
                        stream.election_id = eid
                        self._notify_all()
            except grpc.RpcError:
                pass
            finally:
                stream.out.put(None)

        threading.Thread(target=reader, daemon=True, name="p4rt-stream").start()
        try:
            while True:
                msg = stream.out.get()
                if msg is None:
                    break
                if isinstance(msg, grpc.StatusCode):
                    detail = (
                        f"unknown device id (this is device {self.device_id})"
                        if msg == grpc.StatusCode.NOT_FOUND
                        else "election id already used by another client"
                    )
                    context.abort(msg, detail)
                yield msg
        finally:
            with self._arb_lock:
                was_primary = stream.election_id is not None and (
                    stream.election_id == self._primary_eid()
                )
                self._streams.remove(stream)
                if was_primary:
                    self._notify_all()

    def _check_writer(self, device_id: int, election_id: tuple[int, int], context) -> None:
        if device_id != self.device_id:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown device id {device_id}")
        with self._arb_lock:
            primary = self._primary_eid()
        if primary is None or election_id != primary:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "writer is not the primary client")

    # ---- pipeline config ---------------------------------------------------------------

    def SetForwardingPipelineConfig(self, request, context):  # noqa: N802
        self._check_writer(request.device_id, _eid(request.election_id), context)
        A = p4runtime_pb2.SetForwardingPipelineConfigRequest
        if request.action == A.UNSPECIFIED:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "pipeline config action unspecified")
        if request.action == A.COMMIT:
            if self.p4info is None:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "nothing saved to commit")
            return p4runtime_pb2.SetForwardingPipelineConfigResponse()
        index = P4InfoIndex(request.config.p4info)
        try:
            index.check_against(self.pipeline)
        except ModelError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if request.action == A.VERIFY:
            return p4runtime_pb2.SetForwardingPipelineConfigResponse()
        with self.pipeline.lock:
            if request.action in (A.VERIFY_AND_COMMIT, A.VERIFY_AND_SAVE):
                # A new pipeline starts empty, as on BMv2 (RECONCILE_AND_COMMIT keeps state).
                fresh = InaPipeline()
                p = self.pipeline
                p.ingress, p.egress, p.pre = fresh.ingress, fresh.egress, fresh.pre
                p.tables, p.counters, p.registers = fresh.tables, fresh.counters, fresh.registers
                self._replica_forms = {}
            self.p4info = index
            self.cookie = request.config.cookie.cookie
            self.device_config = request.config.p4_device_config
        log.info("pipeline config set (%s)", A.Action.Name(request.action))
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def GetForwardingPipelineConfig(self, request, context):  # noqa: N802
        if request.device_id != self.device_id:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown device id {request.device_id}")
        if self.p4info is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no forwarding pipeline config set")
        R = p4runtime_pb2.GetForwardingPipelineConfigRequest
        resp = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        resp.config.cookie.cookie = self.cookie
        if request.response_type in (R.ALL, R.P4INFO_AND_COOKIE):
            resp.config.p4info.CopyFrom(self.p4info.info)
        if request.response_type in (R.ALL, R.DEVICE_CONFIG_AND_COOKIE):
            resp.config.p4_device_config = self.device_config
        return resp

    def Capabilities(self, request, context):  # noqa: N802
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    # ---- Write -------------------------------------------------------------------------

    def Write(self, request, context):  # noqa: N802
        self._check_writer(request.device_id, _eid(request.election_id), context)
        if self.p4info is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no forwarding pipeline config set")
        if request.atomicity != p4runtime_pb2.WriteRequest.CONTINUE_ON_ERROR:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "only CONTINUE_ON_ERROR atomicity")
        errors: list[tuple[str, str]] = []
        with self.pipeline.lock:
            for update in request.updates:
                try:
                    self._apply_update(update)
                    errors.append(("OK", ""))
                except ModelError as e:
                    errors.append((e.code, str(e)))
        if all(code == "OK" for code, _ in errors):
            return p4runtime_pb2.WriteResponse()
        status = status_pb2.Status(code=code_pb2.UNKNOWN, message="write failed")
        for code, message in errors:
            err = p4runtime_pb2.Error(canonical_code=_CODES[code], message=message)
            detail = any_pb2.Any()
            detail.Pack(err)
            status.details.append(detail)
        first = next(m for c, m in errors if c != "OK")
        context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
        context.abort(grpc.StatusCode.UNKNOWN, first)

    def _apply_update(self, update) -> None:
        U = p4runtime_pb2.Update
        if update.type == U.UNSPECIFIED:
            raise InvalidArgument("update type unspecified")
        kind = update.entity.WhichOneof("entity")
        if kind == "table_entry":
            self._write_table_entry(update.type, update.entity.table_entry)
        elif kind == "packet_replication_engine_entry":
            pre = update.entity.packet_replication_engine_entry
            if pre.WhichOneof("type") != "multicast_group_entry":
                raise Unimplemented("clone sessions are not supported")
            g = pre.multicast_group_entry
            replicas: list[tuple[int, int]] = []
            forms: list[int] = []  # 0: egress_port; else the byte count of ``port``
            for r in g.replicas:
                if r.WhichOneof("port_kind") == "port":
                    replicas.append((from_bytes(r.port, 32, "replica port"), r.instance))
                    forms.append(len(r.port))
                else:
                    replicas.append((r.egress_port, r.instance))
                    forms.append(0)
            eng = self.pipeline.pre
            if update.type == U.INSERT:
                eng.insert(g.multicast_group_id, replicas)
            elif update.type == U.MODIFY:
                eng.modify(g.multicast_group_id, replicas)
            else:
                eng.delete(g.multicast_group_id)
                self._replica_forms.pop(g.multicast_group_id, None)
                return
            # Read back in the field it was written with, as BMv2 (PI) does.
            self._replica_forms[g.multicast_group_id] = forms
        elif kind == "counter_entry":
            ce = update.entity.counter_entry
            if update.type != U.MODIFY:
                raise InvalidArgument("counter entries can only be modified")
            counter = self._counter(ce.counter_id)
            if not ce.HasField("index"):
                raise InvalidArgument("counter write needs an index")
            counter.write(ce.index.index, ce.data.packet_count, ce.data.byte_count)
        elif kind == "register_entry":
            raise Unimplemented("registers are data-plane state (as on BMv2)")
        else:
            raise Unimplemented(f"entity {kind} is not supported")

    def _table(self, table_id: int):
        assert self.p4info is not None
        info = self.p4info.tables.get(table_id)
        if info is None:
            raise InvalidArgument(f"unknown table id {table_id}")
        return info, self.pipeline.tables[info.name]

    def _counter(self, counter_id: int):
        assert self.p4info is not None
        name = self.p4info.counters.get(counter_id)
        if name is None:
            raise InvalidArgument(f"unknown counter id {counter_id}")
        return self.pipeline.counters[name]

    def _key(self, info, te) -> tuple[int, ...]:
        widths = {fid: (name, w) for fid, name, w in info.keys}
        values: dict[int, int] = {}
        for fm in te.match:
            if fm.field_id not in widths:
                raise InvalidArgument(f"{info.name}: unknown match field id {fm.field_id}")
            if fm.field_id in values:
                raise InvalidArgument(f"{info.name}: match field {fm.field_id} repeated")
            if fm.WhichOneof("field_match_type") != "exact":
                raise InvalidArgument(f"{info.name}: match field {fm.field_id} must be exact")
            name, w = widths[fm.field_id]
            values[fm.field_id] = from_bytes(fm.exact.value, w, f"{info.name}.{name}")
        missing = [widths[f][0] for f in widths if f not in values]
        if missing:
            raise InvalidArgument(f"{info.name}: exact match fields missing: {missing}")
        return tuple(values[fid] for fid, _, _ in info.keys)

    def _action(self, info, te) -> tuple[str, dict[str, int]]:
        assert self.p4info is not None
        if te.action.WhichOneof("type") != "action":
            raise InvalidArgument(f"{info.name}: only direct actions are supported")
        act = te.action.action
        ainfo = self.p4info.actions.get(act.action_id)
        if ainfo is None:
            raise InvalidArgument(f"unknown action id {act.action_id}")
        if act.action_id not in info.action_ids:
            raise InvalidArgument(f"action {ainfo.name} is not an action of {info.name}")
        widths = {pid: (name, w) for pid, name, w in ainfo.params}
        params: dict[str, int] = {}
        for p in act.params:
            if p.param_id not in widths:
                raise InvalidArgument(f"{ainfo.name}: unknown param id {p.param_id}")
            name, w = widths[p.param_id]
            if name in params:
                raise InvalidArgument(f"{ainfo.name}: param {name} repeated")
            params[name] = from_bytes(p.value, w, f"{ainfo.name}.{name}")
        return ainfo.name, params

    def _write_table_entry(self, utype: int, te) -> None:
        U = p4runtime_pb2.Update
        info, table = self._table(te.table_id)
        if te.priority != 0:
            raise InvalidArgument(f"{info.name}: exact-match entries take no priority")
        if te.is_default_action:
            if utype != U.MODIFY:
                raise InvalidArgument("the default entry can only be modified")
            if te.match:
                raise InvalidArgument("the default entry has no match fields")
            if te.HasField("action"):
                action, params = self._action(info, te)
                table.set_default(action, params)
            else:
                if table.CONST_DEFAULT:
                    raise InvalidArgument(f"{info.name}: default action is const")
                table.reset_default()
            return
        key = self._key(info, te)
        if utype == U.DELETE:
            table.delete(key)
            return
        if not te.HasField("action"):
            raise InvalidArgument(f"{info.name}: entry without an action")
        action, params = self._action(info, te)
        entry = TableEntry(key=key, action=action, params=params)
        if utype == U.INSERT:
            table.insert(entry)
        else:
            table.modify(entry)

    # ---- Read --------------------------------------------------------------------------

    def Read(self, request, context):  # noqa: N802
        if request.device_id != self.device_id:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown device id {request.device_id}")
        if self.p4info is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no forwarding pipeline config set")
        resp = p4runtime_pb2.ReadResponse()
        try:
            with self.pipeline.lock:
                for entity in request.entities:
                    self._read_entity(entity, resp)
        except ModelError as e:
            context.abort(getattr(grpc.StatusCode, e.code), str(e))
        yield resp

    def _read_entity(self, entity, resp) -> None:
        kind = entity.WhichOneof("entity")
        assert self.p4info is not None
        if kind == "table_entry":
            te = entity.table_entry
            ids = [te.table_id] if te.table_id else sorted(self.p4info.tables)
            for tid in ids:
                info, table = self._table(tid)
                if te.is_default_action:
                    self._emit_entry(resp, info, table.default, default=True)
                    continue
                if te.table_id and te.match:
                    key = self._key(info, te)
                    entry = table.lookup(key)
                    if entry is None:
                        raise NotFound(f"{info.name}: no entry {key}")
                    self._emit_entry(resp, info, entry)
                    continue
                for entry in table.entries.values():
                    self._emit_entry(resp, info, entry)
        elif kind == "counter_entry":
            ce = entity.counter_entry
            ids = [ce.counter_id] if ce.counter_id else sorted(self.p4info.counters)
            for cid in ids:
                counter = self._counter(cid)
                if ce.HasField("index"):
                    if not 0 <= ce.index.index < counter.size:
                        raise OutOfRange(f"{counter.name}: index {ce.index.index}")
                    indices = [ce.index.index]
                else:
                    indices = range(counter.size)
                for i in indices:
                    out = resp.entities.add().counter_entry
                    out.counter_id = cid
                    out.index.index = i
                    if counter.unit in ("PACKETS", "BOTH"):
                        out.data.packet_count = counter.packets[i]
                    if counter.unit in ("BYTES", "BOTH"):
                        out.data.byte_count = counter.bytes[i]
        elif kind == "packet_replication_engine_entry":
            pre = entity.packet_replication_engine_entry
            if pre.WhichOneof("type") != "multicast_group_entry":
                raise Unimplemented("clone sessions are not supported")
            gid = pre.multicast_group_entry.multicast_group_id
            groups = self.pipeline.pre.groups
            if gid and gid not in groups:
                raise NotFound(f"no multicast group {gid}")
            for g in [gid] if gid else sorted(groups):
                out = resp.entities.add().packet_replication_engine_entry.multicast_group_entry
                out.multicast_group_id = g
                forms = self._replica_forms.get(g, [])
                for i, (port, rid) in enumerate(groups[g]):
                    nbytes = forms[i] if i < len(forms) else 0
                    if nbytes:
                        out.replicas.add(port=port.to_bytes(nbytes, "big"), instance=rid)
                    else:
                        out.replicas.add(egress_port=port, instance=rid)
        else:
            raise Unimplemented(f"reading {kind} is not supported")

    def _emit_entry(self, resp, info, entry: TableEntry, default: bool = False) -> None:
        assert self.p4info is not None
        out = resp.entities.add().table_entry
        out.table_id = info.id
        if default:
            out.is_default_action = True
        for (fid, _name, w), value in zip(info.keys, entry.key, strict=False):
            fm = out.match.add(field_id=fid)
            fm.exact.value = to_bytes(value, w)
        aid = self.p4info.action_ids[entry.action]
        out.action.action.action_id = aid
        for pid, name, w in self.p4info.actions[aid].params:
            out.action.action.params.add(param_id=pid, value=to_bytes(entry.params[name], w))


def serve(
    service: SoftSwitchP4Runtime, address: str, max_workers: int = 8
) -> tuple[grpc.Server, int]:
    """Start the gRPC server on ``address`` (host:port, port 0 picks one); returns it and
    the bound port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(service, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    return server, port
