"""libnccl-net-heroserve.so's point-to-point net (ncclNetPlugin_v8..v12), without a GPU.

NCCL reads a library's CollNet only when the same library exports a net, and then that net
carries the communicator's point-to-point traffic (csrc/README.md). Each rank is a process of
csrc/tests/net_harness.cc: dlopen, init, devices, getProperties, listen, handle exchange
through files, connect/accept called in turn until both return a comm (as NCCL's proxy does),
isend/irecv/test around a ring with receive buffers larger than the messages, exact bytes
and reported sizes checked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from support import CSRC_BUILD

ROOT = Path(__file__).resolve().parents[3]
BUILD = CSRC_BUILD
LIB = BUILD / "libnccl-net-heroserve.so"
HARNESS = BUILD / "net_harness"

pytestmark = pytest.mark.skipif(
    not (LIB.exists() and HARNESS.exists()),
    reason=f"{LIB.name} / net_harness not built in {BUILD} (make cxx, or set HEROSERVE_CSRC_BUILD)",
)

VERSIONS = [8, 9, 10, 11, 12]


def run_ring(
    tmp: Path,
    n: int,
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    per_rank: dict[int, list[str]] | None = None,
    timeout_s: float = 120,
    ranks: list[int] | None = None,
) -> list[tuple[int, list[dict], str]]:
    tmp.mkdir(parents=True, exist_ok=True)
    procs = []
    for r in ranks if ranks is not None else range(n):
        cmd = [str(HARNESS), "--lib", str(LIB), "--dir", str(tmp), "--rank", str(r)]
        cmd += ["--nranks", str(n), *args, *(per_rank or {}).get(r, [])]
        procs.append(
            subprocess.Popen(
                cmd,
                env=dict(os.environ, **(env or {})),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    out = []
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
            pytest.fail(f"a rank hung: {e[-2000:]}")
        out.append((p.returncode, [json.loads(x) for x in o.splitlines() if x.startswith("{")], e))
    return out


def of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e.get("event") == kind]


def test_exports_both_net_and_collnet_symbols() -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils)")
    out = subprocess.run(
        [nm, "-D", "--defined-only", str(LIB)], capture_output=True, text=True, check=True
    ).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    for v in VERSIONS:
        assert f"ncclNetPlugin_v{v}" in names
        assert f"ncclCollNetPlugin_v{v}" in names
    assert names - {f"ncclNetPlugin_v{v}" for v in VERSIONS} - {
        f"ncclCollNetPlugin_v{v}" for v in VERSIONS
    } == {"heroserveCollNetStats"}


@pytest.mark.parametrize("version", VERSIONS)
def test_ring_is_exact_for_every_version(tmp_path: Path, version: int) -> None:
    sizes = [0, 1, 4095, 65536, 1 << 20]
    if version == 12:
        sizes.append(4 << 20)
    res = run_ring(tmp_path, 3, ["--version", str(version), "--sizes", ",".join(map(str, sizes))])
    print(f"\nnet v{version}: 3 ranks in a ring, 4 messages per size, receive buffers +4096 B")
    print(f"{'bytes':>9} {'exact':>6} {'seconds':>8} {'MiB/s':>8}")
    for rc, events, err in res:
        assert rc == 0, err[-3000:]
        props = of(events, "props")
        assert props and props[0]["ndev"] >= 1  # NCCL disables the library on 0 devices
        assert all(p["ptrSupport"] == 1 and p["maxRecvs"] == 1 for p in props)
        assert of(events, "refuses_device_memory")[0]["ok"] is True
        results = of(events, "result")
        assert [r["bytes"] for r in results] == sizes
        assert all(r["exact"] for r in results), results
    for r in of(res[0][1], "result"):
        print(f"{r['bytes']:>9} {r['exact']!s:>6} {r['seconds']:>8.4f} {r['mib_per_s']:>8.1f}")


def test_devices_are_the_nics_the_ina_config_names(tmp_path: Path) -> None:
    cfg = tmp_path / "ina.json"
    cfg.write_text(
        json.dumps(
            {
                "groups": [
                    {
                        "group_id": 5,
                        "num_workers": 2,
                        "worker_id": 0,
                        "window": 4,
                        "switch_ip": "127.0.0.1",
                        "session": 1,
                        "first_generation": 0,
                        "bind_ip": "127.0.0.1",
                    }
                ]
            }
        )
    )
    res = run_ring(
        tmp_path / "ring", 2, ["--sizes", "100,70000"], env={"HEROSERVE_INA_CONFIG": str(cfg)}
    )
    for rc, events, err in res:
        assert rc == 0, err[-3000:]
        props = of(events, "props")
        assert [p["name"] for p in props] == ["lo"]
        assert all(r["exact"] for r in of(events, "result"))


def test_a_peer_that_closes_is_an_error_not_a_hang(tmp_path: Path) -> None:
    res = run_ring(
        tmp_path,
        2,
        ["--sizes", "65536"],
        per_rank={1: ["--close-after-connect"]},
        timeout_s=60,
    )
    rc1, ev1, _ = res[1]
    assert rc1 == 0 and of(ev1, "left")
    rc0, ev0, err0 = res[0]
    assert rc0 == 3, err0[-3000:]
    e = of(ev0, "error")[0]
    # at test(), or at the next post once the comm has failed: an error either way
    assert e["stage"] in ("data", "irecv", "isend") and e["rc"] == 6  # ncclRemoteError
    assert e["seconds"] < 30.0  # an error, far from a hang (slack for a loaded machine)
    assert "closed the connection" in err0 or "peer gone" in err0


def test_accept_and_connect_without_a_peer_give_up_within_the_timeout(tmp_path: Path) -> None:
    env = {"HEROSERVE_NET_CONNECT_TIMEOUT_S": "1.5"}
    # Rank 1 listens and accepts, nobody connects: accept gives up.
    ((rc, ev, err),) = run_ring(
        tmp_path, 2, ["--accept-only"], env=env, per_rank={}, timeout_s=120, ranks=[1]
    )
    assert rc == 3, err[-3000:]
    e = of(ev, "error")[0]
    assert e["stage"] == "accept" and e["rc"] == 6
    assert 1.5 <= e["seconds"] < 30.0, e  # bounded, not measured
    # Its listener is closed now; rank 0 connects to that handle: refused until the timeout.
    ((rc, ev, err),) = run_ring(tmp_path, 2, ["--sizes", "4"], env=env, timeout_s=120, ranks=[0])
    assert rc == 3, err[-3000:]
    e = of(ev, "error")[0]
    # connect is refused until its deadline; its own accept (nobody connects to rank 0
    # either) has the same bound: whichever gives up first
    assert e["stage"] in ("connect", "accept") and e["rc"] == 6
    assert 1.5 <= e["seconds"] < 30.0, e  # bounded, not measured
