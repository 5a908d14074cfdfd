"""``heroserve emulate`` and ``heroserve demo`` as a user runs them (root, Mininet): the
testbed's INA and ring all-reduces exact against NumPy, impaired links, the demo's view of
the policies, and nothing left behind after a normal exit, an error or SIGINT in the middle.
docs/emulation.md describes the runs.

Each command prints its run tag first; :func:`controller.emulate.cluster.leftovers` then
looks for interfaces, shared memory and processes carrying that tag.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from support import ROOT

from agents.ina.packet import InaHeader

pytestmark = [pytest.mark.needs_root, pytest.mark.slow]

GPU_AGENT = ROOT / "build" / "csrc" / "heroserve-gpu-agent"
EXACTLY_ONCE_SWITCH = hasattr(InaHeader, "at_round")  # see tests/agents/ina/test_ina_host.py


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, raw sockets)"
    if not Path("/usr/lib/python3/dist-packages/mininet").is_dir():
        return "Debian's mininet package is not installed"
    for tool in ("mnexec", "tc", "ethtool", "ping"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (.ci/apt-packages.txt)"
    return None


@pytest.fixture(autouse=True)
def _needs_emulation() -> None:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)


# Hang guards only, never what a test measures: a teardown on a loaded 2-core machine takes
# seconds to a few minutes (every process, switch and link of the run).
TEARDOWN_S = 600


def start(args: list[str]) -> subprocess.Popen:
    # Without PYTHONUNBUFFERED, whatever the caller's environment: the commands themselves
    # must put out each line as printed (a block-buffered pipe held the tag and "holding"
    # until exit, so a SIGINT meant for the middle of a run came after its end).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.Popen(
        [sys.executable, "-m", "controller.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=default_sigint,
    )


def default_sigint() -> None:
    """In the child, Ctrl-C's default disposition: a suite started as a background job of a
    shell without job control runs with SIGINT ignored, its children inherit that, and
    Python then never installs its Ctrl-C handler, so the interrupt tests could not
    interrupt anything."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def tag_of(first_line: str) -> str:
    m = re.match(r"(?:emulation|demo) (h[0-9a-z]+):", first_line)
    assert m, first_line
    return m.group(1)


