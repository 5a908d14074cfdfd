"""tools/engine_ports.py and its use by tools/engine_e2e.py: a port the run needs that another
process holds is named, with its holder, in one line before any engine starts; the router's
Prometheus port is one the tool chooses free."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import engine_e2e as e2e  # noqa: E402
import engine_ports as ports  # noqa: E402


@pytest.fixture
def held() -> Iterator[int]:
    """A port this test's process listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_held_port_is_named_with_the_process_holding_it(held: int) -> None:
    assert not ports.bindable(held)
    who = ports.holder(held)
    assert who is not None and who.startswith(f"pid {os.getpid()} (")
    line = ports.check_ports({held: "decode/0's HTTP port (--port)"})
    assert line == f"port {held}, decode/0's HTTP port (--port), is held by {who}"
    assert "\n" not in line


def test_free_ports_pass(held: int) -> None:
    free = ports.free_port()
    assert ports.bindable(free) and ports.holder(free) is None
    assert ports.check_ports({free: "x"}) is None
    # only the held one of two is named
    line = ports.check_ports({free: "a", held: "b"})
    assert line is not None and line.startswith(f"port {held}, b,") and str(free) not in line


def test_needed_ports_are_the_ones_the_commands_bind() -> None:
    engine = ["vllm", "serve", "/m", "--port", "8101", "--max-num-seqs", "12"]
    sglang = ["python", "-m", "sglang.launch_server", "--port", "8100",
              "--disaggregation-bootstrap-port", "8998"]  # fmt: skip
    router = ["vllm-router", "--prefill", "http://localhost:8100", "8998", "--decode",
              "http://localhost:8101", "--port", "8000", "--prometheus-port", "29000"]  # fmt: skip
    need = ports.needed_ports([
        ("decode/0", engine, {"VLLM_NIXL_SIDE_CHANNEL_PORT": "5601"}),
        ("prefill/0", sglang, {}),
        ("the router", router, {}),
    ])  # fmt: skip
    assert need == {
        8101: "decode/0's HTTP port (--port)",
        5601: "decode/0's NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_PORT)",
        8100: "prefill/0's HTTP port (--port)",
        8998: "prefill/0's bootstrap port (--disaggregation-bootstrap-port)",
        8000: "the router's HTTP port (--port)",
        29000: "the router's Prometheus exporter (--prometheus-port)",
    }  # the router's "--prefill URL 8998" is prefill's port, which the router only dials


def test_the_router_gets_a_free_prometheus_port_unless_the_export_names_one() -> None:
    argv = ["vllm-router", "--port", "8000"]
    out = e2e.with_router_ports(argv, 18001)
    assert out[:3] == ["vllm-router", "--port", "18001"] and out[3] == "--prometheus-port"
    assert int(out[4]) != 29000 and ports.bindable(int(out[4]))
    named = [*argv, "--prometheus-port", "29100"]
    assert e2e.with_router_ports(named, None) == named


def test_e2e_refuses_a_held_port_in_one_line_before_starting_anything(
    held: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engines = tmp_path / "engines"
    (engines / "vllm" / "bin").mkdir(parents=True)
    (engines / "vllm" / "bin" / "vllm-router").touch()  # nothing here can start: no engine
    # the export numbers the instances' ports from --base-port: prefill/0 gets the held one
    argv = ["--engines", str(engines), "--work", str(tmp_path / "w"), "--base-port", str(held)]
    assert e2e.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("engine_e2e: ")
    assert f"port {held}, prefill/0's HTTP port (--port), is held by pid {os.getpid()} (" in err
    assert not list((tmp_path / "w").glob("*.log"))  # no engine was started


def test_the_holder_is_read_from_proc_and_shown_on_one_line(tmp_path: Path) -> None:
    # a /proc of one process listening on port 0x1F90 = 8080 (socket inode 777), started
    # with a command line that holds a newline
    (tmp_path / "net").mkdir()
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
    row = "   0: 0100007F:1F90 00000000:0000 {} 00000000:00000000 00:00000000 00000000  0  0 777"
    (tmp_path / "net" / "tcp").write_text(f"{head}\n{row.format('0A')}\n")
    (tmp_path / "42" / "fd").mkdir(parents=True)
    os.symlink("socket:[777]", tmp_path / "42" / "fd" / "5")
    (tmp_path / "42" / "cmdline").write_bytes(b"python\0-c\0import x\nx.serve()\0")
    assert ports.holder(8080, tmp_path) == "pid 42 (python -c import x x.serve())"
    assert ports.holder(8081, tmp_path) is None
    # a socket that only connects (not LISTEN, state 01) holds no port
    (tmp_path / "net" / "tcp").write_text(f"{head}\n{row.format('01')}\n")
    assert ports.holder(8080, tmp_path) is None
