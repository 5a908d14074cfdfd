"""Mutual TLS: only CA-signed client certificates, and only for the node they name (§9)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.pki import CA

from agents.client import ClientTls, channel
from agents.cliutil import UsageError
from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.service.sample import sample_plan, sample_topology
from controller.service.server import ControllerServer, ThreadedServer, Tls
from controller.service.store import Store

S1 = pb.NodeIdentity(node_id="s1", kind=pb.NODE_KIND_SWITCH)
S2 = pb.NodeIdentity(node_id="s2", kind=pb.NODE_KIND_SWITCH)


@pytest.fixture
def srv(tmp_path: Path, ca: CA) -> Iterator[ThreadedServer]:
    cert = ca.issue("controller", dns=("localhost",), ips=("127.0.0.1",), server=True)
    store = Store(tmp_path / "c.db")
    s = ThreadedServer(
        ControllerServer(
            store,
            "127.0.0.1:0",
            tls=Tls(cert.cert, cert.key, ca.pem),
            topology=sample_topology(switches=("s1", "s2")),
        )
    )
    s.call(lambda: s.server.core.apply_plan(sample_plan().to_json()))
    yield s
    s.stop()


def _tls(ca: CA, cn: str, signer: CA | None = None, dns: tuple[str, ...] = ()) -> ClientTls:
    c = (signer or ca).issue(cn, dns=dns)
    return ClientTls(cert=c.cert, key=c.key, ca=ca.pem)


def _register(ch: grpc.Channel, ident: pb.NodeIdentity) -> pb.RegisterResponse:
    req = pb.RegisterRequest(identity=ident, switch_inventory=pb.SwitchInventory(device_id=1))
    return pb_grpc.ControlStub(ch).Register(req, timeout=5)


def test_agent_with_signed_certificate_is_served(srv: ThreadedServer, ca: CA) -> None:
    with channel(f"127.0.0.1:{srv.port}", _tls(ca, "s1")) as ch:
        assert _register(ch, S1).current_epoch == 1


def test_certificate_san_names_the_node(srv: ThreadedServer, ca: CA) -> None:
    with channel(f"127.0.0.1:{srv.port}", _tls(ca, "rack7-agent", dns=("s1",))) as ch:
        assert _register(ch, S1).session_id


def test_client_without_certificate_is_refused(srv: ThreadedServer, ca: CA) -> None:
    creds = grpc.ssl_channel_credentials(root_certificates=ca.pem)
    with grpc.secure_channel(f"127.0.0.1:{srv.port}", creds) as ch:
        with pytest.raises(grpc.RpcError) as ei:
            _register(ch, S1)
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE


def test_certificate_from_another_ca_is_refused(srv: ThreadedServer, ca: CA) -> None:
    with channel(f"127.0.0.1:{srv.port}", _tls(ca, "s1", signer=CA("rogue CA"))) as ch:
        with pytest.raises(grpc.RpcError) as ei:
            _register(ch, S1)
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE


def test_insecure_client_is_refused(srv: ThreadedServer) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
        with pytest.raises(grpc.RpcError) as ei:
            _register(ch, S1)
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE


def test_agent_speaks_only_for_its_node(srv: ThreadedServer, ca: CA) -> None:
    # s2 registers itself; s1's certificate then tries to report and subscribe as s2.
    with channel(f"127.0.0.1:{srv.port}", _tls(ca, "s2")) as ch2:
        session2 = _register(ch2, S2).session_id
    with channel(f"127.0.0.1:{srv.port}", _tls(ca, "s1")) as ch:
        stub = pb_grpc.ControlStub(ch)
        with pytest.raises(grpc.RpcError) as ei:
            _register(ch, S2)
        assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
        rep = pb.TelemetryReport(identity=S2, session_id=session2, window_s=1.0)
        rep.links.add(link_id="s1|s2", utilisation=0.9)
        with pytest.raises(grpc.RpcError) as ei:
            stub.ReportTelemetry(rep, timeout=5)
        assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
        call = stub.Subscribe(pb.SubscribeRequest(identity=S2, session_id=session2), timeout=5)
        with pytest.raises(grpc.RpcError) as ei:
            next(iter(call))
        assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # The admin service needs the admin certificate.
        with pytest.raises(grpc.RpcError) as ei:
            pb_grpc.AdminStub(ch).GetState(pb.GetStateRequest(), timeout=5)
        assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert srv.server.core.utilisation == {}
    with channel(f"127.0.0.1:{srv.port}", _tls(ca, "heroserve-admin")) as ch:
        assert pb_grpc.AdminStub(ch).GetState(pb.GetStateRequest(), timeout=5).epoch == 1


def test_non_loopback_listen_needs_tls(
    tmp_path: Path, ca: CA, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(tmp_path / "c.db")
    for addr in ("0.0.0.0:50051", "[::]:50051", "192.0.2.1:50051", "example.org:1"):
        with pytest.raises(UsageError, match="without TLS"):
            ControllerServer(store, addr)
    cert = ca.issue("controller", server=True)
    ControllerServer(store, "0.0.0.0:50051", tls=Tls(cert.cert, cert.key, ca.pem))
    with caplog.at_level(logging.WARNING, logger="heroserve.controller"):
        # Said when it starts listening (a controller failing before says only why).
        for srv in (
            ControllerServer(store, "0.0.0.0:0", insecure_listen_any=True),
            ControllerServer(store, "127.0.0.1:0"),
        ):
            ThreadedServer(srv).stop()
    assert "INSECURE: listening on 0.0.0.0:0" in caplog.text
    assert "insecure (no TLS): listening on loopback 127.0.0.1:0" in caplog.text
