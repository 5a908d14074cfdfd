"""The switch agent's P4Runtime connection, through ``p4runtime-shell`` (DESIGN.md §10).

One switch per agent process (p4runtime-shell keeps one global client and P4Info
context). The pipeline (P4Info + device config) is installed only when the switch does
not already run our program: installing resets every table, and a restarted agent must
find its entries still there to reconcile them instead.

Needs ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python`` (set by ``agents.switch.main``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable
from pathlib import Path

import p4runtime_sh.shell as sh
from google.protobuf import text_format
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2
from p4runtime_sh.global_options import global_options
from p4runtime_sh.p4runtime import P4RuntimeClient, P4RuntimeException

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
            current = client.get_p4info()
        except P4RuntimeException:
            current = None  # no pipeline yet
        try:
            if current is None or current != self.p4info:
                self._install()
                self.installed_pipeline = True
            else:
                self.installed_pipeline = False
                log.info("switch %s already runs our pipeline: keeping its entries", self.addr)
        except Exception:
            self.close()
            raise
        sh.context.set_p4info(self.p4info)

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
