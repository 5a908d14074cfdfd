"""heroserve-gpu-agent over mutual TLS (docs/design.md §9, §11): a CA-signed certificate naming
the node gets its tables; a certificate from another CA is refused, logged, and retried
while the agent keeps running. Skipped when the C++ build is absent."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.gpu_agent import AGENT, PLUGIN, Proc, acked, agent_env, segment, wait_until
from support.pki import CA

pytestmark = pytest.mark.skipif(
    not (AGENT.exists() and PLUGIN.exists()), reason="C++ GPU agent not built (make cxx)"
)
pb = pytest.importorskip("agents.proto.heroserve.v1.control_pb2")


@pytest.fixture
def prefix() -> Iterator[str]:
    p = f"tls{time.monotonic_ns() % 10000000}."
    yield p
    for f in Path("/dev/shm").glob(f"heroserve-{p}*"):
        f.unlink()


@pytest.fixture
def srv(tmp_path: Path, ca: CA) -> Iterator:
    from agents.client import ClientTls, channel
    from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
    from controller.service.sample import sample_plan, sample_topology
    from controller.service.server import ControllerServer, ThreadedServer, Tls
    from controller.service.store import Store

    cert = ca.issue("controller", dns=("localhost",), ips=("127.0.0.1",), server=True)
    s = ThreadedServer(
        ControllerServer(
            Store(tmp_path / "c.db"),
            "127.0.0.1:0",
            tls=Tls(cert.cert, cert.key, ca.pem),
            topology=sample_topology(),
        )
    )
    sw = ca.issue("s1")
    inv = pb.SwitchInventory(device_id=1, aggregator_slots=1024, slot_bytes=128)
    for k in range(4):
        inv.ports.add(port=k + 1, peer=f"p0-g{k}", capacity=12.5e9)
    req = pb.RegisterRequest(identity=pb.NodeIdentity(node_id="s1", kind=pb.NODE_KIND_SWITCH))
    req.switch_inventory.CopyFrom(inv)
    with channel(f"127.0.0.1:{s.port}", ClientTls(cert=sw.cert, key=sw.key, ca=ca.pem)) as ch:
        pb_grpc.ControlStub(ch).Register(req, timeout=5)
    p = sample_plan(ina_groups=1, ring_groups=0, workers=4)
    s.call(lambda: s.server.core.apply_plan(p.to_json()))
    yield s
    s.stop()


def start(tmp_path: Path, prefix: str, port: int, ca_pem: str, cert: tuple[str, str]) -> Proc:
    args = [str(AGENT), "--controller", f"127.0.0.1:{port}", "--node-id", "p0"]
    args += ["--gpu", "p0-g1", "--tls-ca", ca_pem, "--tls-cert", cert[0], "--tls-key", cert[1]]
    return Proc(args, agent_env(prefix), tmp_path / "agent.log")


def test_agent_with_signed_certificate_gets_its_table(srv, ca: CA, tmp_path: Path, prefix: str):
    ca_pem = tmp_path / "ca.pem"
    ca_pem.write_bytes(ca.pem)
    agent = start(tmp_path, prefix, srv.port, str(ca_pem), ca.issue("p0").write(tmp_path, "a"))
    try:
        wait_until(lambda: acked(srv, 1), what=f"ack over TLS\n{agent.text()}")
        assert segment(prefix).exists()
        assert "insecure" not in agent.text()
    finally:
        assert agent.stop() == 0


def test_certificate_from_another_ca_is_refused_and_retried(
    srv, ca: CA, tmp_path: Path, prefix: str
):
    ca_pem = tmp_path / "ca.pem"
    ca_pem.write_bytes(ca.pem)
    rogue = CA("rogue CA").issue("p0").write(tmp_path, "rogue")
    agent = start(tmp_path, prefix, srv.port, str(ca_pem), rogue)
    try:
        wait_until(lambda: agent.text().count("cannot register") >= 2, what="refusals")
        assert agent.p.poll() is None
        assert not acked(srv, 1)
        assert not segment(prefix).exists()
    finally:
        assert agent.stop() == 0
