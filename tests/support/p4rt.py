"""Programming the INA switch over P4Runtime (p4runtime-shell) for the tests and benchmarks
that run a real switch process: the softswitch (``python -m agents.softswitch``) or BMv2.

Holds ``connect`` (a session, pushing the pipeline or not), ``program`` (table and multicast
entries from a setup mapping), ``ina_setup`` (the setup for one INA group over the netns bed
of tests/support/netns.py: the group's slots, one switch port per worker, results rewritten
to each worker, and, for traffic between the workers, L2 forwarding by MAC),
``read_counters`` and ``run_child``, which runs this file as a script: ``program PORT``
(the setup as JSON on stdin; the pipeline pushed with ``HEROSERVE_BMV2_JSON`` or none) or
``counters PORT``, printing one JSON line. A separate process because p4runtime-shell keeps
module state and a stream thread that is not a daemon, and needs the pure-Python protobuf.
Not a test module.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# tests/support/p4rt.py; not `from support import ROOT`: this file also runs as a script
ROOT = Path(__file__).resolve().parents[2]
P4INFO = ROOT / "p4" / "heroserve_ina.p4info.txtpb"
# For running this file as a child: pure-Python protobuf, the repository and tests/ importable.
CHILD_ENV = dict(
    os.environ,
    PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python",
    PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
)


def connect(port: int, device_config: str | None, timeout_s: float = 30):  # noqa: ANN201
    """A p4runtime-shell session on 127.0.0.1:``port``. ``device_config`` (a BMv2 JSON, or
    ``/dev/null`` for the softswitch) pushes the pipeline, which resets the switch's state;
    None keeps it. Retries until ``timeout_s``: a switch just started may not serve yet."""
    import p4runtime_sh.shell as sh

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sh.setup(
                device_id=1,
                grpc_addr=f"127.0.0.1:{port}",
                election_id=(0, 1),
                config=sh.FwdPipeConfig(str(P4INFO), device_config) if device_config else None,
                verbose=False,
            )
            return sh
        except BaseException:  # p4runtime-shell exits (SystemExit) when it cannot connect
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def program(sh, setup: dict) -> None:  # noqa: ANN001 - the p4runtime_sh.shell module
    """Inserts ``setup``'s entries: aggregation [group, index, slot, workers, mcast],
    worker_port [group, worker, port], result_rewrite [port, dmac, dip], l2 [mac, port],
    l2_flood [mac, group], mcast {group: [ports]}."""
    for group, index, slot, workers, mcast in setup.get("aggregation", []):
        te = sh.TableEntry("InaIngress.aggregation_table")(action="InaIngress.set_slot")
        te.match["group_id"] = str(group)
        te.match["agg_index"] = str(index)
        te.action["slot"] = str(slot)
        te.action["num_workers"] = str(workers)
        te.action["mcast_grp"] = str(mcast)
        te.insert()
    for group, worker, port in setup.get("worker_port", []):
        te = sh.TableEntry("InaIngress.worker_port")(action="InaIngress.set_worker_port")
        te.match["group_id"] = str(group)
        te.match["worker_id"] = str(worker)
        te.action["port"] = str(port)
        te.insert()
    for port, dmac, dip in setup.get("result_rewrite", []):
        te = sh.TableEntry("InaEgress.result_rewrite")(action="InaEgress.set_result_dst")
        te.match["egress_port"] = str(port)
        te.action["dmac"] = str(dmac)
        te.action["dip"] = str(dip)
        te.insert()
    for mac, port in setup.get("l2", []):
        te = sh.TableEntry("InaIngress.l2_forward")(action="InaIngress.forward")
        te.match["dst_addr"] = str(mac)
        te.action["port"] = str(port)
        te.insert()
    for mac, group in setup.get("l2_flood", []):
        te = sh.TableEntry("InaIngress.l2_forward")(action="InaIngress.l2_multicast")
        te.match["dst_addr"] = str(mac)
        te.action["mcast_grp"] = str(group)
        te.insert()
    for group, ports in setup.get("mcast", {}).items():
        g = sh.MulticastGroupEntry(int(group))
        for p in ports:
            g.add(p, 0)
        g.insert()


def ina_setup(group: int, slots: dict[int, int], mcast: int, l2: bool = False) -> dict:
    """One INA group over the netns bed: aggregation index -> slot for every entry of
    ``slots``, worker w on switch port w + 1, results multicast to every worker (group
    ``mcast``) and rewritten to its MAC and IP; with ``l2``, frames to a worker's MAC
    forwarded to its port (traffic between the workers, e.g. a ring all-reduce)."""
    from support.netns import N, worker_ip, worker_mac

    return {
        "aggregation": [[group, k, s, N, mcast] for k, s in slots.items()],
        "worker_port": [[group, w, w + 1] for w in range(N)],
        "result_rewrite": [[w + 1, worker_mac(w), worker_ip(w)] for w in range(N)],
        "l2": [[worker_mac(w), w + 1] for w in range(N)] if l2 else [],
        "mcast": {mcast: [w + 1 for w in range(N)]},
    }


def read_counters(sh, cells: dict[str, int]) -> dict[str, list[int]]:  # noqa: ANN001
    """Packet counts of each named counter's first ``cells[name]`` cells (0 where unset)."""
    out = {}
    for name, n in cells.items():
        got = {c.index: c.data.packet_count for c in sh.CounterEntry(name).read()}
        out[name] = [got.get(i, 0) for i in range(n)]
    return out


def run_child(
    kind: str,
    port: int,
    setup: dict | None = None,
    ns: str | None = None,
    bmv2_json: str | None = None,
    timeout_s: float = 120,
) -> dict:
    """Runs this file as a child (``program`` with ``setup``, or ``counters``), inside
    namespace ``ns`` when given (where the switch's P4Runtime server listens), pushing
    ``bmv2_json`` as the device config (BMv2) where given; its JSON."""
    import subprocess

    cmd = [sys.executable, __file__, kind, str(port)]
    if ns is not None:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    p = subprocess.run(
        cmd,
        input=json.dumps(setup or {}),
        env=dict(CHILD_ENV, HEROSERVE_BMV2_JSON=bmv2_json or ""),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if p.returncode != 0:
        raise RuntimeError(f"p4rt {kind} failed: {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _main(argv: list[str]) -> dict:
    kind, port = argv[0], int(argv[1])
    if kind == "program":
        sh = connect(port, os.environ.get("HEROSERVE_BMV2_JSON") or "/dev/null")
        program(sh, json.loads(sys.stdin.read()))
        sh.teardown()
        return {"ok": True}
    sh = connect(port, None)
    cells = {"InaIngress.ina_drops": 16, "InaIngress.ina_events": 8, "InaIngress.lane_overflows": 1}
    res = read_counters(sh, cells)
    sh.teardown()
    return {name.split(".")[-1]: cells for name, cells in res.items()}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        print(json.dumps(_main(sys.argv[1:])), flush=True)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # the stream thread would keep a failed child alive
