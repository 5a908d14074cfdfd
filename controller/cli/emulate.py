"""``heroserve emulate`` (docs/emulation.md), and the set-up it shares with ``heroserve demo``
(``controller/cli/demo.py``).

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
from controller.inputs.args import bounded, output_file

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
        type=bounded(int, 1, 1024),
        default=128,
        help="aggregator slots of each INA group of the made plan (default: 128)",
    )


def add_args(p: argparse.ArgumentParser) -> None:
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
        type=bounded(float, 1.0, 1e9),
        default=DEFAULT_SLOWDOWN,
        help="bandwidth of every link divided by this (default: 1000: 100 Gb/s -> 100 Mb/s)",
    )
    p.add_argument("--loss", type=_probability, default=0.0, help="per packet, host NIC links")
    p.add_argument("--duplicate", type=_probability, default=0.0, help="per packet, as --loss")
    p.add_argument("--reorder", type=_probability, default=0.0, help="per packet, as --loss")
    p.add_argument(
        "--repeat", type=bounded(int, 1, 100), default=1, help="all-reduces per measurement"
    )
    p.add_argument(
        "--ina-client",
        choices=("python", "plugin"),
        default="python",
        help="who runs the hosts' INA all-reduces: python: the host library "
        "(agents/ina); plugin: collnet_harness driving the C++ CollNet plugin "
        "libnccl-net-heroserve.so (make cxx); hier stays on the host library (default: python)",
    )
    p.add_argument("--seed", type=bounded(int, 0, 2**31), default=1, help="data and impairments")
    p.add_argument(
        "--json",
        metavar="PATH",
        type=output_file,  # checked now, not after minutes of emulation
        help="also write the measurements here (JSON, seconds)",
    )


# -- shared set-up -------------------------------------------------------------------------
def _needs_root() -> None:
    if os.geteuid() != 0:
        raise InputError("the emulation needs root (network namespaces, raw sockets)")


def prepare(a: argparse.Namespace, slowdown: float) -> tuple[Any, Any, Any, list[str]]:
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
        notes += _set_roles_aside(g)
        plan = emulation_plan(g, window=a.window, hier=True)
        notes.append("plan: made for the emulation (heroserve plan may choose no INA group here)")
    try:
        validate(plan)
    except InputError as exc:
        raise InputError(f"the controller would refuse the plan: {exc}") from None
    check_plan(plan, g, spec)
    return g, spec, plan, notes


def _set_roles_aside(g: Any) -> list[str]:
    """The made plan measures collectives, not serving: a GPU's ``role`` (which phase it may
    serve) would only keep INA groups from forming (docs/topology.md's example has one
    prefill and one decode server on its INA switch), so every GPU becomes ``any``, in the
    graph the controller is given too (:func:`start_cluster`). The note names what was set
    aside."""
    roles: dict[str, set[str]] = {}
    for n, d in g.nodes(data=True):
        if d["kind"] == "gpu" and d.get("role", "any") != "any":
            roles.setdefault(d["role"], set()).add(str(d.get("server", n)))
            d["role"] = "any"
    if not roles:
        return []
    said = "; ".join(f"{r}: {', '.join(sorted(s))}" for r, s in sorted(roles.items()))
    return [f"roles set aside for the made plan (it measures collectives, not serving): {said}"]


def start_cluster(a: argparse.Namespace, g: Any, spec: Any, plan: Any, impair: Any = None) -> Any:
    """The cluster. The controller is given the graph this process loaded (roles as
    :func:`prepare` left them), written into the run's work dir, not ``--topology`` itself:
    it runs in the repository's root, where a relative path names nothing."""
    import json

    from controller.emulate.cluster import Cluster, ClusterOptions
    from controller.topology.io import topology_to_dict

    opts = ClusterOptions(
        switch_kind=a.switch,
        impair=impair,
        impair_seed=getattr(a, "seed", 0),
        keep_workdir=a.keep_logs,
    )
    c = Cluster(g, a.topology, spec, plan, opts)
    path = c.workdir / "topology.json"
    path.write_text(json.dumps(topology_to_dict(g), indent=1) + "\n")
    c.topology = str(path)
    return c


