"""``heroserve emulate`` and ``heroserve demo`` (docs/emulation.md).

Both bring up the same emulated cluster (controller/emulate/cluster.py) on this machine and
take it down on exit, on an error or on Ctrl-C. ``emulate`` runs the plan's all-reduces
between the hosts and compares INA with ring, measured and predicted; ``demo`` shows the
policies arriving at the agents. Bad input: one line naming the problem and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from controller.errors import InputError

log = logging.getLogger("heroserve.emulate")

MAX_BYTES = 64 << 20
DEFAULT_SLOWDOWN = 1000.0


def _probability(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
    if not (math.isfinite(v) and 0.0 <= v < 1.0):
        raise argparse.ArgumentTypeError(f"{s} is not a probability in [0, 1)")
    return v


def _bounded(kind: type, lo: float, hi: float):
    name = "an integer" if kind is int else "a number"

    def parse(s: str):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not {name}") from None
        if not (lo <= v <= hi):  # also refuses NaN
            raise argparse.ArgumentTypeError(f"{s} is outside [{kind(lo)}, {kind(hi)}]")
        return v

    return parse


def common_args(p: argparse.ArgumentParser) -> None:
    from agents.logs import add_log_args

    add_log_args(p)
    p.add_argument(
        "--topology",
        default="testbed",
        help="testbed | fig2 | a .yaml/.json topology file (default: testbed)",
    )
    p.add_argument(
        "--plan",
        metavar="PLAN.json",
        help="plan to apply (default: one made for the emulation, with an INA group)",
    )
    p.add_argument(
        "--switch",
        choices=("model", "bmv2"),
        default="model",
        help="model: the executable P4 switch; bmv2: simple_switch_grpc (p4c and BMv2 on "
        "PATH) (default: model)",
    )
    p.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep the run's working directory (every process's log) and print where",
    )
    p.add_argument(
        "--window",
        type=_bounded(int, 1, 1024),
        default=128,
        help="aggregator slots of each INA group of the made plan (default: 128)",
    )


def emulate_args(p: argparse.ArgumentParser) -> None:
    common_args(p)
    p.add_argument(
        "--bytes",
        type=_sizes,
        default=[1 << 20],
        metavar="N[,N...]",
        help="all-reduce message(s), bytes of int32 lanes (default: 1048576)",
    )
    p.add_argument(
        "--slowdown",
        type=_bounded(float, 1.0, 1e9),
        default=DEFAULT_SLOWDOWN,
        help="bandwidth of every link divided by this (default: 1000: 100 Gb/s -> 100 Mb/s)",
    )
    p.add_argument("--loss", type=_probability, default=0.0, help="per packet, host NIC links")
    p.add_argument("--duplicate", type=_probability, default=0.0, help="per packet, as --loss")
    p.add_argument("--reorder", type=_probability, default=0.0, help="per packet, as --loss")
    p.add_argument(
        "--repeat", type=_bounded(int, 1, 100), default=1, help="all-reduces per measurement"
    )
    p.add_argument("--seed", type=_bounded(int, 0, 2**31), default=1, help="data and impairments")
    p.add_argument(
        "--json", metavar="PATH", help="also write the measurements here (JSON, seconds)"
    )


def demo_args(p: argparse.ArgumentParser) -> None:
    common_args(p)
    p.add_argument(
        "--hold",
        type=_bounded(float, 0.0, 86400.0),
        default=0.0,
        help="seconds to keep the cluster up after showing it; Ctrl-C ends it (default: 0)",
    )


# -- shared set-up -------------------------------------------------------------------------
def _needs_root() -> None:
    if os.geteuid() != 0:
        raise InputError("the emulation needs root (network namespaces, raw sockets)")


def _hier_accepted() -> bool:
    """Whether this controller installs hierarchical groups (its plan check says so)."""
    from controller.plan import Group, Rail
    from controller.service.admission import validate
    from controller.service.sample import sample_plan

    probe = Group(0, 0, ["a", "b"], "hier", None, None, {}, 0.0, None, 0.0, "probe")
    probe.rails = [Rail("s", 0, 1, ["a", "b"], None, {"a": ["a", "s"], "b": ["b", "s"]})]
    plan = sample_plan(ina_groups=0, ring_groups=1, workers=2)
    plan.decode.groups[0] = probe
    try:
        validate(plan)
    except InputError:
        return False
    return True


def _setup(a: argparse.Namespace, slowdown: float) -> tuple[Any, Any, Any, list[str]]:
    from controller.emulate.plans import check_plan, emulation_plan
    from controller.emulate.spec import network_spec
    from controller.inputs.plan_checks import load_plan
    from controller.service.admission import validate
    from controller.topology import resolve_topology

    _needs_root()
    g = resolve_topology(a.topology)
    spec = network_spec(g, slowdown)
    notes: list[str] = []
    if a.plan:
        try:
            plan = load_plan(a.plan)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"--plan {a.plan}: not a plan ({type(exc).__name__}: {exc})") from None
    else:
        hier = _hier_accepted()
        plan = emulation_plan(g, window=a.window, hier=hier)
        notes.append(
            "plan: made for the emulation (heroserve plan may choose no INA group here)"
            + ("" if hier else "; no hierarchical group: this controller does not install them")
        )
    try:
        validate(plan)
    except InputError as exc:
        raise InputError(f"the controller would refuse the plan: {exc}") from None
    check_plan(plan, g, spec)
    return g, spec, plan, notes


def _cluster(a: argparse.Namespace, g: Any, spec: Any, plan: Any, impair: Any = None) -> Any:
    from controller.emulate.cluster import Cluster, ClusterOptions

    opts = ClusterOptions(
        switch_kind=a.switch,
        impair=impair,
        impair_seed=getattr(a, "seed", 0),
        keep_workdir=a.keep_logs,
    )
    return Cluster(g, a.topology, spec, plan, opts)


def _report_leftovers(tag: str) -> int:
    from controller.emulate.cluster import leftovers

    left = leftovers(tag)
    if any(left.values()):
        print(f"left behind (please report): {left}", file=sys.stderr)
        return 1
    print(f"torn down: no namespace, interface, process or shared memory of {tag} left")
    return 0


def _setup_logging(a: argparse.Namespace) -> None:
    from agents.logs import setup_logging

    setup_logging(a.log_level, a.log_format)


# -- emulate -------------------------------------------------------------------------------
def _fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def _row(m: Any, pred: float | None) -> list[str]:
    exact = m.error[:60] if m.error else ("yes" if m.exact else "NO")
    return [
        m.group,
        m.scheme,
        str(m.members),
        str(m.nbytes),
        "failed" if m.error else _fmt_ms(m.seconds),
        _fmt_ms(pred),
        exact,
        str(m.ina_retransmissions) if m.scheme != "ring" else "-",
        str(m.tcp_retransmissions) if m.scheme != "ina" else "-",
    ]


def _sizes(s: str) -> list[int]:
    """``N[,N...]``: message sizes in bytes, each in [4, MAX_BYTES]."""
    parse = _bounded(int, 4, MAX_BYTES)
    return [parse(x) for x in s.split(",")]


def run_emulate(a: argparse.Namespace) -> int:
    return _failures_reported("emulate", _emulate, a)


def run_demo(a: argparse.Namespace) -> int:
    return _failures_reported("demo", _demo, a)


def _failures_reported(name: str, fn: Any, a: argparse.Namespace) -> int:
    """A failure of the emulation itself (a process that died, a timeout): one line and
    status 1, after the teardown has run. Bad input (InputError) is the caller's: status 2."""
    try:
        return fn(a)
    except InputError:
        raise
    except (RuntimeError, OSError) as exc:
        print(f"heroserve {name}: failed: {exc}", file=sys.stderr)
        return 1


