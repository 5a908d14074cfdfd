"""The emulation's INA all-reduce through the C++ CollNet plugin (``heroserve emulate
--ina-client plugin``, docs/emulation.md): each member host runs ``collnet_harness``, which
loads ``libnccl-net-heroserve.so`` with dlopen and drives its CollNet as NCCL's proxy does,
instead of the Python host library's worker.

Holds :func:`plugin_missing` (why the mode cannot run here) and :func:`run_ina_plugin`, the
counterpart of ``collectives.run_group`` for scheme ``ina``: the group's INA config file per
member (the group as the switch agent installed it, read back from the switch, the member's
NIC address, a session nobody used yet), one harness process per member in its host, all
at once, and their JSON lines turned into a :class:`Measurement`. The data are float32
summed as fixed point with an agreed exponent (``float_sums``), as the Python workers' are;
each harness checks its result bit for bit against its own reference of every member's
data (csrc/tests/collnet_harness.cc), so ``exact`` is every rank's verdict.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import statistics
import time
from typing import Any

from agents.ina import lanes
from controller.emulate.cluster import GPU_AGENT, Proc
from controller.emulate.collectives import (
    REPLY_TIMEOUT_S,
    CollectiveError,
    Measurement,
    Workers,
    _ina_of,
)
from controller.emulate.plans import GroupRun

log = logging.getLogger("heroserve.emulate")

BUILD = GPU_AGENT.parent  # build/csrc, where `make cxx` puts the agent, plugin and harness
HARNESS = BUILD / "collnet_harness"
LIBRARY = BUILD / "libnccl-net-heroserve.so"
# The harness's own bound on the handle exchange and each member's give-up time of the
# plugin (seconds without progress): those of the Python worker (`--give-up`, 60 s).
GIVE_UP_S = 60


def plugin_missing() -> str | None:
    """Why ``--ina-client plugin`` cannot run here (the C++ build is missing), or None."""
    for f in (HARNESS, LIBRARY):
        if not f.exists():
            return f"{f} is not built (make cxx)"
    return None


def _config(
    run: GroupRun, w: int, info: Any, session: dict[str, int], bind_ip: str, lanes: str
) -> dict:
    return {
        "groups": [
            {
                "group_id": info.group_id,
                "num_workers": len(run.group.gpus),
                "worker_id": w,
                "window": info.window,
                "switch_ip": info.switch_ip,
                "session": session["session"],
                "first_generation": session["first_generation"],
                "bind_ip": bind_ip,
                "give_up_s": GIVE_UP_S,
                "float_sums": True,
                "lane_format": lanes,
            }
        ]
    }


def _collect(procs: dict[str, Any], timeout_s: float) -> dict[str, tuple[int, list[dict]]]:
    """Each member's exit status and JSON events, all read together (a rank blocks when
    its pipe is full); a member still running after ``timeout_s`` is killed."""
    out: dict[str, list[str]] = {g: [] for g in procs}
    sel = selectors.DefaultSelector()
    for g, p in procs.items():
        sel.register(p.stdout, selectors.EVENT_READ, g)
    deadline = time.monotonic() + timeout_s
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for key, _ in sel.select(timeout=min(left, 1.0)):
            line = key.fileobj.readline()  # type: ignore[union-attr]
            if line:
                out[key.data].append(line)
            else:
                sel.unregister(key.fileobj)
    sel.close()
    res = {}
    for g, p in procs.items():
        if p.poll() is None:
            p.kill()
        rc = p.wait()
        res[g] = (rc, [json.loads(x) for x in out[g] if x.startswith("{")])
    return res


def run_ina_plugin(
    workers: Workers,
    installed: dict,
    run: GroupRun,
    nbytes: int,
    seed: int,
    repeat: int,
    lanes_of_ina: str = "int32",
) -> Measurement:
    """Scheme ``ina`` of ``run``'s group through the plugin in the plan's lane format
    ``lanes_of_ina``: ``repeat`` all-reduces of ``nbytes`` (float32) per member, the median
    of the slowest member's seconds."""
    cluster = workers.cluster
    grp = run.group
    members = list(grp.gpus)  # worker id = index in the plan's list, as the controller
    n = max(1, nbytes // 4)
    m = Measurement(run.name, "ina", len(members), n * 4, extra={"client": "plugin"})
    assert grp.switch is not None
    try:
        info = _ina_of(cluster, installed, grp.switch, members)
    except CollectiveError as exc:
        m.error = str(exc)
        return m
    # The host's INA UDP port belongs to one receiver: the members' Python workers go
    # (started again when a later scheme needs them).
    workers.stop(members)
    session = workers.fresh_session(info.group_id)
    workers.run_id += 1
    d = cluster.workdir / f"plugin-{workers.run_id}"
    d.mkdir()
    procs = {}
    for w, gpu in enumerate(members):
        cfg = d / f"ina-{gpu}.json"
        nic = cluster.spec.hosts[gpu].nic_ip
        cfg.write_text(json.dumps(_config(run, w, info, session, nic, lanes_of_ina)))
        argv = [str(HARNESS), "--lib", str(LIBRARY), "--dir", str(d), "--rank", str(w),
                "--nranks", str(len(members)), "--types", "float32", "--seed", str(seed),
                "--sizes", ",".join([str(n * 4)] * repeat), "--lanes", lanes_of_ina,
                "--exchange-timeout", str(GIVE_UP_S)]  # fmt: skip
        path = d / f"harness-{gpu}.log"
        with open(path, "ab") as err:
            p = cluster.net.popen(
                gpu,
                argv,
                stdout=-1,
                stderr=err,
                text=True,
                env=dict(os.environ, HEROSERVE_INA_CONFIG=str(cfg)),  # with the run's tag
            )
        cluster.procs.procs.append(Proc(f"harness-{gpu}", p, path))
        procs[gpu] = p
    got = _collect(procs, REPLY_TIMEOUT_S)
    # Whoever uses the group next (the Python library or the plugin) starts a session of
    # its own: the switch's slots now hold this one's rounds.
    workers.fresh_session(info.group_id)
    results: dict[str, list[dict]] = {}
    for gpu, (rc, events) in got.items():
        res = [e for e in events if e.get("event") == "result"]
        errs = [e for e in events if e.get("event") == "error"]
        if errs or len(res) != repeat or rc not in (0, 1):
            tail = (d / f"harness-{gpu}.log").read_text(errors="replace").strip()[-300:]
            why = f"{errs[0]['stage']} failed (rc {errs[0]['rc']})" if errs else f"exit {rc}"
            m.error = f"{gpu}: plugin {why}: {tail}"
            return m
        results[gpu] = res
        for e in events:
            if e.get("event") == "stats":
                m.ina_retransmissions += int(e["retransmissions"])
                m.stale_results += int(e["stale"])
    m.exact = all(e["exact"] for res in results.values() for e in res)
    per_repeat = [max(res[k]["seconds"] for res in results.values()) for k in range(repeat)]
    m.seconds = statistics.median(per_repeat)
    first = next(iter(results.values()))[0]
    m.max_error = max(r["max_err"] for res in results.values() for r in res)
    if lanes_of_ina == "bfp16":  # the harness's largest block bound, + float32's rounding
        m.error_bound = float(first["bound"]) + float(first["max_abs_sum"]) * 2.0**-24
        m.extra.update(seed=seed, elements=n, lanes="bfp16", session=session["session"])
        return m
    # The harness's scale 2^s, s = lanes.scale_exponent(members, e): the same bound as the
    # Python path, plus the result's one rounding to float32 (relative 2^-24).
    e = lanes.SUM_BITS - lanes.ceil_log2(len(members)) - int(first["scale_exp"])
    m.error_bound = lanes.error_bound(len(members), e) + float(first["max_abs_sum"]) * 2.0**-24
    m.extra.update(seed=seed, elements=n, exponent=e, session=session["session"])
    log.info("%s: plugin all-reduce of %d B, %d members", run.name, n * 4, len(members))
    return m
