"""End to end: controller -> heroserve-gpu-agent -> shm -> tuner plugin -> telemetry.

The controller (in-process, loopback) pushes a group's table; the C++ daemon publishes it in
shared memory; the NCCL tuner plugin, loaded in another process by agents/gpu/tuner_driver.py,
schedules AllReduces with it; the daemon reports the plugin's selections; the controller
derives the next version's apply_from_seq from them, and the plugin switches to it exactly at
that collective. Also the daemon's failure modes (docs/design.md §11).
Skipped when the C++ build (`make cxx`) is absent.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT
from support.gpu_agent import (
    AGENT,
    GROUP,
    PLUGIN,
    Proc,
    acked,
    agent_env,
    apply_plan,
    register_switch,
    segment,
    start_agent,
    wait_until,
)

pytestmark = pytest.mark.skipif(
    not (AGENT.exists() and PLUGIN.exists()), reason="C++ GPU agent not built (make cxx)"
)


@pytest.fixture
def prefix() -> Iterator[str]:
    p = f"pytest{os.getpid()}x{time.monotonic_ns() % 1000000}."
    yield p
    for f in Path("/dev/shm").glob(f"heroserve-{p}*"):
        f.unlink()


@pytest.fixture
def controller(tmp_path: Path) -> Iterator:
    from controller.service.core import Options
    from controller.service.sample import sample_topology
    from controller.service.server import ControllerServer, ThreadedServer
    from controller.service.store import Store

    opts = Options(apply_margin=5, telemetry_interval_s=0.2)
    s = ThreadedServer(
        ControllerServer(
            Store(tmp_path / "c.db"), "127.0.0.1:0", options=opts, topology=sample_topology()
        )
    )
    yield s
    s.stop()


def test_table_reaches_plugin_and_selections_come_back(
    controller, tmp_path: Path, prefix: str
) -> None:
    register_switch(controller.port)
    e1 = apply_plan(controller)
    agent = start_agent(tmp_path, prefix, f"127.0.0.1:{controller.port}")
    driver = None
    try:
        wait_until(lambda: acked(controller, e1), what=f"ack of epoch {e1}\n{agent.text()}")
        assert segment(prefix).exists()
        driver = Proc(
            [
                sys.executable,
                "-X",
                "faulthandler",
                "-m",
                "agents.gpu.tuner_driver",
                str(PLUGIN),
                "--ranks",
                "2",
            ],
            {**agent_env(prefix), "PYTHONPATH": str(ROOT)},
            tmp_path / "driver.log",
            stdin=True,
        )
        first = driver.ask("run 20 1048576")
        assert first["agree"], first
        assert [c[0] for c in first["choices"]] == list(range(20))
        assert {c[1] for c in first["choices"]} == {1}  # version 1 in force
        # The plugin's selections come back as telemetry: the controller learns the sequence.
        store = controller.server.core.store
        wait_until(lambda: store.last_seq(GROUP) == 19, what="telemetry with last_seq 19")
        reg = controller.server.core.metrics.registry
        total = sum(
            reg.get_sample_value(
                "heroserve_policy_selections_total", {"group": GROUP, "policy": str(p)}
            )
            or 0.0
            for p in (0, 1)
        )
        assert total == 20
        # A new version: it applies from last_seq + 1 + margin = 25.
        e2 = apply_plan(controller, reverse=True)
        wait_until(lambda: acked(controller, e2), what=f"ack of epoch {e2}\n{agent.text()}")
        second = driver.ask("run 10 1048576")
        assert second["agree"], second
        versions = [(c[0], c[1]) for c in second["choices"]]
        assert versions == [(s, 1 if s < 25 else 2) for s in range(20, 30)]
        wait_until(lambda: store.last_seq(GROUP) == 29, what="telemetry with last_seq 29")
        assert "published group prefill/0/0 version 2" in agent.text()
    finally:
        if driver is not None:
            driver.stop()
        assert agent.stop() == 0, agent.text()


def test_bad_controller_address_keeps_running(tmp_path: Path, prefix: str) -> None:
    agent = start_agent(tmp_path, prefix, "127.0.0.1:1")
    try:
        wait_until(lambda: agent.text().count("cannot register") >= 2, what="retries")
        assert agent.p.poll() is None
    finally:
        assert agent.stop() == 0
    assert "Connection refused" in agent.text() or "failed to connect" in agent.text()


def test_bad_certificates_keep_running(tmp_path: Path, prefix: str) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    agent = start_agent(
        tmp_path,
        prefix,
        "127.0.0.1:1",
        "--tls-ca",
        str(tmp_path / "missing-ca.pem"),
        "--tls-cert",
        str(bad),
        "--tls-key",
        str(bad),
    )
    try:
        wait_until(lambda: "TLS: cannot read" in agent.text(), what="TLS error")
        assert agent.p.poll() is None
    finally:
        assert agent.stop() == 0


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    for args in (
        [],
        ["--controller", "127.0.0.1:1"],
        ["--controller", "10.1.2.3:50051", "--node-id", "x"],  # no TLS off loopback
        ["--controller", "127.0.0.1:1", "--node-id", "x", "--tls-ca", "a.pem"],
        ["--controller", "127.0.0.1:1", "--node-id", "x", "--telemetry-interval", "-1"],
        ["--bogus"],
    ):
        r = subprocess.run([str(AGENT), *args], capture_output=True, text=True, timeout=10)
        assert r.returncode == 2, args
        assert "heroserve-gpu-agent:" in r.stderr and "Traceback" not in r.stderr


def test_malformed_table_keeps_last_good_one(
    controller, tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from controller.errors import InputError
    from controller.service import tables

    register_switch(controller.port)
    e1 = apply_plan(controller)
    agent = start_agent(tmp_path, prefix, f"127.0.0.1:{controller.port}")
    try:
        wait_until(lambda: acked(controller, e1), what="first ack")
        before = segment(prefix).read_bytes()
        # Links of capacity 0 in the cluster: the controller itself refuses the table...
        cluster = controller.server.core.topology
        for k in range(4):
            cluster.edges[f"p0-g{k}", "s1"]["capacity"] = 0.0
        with pytest.raises(InputError, match="capacity must be > 0"):
            apply_plan(controller, reverse=True)
        # ...and a controller that publishes it anyway (one without the check, a bug) meets
        # the agent's own validator, which keeps the last good table.
        monkeypatch.setattr(tables, "check_table", lambda _t: None)
        e2 = apply_plan(controller, reverse=True)
        wait_until(lambda: "keeping the last good tables" in agent.text(), what="error log")
        assert "capacity must be > 0" in agent.text()
        assert not acked(controller, e2)  # acknowledged with ok=false
        assert agent.p.poll() is None
        after = segment(prefix).read_bytes()
        assert after == before  # nothing republished: the plugin keeps version 1
    finally:
        assert agent.stop() == 0


def test_plugin_survives_missing_and_garbled_segment(tmp_path: Path, prefix: str) -> None:
    """No agent at all, then a segment full of garbage: NCCL's defaults, no crash."""
    driver = Proc(
        [
            sys.executable,
            "-X",
            "faulthandler",
            "-m",
            "agents.gpu.tuner_driver",
            str(PLUGIN),
            "--ranks",
            "2",
        ],
        {**agent_env(prefix), "PYTHONPATH": str(ROOT)},
        tmp_path / "driver.log",
        stdin=True,
    )
    try:
        out = driver.ask("run 3 4096")
        assert out["agree"] and all(c[3] == 1 for c in out["choices"])  # NCCL's Ring/LL
        segment(prefix).write_bytes(os.urandom(8192))
        out = driver.ask("run 3 4096")
        assert out["agree"]
        stats = driver.ask("stats")
        assert stats["selections"] == 0 and stats["fallbacks"] == 6
    finally:
        driver.stop()
    log = driver.text()
    assert log.count("using NCCL's defaults") == 1, log  # logged once
