"""``python -m agents.ina.worker``: one emulated GPU's collective runner (docs/emulation.md).

Runs inside a host (network namespace) of the emulation and takes commands as JSON lines on
stdin, answering each with one JSON line on stdout:

``{"op": "prepare", "run": R, "scheme": "ina"|"ring"|"hier", "elements": N, "repeat": K,
"seed": S, "index": I, "ina": {...}, "ring": {...}}``
    Make member ``I``'s data (:func:`member_data`), open what the scheme needs (the INA
    session of ``ina``: group_id, worker_id, num_workers, window, switch_ip, and the group's
    session and first_generation where the coordinator gives them, and its ``lanes``:
    ``int32`` (default) or ``bfp16``, for scheme hier its rail's; the TCP rings of
    ``ring``: token and one [rank, size, next_ip] per channel) and answer
    ``{"run": R, "prepared": true}``.
``{"op": "go", "run": R}``
    int32: agree on the lane exponent with the scheme's own collective, then run ``K``
    all-reduces of the int32 lanes; bfp16: ``K`` all-reduces of the data itself, each
    agreeing its block exponents in band (``InaSession.allreduce_bfp16``; exponent null,
    agree_s 0; scheme hier: ``HierMember.allreduce_bfp16``, float32 reduce-scatter, the
    rail's bfp16, float32 all-gather). Answer the times, the exponent, a SHA-256 of the
    result (int32 lanes, or the sums as float64) and the transport's counters (INA and TCP
    retransmissions).
``{"op": "quit"}``

INA state (the round of every aggregator index) lives as long as the process, so one
worker runs every collective of its host; another session of a group starts from round 0.
A failed command answers ``"ok": false`` with the reason; the process goes on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agents.ina.hier import HierMember
from agents.ina.lanes import LaneError, member_exponent, to_lanes
from agents.ina.packet import (
    BFP16_LANES,
    GENERATIONS,
    INA_UDP_PORT,
    MAX_AGGREGATOR_SLOTS,
    MAX_GROUP_ID,
    MAX_WORKERS,
    SESSIONS,
)
from agents.ina.ring import RING_PORT, PeerListener, Ring, RingError
from agents.ina.transport import InaGroup, InaSession, InaTimeout, Timeouts

SCHEMES = ("ina", "ring", "hier")
MAX_ELEMENTS = 1 << 26  # 256 MiB of lanes: far beyond what an emulation moves
MAX_REPEAT = 1000
MAX_LINE = 1 << 16


class CommandError(ValueError):
    """A command this worker refuses (names the field)."""


# Member 0's data is this many times the others' (its exponent is 7 where theirs is 0), so
# the group's agreed exponent is not every member's own: a member scaling by its own
# exponent instead of the agreed one gets a wrong sum (the exponent agreements' test).
LEAD_MEMBER_SCALE = 100.0


def member_data(seed: int, index: int, elements: int) -> np.ndarray:
    """Member ``index``'s vector for run ``seed``: float32, reproducible, so the orchestrator
    can compute the exact expected sum without receiving anything. Uniform in [-1, 1),
    member 0's times LEAD_MEMBER_SCALE; member 1's first bfp16 block (BFP16_LANES elements)
    is zeros, the block whose proposal is the smallest exponent."""
    rng = np.random.default_rng([seed, index])
    x = rng.uniform(-1.0, 1.0, elements)
    if index == 0:
        x *= LEAD_MEMBER_SCALE
    elif index == 1:
        x[:BFP16_LANES] = 0.0
    return x.astype(np.float32)


def lanes_digest(lanes: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(lanes, dtype="<i4").tobytes()).hexdigest()


def sums_digest(sums: np.ndarray) -> str:
    """SHA-256 of a bfp16 all-reduce's sums as float64 (exact: the integer sum scaled by
    2^-s; a hierarchical one's float32 sums widen exactly)."""
    return hashlib.sha256(np.ascontiguousarray(sums, dtype="<f8").tobytes()).hexdigest()


