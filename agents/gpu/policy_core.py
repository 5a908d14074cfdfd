"""Thin ctypes binding to the C++ policy core (``csrc/include/heroserve/heroserve.h``).

The same scheduler the NCCL tuner plugin runs, driven from Python: tests compare it with the
reference :mod:`controller.scheduler.online`, and Mininet hosts use it to pick INA or ring per
all-reduce. The library is ``build/csrc/libheroserve_policy.so`` (built by ``make cxx``), or
the path in ``HEROSERVE_POLICY_LIB``.

Units as in the reference: bytes, bytes/s, seconds; costs are fractions of the window T_u.
"""

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[2]


class CoreUnavailable(RuntimeError):
    """The shared library is not built or cannot be loaded."""


class CoreError(ValueError):
    """The core refused an input (bad table, bad utilisation); the message says why."""


def library_path() -> Path:
    """Where the core library is expected: $HEROSERVE_POLICY_LIB or build/csrc."""
    env = os.environ.get("HEROSERVE_POLICY_LIB")
    if env:
        return Path(env)
    return _ROOT / "build" / "csrc" / "libheroserve_policy.so"


_lib: ctypes.CDLL | None = None


def _load() -> ctypes.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    if not path.exists():
        raise CoreUnavailable(f"{path} is not built (run `make cxx`)")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise CoreUnavailable(f"cannot load {path}: {exc}") from exc
    vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    lib.hs_version.restype = cp
    lib.hs_store_new.restype = vp
    lib.hs_store_free.argtypes = [vp]
    lib.hs_store_publish_json.argtypes = [vp, cp, cp, sz]
    lib.hs_scheduler_new.restype = vp
    lib.hs_scheduler_new.argtypes = [vp]
    lib.hs_scheduler_free.argtypes = [vp]
    lib.hs_scheduler_install_json.argtypes = [vp, cp, cp, sz]
    lib.hs_scheduler_select.argtypes = [
        vp,
        ctypes.c_double,
        ctypes.POINTER(ctypes.c_uint32),
        ctypes.POINTER(ctypes.c_double),
    ]
    lib.hs_scheduler_observe_json.argtypes = [vp, cp, cp, sz]
    lib.hs_scheduler_seq.restype = ctypes.c_uint64
    lib.hs_scheduler_seq.argtypes = [vp]
    lib.hs_scheduler_version.restype = ctypes.c_uint64
    lib.hs_scheduler_version.argtypes = [vp]
    lib.hs_scheduler_costs.restype = sz
    lib.hs_scheduler_costs.argtypes = [vp, ctypes.POINTER(ctypes.c_double), sz]
    lib.hs_shm_publish_json.argtypes = [cp, cp, cp, sz]
    _lib = lib
    return lib


def _encode(obj: Mapping[str, Any] | str) -> bytes:
    return (obj if isinstance(obj, str) else json.dumps(obj)).encode()


class PolicyCore:
    """One C++ :class:`Scheduler`: same API shape as ``OnlineScheduler``."""

    def __init__(self, table: Mapping[str, Any] | str | None = None) -> None:
        self._lib = _load()
        self._h = self._lib.hs_scheduler_new(None)
        if not self._h:
            raise MemoryError("hs_scheduler_new failed")
        self.last_cost = 0.0
        if table is not None:
            self.install(table)

    def close(self) -> None:
        if self._h:
            self._lib.hs_scheduler_free(self._h)
            self._h = None

    def __del__(self) -> None:
        self.close()

    def install(self, table: Mapping[str, Any] | str) -> bool:
        """Queue a table (docs/policy-table.md JSON); False when stale. CoreError if invalid."""
        err = ctypes.create_string_buffer(512)
        rc = self._lib.hs_scheduler_install_json(self._h, _encode(table), err, len(err))
        if rc < 0:
            raise CoreError(err.value.decode())
        return rc == 1

    def select(self, nbytes: int | float) -> int:
        """Eqs. 16-17 for ``nbytes`` bytes; returns the policy id (J in ``last_cost``)."""
        if not float(nbytes) >= 0.0:
            raise ValueError(f"transfer size must be >= 0 bytes, got {nbytes!r}")
        pid = ctypes.c_uint32()
        cost = ctypes.c_double()
        if self._lib.hs_scheduler_select(self._h, float(nbytes), pid, cost) != 0:
            raise RuntimeError(f"no policy table in force at collective {self.seq}")
        self.last_cost = cost.value
        return pid.value

    def observe_utilisation(self, utilisation: Mapping[str, float]) -> None:
        """Close a window T_u (Eq. 18 and cost decay)."""
        err = ctypes.create_string_buffer(512)
        if self._lib.hs_scheduler_observe_json(self._h, _encode(utilisation), err, len(err)):
            raise CoreError(err.value.decode())

    @property
    def seq(self) -> int:
        return int(self._lib.hs_scheduler_seq(self._h))

    @property
    def version(self) -> int | None:
        v = int(self._lib.hs_scheduler_version(self._h))
        return v or None

    @property
    def costs(self) -> list[float]:
        n = self._lib.hs_scheduler_costs(self._h, None, 0)
        buf = (ctypes.c_double * n)()
        self._lib.hs_scheduler_costs(self._h, buf, n)
        return list(buf)


def publish_to_shm(group_id: str, tables: list[Mapping[str, Any]]) -> None:
    """Write tables into the group's shm segment as the GPU agent daemon does."""
    lib = _load()
    err = ctypes.create_string_buffer(512)
    doc = json.dumps({"tables": list(tables)}).encode()
    if lib.hs_shm_publish_json(group_id.encode(), doc, err, len(err)):
        raise CoreError(err.value.decode())
