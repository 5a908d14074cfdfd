"""libnccl-net-heroserve.so's CollNet against the executable switch model, without a GPU.

Each rank is a process of csrc/tests/collnet_harness.cc, which loads the library with dlopen and
calls the CollNet API in the order NCCL's proxy does (init, devices, getProperties,
reduceSupport, listen, handle exchange, connect, closeListen, regMr, iallreduce in slices with
several outstanding, test, iflush, deregMr, closeColl, finalize) and checks every result bit for
bit against a host reference. The switch is the P4 program's model (agents/softswitch/pipeline.py)
behind a UDP socket on loopback (agents/ina/loopback.py), with netem-style loss, duplication and
reordering (agents/ina/impairments.py).

The library and harness come from the CMake build: $HEROSERVE_CSRC_BUILD, else build/csrc
(`make cxx`); the tests skip, saying so, when they are not built.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import CSRC_BUILD
from support.waiting import wait_for

from agents.ina.impairments import Impairments
from agents.ina.loopback import LoopbackSwitch

ROOT = Path(__file__).resolve().parents[3]
BUILD = CSRC_BUILD
LIB = BUILD / "libnccl-net-heroserve.so"
HARNESS = BUILD / "collnet_harness"

pytestmark = pytest.mark.skipif(
    not (LIB.exists() and HARNESS.exists()),
    reason=f"{LIB.name} / collnet_harness not built in {BUILD} (make cxx, or set "
    "HEROSERVE_CSRC_BUILD)",
)

EXACT_TYPES = ["int8", "uint8", "int32", "uint32"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Rank:
    proc: subprocess.Popen[str]
    events: list[dict] = field(default_factory=list)
    stderr: str = ""
    rc: int | None = None

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == kind]


@dataclass
class Group:
    group_id: int
    n: int
    window: int = 16
    session: int = 0xC0FFEE
    first_generation: int = 0xFFFFFFF0  # crosses the 32-bit generation wrap
    give_up_s: float = 3.0
    ports: list[int] = field(default_factory=list)
    config: dict = field(default_factory=dict)  # more fields of each entry (float_sums)


def start_group(
    sw: LoopbackSwitch,
    g: Group,
    tmp: Path,
    args: list[str],
    *,
    first_switch_port: int = 1,
    per_rank: dict[int, list[str]] | None = None,
) -> list[Rank]:
    """Installs the group on the switch, writes each rank's HEROSERVE_INA_CONFIG and starts
    the ranks."""
    g.ports = [free_port() for _ in range(g.n)]
    sw_ports = [first_switch_port + i for i in range(g.n)]
    sw.add_group(g.group_id, g.window, sw_ports)
    for i, p in enumerate(g.ports):
        sw.register(sw_ports[i], ("127.0.0.1", p))
    d = tmp / f"group{g.group_id}"
    d.mkdir()
    ranks = []
    for r in range(g.n):
        cfg = d / f"ina{r}.json"
        entry = {
            "group_id": g.group_id,
            "num_workers": g.n,
            "worker_id": r,
            "window": g.window,
            "switch_ip": sw.address[0],
            "switch_port": sw.address[1],
            "session": g.session,
            "first_generation": g.first_generation,
            "bind_ip": "127.0.0.1",
            "bind_port": g.ports[r],
            "give_up_s": g.give_up_s,
            "initial_rto_s": 0.05,
            "min_rto_s": 0.01,
            "max_rto_s": 0.4,
            **g.config,
        }
        cfg.write_text(json.dumps({"groups": [entry]}))
        env = dict(os.environ, HEROSERVE_INA_CONFIG=str(cfg))
        cmd = [str(HARNESS), "--lib", str(LIB), "--dir", str(d), "--rank", str(r)]
        cmd += ["--nranks", str(g.n), *args, *(per_rank or {}).get(r, [])]
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        ranks.append(Rank(proc))
    return ranks


def finish(ranks: list[Rank], timeout_s: float = 120.0) -> list[Rank]:
    deadline = time.monotonic() + timeout_s
    for rk in ranks:
        try:
            out, err = rk.proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rk.proc.kill()
            out, err = rk.proc.communicate()
            pytest.fail(f"a rank hung: {err[-2000:]}")
        rk.rc, rk.stderr = rk.proc.returncode, err
        rk.events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return ranks


def results_table(ranks: list[Rank]) -> list[tuple[str, int, bool, float]]:
    rows = []
    for e in ranks[0].of("result"):
        same = [
            x
            for rk in ranks
            for x in rk.of("result")
            if (x["type"], x["bytes"]) == (e["type"], e["bytes"])
        ]
        rows.append(
            (e["type"], e["bytes"], all(x["exact"] for x in same), max(x["seconds"] for x in same))
        )
    return rows


def print_table(title: str, n: int, loss: str, rows: list[tuple[str, int, bool, float]]) -> None:
    print(f"\n{title}: {n} ranks, loss {loss}")
    print(f"{'type':>8} {'bytes':>9} {'exact':>6} {'seconds':>8}")
    for t, b, ok, s in rows:
        print(f"{t:>8} {b:>9} {ok!s:>6} {s:>8.3f}")


def test_exact_sums_for_every_accepted_type_and_size(tmp_path: Path) -> None:
    sizes = [4, 100, 4096, 65536]
    with LoopbackSwitch() as sw:
        g = Group(group_id=11, n=4, window=32)
        ranks = finish(
            start_group(
                sw,
                g,
                tmp_path,
                ["--types", ",".join(EXACT_TYPES), "--sizes", ",".join(map(str, sizes))],
            )
        )
    for rk in ranks:
        assert rk.rc == 0, rk.stderr[-3000:]
        assert rk.of("refuses_device_memory") == [{"event": "refuses_device_memory", "ok": True}]
        support = rk.of("support")[0]["supported"]
        assert support == [f"{t}/sum" for t in EXACT_TYPES], support
        # NULL: NCCL never picks CollNet for AllGather / ReduceScatter (csrc/README.md)
        assert rk.of("optional")[0] == {
            "event": "optional",
            "iallgather": False,
            "ireducescatter": False,
        }
    rows = results_table(ranks)
    print_table("CollNet v12 over the switch model", g.n, "0", rows)
    assert len(rows) == len(EXACT_TYPES) * len(sizes)
    assert all(ok for _, _, ok, _ in rows)


@pytest.mark.slow
def test_exact_sums_of_a_few_mebibytes(tmp_path: Path) -> None:
    with LoopbackSwitch() as sw:
        g = Group(group_id=12, n=4, window=64, give_up_s=10.0)
        ranks = finish(
            start_group(
                sw,
                g,
                tmp_path,
                [
                    "--types",
                    "int32",
                    "--sizes",
                    str(2 << 20),
                    "--slice",
                    str(256 << 10),
                    "--outstanding",
                    "8",
                ],
            ),
            timeout_s=300,
        )
    for rk in ranks:
        assert rk.rc == 0, rk.stderr[-3000:]
    rows = results_table(ranks)
    print_table("CollNet v12, 2 MiB", g.n, "0", rows)
    assert rows and all(ok for _, _, ok, _ in rows)


def test_v8_abi_is_exact_too(tmp_path: Path) -> None:
    with LoopbackSwitch() as sw:
        g = Group(group_id=13, n=3, window=8)
        ranks = finish(
            start_group(
                sw,
                g,
                tmp_path,
                ["--version", "8", "--types", "int32,uint8", "--sizes", "4,1000,20000"],
            )
        )
    for rk in ranks:
        assert rk.rc == 0, rk.stderr[-3000:]
    rows = results_table(ranks)
    print_table("CollNet v8 over the switch model", g.n, "0", rows)
    assert len(rows) == 6 and all(ok for _, _, ok, _ in rows)


def test_exact_under_loss_duplication_and_reordering(tmp_path: Path) -> None:
    impair = Impairments(loss=0.03, duplicate=0.03, reorder=0.2)
    with LoopbackSwitch(impair, delay_s=0.001, seed=7) as sw:
        g = Group(group_id=14, n=4, window=16, give_up_s=10.0)
        ranks = finish(
            start_group(sw, g, tmp_path, ["--types", "int32,int8", "--sizes", "4,4096,131072"])
        )
        lost = sw.stats.lost
    for rk in ranks:
        assert rk.rc == 0, rk.stderr[-3000:]
    rows = results_table(ranks)
    print_table("CollNet v12, impaired", g.n, "3% (+3% dup, 20% reorder)", rows)
    assert all(ok for _, _, ok, _ in rows)
    stats = [rk.of("stats")[0] for rk in ranks]
    assert lost > 0
    assert sum(s["retransmissions"] for s in stats) > 0


def test_two_communicators_at_once_are_isolated(tmp_path: Path) -> None:
    with LoopbackSwitch() as sw:
        a = Group(group_id=21, n=2, window=8, session=1001)
        b = Group(group_id=22, n=2, window=8, session=1002)
        args = ["--types", "int32", "--sizes", "4,65536", "--seed"]
        ra = start_group(sw, a, tmp_path, [*args, "5"], first_switch_port=1)
        rb = start_group(sw, b, tmp_path, [*args, "6"], first_switch_port=3)
        ranks = finish(ra + rb)
    for rk in ranks:
        assert rk.rc == 0, rk.stderr[-3000:]
        assert all(e["exact"] for e in rk.of("result"))
        assert rk.of("stats")[0]["foreign"] == 0


def test_stopped_switch_fails_cleanly_within_the_timeout(tmp_path: Path) -> None:
    """Every rank connects (one join round through the switch), then the switch stops, then
    the ranks all-reduce: each fails with ncclRemoteError after its give-up time, no hang.
    The steps follow each other on conditions (files the ranks write), never on a clock."""
    g = Group(group_id=31, n=2, window=8, give_up_s=1.5)
    d = tmp_path / f"group{g.group_id}"
    with LoopbackSwitch() as sw:
        ranks = start_group(
            sw, g, tmp_path, ["--types", "int32", "--sizes", "65536", "--wait-for-go"]
        )
        wait_for(
            "every rank connected",
            lambda: (
                all((d / f"connected.{r}").exists() for r in range(g.n))
                or any(rk.proc.poll() is not None for rk in ranks)
            ),
        )
    (d / "go").write_text("1")  # the switch has stopped
    ranks = finish(ranks, timeout_s=60)
    for rk in ranks:
        assert rk.rc == 3, rk.stderr[-3000:]
        assert rk.of("connected"), "the switch stopped before the ranks connected"
        err = rk.of("error")[0]
        assert err["stage"] == "allreduce"
        assert err["rc"] == 6  # ncclRemoteError
        # bounded: not before the give-up time, and far from a hang (the slack is for a
        # loaded machine, not a measurement)
        assert g.give_up_s <= err["seconds"] + 1.0 < g.give_up_s + 20.0, err
        assert "no result from the switch" in rk.stderr


def test_a_rank_that_never_joins_fails_connect_within_the_timeout(tmp_path: Path) -> None:
    g = Group(group_id=32, n=3, window=4, give_up_s=1.5)
    with LoopbackSwitch() as sw:
        ranks = finish(
            start_group(
                sw,
                g,
                tmp_path,
                ["--types", "int32", "--sizes", "4"],
                per_rank={2: ["--leave-after-listen"]},
            ),
            timeout_s=120,
        )
    assert ranks[2].rc == 0 and ranks[2].of("left")
    for rk in ranks[:2]:
        assert rk.rc == 3, rk.stderr[-3000:]
        err = rk.of("error")[0]
        assert err["stage"] == "connect"
        assert err["rc"] == 6
        assert g.give_up_s <= err["seconds"] < g.give_up_s + 20.0, err  # bounded, not measured


def test_no_config_disables_collnet_only(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HEROSERVE_INA_CONFIG"}
    p = subprocess.run(
        [str(HARNESS), "--lib", str(LIB), "--dir", str(tmp_path), "--rank", "0", "--nranks", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 3
    err = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")][-1]
    assert err["stage"] == "init" and err["rc"] == 5  # ncclInvalidUsage: NCCL disables CollNet
    assert "HEROSERVE_INA_CONFIG is not set" in p.stderr


FLOAT_TYPES = ["float32", "float16", "bfloat16"]


def float_table(title: str, n: int, ranks: list[Rank]) -> list[dict]:
    rows = [e for e in ranks[0].of("result") if e["type"] in FLOAT_TYPES]
    print(f"\n{title}: {n} ranks, normal(0,1) data with 0.1% outliers x50")
    print(
        f"{'type':>9} {'bytes':>8} {'exact':>6} {'max|sum|':>9} {'max err':>10} {'rms err':>10}"
        f" {'type max':>10} {'type rms':>10} {'s':>3} {'seconds':>8}"
    )
    for e in rows:
        same = [
            x
            for rk in ranks
            for x in rk.of("result")
            if (x["type"], x["bytes"]) == (e["type"], e["bytes"])
        ]
        print(
            f"{e['type']:>9} {e['bytes']:>8} {all(x['exact'] for x in same)!s:>6}"
            f" {e['max_abs_sum']:>9.4g} {e['max_err']:>10.3g} {e['rms_err']:>10.3g}"
            f" {e['best_max_err']:>10.3g} {e['best_rms_err']:>10.3g} {e['scale_exp']:>3}"
            f" {max(x['seconds'] for x in same):>8.3f}"
        )
    return rows


@pytest.mark.parametrize("n", [4, 8])
def test_float_sums_when_the_group_opts_in(tmp_path: Path, n: int) -> None:
    """float32/float16/bfloat16 through int32 lanes with an agreed exponent: the plugin's
    result equals the harness's own quantized reference bit for bit, and the error against
    the float64 sum is what csrc/README.md's table says."""
    sizes = [4, 1000, 65536] if n == 4 else [65536]
    with LoopbackSwitch() as sw:
        g = Group(group_id=41 + n, n=n, window=32, give_up_s=10.0, config={"float_sums": True})
        ranks = finish(
            start_group(
                sw,
                g,
                tmp_path,
                [
                    "--types",
                    ",".join(FLOAT_TYPES + ["int32"]),
                    "--sizes",
                    ",".join(map(str, sizes)),
                ],
            ),
            timeout_s=240,
        )
    for rk in ranks:
        assert rk.rc == 0, rk.stderr[-3000:]
        support = rk.of("support")[0]["supported"]
        assert support == [f"{t}/sum" for t in EXACT_TYPES[:4]] + [
            "float16/sum",
            "float32/sum",
            "bfloat16/sum",
        ], support
        assert all(e["exact"] for e in rk.of("result"))
    rows = float_table("CollNet v12 float sums", n, ranks)
    assert len(rows) == len(FLOAT_TYPES) * len(sizes)
    for e in rows:
        # lanes.py's bound on the fixed point (w / 2^(s+1)) plus the final rounding to the
        # type, which the best possible result in that type also pays.
        assert e["max_err"] <= n * 2.0 ** (-e["scale_exp"] - 1) + 2 * e["best_max_err"] + 1e-12


