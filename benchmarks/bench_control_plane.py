"""Time from a new plan to acknowledged policies, for 1, 100 and 1,000 simulated agents.

The controller runs as its own process on loopback (``python -m controller.service``, SQLite
in a temporary directory); the agents are asyncio tasks in this process, each a GPU agent
owning one GPU of the plan: register, subscribe, acknowledge every update. Per round the
benchmark applies a new plan (the INA groups' slot ranges move, so every policy table
changes) through the Admin service and measures until every agent has acknowledged it.

    .venv/bin/python benchmarks/bench_control_plane.py [--agents 1 100 1000] [--rounds 5]
        [--profile DIR]   # the controller under cProfile: DIR/controller-<agents>.prof
        [--baseline DIR [--repeats 2]]   # also another checkout's controller, alternating

``--baseline DIR`` runs the controller of another checkout (e.g. ``git worktree add
/tmp/base main``; its stubs are generated if missing) against the same agents, alternating
with this one ``--repeats`` times, and prints the ratio of the medians: the machine is
shared, so only figures taken in the same minutes compare.

Prints, per agent count: plan-to-all-acked time (median and worst over rounds), the
per-agent ack latency (median, p99) of the last round, how long the ApplyPlan call itself
took (median: deriving and committing the plan, before any update is sent), and the
controller process's CPU time per round (user + system, from /proc). Figures
depend on the machine (and on sharing its two cores); they are not asserted anywhere:
compare them with another checkout's in the same minutes (`--baseline DIR`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.proto.heroserve.v1 import control_pb2 as pb  # noqa: E402
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc  # noqa: E402
from controller.service.sample import sample_plan, save_sample_topology  # noqa: E402

WORKERS = 4
AGENTS_PER_CHANNEL = 100


def _shape(n_agents: int) -> dict:
    groups = max(1, -(-n_agents // WORKERS))
    switches = tuple(f"s{i}" for i in range(1, 1 + max(1, groups // 32)))
    return {"ina_groups": groups, "workers": WORKERS, "ring_groups": 0, "switches": switches}


def plan_json(n_agents: int, round_: int) -> str:
    p = sample_plan(**_shape(n_agents))
    for g in p.prefill.groups:  # move every group's slots: every table and assignment changes
        assert g.slots is not None
        g.slots.count = 4 + round_ % 4
    p.notes.append(f"round {round_}")
    return p.to_json()


async def agent(
    ch: grpc.aio.Channel, gpu: str, acked: dict[int, dict[str, float]], ready: asyncio.Event
) -> None:
    stub = pb_grpc.ControlStub(ch)
    ident = pb.NodeIdentity(node_id=gpu, kind=pb.NODE_KIND_GPU)
    reg = await stub.Register(
        pb.RegisterRequest(identity=ident, gpu=pb.GpuInventory(gpus=[pb.GpuInfo(gpu_id=gpu)]))
    )
    call = stub.Subscribe(pb.SubscribeRequest(identity=ident, session_id=reg.session_id))
    async for upd in call:
        await stub.Ack(
            pb.AckRequest(identity=ident, session_id=reg.session_id, epoch=upd.epoch, ok=True)
        )
        acked.setdefault(upd.epoch, {})[gpu] = time.perf_counter()
        ready.set()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (Linux /proc): less sensitive than wall time
    to what else shares the machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(n: int, rounds: int, port: int, pid: int) -> dict[str, float]:
    chans = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(-(-n // AGENTS_PER_CHANNEL))
    ]
    gpus = [f"p{i // WORKERS}-g{i % WORKERS}" for i in range(n)]
    acked: dict[int, dict[str, float]] = {}
    ready = asyncio.Event()
    tasks = [
        asyncio.create_task(agent(chans[i // AGENTS_PER_CHANNEL], g, acked, ready))
        for i, g in enumerate(gpus)
    ]
    admin = pb_grpc.AdminStub(chans[0])
    first = (await admin.GetState(pb.GetStateRequest())).epoch
    while len(acked.get(first, {})) < n:  # everyone connected and acked the initial state
        await asyncio.sleep(0.01)
    totals, per_agent, applies = [], [], []
    cpu0 = cpu_seconds(pid)
    for r in range(1, rounds + 1):
        text = plan_json(n, r)
        t0 = time.perf_counter()
        epoch = (await admin.ApplyPlan(pb.ApplyPlanRequest(plan_json=text))).epoch
        applies.append(time.perf_counter() - t0)
        while len(acked.get(epoch, {})) < n:
            await asyncio.sleep(0.0005)
        times = sorted(t - t0 for t in acked[epoch].values())
        totals.append(times[-1])
        per_agent = times
    cpu = (cpu_seconds(pid) - cpu0) / rounds
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in chans:
        await c.close()
    return {
        "apply_median_ms": statistics.median(applies) * 1e3,
        "controller_cpu_ms": cpu * 1e3,
        "all_acked_median_ms": statistics.median(totals) * 1e3,
        "all_acked_worst_ms": max(totals) * 1e3,
        "agent_median_ms": statistics.median(per_agent) * 1e3,
        "agent_p99_ms": per_agent[min(len(per_agent) - 1, int(0.99 * len(per_agent)))] * 1e3,
    }


async def bench(
    n: int, rounds: int, tmp: Path, profile: Path | None, root: Path = ROOT
) -> dict[str, float]:
    """One controller process (the checkout at ``root``) against ``n`` agents."""
    plan, port_file = tmp / "plan.json", tmp / "port"
    plan.write_text(plan_json(n, 0))
    topo = save_sample_topology(tmp / "topology.json", **_shape(n))  # the plan's cluster
    log = open(tmp / "controller.log", "wb")  # noqa: SIM115 - closed below
    prof = ["-m", "cProfile", "-o", str(profile / f"controller-{n}.prof")] if profile else []
    proc = subprocess.Popen(
        [
            sys.executable,
            *prof,
            "-m",
            "controller.service",
            "--db",
            str(tmp / "c.db"),
            "--plan",
            str(plan),
            "--topology",
            str(topo),
            "--listen",
            "127.0.0.1:0",
            "--port-file",
            str(port_file),
            "--log-level",
            "WARNING",
        ],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"controller did not start: {(tmp / 'controller.log').read_text()}"
                )
            await asyncio.sleep(0.05)
        return await run(n, rounds, int(port_file.read_text()), proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


async def bench_all(
    agents: list[int], rounds: int, profile: Path | None, baseline: Path | None, repeats: int
) -> None:
    runs = [("this", ROOT)] if baseline is None else [("baseline", baseline), ("this", ROOT)]
    label = "" if baseline is None else f"{'checkout':>9} "
    print(
        f"{label}{'agents':>7} {'all acked ms (median)':>22} {'(worst)':>9} "
        f"{'agent ms (median)':>18} {'(p99)':>8} {'ApplyPlan ms (median)':>22} "
        f"{'controller CPU ms/round':>24}",
        flush=True,
    )
    for n in agents:
        medians: dict[str, list[float]] = {name: [] for name, _ in runs}
        cpus: dict[str, list[float]] = {name: [] for name, _ in runs}
        for _ in range(repeats if baseline is not None else 1):
            for name, root in runs:
                with tempfile.TemporaryDirectory() as tmp:
                    res = await bench(n, rounds, Path(tmp), profile, root)
                medians[name].append(res["all_acked_median_ms"])
                cpus[name].append(res["controller_cpu_ms"])
                tag = "" if baseline is None else f"{name:>9} "
                print(
                    f"{tag}{n:>7} {res['all_acked_median_ms']:>22.1f} "
                    f"{res['all_acked_worst_ms']:>9.1f} {res['agent_median_ms']:>18.1f} "
                    f"{res['agent_p99_ms']:>8.1f} {res['apply_median_ms']:>22.1f} "
                    f"{res['controller_cpu_ms']:>24.1f}",
                    flush=True,
                )
        if baseline is not None:
            ratio = statistics.median(medians["this"]) / statistics.median(medians["baseline"])
            cpu = statistics.median(cpus["this"]) / statistics.median(cpus["baseline"])
            print(
                f"{'ratio':>9} {n:>7} this / baseline: all acked (median) {ratio:.2f}, "
                f"controller CPU {cpu:.2f}"
            )


def _prepare_baseline(root: Path) -> None:
    if not (root / "controller" / "service").is_dir():
        raise SystemExit(f"bench_control_plane: --baseline {root} is not a checkout")
    if not (root / "controller" / "_gen").is_dir():
        subprocess.run(
            [sys.executable, "-m", "proto.build_proto"],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
            check=True,
            stdout=subprocess.DEVNULL,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, nargs="+", default=[1, 100, 1000])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", type=Path, help="write the controller's cProfile data here")
    ap.add_argument("--baseline", type=Path, help="another checkout to compare with")
    ap.add_argument("--repeats", type=int, default=2, help="alternations with --baseline")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1 or any(n < 1 for n in args.agents):
        print("bench_control_plane: --rounds, --repeats, --agents must be >= 1", file=sys.stderr)
        return 2
    if args.baseline is not None:
        _prepare_baseline(args.baseline.resolve())
    logging.basicConfig(level=logging.ERROR)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    baseline = args.baseline.resolve() if args.baseline is not None else None
    asyncio.run(bench_all(args.agents, args.rounds, args.profile, baseline, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