def report_leftovers(tag: str) -> int:
    from controller.emulate.cluster import leftovers

    left = leftovers(tag)
    if any(left.values()):
        print(f"left behind (please report): {left}", file=sys.stderr)
        return 1
    print(f"torn down: no namespace, interface, process or shared memory of {tag} left")
    return 0


def setup_logging(a: argparse.Namespace) -> None:
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
    parse = bounded(int, 4, MAX_BYTES)
    return [parse(x) for x in s.split(",")]


def run(a: argparse.Namespace) -> int:
    return failures_reported("emulate", _emulate, a)


def failures_reported(name: str, fn: Any, a: argparse.Namespace) -> int:
    """A failure of the emulation itself (a process that died, a timeout): one line and
    status 1, after the teardown has run. Bad input (InputError) is the caller's: status 2."""
    # Each line out as it is printed, into a pipe too: the run tag and "holding" are what a
    # script (or a test) waits on before it interrupts the run.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    try:
        return fn(a)
    except InputError:
        raise
    except (RuntimeError, OSError) as exc:
        print(f"heroserve {name}: failed: {exc}", file=sys.stderr)
        return 1


def _emulate(a: argparse.Namespace) -> int:
    from agents.ina.impairments import Impairments
    from controller.cli.report import text_table
    from controller.costmodel.netparams import NetParams
    from controller.emulate.cluster import handle_signals
    from controller.emulate.collectives import Workers, ina_groups, run_group
    from controller.emulate.plans import group_runs
    from controller.emulate.plugin import plugin_missing, run_ina_plugin
    from controller.emulate.predict import (
        emulated_graph,
        measure_hop_latency,
        predict,
        ratio_note,
    )

    setup_logging(a)
    if a.ina_client == "plugin" and (why := plugin_missing()):
        raise InputError(f"--ina-client plugin: {why}")
    g, spec, plan, notes = prepare(a, a.slowdown)
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
    if a.ina_client == "plugin":
        print(
            "INA client: the C++ CollNet plugin (collnet_harness driving "
            "libnccl-net-heroserve.so) for scheme ina; hier on the Python host library"
        )
    for n in notes:
        print(n)
    # INA, flat and hierarchical, runs the lane format the plan was priced for; the host
    # library and the plugin run int32 and bfp16 (a plan for another format is refused with
    # the plan).
    ina_lanes = NetParams.from_plan_options(plan.options).ina_lanes
    print(f"INA lanes: {ina_lanes} for flat and hierarchical INA groups (the ring: int32)")
    runs = group_runs(plan)
    rows: list[list[str]] = [["group", "scheme", "GPUs", "bytes", "measured ms", "predicted ms",
                              "exact", "INA retx", "TCP retx"]]  # fmt: skip
    results = []
    why: list[str] = []  # one line per ratio far from its prediction
    cluster = start_cluster(a, g, spec, plan, impair)
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
                    if scheme == "ina" and a.ina_client == "plugin":
                        m = run_ina_plugin(workers, installed, run, nbytes, a.seed, a.repeat,
                                           ina_lanes)  # fmt: skip
                    else:
                        m = run_group(workers, installed, run, scheme, nbytes, a.seed, a.repeat,
                                      ina_lanes)  # fmt: skip
                    pred = predict(h, scheme, run.group.gpus, run.group.switch, m.nbytes,
                                   lanes=ina_lanes)  # fmt: skip
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
                    if ina[1] and ring[1]:
                        scheme = "ina" if "ina" in ratio else "hier"
                        times = ((ina[0], ring[0]), (ina[1], ring[1]))
                        note = ratio_note(run.group, scheme, nbytes, *times, g, a.slowdown,
                                          a.switch)  # fmt: skip
                        if note:
                            why.append(f"{run.name} at {nbytes} B: {note}")
    print()
    print(text_table(rows))
    for line in why:
        print(line)
    status = 0 if all(m.exact and not m.error for m, _ in results) else 1
    if a.json:
        import json

        Path(a.json).write_text(json.dumps(
            [{**m.__dict__, "predicted_s": p} for m, p in results], indent=1) + "\n")  # fmt: skip
    return max(status, report_leftovers(spec.tag))


# -- demo ----------------------------------------------------------------------------------
