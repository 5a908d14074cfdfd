"""Small hand-built plans for tests, benchmarks and docs of the control plane.

``sample_plan(ina_groups=2, workers=4)`` gives prefill instances whose one stage each is an
INA group of ``workers`` GPUs aggregated on ``switches[i % len(switches)]`` (every GPU one
hop from its switch: path ``[gpu, switch]``), and ``ring_groups`` decode instances whose
groups use ring over the same switches. GPU ids are ``"p<i>-g<k>"`` and ``"d<i>-g<k>"``.

Its ``topology`` is ``"sample"``, which no built-in resolves: serve it with the cluster
``sample_topology(...)`` (same arguments) as the controller's ``--topology`` (in process:
``ControllerServer(..., topology=sample_topology())``; a separate process: the file
``save_sample_topology(path)`` writes).
"""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx

from controller.plan import (
    SLA,
    Group,
    Instance,
    KVTransfer,
    PhasePlan,
    Plan,
    Predicted,
    SlotRange,
)


def sample_plan(
    ina_groups: int = 1,
    workers: int = 4,
    ring_groups: int = 1,
    switches: tuple[str, ...] = ("s1",),
    slots_per_group: int | None = 8,
    tag: str = "",
) -> Plan:
    """A valid plan; ``tag`` goes into ``notes`` so two plans can differ only by it."""
    pre_groups, pre_inst = [], []
    for i in range(ina_groups):
        sw = switches[i % len(switches)]
        gpus = [f"p{i}-g{k}" for k in range(workers)]
        pre_inst.append(Instance(stages=[gpus]))
        pre_groups.append(
            Group(
                instance=i,
                stage=0,
                gpus=gpus,
                scheme="ina",
                switch=sw,
                slots=SlotRange(start=i * slots_per_group, count=slots_per_group)
                if slots_per_group
                else None,
                paths={g: [g, sw] for g in gpus},
                allreduce_s=1e-3,
                ina_s=1e-3,
                ring_s=2e-3,
                reason="INA is faster than ring on the Ethernet links",
            )
        )
    dec_groups, dec_inst = [], []
    for i in range(ring_groups):
        sw = switches[i % len(switches)]
        gpus = [f"d{i}-g{k}" for k in range(workers)]
        dec_inst.append(Instance(stages=[gpus]))
        dec_groups.append(
            Group(
                instance=i,
                stage=0,
                gpus=gpus,
                scheme="ring",
                switch=None,
                slots=None,
                paths={g: [g, sw, gpus[(k + 1) % workers]] for k, g in enumerate(gpus)},
                allreduce_s=2e-3,
                ina_s=None,
                ring_s=2e-3,
                reason="no INA switch allowed",
            )
        )
    kv = []
    if ina_groups and ring_groups:
        kv.append(
            KVTransfer(
                src="p0-g0",
                dst="d0-g0",
                bytes=1e6,
                path=["p0-g0", switches[0], "d0-g0"],
                time_s=1e-4,
            )
        )
    return Plan(
        planner="sample",
        topology="sample",
        model="none",
        workload="none",
        sla=SLA(1.0, 0.1),
        prefill=PhasePlan(
            "prefill", workers, 1, "A100-40GB", pre_inst, pre_groups, 1e-3, 1e-2, 4, 10.0
        ),
        decode=PhasePlan(
            "decode", workers, 1, "V100-32GB", dec_inst, dec_groups, 2e-3, 1e-2, 16, 10.0
        ),
        kv_transfer=kv,
        predicted=Predicted(0.1, 0.01, 1e-4, 10.0, 1.0, workers * (ina_groups + ring_groups)),
        notes=[tag] if tag else [],
    )


SAMPLE_LINK_BPS = 12.5e9  # every sample link: 100 Gb/s


def sample_topology(
    ina_groups: int = 1,
    workers: int = 4,
    ring_groups: int = 1,
    switches: tuple[str, ...] = ("s1",),
) -> nx.Graph:
    """The cluster of ``sample_plan`` with the same arguments (a superset serves smaller
    plans): each GPU has one 100 Gb/s Ethernet link to its instance's switch, and the
    switches form a chain of 100 Gb/s links. Named ``"sample"`` like the plans."""
    from controller.topology import validate
    from controller.topology.graph import add_gpu, add_link, add_switch

    g = nx.Graph(name="sample")
    for sw in switches:
        add_switch(g, sw, tier="access")
    for a, b in zip(switches, switches[1:], strict=False):
        add_link(g, a, b, link="ethernet", capacity=SAMPLE_LINK_BPS)
    for prefix, n, gpu_type, mem, role in (
        ("p", ina_groups, "A100-40GB", 40.0, "prefill"),
        ("d", ring_groups, "V100-32GB", 32.0, "decode"),
    ):
        for i in range(n):
            sw = switches[i % len(switches)]
            for k in range(workers):
                gpu = f"{prefix}{i}-g{k}"
                add_gpu(
                    g,
                    gpu,
                    gpu_type=gpu_type,
                    memory_gb=mem,
                    server=f"{prefix}{i}",
                    index=k,
                    role=role,
                )
                add_link(g, gpu, sw, link="ethernet", capacity=SAMPLE_LINK_BPS)
    validate(g)
    return g


def save_sample_topology(path: str | Path, **kw: object) -> Path:
    """Write ``sample_topology(**kw)`` as a topology file (JSON, docs/topology.md) for
    ``heroserve controller --topology``; returns the path."""
    from controller.topology import topology_to_dict

    out = Path(path)
    out.write_text(json.dumps(topology_to_dict(sample_topology(**kw)), indent=1) + "\n")  # type: ignore[arg-type]
    return out
