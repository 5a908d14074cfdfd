"""Small hand-built plans for tests, benchmarks and docs of the control plane.

``sample_plan(ina_groups=2, workers=4)`` gives prefill instances whose one stage each is an
INA group of ``workers`` GPUs aggregated on ``switches[i % len(switches)]`` (every GPU one
hop from its switch: path ``[gpu, switch]``), and ``ring_groups`` decode instances whose
groups use ring over the same switches. GPU ids are ``"p<i>-g<k>"`` and ``"d<i>-g<k>"``.
"""

from __future__ import annotations

from controller.plan import (
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
        sla={"ttft_s": 1.0, "tpot_s": 0.1},
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
