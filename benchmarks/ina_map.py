"""Where in-network aggregation pays, as a map (docs/ina-map.md): for one all-reduce message,
over a grid of NIC bandwidth per GPU, GPUs per server, the link inside a server, the
tensor-parallel group's size and the INA lane format, which scheme the cost model prices
fastest (NCCL's ring, flat INA, hierarchical INA) and by how much (T_ring / T_best).

Each cell is one group on its own cluster (``map_cluster``): servers of ``g`` GPUs, each GPU's
own NIC at the cell's rate on one INA-capable switch (a single top-of-rack Tofino-class switch:
every member one Ethernet hop from it, the shape where INA needs the fewest hops), the GPUs
of a server joined through one fabric node at the link's rate per direction (an NVSwitch
board, or the host's PCIe fabric). A group of ``t`` GPUs is packed as the planner's DistServe
baselines pack it: inside one server where ``t <= g``, else ``t / g`` whole servers. Schemes
are priced as the planner prices them (``controller/costmodel``: ``ring_pattern``,
``ina_pattern`` on the relaying and the Ethernet-only fabric, the cheaper kept, as
``AllReducePricer._flat_ina`` does; ``hier_pattern`` where the group spans servers with >= 2
GPUs on each), in the pipelined cost mode with NetParams' latencies.

Holds ``INTRA`` (the server links, each from ``controller/models``), ``map_cluster``,
``price_cell`` (one cell: the schemes' times), ``spot_check`` (a cell through the planner's
own ``AllReducePricer``, printed beside the map's figure) and the figure. Prints the table;
writes the figure (PNG at 150 dpi and SVG beside it) to ``--out``.

    PYTHONPATH=. .venv/bin/python benchmarks/ina_map.py [--model OPT-175B] [--tokens 160]
        [--out ina_map.png] [--all]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

from controller.costmodel.hier import hier_pattern
from controller.costmodel.ina import ina_pattern
from controller.costmodel.netparams import INA_LANES, NetParams
from controller.costmodel.ring import ring_pattern
from controller.models.gpus import PCIE_X16_BYTES_PER_S
from controller.topology.generators import nvlink_per_direction
from controller.topology.graph import add_gpu, add_link, add_nvswitch, add_switch
from controller.units import gbps

NIC_GBPS = (25, 50, 100, 200, 400)  # Ethernet per GPU: ConnectX-4 Lx .. ConnectX-7 port rates
GPUS_PER_SERVER = (1, 2, 4, 8)
GROUP_SIZES = (2, 4, 8, 16)
SWITCH = "tor"


@dataclass(frozen=True)
class Intra:
    """A server's GPU-to-GPU link: its name, graph link kind, bytes/s per direction, the GPU
    type whose figure it is (each from ``controller/models``)."""

    name: str
    link: str
    bw: float
    gpu_type: str


INTRA = (
    Intra("PCIe 4.0", "pcie", PCIE_X16_BYTES_PER_S[4], "L40"),  # 32 GB/s, L40/L4 cards
    Intra("PCIe 5.0", "pcie", PCIE_X16_BYTES_PER_S[5], "L40"),  # 64 GB/s, a Gen5 x16 card
    Intra("NVLink2", "nvlink", nvlink_per_direction("V100-32GB"), "V100-32GB"),  # 150 GB/s
    Intra("NVLink3", "nvlink", nvlink_per_direction("A100-80GB"), "A100-80GB"),  # 300 GB/s
    Intra("NVLink4", "nvlink", nvlink_per_direction("H100"), "H100"),  # 450 GB/s
)
SCHEMES = ("ring", "ina", "hier")
LETTER = {"ring": "R", "ina": "F", "hier": "H"}  # ring, flat INA, hierarchical INA


def map_cluster(servers: int, per_server: int, intra: Intra, nic_gbps: float) -> nx.Graph:
    """``servers`` servers of ``per_server`` GPUs (module docstring): GPUs ``s<i>-gpu<j>``,
    each with one NIC of ``nic_gbps`` on the INA switch ``tor``, joined in a server through
    the fabric node ``s<i>-nvsw`` at ``intra.bw`` per direction."""
    g = nx.Graph(name=f"map-{servers}x{per_server}")
    add_switch(g, SWITCH, tier="access")
    for s in range(servers):
        server = f"s{s}"
        if per_server > 1:
            add_nvswitch(g, f"{server}-nvsw", server=server)
        for j in range(per_server):
            gid = f"{server}-gpu{j}"
            add_gpu(g, gid, gpu_type=intra.gpu_type, memory_gb=80, server=server, index=j)
            if per_server > 1:
                add_link(g, gid, f"{server}-nvsw", link=intra.link, capacity=intra.bw)
            add_link(g, gid, SWITCH, link="ethernet", capacity=gbps(nic_gbps))
    return g


def placement(group: int, per_server: int) -> tuple[int, int]:
    """(servers, GPUs of the group on each): packed, as DistServe's baselines place a group."""
    return (1, group) if group <= per_server else (group // per_server, per_server)


def price_cell(g: nx.Graph, nbytes: float, net: NetParams) -> dict[str, float]:
    """The all-reduce time of ``nbytes`` on every GPU of ``g`` under each scheme that applies
    (``SCHEMES``; a scheme that does not apply is absent), seconds."""
    members = sorted(n for n, d in g.nodes(data=True) if d["kind"] == "gpu")
    relay, eth = net.fabric(g, relay=True), net.fabric(g, relay=False)
    out = {"ring": ring_pattern(relay, members, nbytes, net).time(relay, nbytes)}
    flat = [
        p.time(relay, nbytes)
        for fab in (relay, eth)
        if (p := ina_pattern(fab, members, SWITCH, nbytes, net)) is not None
    ]
    if flat:
        out["ina"] = min(flat)
    hier = hier_pattern(relay, members, nbytes, net)
    if hier is not None:
        out["hier"] = hier.time(relay, nbytes)
    return out


@dataclass(frozen=True)
class Cell:
    lanes: str
    intra: str
    per_server: int
    group: int
    nic_gbps: float
    times: dict[str, float]

    @property
    def winner(self) -> str:
        return min(self.times, key=lambda k: (self.times[k], SCHEMES.index(k)))

    @property
    def gain(self) -> float:
        """T_ring / T_best: 1.0 where the ring wins."""
        return self.times["ring"] / self.times[self.winner]


def compute_map(nbytes: float) -> list[Cell]:
    cells = []
    for lanes in INA_LANES:
        net = NetParams(ina_lanes=lanes)
        for intra in INTRA:
            for per in GPUS_PER_SERVER:
                for t in GROUP_SIZES:
                    servers, _ = placement(t, per)
                    for nic in NIC_GBPS:
                        g = map_cluster(servers, min(per, t), intra, nic)
                        cells.append(
                            Cell(lanes, intra.name, per, t, nic, price_cell(g, nbytes, net))
                        )
    return cells


def spot_check(cell: Cell, nbytes: float) -> dict[str, float]:
    """The cell's group priced by the planner itself: HeroServe's ``AllReducePricer.group``
    on the cell's cluster (candidate switches, relays, lower bounds and all), seconds."""
    from controller.models import model_spec
    from controller.planner.evaluate import Evaluator
    from controller.planner.heroserve import POLICY
    from controller.planner.options import PlannerOptions, Problem
    from controller.workload import chatbot, default_sla

    intra = next(i for i in INTRA if i.name == cell.intra)
    servers, _ = placement(cell.group, cell.per_server)
    g = map_cluster(servers, min(cell.per_server, cell.group), intra, cell.nic_gbps)
    net = NetParams(ina_lanes=cell.lanes)  # type: ignore[arg-type]
    problem = Problem(
        g, model_spec("OPT-66B"), chatbot(), default_sla("chatbot"), PlannerOptions(net=net)
    )
    ev = Evaluator(problem, POLICY)
    members = sorted(n for n, d in g.nodes(data=True) if d["kind"] == "gpu")
    ge = ev.allreduce.group(members, nbytes)
    ctx = ev.allreduce.ctx
    out = {"ring": ge.ring.time(ctx.ring_fabric, nbytes)}
    if ge.ina:
        out["ina"] = ge.ina[0].time(ctx.ina_fabric, nbytes)
    if ge.hier is not None:
        out["hier"] = ge.hier.time(ctx.ina_fabric, nbytes)
    return out


def _fmt(cell: Cell) -> str:
    t = cell.times
    cols = " ".join(f"{t[k] * 1e6:8.1f}" if k in t else "       -" for k in SCHEMES)
    return (
        f"{cell.lanes:5} {cell.intra:8} {cell.per_server:3} {cell.group:3} {cell.nic_gbps:5g} "
        f"{cols}  {LETTER[cell.winner]} {cell.gain:5.2f}"
    )


def print_table(cells: list[Cell], only_ina: bool) -> None:
    print("lanes intra    g/s  TP  NIC   ring us   flat us   hier us  win T_ring/T_best")
    for c in cells:
        if not only_ina or c.winner != "ring":
            print(_fmt(c))


def draw(cells: list[Cell], out: Path, title: str) -> list[Path]:
    """Small multiples: a row per lane format, a column per server link; in each panel a
    heat map of T_ring / T_best over NIC rate (x) and (GPUs per server, TP) (y), each cell
    lettered with its winner. Returns the files written (PNG, SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm, Normalize

    rows = [(per, t) for per in GPUS_PER_SERVER for t in GROUP_SIZES]
    top = max(c.gain for c in cells)
    norm = LogNorm(1.0, top) if top > 10 else Normalize(1.0, max(top, 1.01))
    lanes, intras = list(INA_LANES), [i.name for i in INTRA]
    fig, axes = plt.subplots(
        len(lanes),
        len(intras),
        figsize=(3.3 * len(intras), 4.6 * len(lanes)),
        sharey=True,
        layout="constrained",
    )
    by = {(c.lanes, c.intra, c.per_server, c.group, c.nic_gbps): c for c in cells}
    for r, ln in enumerate(lanes):
        for k, it in enumerate(intras):
            ax = axes[r][k]
            grid = [[by[(ln, it, per, t, nic)].gain for nic in NIC_GBPS] for per, t in rows]
            im = ax.imshow(grid, cmap="YlOrRd", norm=norm, aspect="auto")
            for y, (per, t) in enumerate(rows):
                for x, nic in enumerate(NIC_GBPS):
                    c = by[(ln, it, per, t, nic)]
                    label = "R" if c.winner == "ring" else f"{LETTER[c.winner]}{c.gain:.2f}"
                    dark = norm(c.gain) > 0.6
                    ax.text(x, y, label, ha="center", va="center", fontsize=6.5,
                            color="white" if dark else "black")  # fmt: skip
            for y in range(len(GROUP_SIZES), len(rows), len(GROUP_SIZES)):
                ax.axhline(y - 0.5, color="black", lw=0.8)
            ax.set_xticks(range(len(NIC_GBPS)), [f"{n:g}" for n in NIC_GBPS], fontsize=8)
            ax.set_yticks(range(len(rows)), [f"{per}/srv TP{t}" for per, t in rows], fontsize=7)
            ax.set_title(f"{ln} lanes, {it}", fontsize=9)
            if r == len(lanes) - 1:
                ax.set_xlabel("NIC Gb/s per GPU (log2 steps)", fontsize=8)
    cb = fig.colorbar(im, ax=axes, shrink=0.5)
    cb.set_label("T_ring / T_best (1 = ring wins)")
    fig.suptitle(
        f"{title}\nR: ring wins; F: flat INA; H: hierarchical INA, with T_ring / T_best",
        fontsize=10,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    svg = out.with_suffix(".svg")
    fig.savefig(out, dpi=150, bbox_inches="tight")
    fig.savefig(svg, bbox_inches="tight")
    plt.close(fig)
    return [out, svg]


# Where the map is checked against the planner, in every lane format of INA_LANES:
# (intra, GPUs per server, TP, NIC Gb/s): l40s-rack's decode group (hierarchical INA wins
# with int32 lanes), a group inside a PCIe server (flat INA wins with 16-bit lanes) and an
# NVLink group (the ring wins).
SPOT_CELLS = (
    ("PCIe 4.0", 8, 16, 200),
    ("PCIe 4.0", 8, 8, 400),
    ("NVLink3", 4, 4, 100),
)


def spot_checks(cells: list[Cell], nbytes: float) -> list[tuple[Cell, dict[str, float]]]:
    """Each ``SPOT_CELLS`` geometry in every lane format: the map's cell beside the planner's
    figures (``spot_check``)."""
    by = {(c.lanes, c.intra, c.per_server, c.group, c.nic_gbps): c for c in cells}
    cells = [by[(lanes, *key)] for lanes in INA_LANES for key in SPOT_CELLS]
    return [(c, spot_check(c, nbytes)) for c in cells]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="OPT-175B", help="whose hidden size sets the message")
    ap.add_argument(
        "--tokens",
        type=int,
        default=160,
        help="tokens in the all-reduce: a decode batch (default: the batch the planner gives "
        "OPT-175B's decode on l40s-rack), or a prompt's length",
    )
    ap.add_argument("--out", default="ina_map.png", help="the PNG (an SVG is written beside it)")
    ap.add_argument("--all", action="store_true", help="print every cell, not only INA's wins")
    a = ap.parse_args(argv)
    from controller.errors import InputError
    from controller.models import model_spec

    try:
        model = model_spec(a.model)
    except InputError as e:
        print(f"ina_map: {e}", file=sys.stderr)
        return 2
    if not 1 <= a.tokens <= 1_000_000:
        print("ina_map: --tokens must be 1..1000000", file=sys.stderr)
        return 2
    nbytes = a.tokens * model.hidden * model.dtype_bytes
    title = (
        f"{model.name}, {a.tokens} tokens: all-reduce of {nbytes / 1e6:.3f} MB "
        f"({a.tokens} x {model.hidden} x {model.dtype_bytes} B), pipelined cost model"
    )
    print(title)
    t0 = time.process_time()
    cells = compute_map(nbytes)
    print(f"{len(cells)} cells in {time.process_time() - t0:.1f} CPU-s")
    print_table(cells, only_ina=not a.all)
    wins: dict[str, int] = {}
    for c in cells:
        wins[f"{c.lanes} {c.winner}"] = wins.get(f"{c.lanes} {c.winner}", 0) + 1
    print("winners: " + ", ".join(f"{k} {v}" for k, v in sorted(wins.items())))
    print("\nspot checks: the map's figure beside the planner's AllReducePricer.group (us)")
    for c, planner in spot_checks(cells, nbytes):
        pairs = "  ".join(
            f"{k} {c.times[k] * 1e6:.1f} / "
            + (f"{planner[k] * 1e6:.1f}" if k in planner else "not routed (bound cannot win)")
            for k in SCHEMES
            if k in c.times
        )
        print(f"  {_fmt(c)[:31]}  {pairs}")
    for p in draw(cells, Path(a.out), title):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