def _int(d: dict[str, Any], key: str, lo: int, hi: int) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise CommandError(f"{key} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _str(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v or len(v) > 64:
        raise CommandError(f"{key} must be a short string, got {v!r}")
    return v


def _section(cmd: dict[str, Any], key: str) -> dict[str, Any]:
    v = cmd.get(key)
    if not isinstance(v, dict):
        raise CommandError(f"scheme {cmd.get('scheme')!r} needs an object {key!r}")
    return v


@dataclass
class Prepared:
    run: int
    scheme: str
    data: np.ndarray
    workers: int  # members of the whole group (for the lane scale)
    repeat: int
    collective: Any  # InaSession, Ring or HierMember
    ring: Ring | None = None
    lanes: str = "int32"  # the INA group's lane format (int32 or bfp16; ring: int32)


@dataclass
class Worker:
    name: str
    udp: socket.socket
    listener: PeerListener
    timeouts: Timeouts = field(default_factory=Timeouts)
    sessions: dict[int, InaSession] = field(default_factory=dict)
    prepared: Prepared | None = None
    switch_port: int = INA_UDP_PORT  # where switches listen (a loopback switch's own in tests)

    def session(self, spec: dict[str, Any]) -> InaSession:
        g = InaGroup(
            group_id=_int(spec, "group_id", 1, MAX_GROUP_ID),
            worker_id=_int(spec, "worker_id", 0, MAX_WORKERS - 1),
            num_workers=_int(spec, "num_workers", 1, MAX_WORKERS),
            window=_int(spec, "window", 1, MAX_AGGREGATOR_SLOTS - 1),
            switch_ip=_str(spec, "switch_ip"),
            switch_port=self.switch_port,
            # The group's session (docs/dataplane.md, "Known limits"): optional, 0 without.
            session=_int(spec, "session", 0, SESSIONS - 1) if "session" in spec else 0,
            first_generation=(
                _int(spec, "first_generation", 0, GENERATIONS - 1)
                if "first_generation" in spec
                else 0
            ),
        )
        s = self.sessions.get(g.group_id)
        if s is None or s.group != g:
            same_session = s is not None and s.group.session == g.session
            if same_session and s.group.window != g.window:
                raise CommandError(f"group {g.group_id} changed its window while in use")
            s = InaSession(g, self.udp, timeouts=self.timeouts)
            self.sessions[g.group_id] = s
        return s

    def ring(self, spec: dict[str, Any]) -> Ring:
        chans = spec.get("channels")
        if not isinstance(chans, list) or not 1 <= len(chans) <= 64:
            raise CommandError("ring.channels must list 1..64 [rank, size, next_ip]")
        positions = []
        for c in chans:
            if not isinstance(c, list) or len(c) != 3:
                raise CommandError("a ring channel is [rank, size, next_ip]")
            ch = {"rank": c[0], "size": c[1], "next_ip": c[2]}
            size = _int(ch, "size", 1, 4096)
            positions.append((_int(ch, "rank", 0, size - 1), size, _str(ch, "next_ip")))
        if len({p[1] for p in positions}) != 1:
            raise CommandError("every ring channel has the same size")
        return Ring.connect(
            self.listener,
            token=_int(spec, "token", 0, 2**56 - 1),
            positions=positions,
            timeout_s=self.timeouts.give_up_s,
        )

    def prepare(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.release()
        run = _int(cmd, "run", 0, 2**62)
        scheme = cmd.get("scheme")
        if scheme not in SCHEMES:
            raise CommandError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        n = _int(cmd, "elements", 1, MAX_ELEMENTS)
        data = member_data(_int(cmd, "seed", 0, 2**62), _int(cmd, "index", 0, 4095), n)
        workers = _int(cmd, "workers", 1, 4096)
        repeat = _int(cmd, "repeat", 1, MAX_REPEAT)
        ring = None
        lanes = _section(cmd, "ina").get("lanes", "int32") if scheme != "ring" else "int32"
        if lanes not in ("int32", "bfp16"):
            raise CommandError(f"ina.lanes must be int32 or bfp16, got {lanes!r}")
        if scheme == "ina":
            collective: Any = self.session(_section(cmd, "ina"))
        elif scheme == "ring":
            ring = collective = self.ring(_section(cmd, "ring"))
        else:
            rail = self.session(_section(cmd, "ina"))
            ring = self.ring(_section(cmd, "ring"))
            collective = HierMember(ring, rail)
        self.prepared = Prepared(run, scheme, data, workers, repeat, collective, ring, lanes)
        return {"run": run, "prepared": True}

    def go(self, cmd: dict[str, Any]) -> dict[str, Any]:
        p = self.prepared
        run = _int(cmd, "run", 0, 2**62)
        if p is None or p.run != run:
            raise CommandError(f"run {run} was not prepared")
        before = {id(s): s.stats.as_dict() for s in self._sessions_of(p)}
        try:
            seconds, digests = [], set()
            e: int | None = None
            agree_s = 0.0
            if p.lanes == "bfp16":
                for _ in range(p.repeat):
                    t0 = time.perf_counter()
                    sums = p.collective.allreduce_bfp16(p.data)
                    seconds.append(time.perf_counter() - t0)
                    digests.add(sums_digest(sums))
            else:
                t0 = time.perf_counter()
                e = p.collective.agree_exponent(member_exponent(p.data))
                agree_s = time.perf_counter() - t0
                lanes = to_lanes(p.data, p.workers, e)
                for _ in range(p.repeat):
                    t0 = time.perf_counter()
                    out = p.collective.allreduce_lanes(lanes)
                    seconds.append(time.perf_counter() - t0)
                    digests.add(lanes_digest(out))
            stats = self.counters(p, before)
        finally:
            self.release()
        return {
            "run": run,
            "ok": True,
            "seconds": seconds,
            "agree_s": agree_s,
            "exponent": e,
            "digest": digests.pop() if len(digests) == 1 else "differs-between-repeats",
            "stats": stats,
        }

    @staticmethod
    def _sessions_of(p: Prepared) -> list[InaSession]:
        if isinstance(p.collective, InaSession):
            return [p.collective]
        if isinstance(p.collective, HierMember):
            return [p.collective.rail]
        return []

    def counters(self, p: Prepared, before: dict[int, dict[str, float]]) -> dict[str, Any]:
        """This run's transport counters: TCP retransmissions of its rings, and the INA
        session's counters (differences over the run; srtt and rto as they ended)."""
        out: dict[str, Any] = {}
        if p.ring is not None:
            out["tcp_retransmissions"] = p.ring.retransmissions()
        for s in self._sessions_of(p):
            now, old = s.stats.as_dict(), before.get(id(s), {})
            out["ina"] = {
                k: v if k in ("srtt_s", "rto_s") else v - old.get(k, 0) for k, v in now.items()
            }
        return out

    def release(self) -> None:
        if self.prepared is not None and self.prepared.ring is not None:
            self.prepared.ring.close()
        self.prepared = None


def _answer(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def serve(w: Worker, lines: Any) -> None:
    for line in lines:
        cmd: Any = None
        if len(line) > MAX_LINE:
            _answer({"ok": False, "error": f"command longer than {MAX_LINE} bytes"})
            continue
        try:
            cmd = json.loads(line)
            if not isinstance(cmd, dict):
                raise CommandError("a command is a JSON object")
            op = cmd.get("op")
            if op == "quit":
                return
            if op == "prepare":
                _answer({"ok": True, **w.prepare(cmd)})
            elif op == "go":
                _answer(w.go(cmd))
            else:
                raise CommandError(f"unknown op {op!r}")
        except (CommandError, LaneError, InaTimeout, RingError, OSError, ValueError) as exc:
            w.release()
            _answer(
                {
                    "ok": False,
                    "run": cmd.get("run") if isinstance(cmd, dict) else None,
                    "error": f"{type(exc).__name__}: {exc}",
                }
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m agents.ina.worker", description=__doc__.split("\n")[0]
    )
    p.add_argument("--name", required=True, help="the GPU this worker stands for")
    p.add_argument("--ina-port", type=int, default=INA_UDP_PORT, help="UDP port for results")
    p.add_argument("--ring-port", type=int, default=RING_PORT, help="TCP port for ring peers")
    p.add_argument("--give-up", type=float, default=60.0, help="seconds without progress")
    a = p.parse_args(argv)
    try:
        timeouts = Timeouts(give_up_s=a.give_up)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        udp.bind(("0.0.0.0", a.ina_port))
        listener = PeerListener.open("0.0.0.0", a.ring_port)
    except (OSError, ValueError) as exc:
        print(f"worker {a.name}: {exc}", file=sys.stderr)
        return 2
    w = Worker(a.name, udp, listener, timeouts)
    _answer({"ok": True, "ready": a.name})
    try:
        serve(w, sys.stdin)
    except KeyboardInterrupt:
        pass
    finally:
        w.release()
        listener.close()
        udp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
