"""Drive ``libnccl-tuner-heroserve.so`` the way NCCL does, without NCCL or a GPU.

Loads the plugin with ctypes, opens ``--ranks`` communicator contexts through the v6 ABI and
answers commands on stdin, one per line, with one JSON line each on stdout:

* ``run N BYTES``: N AllReduces of BYTES on every rank; replies
  ``{"choices": [[seq, version, policy_id, algorithm], ...]}`` for rank 0,
  ``"agree": true`` when every rank picked the same algorithm every time, and
  ``"max_call_us"``, the longest single ``getCollInfo`` call (wall clock, this process).
* ``stats``: ``{"version": .., "seq": .., "selections": .., "fallbacks": .., "stalled": ..,
  "refused": ..}`` of rank 0 (``stalled``: collectives decided while the segment's seqlock
  stayed held; ``refused``: segment reads refused as garbled, truncated or foreign).
* ``quit``.

Used by the end-to-end tests (controller -> agent -> shm -> plugin -> telemetry) and
by Mininet hosts. The environment selects the group (``HEROSERVE_GROUP``) and segment prefix
(``HEROSERVE_SHM_PREFIX``). Usage errors: message and exit status 2.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time

NUM_ALGO, NUM_PROTO = 7, 3
ALLREDUCE = 4


class _Stats(ctypes.Structure):
    _fields_ = [
        ("selections", ctypes.c_uint64),
        ("fallbacks", ctypes.c_uint64),
        ("table_version", ctypes.c_uint64),
        ("seq", ctypes.c_uint64),
        ("last_policy_id", ctypes.c_uint32),
        ("last_algorithm", ctypes.c_int),
        ("stalled", ctypes.c_uint64),
        ("refused", ctypes.c_uint64),
        ("parsed", ctypes.c_uint64),
        ("reader_parsed", ctypes.c_uint64),
    ]


_INIT = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_uint64,
    ctypes.c_size_t,
    ctypes.c_size_t,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
)
_GET = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_int),
)
_FIN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class _TunerV6(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("init", _INIT),
        ("getCollInfo", _GET),
        ("finalize", _FIN),
        ("getChunkSize", ctypes.c_void_p),
    ]


def _nccl_costs() -> ctypes.Array:
    """An NCCL-shaped cost table float[7][3] where NCCL by itself would pick Ring/LL."""
    t = (ctypes.c_float * (NUM_ALGO * NUM_PROTO))()
    for a in range(NUM_ALGO):
        for p in range(NUM_PROTO):
            t[a * NUM_PROTO + p] = 10.0 + a * 3 + p
    t[1 * NUM_PROTO + 0] = 5.0
    return t


def _cheapest(t: ctypes.Array) -> int:
    best, cost = -1, 0.0
    for i in range(NUM_ALGO * NUM_PROTO):
        if t[i] >= 0 and (best < 0 or t[i] < cost):
            best, cost = i, t[i]
    return best // NUM_PROTO


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plugin", help="path of libnccl-tuner-heroserve.so")
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args(argv)
    if args.ranks < 1:
        ap.error("--ranks must be >= 1")
    try:
        lib = ctypes.CDLL(args.plugin)
    except OSError as exc:
        print(f"tuner_driver: cannot load {args.plugin}: {exc}", file=sys.stderr)
        return 2
    tuner = _TunerV6.in_dll(lib, "ncclTunerPlugin_v6")
    stats_fn = lib.heroserveTunerStats
    stats_fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Stats)]
    ctxs = []
    for _ in range(args.ranks):
        c = ctypes.c_void_p()
        if tuner.init(ctypes.byref(c), 1, args.ranks, 1, None, None, None) != 0:
            print("tuner_driver: init failed", file=sys.stderr)
            return 1
        ctxs.append(c)
    nch = ctypes.c_int(0)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        if words[0] == "stats":
            s = _Stats()
            stats_fn(ctxs[0], ctypes.byref(s))
            out = {
                "version": s.table_version,
                "seq": s.seq,
                "selections": s.selections,
                "fallbacks": s.fallbacks,
                "stalled": s.stalled,
                "refused": s.refused,
            }
        elif words[0] == "run" and len(words) == 3 and all(w.isdigit() for w in words[1:]):
            n, size = int(words[1]), int(words[2])
            choices, agree, worst = [], True, 0.0
            for _ in range(n):
                algos = []
                for c in ctxs:
                    t = _nccl_costs()
                    t0 = time.perf_counter()
                    tuner.getCollInfo(c, ALLREDUCE, size, 1, t, NUM_ALGO, NUM_PROTO, 0, nch)
                    worst = max(worst, time.perf_counter() - t0)
                    algos.append(_cheapest(t))
                agree = agree and len(set(algos)) == 1
                s = _Stats()
                stats_fn(ctxs[0], ctypes.byref(s))
                choices.append([s.seq - 1, s.table_version, s.last_policy_id, algos[0]])
            out = {"choices": choices, "agree": agree, "max_call_us": round(worst * 1e6, 1)}
        else:
            out = {"error": f"unknown command {line.strip()!r}"}
        print(json.dumps(out), flush=True)
    for c in ctxs:
        tuner.finalize(c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
