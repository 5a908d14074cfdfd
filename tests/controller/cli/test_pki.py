"""``heroserve pki``: the certificates it makes are the ones the controller binds (§9)."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from agents.client import ClientTls, channel
from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.cli import main
from controller.service.sample import sample_plan, sample_topology
from controller.service.server import ControllerServer, ThreadedServer, Tls
from controller.service.store import Store


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    assert main(["pki", "init", str(d)]) == 0
    assert (
        main(["pki", "issue", str(d), "--name", "controller", "--server", "--host", "127.0.0.1"])
        == 0
    )
    for node in ("s1", "heroserve-admin"):
        assert main(["pki", "issue", str(d), "--name", node]) == 0
    return d


@pytest.fixture
def srv(pki: Path, tmp_path: Path) -> Iterator[ThreadedServer]:
    tls = Tls(
        (pki / "controller.crt").read_bytes(),
        (pki / "controller.key").read_bytes(),
        (pki / "ca.crt").read_bytes(),
    )
    s = ThreadedServer(
        ControllerServer(
            Store(tmp_path / "c.db"), "127.0.0.1:0", tls=tls, topology=sample_topology()
        )
    )
    s.call(lambda: s.server.core.apply_plan(sample_plan().to_json()))
    yield s
    s.stop()


def _client(pki: Path, name: str) -> ClientTls:
    return ClientTls(
        (pki / f"{name}.crt").read_bytes(),
        (pki / f"{name}.key").read_bytes(),
        (pki / "ca.crt").read_bytes(),
    )


def _register(ch: grpc.Channel, node: str) -> pb.RegisterResponse:
    req = pb.RegisterRequest(
        identity=pb.NodeIdentity(node_id=node, kind=pb.NODE_KIND_SWITCH),
        switch_inventory=pb.SwitchInventory(device_id=1),
    )
    return pb_grpc.ControlStub(ch).Register(req, timeout=5)


def test_issued_certificate_speaks_for_its_node_only(srv: ThreadedServer, pki: Path) -> None:
    with channel(f"127.0.0.1:{srv.port}", _client(pki, "s1")) as ch:
        assert _register(ch, "s1").current_epoch == 1
        with pytest.raises(grpc.RpcError) as ei:
            _register(ch, "s2")
        assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as ei:
            pb_grpc.AdminStub(ch).GetState(pb.GetStateRequest(), timeout=5)
        assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with channel(f"127.0.0.1:{srv.port}", _client(pki, "heroserve-admin")) as ch:
        assert pb_grpc.AdminStub(ch).GetState(pb.GetStateRequest(), timeout=5).epoch == 1


def test_certificate_contents(pki: Path) -> None:
    ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    srv = x509.load_pem_x509_certificate((pki / "controller.crt").read_bytes())
    cli = x509.load_pem_x509_certificate((pki / "s1.crt").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for c in (srv, cli):
        c.verify_directly_issued_by(ca)
        assert not c.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["controller"]
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    eku = cli.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert [u.dotted_string for u in eku] == ["1.3.6.1.5.5.7.3.2"]  # clientAuth
    for key in ("ca.key", "s1.key", "controller.key"):
        assert stat.S_IMODE((pki / key).stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "argv, says",
    [
        (["issue", "{d}", "--name", "s1"], "exists; pass --force"),
        (["issue", "{d}", "--name", "a/b"], "node name"),
        (["issue", "{d}", "--name", "ca"], "CA's own files"),
        (["issue", "{d}", "--name", "s9", "--host", "10.0.0.1"], "add --server"),
        (["issue", "{d}", "--name", "s9", "--server", "--host", "a b"], "neither an IP"),
        (["issue", "{d}/nothing", "--name", "s9"], "pki init"),
        (["init", "{d}"], "exists; pass --force"),
        (["issue", "{d}", "--name", "s9", "--days", "0"], "--days 0"),
        (["init", "{d}/ctl", "--name", "a\nb"], "no control characters"),
        (["init", "{d}/ctl", "--name", "a\x1b[31mb"], "no control characters"),
    ],
)
def test_bad_requests_get_one_line_and_exit_2(
    pki: Path, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pki", *(a.format(d=pki) for a in argv)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_a_key_from_elsewhere_is_refused(
    tmp_path: Path, pki: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    assert main(["pki", "init", str(other)]) == 0
    (other / "ca.key").write_bytes((pki / "ca.key").read_bytes())
    assert main(["pki", "issue", str(other), "--name", "s1"]) == 2
    assert "does not belong" in capsys.readouterr().err


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("dangling", [False, True])
def test_keys_are_never_written_through_a_symbolic_link(
    tmp_path: Path, pki: Path, force: bool, dangling: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A link planted where a key will go (pointing at an existing file, or at none yet)
    is refused, with or without --force; the file it points at stays as it was."""
    victim = tmp_path / "victim"
    if not dangling:
        victim.write_text("precious\n")
    d = tmp_path / "ca"
    d.mkdir()
    (d / "ca.key").symlink_to(victim)
    assert main(["pki", "init", str(d), *(["--force"] if force else [])]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a symbolic link" in err and len(err.splitlines()) == 1, err
    assert victim.read_text() == "precious\n" if not dangling else not victim.exists()
    # issue: the node's key path is a link
    (pki / "s7.key").symlink_to(victim)
    try:
        assert (
            main(["pki", "issue", str(pki), "--name", "s7", *(["--force"] if force else [])]) == 2
        )
        assert "is a symbolic link" in capsys.readouterr().err
        assert victim.read_text() == "precious\n" if not dangling else not victim.exists()
        assert not (pki / "s7.crt").exists()
    finally:
        (pki / "s7.key").unlink()


def test_force_replaces_a_regular_key_with_a_new_private_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "ca"
    assert main(["pki", "init", str(d)]) == 0
    old = (d / "ca.key").read_bytes()
    (d / "ca.key").chmod(0o644)
    assert main(["pki", "init", str(d), "--force"]) == 0
    assert (d / "ca.key").read_bytes() != old
    assert stat.S_IMODE((d / "ca.key").stat().st_mode) == 0o600
