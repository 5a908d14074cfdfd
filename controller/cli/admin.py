"""``heroserve admin``: operate a running controller over its Admin service (docs/design.md §9).

    heroserve admin [--controller ADDR] [--tls-cert PEM --tls-key PEM --tls-ca PEM]
                    [--tls-server-name NAME] apply PLAN.json [--wait S] | state | agents | slots

``apply`` hands the controller a new plan: it derives the policies, bumps the epoch and
streams the change to every connected agent, which applies it without a restart; with
``--wait S`` the command waits up to S seconds until every connected agent acknowledged the
new epoch. ``state``, ``agents`` and ``slots`` print what the controller holds. With mutual
TLS, the certificate must carry the controller's ``--admin-name`` (``heroserve pki issue
DIR --name heroserve-admin``); the TLS flags are the switch agent's. Absent flags come from
``HEROSERVE_CONTROLLER`` and ``HEROSERVE_TLS_CERT``/``_KEY``/``_CA`` (docs/control-plane.md).

A plan file that is not a plan, and a plan the controller refuses (INVALID_ARGUMENT,
PERMISSION_DENIED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION) print one line and exit 2; a
controller that cannot be reached prints one line and exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time

import grpc

from agents.client import (
    CONTROLLER_ENV,
    ClientTls,
    add_tls_args,
    channel,
    controller_from_args,
    tls_from_args,
    tls_mismatch,
)
from agents.cliutil import DefaultsHelpFormatter, UsageError
from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.cli.report import text_table
from controller.errors import InputError
from controller.inputs.args import bounded

KIND = {pb.NODE_KIND_SWITCH: "switch", pb.NODE_KIND_GPU: "gpu"}
DEFAULT_CONTROLLER = "127.0.0.1:50051"  # the controller's own --listen default
TIMEOUT_S = 30.0  # one RPC; ApplyPlan derives every policy table of the plan


class Unreachable(Exception):
    """The controller did not answer: exit status 1."""


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--controller",
        help=f"controller address HOST:PORT [{CONTROLLER_ENV}] (default: {DEFAULT_CONTROLLER})",
    )
    p.set_defaults(controller_default=DEFAULT_CONTROLLER)
    add_tls_args(p, "the admin (the controller's --admin-name)")
    sub = p.add_subparsers(dest="admin_action", required=True)
    fmt = DefaultsHelpFormatter
    a = sub.add_parser(
        "apply", help="apply a plan: agents move to a new epoch", formatter_class=fmt
    )
    a.add_argument("plan", help="plan JSON (heroserve plan --json PATH)")
    a.add_argument(
        "--wait",
        # a day: far past any agent's acknowledgement (seconds); inf or NaN would never end
        type=bounded(float, 0, 86400),
        default=0.0,
        metavar="S",
        help="wait up to S seconds for every connected agent to acknowledge (0: do not wait)",
    )
    sub.add_parser("state", help="epoch, plan and agent counts", formatter_class=fmt)
    sub.add_parser("agents", help="every registered agent and the epoch it acknowledged")
    sub.add_parser("slots", help="aggregator slot pool of every switch")


def _call(fn, request, timeout: float = TIMEOUT_S):  # noqa: ANN001, ANN202 - a stub method
    try:
        return fn(request, timeout=timeout)
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise Unreachable(f"controller unreachable ({code.name}): {details}", details) from None
        raise InputError(f"controller refused ({code.name}): {details}") from None


def _why(target: str, tls: ClientTls | None, exc: Unreachable) -> str:
    """What to say of an unreachable controller: a TLS mismatch named as such (the probe of
    agents.client.tls_mismatch), else gRPC's own words."""
    mismatch = tls_mismatch(target, tls)
    if mismatch is None and tls is not None and "Socket closed" in exc.args[1]:
        # it speaks TLS with a certificate our CA signed, then hung up: it refused ours
        mismatch = (
            "the controller closed the connection after the TLS handshake: it refused this "
            f"client's certificate ({tls.names[0]}: signed by another CA than its --tls-ca?)"
        )
    return f"controller at {target}: {mismatch}" if mismatch else str(exc)