def _emulate(a: argparse.Namespace) -> int:
    from agents.ina.impairments import Impairments
    from controller.cli.report import _table
    from controller.emulate.cluster import handle_signals
    from controller.emulate.collectives import Workers, ina_groups, run_group
    from controller.emulate.plans import group_runs
    from controller.emulate.predict import emulated_graph, measure_hop_latency, predict

    _setup_logging(a)
    g, spec, plan, notes = _setup(a, a.slowdown)
    impair = Impairments(a.loss, a.duplicate, a.reorder) or None
    eth = min((d["capacity"] for *_, d in g.edges(data=True) if d["link"] == "ethernet"), default=0)
    print(
        f"emulation {spec.tag}: topology {g.name}, {len(spec.hosts)} hosts, "
        f"{len(spec.switches)} {a.switch} switches, {len(spec.bridges)} NVLink bridges"
    )
    unshaped = f"; {len(spec.unshaped)} links unshaped (over 2 Gb/s)" if spec.unshaped else ""
    print(
        f"scale: bandwidth / {a.slowdown:g} (time runs {a.slowdown:g}x slower): "
        f"{eth * 8 / 1e9:g} Gb/s Ethernet -> {eth * 8 / a.slowdown / 1e6:g} Mb/s{unshaped}"
    )
    print("latency: as emulated (this kernel adds none), measured per hop below")
    if impair:
        print(f"impairments on every host NIC link, each way: loss {a.loss:g}, duplicate "
              f"{a.duplicate:g}, reorder {a.reorder:g} (user-space link emulator)")  # fmt: skip
    for n in notes:
        print(n)
    runs = group_runs(plan)
    rows: list[list[str]] = [["group", "scheme", "GPUs", "bytes", "measured ms", "predicted ms",
                              "exact", "INA retx", "TCP retx"]]  # fmt: skip
    results = []
    cluster = _cluster(a, g, spec, plan, impair)
    workers = Workers(cluster)
    cluster.on_network_up = lambda: workers.launch(sorted({m for r in runs for m in r.group.gpus}))
    with handle_signals(), cluster as c:
        for note in c.notes:
            print(note)
        hops = measure_hop_latency(c.net, spec, g)
        print("per-hop latency: " + ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in hops.items()))
        h = emulated_graph(g, a.slowdown, hops)
        installed = ina_groups(c)
        for run in runs:
            for nbytes in a.bytes:
                ratio: dict[str, tuple[float, float | None]] = {}
                for scheme in run.schemes:
                    t0 = time.monotonic()
                    m = run_group(workers, installed, run, scheme, nbytes, a.seed, a.repeat)
                    pred = predict(h, scheme, run.group.gpus, run.group.switch, m.nbytes)
                    ratio[scheme] = (m.seconds, pred)
                    results.append((m, pred))
                    log.info("%s %s %d B done in %.1fs", run.name, scheme, nbytes,
                             time.monotonic() - t0)  # fmt: skip
                    rows.append(_row(m, pred))
                ina = ratio.get("ina") or ratio.get("hier")
                ring = ratio.get("ring")
                if ina and ring and ina[0] and ring[0]:
                    pr = f"{ina[1] / ring[1]:.2f}" if ina[1] and ring[1] else "-"
                    rows.append(["", "INA/ring", "", "", f"{ina[0] / ring[0]:.2f}", pr, "", "", ""])
    print()
    print(_table(rows))
    status = 0 if all(m.exact and not m.error for m, _ in results) else 1
    if a.json:
        import json

        Path(a.json).write_text(json.dumps(
            [{**m.__dict__, "predicted_s": p} for m, p in results], indent=1) + "\n")  # fmt: skip
    return max(status, _report_leftovers(spec.tag))