def test_float_data_that_cannot_travel_fails_that_all_reduce_on_every_member(
    tmp_path: Path,
) -> None:
    """One member's data holds infinity: the agreement round tells every member, all of them
    skip the data (their rounds stay numbered alike) and fail that all-reduce with
    ncclInvalidArgument, not the session's ncclRemoteError, and without waiting."""
    with LoopbackSwitch() as sw:
        g = Group(group_id=51, n=3, window=8, config={"float_sums": True})
        ranks = finish(
            start_group(
                sw,
                g,
                tmp_path,
                ["--types", "float32", "--sizes", "65536", "--outlier-rate", "0.01"],
                per_rank={1: ["--outlier-mag", "inf"]},
            ),
            timeout_s=60,
        )
    for rk in ranks:
        assert rk.rc == 3, rk.stderr[-3000:]
        err = rk.of("error")[0]
        assert err["stage"] == "allreduce" and err["rc"] == 4, err  # ncclInvalidArgument
        assert err["seconds"] < 2.0
        assert "not finite" in rk.stderr


def test_float_sums_stay_off_unless_every_entry_opts_in(tmp_path: Path) -> None:
    with LoopbackSwitch() as sw:
        g = Group(group_id=52, n=2, window=4, config={"float_sums": False})
        ranks = finish(start_group(sw, g, tmp_path, ["--types", "int32", "--sizes", "4"]))
    for rk in ranks:
        assert rk.rc == 0, rk.stderr[-3000:]
        assert rk.of("support")[0]["supported"] == [f"{t}/sum" for t in EXACT_TYPES]
