"""gRPC servicers (asyncio) of ``heroserve.v1.Control`` and ``heroserve.v1.Admin``.

Maps the core's errors to status codes: malformed requests and plans (InputError) ->
INVALID_ARGUMENT, no session -> FAILED_PRECONDITION, an identity the client certificate does
not name, or a claim the plan does not give that identity -> PERMISSION_DENIED, a plan whose
slots or group ids do not fit or a full agent registry -> RESOURCE_EXHAUSTED, a plan whose
topology the controller cannot resolve (TopologyUnavailable: it needs ``--topology``) ->
FAILED_PRECONDITION. Anything else is a controller bug: INTERNAL with a fixed message (the
traceback goes to the log, never to the client).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError

from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.errors import InputError
from controller.service.admission import TopologyUnavailable
from controller.service.binding import KIND_NAMES, Denied
from controller.service.core import Controller, NotRegistered, RegistryFull
from controller.service.planinput import Parsed, parse_plan_canonical
from controller.service.slots import SlotError
from controller.service.state import NodeState, diff
from controller.service.store import StoreError

log = logging.getLogger("heroserve.controller")


def peer_names(context: grpc.aio.ServicerContext) -> set[str] | None:
    """Names the client certificate vouches for (CN and SAN entries); None without TLS."""
    auth = context.auth_context()
    if auth.get("transport_security_type", [b""])[0] != b"ssl":
        return None
    names: set[str] = set()
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        names.update(v.decode() for v in auth.get(key, []))
    return names


def decode_apply_plan(raw: bytes) -> tuple[str, Parsed]:
    """The plan JSON of a serialised ``ApplyPlanRequest`` and the plan parsed from it, or
    :class:`InputError`. Decoding holds the interpreter lock whichever thread runs it, and
    each read of a protobuf string field makes a new copy (150 ms for 56 MB): the request is
    decoded here once, in a worker thread (benchmarks/bench_apply_stall.py)."""
    try:
        text = pb.ApplyPlanRequest.FromString(raw).plan_json
    except DecodeError:
        raise InputError("ApplyPlan: not an ApplyPlanRequest message") from None
    return text, parse_plan_canonical(text)


class _Base:
    def __init__(self, core: Controller, tls: bool) -> None:
        self.core = core
        self.tls = tls

    async def _fail(self, context: grpc.aio.ServicerContext, rpc: str, exc: Exception) -> None:
        # TopologyUnavailable is an InputError that needs another status: tested first
        if isinstance(exc, TopologyUnavailable):
            log.warning("%s: %s", rpc, exc)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if isinstance(exc, InputError):
            self.core.metrics.invalid.labels(rpc).inc()
            log.warning("%s: invalid request: %s", rpc, exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if isinstance(exc, NotRegistered):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if isinstance(exc, Denied):
            self.core.metrics.denied.labels(rpc).inc()
            log.warning("%s: denied: %s", rpc, exc)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        if isinstance(exc, SlotError | RegistryFull | StoreError):
            log.warning("%s: %s", rpc, exc)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        log.error("%s: internal error", rpc, exc_info=exc)
        await context.abort(grpc.StatusCode.INTERNAL, f"{rpc}: internal error (see the log)")

    async def _authorise(self, context: grpc.aio.ServicerContext, rpc: str, node_id: str) -> None:
        """With mutual TLS, an agent speaks only for a node its certificate names."""
        names = peer_names(context)
        if names is None:
            return
        if node_id not in names:
            self.core.metrics.denied.labels(rpc).inc()
            log.warning("%s: certificate %s may not speak for %r", rpc, sorted(names), node_id)
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the client certificate does not name node {node_id!r}",
            )


class ControlServicer(_Base, pb_grpc.ControlServicer):
    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterResponse:
        await self._authorise(context, "Register", request.identity.node_id)
        try:
            return self.core.register(request)
        except Exception as exc:  # noqa: BLE001 - mapped to a status by _fail
            await self._fail(context, "Register", exc)
            raise

    async def Subscribe(
        self, request: pb.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.PolicyUpdate]:
        await self._authorise(context, "Subscribe", request.identity.node_id)
        try:
            ident = self.core.check_session(request.identity, request.session_id)
        except Exception as exc:  # noqa: BLE001
            await self._fail(context, "Subscribe", exc)
            raise
        sub = self.core.subscribe(ident)
        kind = ident.kind
        last: NodeState | None = None
        sent = -1
        try:
            while True:
                epoch = self.core.epoch
                if epoch != sent:
                    state = self.core.node_state(ident)
                    body, _changed = diff(last, state, kind, ident.node_id)
                    upd = pb.PolicyUpdate(
                        epoch=epoch,
                        full=last is None,
                        plan_id=self.core.state.plan_id if self.core.state else "",
                        generation=self.core.generation,
                    )
                    if isinstance(body, pb.SwitchPolicy):
                        upd.switch_policy.CopyFrom(body)
                    else:
                        upd.gpu_policy.CopyFrom(body)
                    self.core.metrics.updates.labels(str(upd.full).lower()).inc()
                    log.debug(
                        "-> %s %s epoch %d (%s)",
                        KIND_NAMES[kind],
                        ident.node_id,
                        epoch,
                        "full" if upd.full else "delta",
                    )
                    yield upd
                    last, sent = state, epoch
                item = await sub.queue.get()
                if self.core.is_close(item):
                    return
        finally:
            self.core.unsubscribe(sub)

    async def Ack(
        self, request: pb.AckRequest, context: grpc.aio.ServicerContext
    ) -> pb.AckResponse:
        await self._authorise(context, "Ack", request.identity.node_id)
        try:
            return self.core.ack(request)
        except Exception as exc:  # noqa: BLE001
            await self._fail(context, "Ack", exc)
            raise

    async def ReportTelemetry(
        self, request: pb.TelemetryReport, context: grpc.aio.ServicerContext
    ) -> pb.TelemetryAck:
        await self._authorise(context, "ReportTelemetry", request.identity.node_id)
        try:
            return self.core.telemetry(request)
        except Exception as exc:  # noqa: BLE001
            await self._fail(context, "ReportTelemetry", exc)
            raise


class AdminServicer(_Base, pb_grpc.AdminServicer):
    def __init__(self, core: Controller, tls: bool, admin_name: str) -> None:
        super().__init__(core, tls)
        self.admin_name = admin_name

    async def ApplyPlan(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> pb.ApplyPlanResponse:
        """``request`` arrives serialised (server.py registers it so) and is decoded once, in a
        worker thread; what changes state runs back on the loop."""
        await self._authorise(context, "ApplyPlan", self.admin_name)
        try:
            text, parsed = await asyncio.to_thread(decode_apply_plan, request)
            epoch, pid = self.core.apply_plan(text, parsed)
        except Exception as exc:  # noqa: BLE001
            await self._fail(context, "ApplyPlan", exc)
            raise
        return pb.ApplyPlanResponse(epoch=epoch, plan_id=pid)

    async def GetState(
        self, request: pb.GetStateRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetStateResponse:
        await self._authorise(context, "GetState", self.admin_name)
        return pb.GetStateResponse(
            epoch=self.core.epoch,
            plan_id=self.core.state.plan_id if self.core.state else "",
            topology=self.core.store.topology,
            agents=self.core.agent_states(),
            generation=self.core.generation,
        )

    async def GetSlots(
        self, request: pb.GetSlotsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSlotsResponse:
        await self._authorise(context, "GetSlots", self.admin_name)
        pool = self.core.pool
        return pb.GetSlotsResponse(
            switches=[
                pb.SwitchSlots(
                    switch=sw,
                    capacity=pool.capacity(sw) or 0,
                    allocations=[
                        pb.SlotAllocation(group=a.owner, start=a.start, count=a.count)
                        for a in pool.allocations(sw)
                    ],
                )
                for sw in pool.switches()
            ]
        )