# -- demo ----------------------------------------------------------------------------------
def _demo(a: argparse.Namespace) -> int:
    from agents.gpu.shmview import describe, read_segment
    from controller.emulate.cluster import SHM_DIR, handle_signals

    _setup_logging(a)
    g, spec, plan, notes = _setup(a, 1.0)
    print(f"demo {spec.tag}: topology {g.name}; links unshaped")
    for n in notes:
        print(n)
    with handle_signals(), _cluster(a, g, spec, plan) as c:
        for note in c.notes:
            print(note)
        st = c.state()
        print(f"\ncontroller {c.controller_addr}: epoch {st.epoch}, plan {st.plan_id[:12]}")
        for ag in sorted(st.agents, key=lambda x: x.identity.node_id):
            kind = "switch" if ag.identity.kind == 1 else "gpu"
            print(f"  {kind:6} agent {ag.identity.node_id:10} acknowledged epoch {ag.acked_epoch}")
        print("\npolicy tables in shared memory (GPU agents -> NCCL tuner plugin):")
        for name, size in c.shm_segments():
            seen = describe(read_segment(SHM_DIR / name))
            print(f"  /dev/shm/{name}  {size} bytes: {seen}")
        for s, d in sorted(c.switch_entries().items()):
            groups: dict[int, list[int]] = {}
            for key, _act, params in d["aggregation_table"]:
                groups.setdefault(key[0], []).append(params[0])
            # worker_port: each worker bound to its ingress port, where the data plane has it
            bound = f", {len(d['worker_port'])} worker_port" if "worker_port" in d else ""
            print(f"\nswitch {s} ({c.net.p4runtime(s)}): {len(d['l2_forward'])} l2_forward, "
                  f"{len(d['result_rewrite'])} result_rewrite{bound} entries")  # fmt: skip
            for gid, slots in sorted(groups.items()):
                ports = d["multicast_groups"].get(str(gid), [])
                print(f"  INA group {gid}: {len(slots)} aggregation entries, slots "
                      f"{min(slots)}..{max(slots)}, results to ports {ports}")  # fmt: skip
        print("\n/metrics (heroserve_*):")
        for line in c.metrics().splitlines():
            if line.startswith("heroserve_") and "_created" not in line:
                print("  " + line)
        if a.hold:
            print(f"\nholding for {a.hold:g}s (Ctrl-C ends it)")
            time.sleep(a.hold)
    return _report_leftovers(spec.tag)
