"""gRPC fuzz of every controller method.

Seeded random and boundary field values, other identities' names and sessions, mutated
plans: every call gets a proper status (never UNKNOWN or INTERNAL, which would mean an
unhandled exception), and after every call the database is consistent (the slot pool check
and the store's own check pass) and metrics carry only label values the plan names.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.pki import CA

from agents.client import ClientTls, channel
from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.service.sample import sample_plan, sample_topology
from controller.service.server import ControllerServer, ThreadedServer, Tls
from controller.service.store import Store

SEED = 20261123
CALLS = 1500
SHAPE = {"ina_groups": 2, "ring_groups": 1, "switches": ("s1", "s2")}
PROPER = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
U64 = [0, 1, 7, 2**16 - 1, 2**16, 2**32 - 1, 2**53, 2**53 + 1, 2**62, 2**63 - 1, 2**64 - 1]
U32 = [0, 1, 3, 511, 512, 2**16 - 1, 2**16, 2**31, 2**32 - 1]
DOUBLES = [0.0, -0.0, 0.25, 1.0, 1.5, -1.0, 12.5e9, 1e308, math.inf, -math.inf, math.nan]
NODES = ["s1", "s2", "p0", "p1", "d0", "p0-g0", "p0-g3", "p1-g2", "d0-g1", "s3", "zz"]
STRINGS = ["", "a" * 200, "x|y", "has space", "\x00", "é", "prefill/0/0", "decode/0/0"]
GROUPS = ["prefill/0/0", "prefill/1/0", "decode/0/0", "prefill/9/9", "", "a" * 300]
PLAN_GROUPS = {"prefill/0/0", "prefill/1/0", "decode/0/0"}
LINKS = ["p0-g0|s1", "s1|p0-g0", "p1-g0|s1", "s1|s2", "d0-g1|s1", "p0-g0|zz", "nolink", "|"]


class Fuzz:
    """Random requests over one channel; sessions of the identities that registered."""

    def __init__(self, rng: random.Random, ch: grpc.Channel) -> None:
        self.rng = rng
        self.control = pb_grpc.ControlStub(ch)
        self.admin = pb_grpc.AdminStub(ch)
        self.health = health_pb2_grpc.HealthStub(ch)
        self.sessions: dict[str, str] = {}

    def pick(self, values: list) -> object:
        return self.rng.choice(values)

    def maybe(self, legit: object, values: list, p: float = 0.12) -> object:
        """``legit`` mostly; a random or boundary value from ``values`` with probability p, so
        requests are valid often enough to reach the code behind the checks."""
        return self.pick(values) if self.rng.random() < p else legit

    def name(self) -> str:
        return self.pick(NODES) if self.rng.random() < 0.8 else self.pick(STRINGS)

    def identity(self) -> pb.NodeIdentity:
        node = self.name()
        legit = pb.NODE_KIND_SWITCH if node.startswith("s") else pb.NODE_KIND_GPU
        kind = self.maybe(legit, [pb.NODE_KIND_SWITCH, pb.NODE_KIND_GPU, 0, 7], p=0.25)
        return pb.NodeIdentity(node_id=node, kind=kind)

    def session(self, node: str) -> str:
        r = self.rng.random()
        if r < 0.6 and node in self.sessions:
            return self.sessions[node]
        if r < 0.8 and self.sessions:  # another identity's session
            return self.pick(sorted(self.sessions.values()))
        return self.pick(["", "00", "f" * 16, "a" * 100])

    def register(self) -> object:
        ident = self.identity()
        req = pb.RegisterRequest(
            identity=ident,
            agent_version=self.maybe("t/1", ["", "v" * 200]),
            last_applied_epoch=self.maybe(0, U64),
            generation=self.maybe("", ["0123456789abcdef", "g" * 100]),
        )
        switch = self.maybe(ident.kind == pb.NODE_KIND_SWITCH, [True, False])
        if switch:
            inv = req.switch_inventory
            inv.device_id = self.maybe(1, U64)
            inv.aggregator_slots = self.maybe(1024, U32)
            inv.slot_bytes = self.maybe(128, U32)
            for k in range(self.rng.randint(0, 6)):
                inv.ports.add(
                    port=self.maybe(k + 1, U32),
                    peer=self.maybe(f"p0-g{k % 4}", NODES + STRINGS),
                    capacity=self.maybe(12.5e9, DOUBLES),
                    peer_mac=self.maybe(f"02:00:00:00:00:0{k}", ["", "zz"]),
                    peer_ipv4=self.maybe(f"10.0.0.{k}", ["", "999.1.1.1"]),
                )
        else:
            server = ident.node_id.split("-")[0]
            for k in range(self.rng.randint(0, 5)):
                req.gpu.gpus.add(
                    gpu_id=self.maybe(f"{server}-g{k % 4}", NODES + STRINGS, p=0.2),
                    server=self.maybe("", ["p0", "p1", "zz"]),
                    local_index=self.maybe(k, U32),
                    mac=self.maybe("", ["02:00:00:00:00:01", "x"]),
                )
            for _ in range(self.rng.randint(0, 3)):
                req.held_tables.add(
                    group_id=self.pick(GROUPS),
                    version=self.maybe(self.rng.randint(0, 9), U64, p=0.3),
                    last_seq=self.maybe(self.rng.randint(0, 999), U64, p=0.3),
                )
        resp = self.control.Register(req, timeout=10)
        self.sessions[ident.node_id] = resp.session_id
        return resp

    def subscribe(self) -> object:
        ident = self.identity()
        call = self.control.Subscribe(
            pb.SubscribeRequest(identity=ident, session_id=self.session(ident.node_id)),
            timeout=10,
        )
        try:
            return next(iter(call))  # the full state, or the refusal
        finally:
            call.cancel()

    def ack(self) -> object:
        ident = self.identity()
        return self.control.Ack(
            pb.AckRequest(
                identity=ident,
                session_id=self.session(ident.node_id),
                epoch=self.maybe(self.rng.randint(1, 3), U64, p=0.3),
                ok=self.rng.random() < 0.8,
                error=self.pick(STRINGS),
            ),
            timeout=10,
        )

    def telemetry(self) -> object:
        ident = self.identity()
        own = [lk for lk in LINKS if ident.node_id in lk.split("|")] or LINKS
        rep = pb.TelemetryReport(
            identity=ident,
            session_id=self.session(ident.node_id),
            timestamp_ns=self.pick(U64),
            window_s=self.maybe(0.1, DOUBLES),
        )
        for _ in range(self.rng.randint(0, 4)):
            rep.links.add(
                link_id=self.maybe(self.pick(own), LINKS + STRINGS, p=0.3),
                utilisation=self.maybe(0.25, DOUBLES),
                bytes_per_s=self.maybe(1e9, DOUBLES),
            )
        for _ in range(self.rng.randint(0, 3)):
            rep.ports.add(port=self.maybe(1, U32), rx_bytes=self.pick(U64))
        for _ in range(self.rng.randint(0, 2)):
            rep.counters.add(name=self.maybe("ina_drops", STRINGS), index=self.pick(U64))
        for _ in range(self.rng.randint(0, 4)):
            rep.selections.add(
                group_id=self.pick(GROUPS),
                version=self.maybe(1, U64),
                policy_id=self.maybe(self.rng.randint(0, 1), [2, 2**32 - 1]),
                selections=self.pick(U64),
                bytes=self.pick(U64),
                last_seq=self.maybe(self.rng.randint(0, 10**6), U64, p=0.3),
            )
        return self.control.ReportTelemetry(rep, timeout=10)

    def apply_plan(self) -> object:
        plan = sample_plan(
            ina_groups=self.rng.randint(1, 2),
            ring_groups=self.rng.randint(0, 1),
            switches=SHAPE["switches"],
            slots_per_group=self.pick([None, 4, 8, 300]),
            tag=str(self.rng.randrange(4)),
        )
        d = json.loads(plan.to_json())
        if self.rng.random() < 0.7:
            self.mutate(d)
        text = json.dumps(d)
        if self.rng.random() < 0.05:
            text = text[: self.rng.randrange(len(text))]
        return self.admin.ApplyPlan(pb.ApplyPlanRequest(plan_json=text), timeout=30)

    def mutate(self, d: object, depth: int = 0) -> None:
        """Replace one value somewhere in the plan by a random or boundary one."""
        if isinstance(d, dict) and d:
            key = self.pick(sorted(d))
            if depth < 6 and isinstance(d[key], dict | list) and self.rng.random() < 0.8:
                self.mutate(d[key], depth + 1)
            else:
                d[key] = self.value()
        elif isinstance(d, list) and d:
            i = self.rng.randrange(len(d))
            if depth < 6 and isinstance(d[i], dict | list) and self.rng.random() < 0.8:
                self.mutate(d[i], depth + 1)
            else:
                d[i] = self.value()

    def value(self) -> object:
        return self.pick(
            [None, True, -1, 0, 2**16, 2**63, 1e300, "", "s9", "p1-g0", [], {}, [1], {"x": 1}]
            + NODES
        )

    def state(self) -> object:
        return self.admin.GetState(pb.GetStateRequest(), timeout=10)

    def health_check(self) -> object:
        return self.health.Check(
            health_pb2.HealthCheckRequest(service=self.pick(["", "heroserve.v1.Control", "x"])),
            timeout=10,
        )

    def methods(self) -> list[tuple[str, Callable[[], object], float]]:
        return [
            ("Register", self.register, 3),
            ("Subscribe", self.subscribe, 1.5),
            ("Ack", self.ack, 2),
            ("ReportTelemetry", self.telemetry, 3),
            ("ApplyPlan", self.apply_plan, 1),
            ("GetState", self.state, 0.3),
            ("Health", self.health_check, 0.2),
        ]

    def call(self) -> tuple[str, grpc.StatusCode]:
        names, fns, weights = zip(*self.methods(), strict=True)
        i = self.rng.choices(range(len(names)), weights)[0]
        try:
            fns[i]()
        except grpc.RpcError as exc:
            code = exc.code()
            if names[i] == "Health" and code == grpc.StatusCode.NOT_FOUND:
                return names[i], grpc.StatusCode.OK  # an unknown service: Health's answer
            return names[i], code
        return names[i], grpc.StatusCode.OK


def check_consistent(srv: ThreadedServer) -> None:
    core = srv.server.core
    core.store.verify()
    core.pool.check_all()
    assert core.epoch == core.store.epoch()
    # Metrics carry only what the plan's cluster names.
    index = core.index
    assert index is not None
    reg = core.metrics.registry
    for metric in reg.collect():
        for s in metric.samples:
            if "link" in s.labels:
                assert s.labels["link"] in index.links, s
            if "agent" in s.labels:
                a = s.labels["agent"]
                assert a in index.switches or index.owned_gpus(a), s
            if "group" in s.labels:  # groups of the plans the fuzz applies, policies of theirs
                assert s.labels["group"] in PLAN_GROUPS, s
                assert s.labels["policy"] in ("0", "1"), s


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ThreadedServer]:
    s = ThreadedServer(
        ControllerServer(Store(tmp_path / "c.db"), "127.0.0.1:0", topology=sample_topology(**SHAPE))
    )
    s.call(lambda: s.server.core.apply_plan(sample_plan(**SHAPE).to_json()))
    yield s
    s.stop()


def test_every_method_answers_properly_and_the_database_stays_consistent(
    srv: ThreadedServer,
) -> None:
    rng = random.Random(SEED)
    seen: dict[tuple[str, grpc.StatusCode], int] = {}
    with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
        fuzz = Fuzz(rng, ch)
        for n in range(CALLS):
            method, code = fuzz.call()
            assert code in PROPER, (n, method, code)
            seen[(method, code)] = seen.get((method, code), 0) + 1
            check_consistent(srv)
    # The fuzz reached both sides of every method: accepted and refused.
    for method in ("Register", "Subscribe", "Ack", "ReportTelemetry", "ApplyPlan"):
        assert seen.get((method, grpc.StatusCode.OK), 0) > 0, (method, seen)
        assert sum(v for (m, c), v in seen.items() if m == method and c != grpc.StatusCode.OK)
    assert seen.get(("ReportTelemetry", grpc.StatusCode.PERMISSION_DENIED), 0) > 0
    assert srv.server.core.epoch > 1  # some mutated plans were still valid plans


def test_over_mutual_tls_an_agent_speaks_only_for_itself(tmp_path: Path) -> None:
    """With a certificate naming p0, every request speaking for another node is
    PERMISSION_DENIED, whatever else it holds; the database stays consistent."""
    ca = CA()
    cert = ca.issue("controller", dns=("localhost",), ips=("127.0.0.1",), server=True)
    s = ThreadedServer(
        ControllerServer(
            Store(tmp_path / "c.db"),
            "127.0.0.1:0",
            tls=Tls(cert.cert, cert.key, ca.pem),
            topology=sample_topology(**SHAPE),
        )
    )
    try:
        s.call(lambda: s.server.core.apply_plan(sample_plan(**SHAPE).to_json()))
        p0 = ca.issue("p0")
        rng = random.Random(SEED + 1)
        with channel(f"127.0.0.1:{s.port}", ClientTls(p0.cert, p0.key, ca.pem)) as ch:
            fuzz = Fuzz(rng, ch)
            for n in range(200):
                before = dict(fuzz.sessions)
                ident = fuzz.identity()
                fuzz.identity = lambda ident=ident: ident  # type: ignore[method-assign]
                method, code = fuzz.call()
                del fuzz.identity
                assert code in PROPER, (n, method, code)
                if method in ("Register", "Subscribe", "Ack", "ReportTelemetry"):
                    if ident.node_id != "p0":
                        assert code == grpc.StatusCode.PERMISSION_DENIED, (n, method, ident)
                        assert fuzz.sessions == before
                if method in ("ApplyPlan", "GetState"):  # p0 is no admin
                    assert code == grpc.StatusCode.PERMISSION_DENIED
                check_consistent(s)
    finally:
        s.stop()
