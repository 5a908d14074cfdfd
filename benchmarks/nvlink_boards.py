"""How the boards' NVLink wiring moves the figures of the built-in clusters that have 4-GPU A100
or V100 servers (docs/topology.md "Server fabrics"): `testbed` and `testbed-paper`.

Each cluster is planned twice in the same run, with every planner of `heroserve plan`: as the
boards wire it (4-GPU boards are point-to-point meshes: a GPU pair gets 100 GB/s on A100, 50
on V100, each way) and with each server's GPUs joined through one NVSwitch node at the GPU's
whole NVLink bandwidth (300 / 150 GB/s each way), the model the project used before the boards.
For HeroServe's plan it also simulates each wiring at its own predicted rate (the simulator
prices the same patterns on the same links). Printed: layouts, predicted TTFT, TPOT, KV
transfer, H, the simulated attainment and mean TPOT, and the ratio of H mesh / NVSwitch. The
track clusters (8 A100 per server: NVSwitch) and fig2 (explicit NVSwitch) do not change.

    PYTHONPATH=. .venv/bin/python benchmarks/nvlink_boards.py [--clusters testbed]
        [--workloads chatbot,summarization] [--requests 600] [--no-sim]
"""

from __future__ import annotations

import argparse
import time

import networkx as nx

PLANNERS = ("heroserve", "distserve", "ds-atp", "ds-switchml", "distserve-paper")


def as_nvswitch(g: nx.Graph) -> nx.Graph:
    """``g`` with every mesh server rewired through one NVSwitch node ``<server>-nvsw``: each
    GPU one NVLink edge to it at the GPU's whole NVLink bandwidth per direction."""
    from controller.topology.generators import fabric_node, nvlink_per_direction
    from controller.topology.graph import GPU, add_link, add_nvswitch

    h = g.copy()
    mesh = [
        (a, b)
        for a, b, d in h.edges(data=True)
        if h.nodes[a]["kind"] == GPU and h.nodes[b]["kind"] == GPU and d["link"] == "nvlink"
    ]
    h.remove_edges_from(mesh)
    for n in sorted({x for e in mesh for x in e}):
        hub = fabric_node(h.nodes[n]["server"])
        if hub not in h:
            add_nvswitch(h, hub, server=h.nodes[n]["server"])
        add_link(h, n, hub, link="nvlink", capacity=nvlink_per_direction(h.nodes[n]["gpu_type"]))
    return h


def _row(p) -> str:
    pr = p.predicted
    return (
        f"{p.prefill.tp}x{p.prefill.pp}  {p.decode.tp}x{p.decode.pp}  "
        f"TTFT {pr.ttft_s * 1e3:7.1f} ms  TPOT {pr.tpot_s * 1e3:5.1f} ms  "
        f"KV {pr.kv_transfer_s * 1e6:7.1f} us  H {pr.rate:6.3f} r/s"
    )


def _simulate(p, g, workload, n: int) -> str:
    from controller.sim import SimOptions, build_model, make_requests
    from controller.sim.engine import Simulator

    if not p.predicted.rate > 0:
        return "not simulated (H = 0)"
    reqs = make_requests(workload, p.predicted.rate, n, seed=0)
    res = Simulator(build_model(p, g, workload), SimOptions(seed=0)).run(reqs)
    return (
        f"simulated at H: attainment {res.attainment:.1%}, "
        f"mean TPOT {res.tpot_s['mean'] * 1e3:.1f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", default="testbed,testbed-paper")
    ap.add_argument("--workloads", default="chatbot,summarization")
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--no-sim", action="store_true")
    a = ap.parse_args()

    from controller.errors import InputError
    from controller.models import model_spec
    from controller.planner import plan
    from controller.topology import resolve_topology
    from controller.workload import chatbot, default_sla, summarization

    workloads = {"chatbot": chatbot, "summarization": summarization}
    model = model_spec("OPT-66B")
    c0 = time.process_time()
    for cluster in a.clusters.split(","):
        boards = resolve_topology(cluster)
        for wname in a.workloads.split(","):
            w, sla = workloads[wname](), default_sla(wname)
            print(f"== {cluster}, {wname} (OPT-66B, SLA TTFT {sla.ttft_s} s / TPOT {sla.tpot_s} s)")
            for planner in PLANNERS:
                got = {}
                for wiring, g in (("mesh", boards), ("nvswitch", as_nvswitch(boards))):
                    try:
                        p = plan(g, model, w, sla, planner=planner)
                    except InputError as e:  # a planner that finds no layout says why
                        print(f"  {planner:15s} {wiring:8s} no plan: {e}")
                        continue
                    got[wiring] = p.predicted.rate
                    print(f"  {planner:15s} {wiring:8s} {_row(p)}")
                    if planner == "heroserve" and not a.no_sim:
                        print(f"  {'':15s} {'':8s} {_simulate(p, g, w, a.requests)}")
                if len(got) == 2 and got["nvswitch"] > 0:
                    ratio = got["mesh"] / got["nvswitch"]
                    print(f"  {planner:15s} H mesh / NVSwitch = {ratio:.3f}")
    print(f"CPU time {time.process_time() - c0:.1f} s")


if __name__ == "__main__":
    main()
