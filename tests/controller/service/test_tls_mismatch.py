"""A TLS mismatch is named as such on both sides (docs/control-plane.md, "TLS mismatches"):
``heroserve admin`` probes a controller gRPC could not talk to, and the controller turns gRPC
core's "Handshake failed" lines into one rate-limited line of its own log format."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.pki import CA

from agents.client import ClientTls, tls_mismatch
from controller.cli import main
from controller.service.corelog import CoreLogRelay, handshake_kind
from controller.service.sample import sample_plan, sample_topology, save_sample_topology
from controller.service.server import ControllerServer, ThreadedServer, Tls
from controller.service.store import Store

CORE_PLAINTEXT = (
    "I1129 05:05:47.817386   11745 ssl_transport_security.cc:2563] Handshake failed with error "
    "SSL_ERROR_SSL: error:100000f7:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER: x"
)
CORE_WRONG_CA = (
    "I1129 05:06:40.085611   11747 ssl_transport_security.cc:2563] Handshake failed with error "
    "SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: y"
)


def _server(tmp_path: Path, tls: Tls | None) -> ThreadedServer:
    s = ThreadedServer(
        ControllerServer(
            Store(tmp_path / "c.db"),
            "127.0.0.1:0",
            tls=tls,
            topology=sample_topology(switches=("s1", "s2")),
        )  # fmt: skip
    )
    s.call(lambda: s.server.core.apply_plan(sample_plan().to_json()))
    return s


@pytest.fixture
def tls_srv(tmp_path: Path, ca: CA) -> Iterator[ThreadedServer]:
    cert = ca.issue("controller", ips=("127.0.0.1",), server=True)
    s = _server(tmp_path, Tls(cert.cert, cert.key, ca.pem))
    yield s
    s.stop()


def _client(ca: CA, signer: CA | None = None) -> ClientTls:
    c = (signer or ca).issue("heroserve-admin")
    return ClientTls(cert=c.cert, key=c.key, ca=ca.pem)


def test_probe_names_a_tls_controller_to_a_plaintext_client(tls_srv: ThreadedServer) -> None:
    assert "requires TLS" in (tls_mismatch(f"127.0.0.1:{tls_srv.port}", None) or "")


def test_probe_names_a_plaintext_controller_to_a_tls_client(tmp_path: Path, ca: CA) -> None:
    s = _server(tmp_path, None)
    try:
        target = f"127.0.0.1:{s.port}"
        assert "does not speak TLS" in (tls_mismatch(target, _client(ca)) or "")
        assert tls_mismatch(target, None) is None  # plaintext both: not a TLS matter
    finally:
        s.stop()


def test_probe_names_a_controller_certificate_from_another_ca(tls_srv: ThreadedServer) -> None:
    rogue = CA("rogue")
    says = tls_mismatch(f"127.0.0.1:{tls_srv.port}", _client(rogue))
    assert says is not None and "not signed by the CA of --tls-ca" in says


def test_probe_stays_silent_when_nothing_listens() -> None:
    assert tls_mismatch("127.0.0.1:1", None) is None
    assert tls_mismatch("unix:/nonexistent", None) is None


def test_admin_without_tls_flags_says_the_controller_requires_tls(
    tls_srv: ThreadedServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for var in ("HEROSERVE_TLS_CERT", "HEROSERVE_TLS_KEY", "HEROSERVE_TLS_CA"):
        monkeypatch.delenv(var, raising=False)
    assert main(["admin", "--controller", f"127.0.0.1:{tls_srv.port}", "state"]) == 1
    err = capsys.readouterr().err
    assert "the controller requires TLS" in err and "Socket closed" not in err
    assert len(err.splitlines()) == 1


def test_relay_names_each_mismatch_and_rate_limits(caplog: pytest.LogCaptureFixture) -> None:
    assert handshake_kind(CORE_PLAINTEXT) == "WRONG_VERSION_NUMBER"
    assert handshake_kind("Handshake failed: something new") == "OTHER"
    assert handshake_kind("Server started") is None
    relay = CoreLogRelay(logging.getLogger("t.relay"), rate_s=10.0)
    with caplog.at_level(logging.INFO, logger="t.relay"):
        relay.line(CORE_PLAINTEXT, now=100.0)
        relay.line(CORE_PLAINTEXT, now=101.0)  # left out: within 10 s of the last
        relay.line(CORE_PLAINTEXT, now=105.0)  # left out
        relay.line(CORE_WRONG_CA, now=105.0)  # another kind: said at once
        relay.line(CORE_PLAINTEXT, now=110.5)  # said, counting the two left out
        relay.line("W1129 05:00:00.000000 1 chttp2.cc:12] odd \x1b[31mthing", now=111.0)
    recs = [(r.levelno, r.getMessage(), getattr(r, "refused_since_last", None))
            for r in caplog.records]  # fmt: skip
    assert [r[2] for r in recs] == [0, 0, 2, None]
    assert "plaintext" in recs[0][1] and "not signed by" in recs[1][1]
    assert recs[3][:2] == (logging.WARNING, "grpc: odd ?[31mthing")  # printable, our format


def test_controller_logs_a_plaintext_client_in_its_own_format(tmp_path: Path, ca: CA) -> None:
    cert, key = ca.issue("controller", ips=("127.0.0.1",), server=True).write(tmp_path, "c")
    (tmp_path / "ca.crt").write_bytes(ca.pem)
    plan = tmp_path / "plan.json"
    plan.write_text(sample_plan().to_json())
    topo = tmp_path / "topo.json"
    port_file = tmp_path / "port"
    save_sample_topology(topo, switches=("s1", "s2"))
    argv = [sys.executable, "-m", "controller.cli", "controller", "--listen", "127.0.0.1:0",
            "--db", str(tmp_path / "c.db"), "--plan", str(plan), "--topology", str(topo),
            "--port-file", str(port_file), "--tls-cert", cert, "--tls-key", key,
            "--tls-ca", str(tmp_path / "ca.crt")]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        deadline = time.monotonic() + 120
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "controller did not start"
            time.sleep(0.05)
        target = f"127.0.0.1:{port_file.read_text().strip()}"
        with grpc.insecure_channel(target) as ch:
            with pytest.raises(grpc.FutureTimeoutError):
                grpc.channel_ready_future(ch).result(timeout=3)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    lines = err.splitlines()
    said = [x for x in lines if "TLS handshake refused: a client spoke plaintext" in x]
    assert said and said[0].split()[1:3] == ["WARNING", "heroserve.controller"], err
    # one line per 10 s however often the channel retried, and no line in gRPC's own format
    assert len(said) == 1, err
    assert not [x for x in lines if "ssl_transport_security" in x], err


def test_an_agent_without_tls_logs_the_mismatch(
    tls_srv: ThreadedServer, caplog: pytest.LogCaptureFixture
) -> None:
    import threading

    from agents.client import AgentClient, Backoff
    from agents.proto.heroserve.v1 import control_pb2 as pb

    client = AgentClient(
        f"127.0.0.1:{tls_srv.port}",
        pb.NodeIdentity(node_id="s1", kind=pb.NODE_KIND_SWITCH),
        lambda: pb.SwitchInventory(device_id=1, aggregator_slots=64),
        lambda old, new, upd: None,
        backoff=Backoff(initial=0.05, maximum=0.2),
    )
    t = threading.Thread(target=client.run, daemon=True)
    with caplog.at_level(logging.WARNING, logger="heroserve.agent"):
        t.start()
        try:
            deadline = time.monotonic() + 30
            while "TLS mismatch" not in caplog.text:
                assert time.monotonic() < deadline, caplog.text
                time.sleep(0.02)
        finally:
            client.stop()
            t.join(10)
    assert "the controller requires TLS" in caplog.text