def _ago(t: float) -> str:
    return f"{max(0.0, time.time() - t):.1f} s ago" if t > 0 else "never"


def print_agents(resp: pb.GetStateResponse) -> None:
    rows = [
        [
            a.identity.node_id,
            KIND.get(a.identity.kind, "?"),
            "yes" if a.connected else "no",
            str(a.acked_epoch),
            "yes" if a.acked_epoch == resp.epoch else "no",
            _ago(a.last_seen_unix_s),
        ]
        for a in sorted(resp.agents, key=lambda a: (a.identity.kind, a.identity.node_id))
    ]
    head = ["agent", "kind", "connected", "acked epoch", "current", "last seen"]
    print(text_table([head, *rows]) if rows else "no agent has registered")


def print_slots(resp: pb.GetSlotsResponse) -> None:
    if not resp.switches:
        print("no switch has a slot pool yet")
        return
    for sw in resp.switches:
        used = sum(a.count for a in sw.allocations)
        print(f"{sw.switch}: {used} of {sw.capacity} aggregator slots allocated")
        rows = [
            [a.group, str(a.start), str(a.start + a.count - 1), str(a.count)]
            for a in sw.allocations
        ]
        if rows:
            print(text_table([["group", "first", "last", "count"], *rows]))


def _wait(admin: pb_grpc.AdminStub, epoch: int, seconds: float) -> pb.GetStateResponse:
    deadline = time.monotonic() + seconds
    while True:
        st = _call(admin.GetState, pb.GetStateRequest())
        behind = [a for a in st.agents if a.connected and a.acked_epoch < epoch]
        if not behind or time.monotonic() >= deadline:
            return st
        time.sleep(0.05)


def print_state(st: pb.GetStateResponse) -> None:
    connected = sum(1 for x in st.agents if x.connected)
    acked = sum(1 for x in st.agents if x.acked_epoch == st.epoch)
    print(f"epoch      {st.epoch}")
    print(f"plan       {st.plan_id or '(none)'}")
    print(f"topology   {st.topology or '(none)'}")
    print(f"agents     {len(st.agents)} registered, {connected} connected, {acked} at the epoch")


def apply(admin: pb_grpc.AdminStub, plan_json: str, wait_s: float) -> int:
    r = _call(admin.ApplyPlan, pb.ApplyPlanRequest(plan_json=plan_json))
    print(f"plan {r.plan_id} applied at epoch {r.epoch}")
    if wait_s <= 0:
        return 0
    st = _wait(admin, r.epoch, wait_s)
    late = sorted(x.identity.node_id for x in st.agents if x.connected and x.acked_epoch < r.epoch)
    if late:
        print(f"not acknowledged after {wait_s:g} s: {', '.join(late)}")
        return 1
    n = sum(1 for x in st.agents if x.connected)
    print(f"all {n} connected agents acknowledged epoch {r.epoch}")
    return 0


def run(a: argparse.Namespace) -> int:
    from controller.inputs.plan_checks import load_plan
    from controller.service.server import check_pem

    try:
        target = controller_from_args(a)  # the flag, else HEROSERVE_CONTROLLER, checked
        tls = tls_from_args(a)
        if tls is not None:  # empty or binary files: said here, not as "unreachable"
            check_pem(tls)
    except (ValueError, UsageError) as exc:
        raise InputError(str(exc)) from None
    plan_json = ""
    if a.admin_action == "apply":
        if not a.wait >= 0:
            raise InputError(f"--wait {a.wait} must be >= 0")
        plan_json = load_plan(a.plan).to_json()  # refuse a non-plan before dialling
    try:
        with channel(target, tls) as ch:
            admin = pb_grpc.AdminStub(ch)
            if a.admin_action == "apply":
                return apply(admin, plan_json, a.wait)
            if a.admin_action == "slots":
                print_slots(_call(admin.GetSlots, pb.GetSlotsRequest()))
            elif a.admin_action == "agents":
                print_agents(_call(admin.GetState, pb.GetStateRequest()))
            else:
                print_state(_call(admin.GetState, pb.GetStateRequest()))
    except Unreachable as exc:
        print(f"heroserve admin: {_why(target, tls, exc)}", file=sys.stderr)
        return 1
    return 0