def finish(p: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """Its output; a command that overruns is interrupted (so it tears down) before the
    test fails."""
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)
        try:
            p.communicate(timeout=TEARDOWN_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
        raise


def run(args: list[str], timeout: float = 600) -> tuple[int, str, str, str]:
    p = start(args)
    out, err = finish(p, timeout)
    return p.returncode, out, err, tag_of(out.splitlines()[0]) if out else ""


def assert_nothing_left(tag: str) -> None:
    from controller.emulate.cluster import leftovers

    assert tag
    left = leftovers(tag)
    assert left == {"interfaces": [], "shm": [], "processes": []}, left
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in ns


def made_plan(
    tmp_path: Path,
    topology: str,
    *,
    ina_only: bool = True,
    hier: bool = False,
    slots: int = 0,
    lanes: str = "int32",
) -> Path:
    """The plan emulate makes itself, trimmed to its flat INA group (the runs' time goes to
    the group under test) and, with ``hier``, its hierarchical group; ``slots``
    overrides the flat group's slot count; ``lanes`` is the INA lane format it is priced
    for (the plan's ``ina_lanes`` option)."""
    from controller.emulate.plans import emulation_plan
    from controller.topology import resolve_topology

    plan = emulation_plan(resolve_topology(topology), hier=hier)
    if ina_only:
        plan.decode.groups, plan.decode.instances = [], []
    if slots:
        plan.prefill.groups[0].slots.count = slots  # type: ignore[union-attr]
    plan.options["ina_lanes"] = lanes
    path = tmp_path / f"plan-{topology}.json"
    plan.save(path)
    return path


def scratch_data(seed: int, n: int, workers: int) -> list[np.ndarray]:
    """Every member's float32 data, restated here from the worker's documented rule: uniform
    in [-1, 1), member 0's times 100, member 1's first 64 elements zero."""
    xs = []
    for i in range(workers):
        x = np.random.default_rng([seed, i]).uniform(-1.0, 1.0, n)
        if i == 0:
            x *= 100.0
        elif i == 1:
            x[:64] = 0.0
        xs.append(x.astype(np.float32))
    return xs


def numpy_digest(seed: int, n: int, workers: int) -> str:
    """The expected result computed here from scratch: each member's float32 data, one
    shared power-of-two scale, the int64 sum wrapped to int32, its SHA-256."""
    import hashlib

    xs = scratch_data(seed, n, workers)
    e = max(int(np.frexp(np.max(np.abs(x)))[1]) for x in xs)
    scale = 2.0 ** (30 - (workers - 1).bit_length() - e)
    total = sum(np.rint(x.astype(np.float64) * scale).astype(np.int64) for x in xs)
    lanes = total.astype(np.uint32).view(np.int32)  # type: ignore[union-attr]
    return hashlib.sha256(lanes.astype("<i4").tobytes()).hexdigest()


def rows(out: str) -> dict[tuple[str, str], list[str]]:
    """The result table: (group, scheme) -> its cells."""
    table: dict[tuple[str, str], list[str]] = {}
    for line in out.splitlines():
        cells = line.split()
        if len(cells) >= 9 and "/" in cells[0] and cells[1] in ("ina", "ring", "hier"):
            table[(cells[0], cells[1])] = cells
    return table


def test_testbed_ina_hier_and_ring_of_1mb_exact(tmp_path: Path) -> None:
    plan = made_plan(tmp_path, "testbed", hier=True)
    out_json = tmp_path / "m.json"
    rc, out, err, tag = run(["emulate", "--plan", str(plan), "--json", str(out_json)], 900)
    assert rc == 0, out + err[-3000:]
    assert "scale: bandwidth / 1000" in out
    got = json.loads(out_json.read_text())
    # The flat INA group on s1, then the hierarchical one (two rails on s2), each beside
    # a ring of the same GPUs.
    assert [m["scheme"] for m in got] == ["ina", "ring", "hier", "ring"]
    for m in got:
        assert m["nbytes"] >= 1 << 20 and m["members"] == 4 and not m["error"]
        assert m["exact"], m
        # Every member's result is the sum NumPy gives for the same data.
        assert m["extra"]["digests"] == [
            numpy_digest(m["extra"]["seed"], m["extra"]["elements"], 4)
        ]
        assert m["max_error"] <= m["error_bound"]
    table = rows(out)
    assert table[("prefill/0/0", "ina")][6] == "yes" and table[("prefill/0/0", "ring")][6] == "yes"
    assert table[("prefill/1/0", "hier")][6] == "yes"
    assert_nothing_left(tag)


@pytest.mark.skipif(
    not (GPU_AGENT.parent / "collnet_harness").exists(), reason="collnet_harness not built"
)
def test_ina_through_the_cxx_plugin_is_exact_beside_the_python_ring(tmp_path: Path) -> None:
    """--ina-client plugin: the hosts' INA all-reduces run through libnccl-net-heroserve.so
    (collnet_harness in each host), two sizes (a fresh session each, the Python workers
    stopped for the plugin and started again for the ring in between)."""
    plan = made_plan(tmp_path, "fig2")
    out_json = tmp_path / "m.json"
    sizes = [64 << 10, 96 << 10]
    rc, out, err, tag = run(
        ["emulate", "--topology", "fig2", "--plan", str(plan), "--ina-client", "plugin",
         "--bytes", ",".join(map(str, sizes)), "--repeat", "2", "--json", str(out_json)]
    )  # fmt: skip
    assert rc == 0, out + err[-3000:]
    assert "INA client: the C++ CollNet plugin" in out
    got = json.loads(out_json.read_text())
    assert [(m["scheme"], m["nbytes"]) for m in got] == [
        ("ina", sizes[0]), ("ring", sizes[0]), ("ina", sizes[1]), ("ring", sizes[1])
    ]  # fmt: skip
    for m in got:
        assert m["exact"] and not m["error"] and m["members"] == 2, m
    for ina in got[0::2]:
        assert ina["extra"]["client"] == "plugin", ina
        assert 0 < ina["max_error"] <= ina["error_bound"], ina
    assert got[2]["extra"]["session"] == (got[0]["extra"]["session"] + 2) % 2**32
    assert_nothing_left(tag)


def bfp16_digest(seed: int, n: int, workers: int) -> tuple[str, float, float]:
    """A bfp16 all-reduce's float64 sums computed here from scratch: per block of 64, the
    largest member exponent E (|x| < 2^E), s = 14 - ceil(log2 w) - E, the int64 sum of every
    member's round(x 2^s), scaled back; their SHA-256, the largest error against the float64
    sum and the documented bound, the largest w / (2 * 2^s) over the blocks. Every block's
    agreed E must differ from some member's own (member 0's data is 100 times the others'),
    or a member scaling by its own exponent would go unnoticed."""
    import hashlib

    xs = [x.astype(float) for x in scratch_data(seed, n, workers)]
    out, bound = np.zeros(n), 0.0
    for b in range(0, n, 64):
        own = [int(np.frexp(np.max(np.abs(x[b : b + 64])))[1]) for x in xs]
        e = max(own)
        assert min(own) < e, own
        s = 14 - (workers - 1).bit_length() - e
        q = sum(np.rint(x[b : b + 64] * 2.0**s).astype(np.int64) for x in xs)
        out[b : b + 64] = q / 2.0**s
        bound = max(bound, workers / (2 * 2.0**s))
    err = float(np.max(np.abs(out - sum(xs))))
    return hashlib.sha256(out.astype("<f8").tobytes()).hexdigest(), err, bound


def test_bfp16_plan_runs_its_flat_ina_in_bfp16_exact(tmp_path: Path) -> None:
    """A plan priced for bfp16 lanes: the flat INA group's members run bfp16 all-reduces
    through the switch (the block exponents agreed in band), each result the exact sum of
    the quantized values at each block's agreed exponent (member 0's data 100 times the
    other's, whose first block is zeros: the agreement is not every member's own exponent),
    within the format's bound; the ring beside it runs int32."""
    plan = made_plan(tmp_path, "fig2", lanes="bfp16")
    out_json = tmp_path / "m.json"
    rc, out, err, tag = run(
        ["emulate", "--topology", "fig2", "--plan", str(plan), "--bytes", str(64 << 10),
         "--json", str(out_json)]
    )  # fmt: skip
    assert rc == 0, out + err[-3000:]
    assert "INA lanes: bfp16 for flat and hierarchical INA groups" in out
    ina, ring = json.loads(out_json.read_text())
    assert (ina["scheme"], ina["extra"]["lanes"]) == ("ina", "bfp16")
    assert ina["exact"] and not ina["error"] and ina["members"] == 2, ina
    seed, n = ina["extra"]["seed"], ina["extra"]["elements"]
    digest, err, bound = bfp16_digest(seed, n, 2)
    assert ina["extra"]["digests"] == [digest]
    assert (ina["max_error"], ina["error_bound"]) == (err, bound)
    assert 0 < err <= bound == 2 / (2 * 2.0 ** (14 - 1 - 7))  # E = 7: 100 x [-1, 1)
    assert ring["exact"] and ring["extra"]["digests"] == [numpy_digest(seed, n, 2)]
    assert_nothing_left(tag)


def hier_bfp16_digest(seed: int, n: int) -> tuple[str, float, float]:
    """A hierarchical bfp16 all-reduce of 2 servers of 2 (data indices 0, 1 on one, 2, 3 on
    the other, in shard order) computed here from scratch: each server's float32 sum, shard
    k = elements [k n / 2, (k + 1) n / 2), per block of 64 of a shard the larger server
    exponent E, s = 14 - 1 - E, the int64 sum of both servers' round(x 2^s), scaled back;
    its SHA-256, the largest error against the float64 sum, and the documented bound: the
    largest 2 / (2 2^s) plus u / (1 - u) (u = 2^-24, one float32 addition per server) times
    the largest sum of |x|. Every block's E must exceed one server's own."""
    import hashlib

    xs = scratch_data(seed, n, 4)
    servers = [(xs[0] + xs[1]).astype(float), (xs[2] + xs[3]).astype(float)]
    out, bound = np.zeros(n), 0.0
    for lo, hi in ((0, n // 2), (n // 2, n)):
        for b in range(lo, hi, 64):
            blk = [x[b : min(b + 64, hi)] for x in servers]
            own = [int(np.frexp(np.max(np.abs(x)))[1]) for x in blk]
            assert min(own) < max(own), own
            s = 14 - 1 - max(own)
            out[b : b + blk[0].size] = (
                sum(np.rint(x * 2.0**s).astype(np.int64) for x in blk) / 2.0**s
            )
            bound = max(bound, 2 / (2 * 2.0**s))
    real = sum(x.astype(float) for x in xs)
    u = 2.0**-24
    bound += u / (1 - u) * float(np.max(sum(np.abs(x.astype(float)) for x in xs)))
    digest = hashlib.sha256(out.astype("<f8").tobytes()).hexdigest()
    return digest, float(np.max(np.abs(out - real))), bound


def test_bfp16_plan_runs_its_hier_ina_in_bfp16_exact(tmp_path: Path) -> None:
    """A testbed plan priced for bfp16 with a hierarchical group (2 servers of 2, both rails
    on s2): its members reduce-scatter float32 over NVLink, each rail sums its 2 server sums
    in bfp16 through the switch, every member's result is the sum worked here from scratch
    and within the documented bound (a quarter of a flat group's of 4: the switch sums 2
    server sums); the flat INA group beside it runs bfp16 too, the rings int32."""
    plan = made_plan(tmp_path, "testbed", hier=True, lanes="bfp16")
    out_json = tmp_path / "m.json"
    rc, out, err, tag = run(
        ["emulate", "--plan", str(plan), "--bytes", str(64 << 10), "--json", str(out_json)]
    )
    assert rc == 0, out + err[-3000:]
    assert "INA lanes: bfp16 for flat and hierarchical INA groups" in out
    ina, ring, hier, ring2 = json.loads(out_json.read_text())
    assert [m["scheme"] for m in (ina, ring, hier, ring2)] == ["ina", "ring", "hier", "ring"]
    assert (ina["extra"]["lanes"], hier["extra"]["lanes"]) == ("bfp16", "bfp16")
    assert all(m["exact"] and not m["error"] for m in (ina, ring, hier, ring2)), (ina, hier)
    seed, n = hier["extra"]["seed"], hier["extra"]["elements"]
    digest, err, bound = hier_bfp16_digest(seed, n)
    assert hier["extra"]["digests"] == [digest]
    assert hier["max_error"] == pytest.approx(err, rel=1e-9)
    assert hier["error_bound"] == pytest.approx(bound, rel=1e-12)
    assert 0 < err <= bound < 2.0**-6 + 1e-5  # E = 7: 100 x [-1, 1), s = 6
    assert ina["error_bound"] == 4 / (2 * 2.0 ** (14 - 2 - 7))
    assert ring2["extra"]["digests"] == [numpy_digest(seed, n, 4)]
    assert_nothing_left(tag)


@pytest.mark.skipif(
    not (GPU_AGENT.parent / "collnet_harness").exists(), reason="collnet_harness not built"
)
def test_bfp16_plan_through_the_cxx_plugin_is_exact(tmp_path: Path) -> None:
    """The same bfp16 plan with --ina-client plugin: the hosts' harnesses get the group's
    ``lane_format`` and check their sums bit for bit against their own bfp16 reference."""
    plan = made_plan(tmp_path, "fig2", lanes="bfp16")
    out_json = tmp_path / "m.json"
    rc, out, err, tag = run(
        ["emulate", "--topology", "fig2", "--plan", str(plan), "--ina-client", "plugin",
         "--bytes", str(64 << 10), "--json", str(out_json)]
    )  # fmt: skip
    assert rc == 0, out + err[-3000:]
    ina, ring = json.loads(out_json.read_text())
    assert (ina["extra"]["client"], ina["extra"]["lanes"]) == ("plugin", "bfp16"), ina
    assert ina["exact"] and ring["exact"] and not ina["error"], (ina, ring)
    assert 0 < ina["max_error"] <= ina["error_bound"], ina
    assert_nothing_left(tag)


def impaired(tmp_path: Path, nbytes: int, *flags: str) -> dict[tuple[str, str], list[str]]:
    plan = made_plan(tmp_path, "fig2")
    rc, out, err, tag = run(
        ["emulate", "--topology", "fig2", "--plan", str(plan), "--bytes", str(nbytes), *flags]
    )
    assert rc == 0, out + err[-3000:]
    assert_nothing_left(tag)
    table = rows(out)
    ina, ring = table[("prefill/0/0", "ina")], table[("prefill/0/0", "ring")]
    assert ina[6] == "yes" and ring[6] == "yes", out
    assert int(ina[7]) > 0, out  # INA retransmissions
    assert int(ring[8]) > 0, out  # TCP retransmissions
    return table


def test_one_percent_loss_exact_with_retransmissions(tmp_path: Path) -> None:
    impaired(tmp_path, 256 << 10, "--loss", "0.01")


@pytest.mark.skipif(
    not EXACTLY_ONCE_SWITCH,
    reason="needs the switch's per-copy generation (dataplane branch)",
)
def test_five_percent_loss_duplication_reordering_exact(tmp_path: Path) -> None:
    impaired(tmp_path, 128 << 10, "--loss", "0.05", "--duplicate", "0.02", "--reorder", "0.1")


def wait_for_line(p: subprocess.Popen, marker: str, stream: str) -> tuple[str, str]:
    """(run tag, what was read) once the command printed ``marker`` on ``stream``: the
    condition to act on. Each read blocks until the command writes; a command that ends
    first fails the test (the line never came)."""
    assert p.stdout is not None and p.stderr is not None
    tag = tag_of(p.stdout.readline())
    seen = ""
    while marker not in seen:
        line = (p.stderr if stream == "stderr" else p.stdout).readline()
        assert line, f"ended before {marker!r}: " + seen[-2000:]
        seen += line
    return tag, seen


def interrupt_after(args: list[str], marker: str) -> tuple[int, str, str]:
    p = start(args)
    try:
        tag, seen = wait_for_line(p, marker, "stderr" if "emulate" in args else "stdout")
    finally:
        p.send_signal(signal.SIGINT)
        finish(p, TEARDOWN_S)
    return p.returncode, seen, tag


def test_emulate_sigint_in_the_middle_leaves_nothing(tmp_path: Path) -> None:
    plan = made_plan(tmp_path, "fig2")
    args = ["emulate", "--topology", "fig2", "--plan", str(plan), "--bytes", str(8 << 20)]
    rc, _, tag = interrupt_after(args, "every agent acknowledged")
    assert rc == 130
    assert_nothing_left(tag)


def test_emulate_error_in_the_middle_leaves_nothing(tmp_path: Path) -> None:
    """The controller refuses the plan's 5000 slots (the switch has 1024) after the network
    is up: one line, status 1, and the network is gone."""
    plan = made_plan(tmp_path, "fig2", slots=5000)
    rc, out, err, tag = run(["emulate", "--topology", "fig2", "--plan", str(plan)])
    assert rc == 1
    assert "heroserve emulate: failed: controller exited" in err
    assert "Traceback" not in err
    assert_nothing_left(tag)


@pytest.mark.skipif(not GPU_AGENT.exists(), reason=f"{GPU_AGENT} not built (make cxx)")
def test_demo_shows_every_agent_acknowledging_and_the_entries(tmp_path: Path) -> None:
    rc, out, err, tag = run(["demo"])
    assert rc == 0, out + err[-3000:]
    acks = re.findall(r"(switch|gpu) +agent (\S+) +acknowledged epoch (\d+)", out)
    assert sorted((k, n) for k, n, _ in acks) == [
        ("gpu", "srv0"),
        ("gpu", "srv1"),
        ("gpu", "srv2"),
        ("gpu", "srv3"),
        ("switch", "s1"),
        ("switch", "s2"),
    ]
    epoch = re.search(r"epoch (\d+), plan", out)
    assert epoch and {e for *_, e in acks} == {epoch.group(1)}
    assert re.search(r"INA group \d+: 128 aggregation entries, slots 0\.\.127", out), out
    # What each GPU agent published, read back as the tuner plugin reads it: the flat
    # group's INA on s1 beside its ring, the hierarchical group's rails on s2.
    seg = (
        r"/dev/shm/heroserve-" + tag + r"-prefill\.{}\.0 +\d+ bytes: group prefill/{}/0 version 1: "
    )
    assert re.search(seg.format(0, 0) + r"ina s1; ring\n", out), out
    assert re.search(seg.format(1, 1) + r"hier s2:0,s2:1; ina s2; ring\n", out), out
    assert "heroserve_agents_connected 6.0" in out
    assert_nothing_left(tag)


def test_demo_sigint_and_error_leave_nothing(tmp_path: Path) -> None:
    rc, _, tag = interrupt_after(["demo", "--topology", "fig2", "--hold", "300"], "holding")
    assert rc == 130
    assert_nothing_left(tag)
    plan = made_plan(tmp_path, "fig2", slots=5000)
    rc, out, err, tag = run(["demo", "--topology", "fig2", "--plan", str(plan)])
    assert rc == 1 and "heroserve demo: failed" in err and "Traceback" not in err
    assert_nothing_left(tag)


def _bmv2_missing() -> str | None:
    missing = [t for t in ("p4c-bm2-ss", "simple_switch_grpc") if shutil.which(t) is None]
    return (
        f"{', '.join(missing)} not on PATH (the P4 toolchain; docs/emulation.md)"
        if missing
        else None
    )


@pytest.mark.skipif(_bmv2_missing() is not None, reason=str(_bmv2_missing()))
def test_bmv2_switch_gives_the_same_exact_allreduces(tmp_path: Path) -> None:
    """BMv2 in the switches' place, same plan."""
    plan = made_plan(tmp_path, "fig2")
    rc, out, err, tag = run(
        ["emulate", "--topology", "fig2", "--plan", str(plan), "--switch", "bmv2",
         "--bytes", str(64 << 10)]
    )  # fmt: skip
    assert rc == 0, out + err[-3000:]
    table = rows(out)
    assert table[("prefill/0/0", "ina")][6] == "yes" and table[("prefill/0/0", "ring")][6] == "yes"
    assert_nothing_left(tag)


def test_demo_killed_with_sigkill_is_swept_by_its_watchdog(tmp_path: Path) -> None:
    """SIGKILL gives the command no teardown: its watchdog (controller/emulate/sweep.py)
    sees the pipe close and sweeps processes, links, segments and the work dir."""
    from controller.emulate.sweep import WORKDIR_PREFIX, dead_runs

    p = start(["demo", "--topology", "fig2", "--hold", "600"])
    try:
        tag, _ = wait_for_line(p, "holding", "stdout")
        workdirs = list(Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}{tag}-*"))
        assert len(workdirs) == 1
        p.kill()
        p.wait(60)
        deadline = time.monotonic() + TEARDOWN_S  # a hang guard: the sweep takes seconds
        while workdirs[0].exists():
            assert time.monotonic() < deadline, "the watchdog did not sweep"
            time.sleep(0.2)
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate()
    assert_nothing_left(tag)
    assert tag not in dead_runs()
