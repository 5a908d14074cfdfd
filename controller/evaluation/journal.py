"""A journal of finished jobs, so that a long evaluation a crash or a killed worker stops
goes on where it stopped instead of from the start.

``heroserve fidelity`` at 1,200 servers runs for about an hour, and a worker the system kills
for memory used to lose every scenario already planned. The runner (``sweep.Runner``) now
looks each job up here before running it, and records each result as it finishes:

- **What a job is**: the function's module and name, its argument as canonical JSON, and a
  digest of the ``controller`` package's source, so a journal written by other code, or for
  other inputs, is never read back. Runs of the same command on the same code share results.
- **What is stored**: the result as JSON text and the seconds the job took in its worker, in
  a SQLite file, one committed transaction per job; a crash loses at most the jobs running at
  that moment. A run that reads jobs back can so tell what they cost when they ran, and a
  report written from the journal does not show only its own short time. A job's result
  passes through the same JSON round trip whether it was just computed or read back, so both
  runs of a command see the same values (tuples become lists).
- **Hostile file**: the file may be truncated, edited or written by another program. A row
  that does not parse as JSON is treated as missing and its job runs again, and so is a row
  its caller's check refuses (``evaluation.results``: wrong types, an attainment outside
  [0, 1], a negative latency, NaN; an ablation job's plans as ``heroserve`` checks a plan
  file), with one warning line naming the job and the problem, never a traceback.

Holds ``code_digest``, ``job_key`` and ``Journal``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sqlite3
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from controller.errors import InputError

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS job"
    " (key TEXT PRIMARY KEY, code TEXT NOT NULL, result TEXT NOT NULL, seconds REAL)"
)
MISSING = object()  # what ``Journal.get`` returns for a job not (or not readably) recorded


@cache
def code_digest() -> str:
    """SHA-256 of every Python file of the ``controller`` package (relative path and bytes,
    in path order): a change to any of them is a change of every job's key."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _canonical(o: Any) -> Any:
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return {"__type__": type(o).__qualname__, **dataclasses.asdict(o)}
    raise TypeError(f"a job's argument holds a {type(o).__name__}, which has no canonical JSON")


def job_key(fn: Callable[..., Any], item: Any) -> str:
    """The key of ``fn(item)``: SHA-256 of the function's name, ``item`` as canonical JSON
    (sorted keys; dataclasses as their fields and type name) and ``code_digest()``."""
    arg = json.dumps(item, sort_keys=True, default=_canonical, allow_nan=True)
    text = f"{fn.__module__}.{fn.__qualname__}\0{arg}\0{code_digest()}"
    return hashlib.sha256(text.encode()).hexdigest()


class Journal:
    """Finished jobs' results in the SQLite file at ``path`` (made if missing, with its
    folder); ``fresh`` forgets what it holds first. Jobs of other code (``code_digest``) can
    never be read back, and are dropped when the journal opens, so it does not grow with
    every change of the code."""

    def __init__(
        self, path: str | Path, fresh: bool = False, warn: Callable[[str], None] | None = None
    ) -> None:
        self.path = Path(path)
        self.warn = warn or (lambda m: print(m, file=sys.stderr))  # one line per refused row
        self.refused = 0  # rows read back that a check refused this run (their jobs ran again)
        self.hits = 0  # jobs read back this run
        self.hit_seconds = 0.0  # what the jobs read back took when they ran (s, in workers)
        self.recorded = 0  # jobs run and recorded this run
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None)
            # WAL without a sync per commit: a committed job survives the process's crash
            # (what the journal is for), only not the machine's power loss
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
            columns = {r[1] for r in self._db.execute("PRAGMA table_info(job)")}
            if "seconds" not in columns:  # a journal written before durations were kept
                self._db.execute("ALTER TABLE job ADD COLUMN seconds REAL")
            if fresh:
                self._db.execute("DELETE FROM job")
            else:
                self._db.execute("DELETE FROM job WHERE code != ?", (code_digest(),))
        except (OSError, sqlite3.Error) as e:
            raise InputError(f"--journal: cannot use {self.path}: {e}") from None

    def get(self, key: str, check: Callable[[Any], str | None] | None = None) -> Any:
        """The result recorded for ``key``, or ``MISSING`` (also when ``check``, given the
        value, names a problem: one warning line, and the job runs again)."""
        row = self._db.execute("SELECT result, seconds FROM job WHERE key = ?", (key,)).fetchone()
        if row is None or not isinstance(row[0], str):
            return MISSING
        try:
            value = json.loads(row[0])
        except (ValueError, RecursionError):
            return MISSING
        problem = check(value) if check is not None else None
        if problem is not None:
            self.refused += 1
            self.warn(f"journal {self.path}: job {key[:12]}: {problem[:200]}: running it again")
            return MISSING
        self.hits += 1
        seconds = row[1]
        # a duration that is not a finite non-negative number is not believed, and not added
        if isinstance(seconds, (int, float)) and 0.0 <= seconds < math.inf:
            self.hit_seconds += float(seconds)
        return value

    def put(self, key: str, result: Any, seconds: float | None = None) -> Any:
        """Record ``result`` for ``key``, with the ``seconds`` the job took when known (one
        transaction); return the result as read back would be."""
        text = encode(result)
        self._db.execute(
            "INSERT OR REPLACE INTO job (key, code, result, seconds) VALUES (?, ?, ?, ?)",
            (key, code_digest(), text, seconds),
        )
        self.recorded += 1
        return json.loads(text)

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM job").fetchone()[0])

    def close(self) -> None:
        self._db.close()


def encode(result: Any) -> str:
    """``result`` as the journal stores it: JSON (NumPy scalars as the Python numbers they
    hold); TypeError for anything else JSON cannot hold."""
    return json.dumps(result, allow_nan=True, default=_number)


def _number(o: Any) -> int | float | bool:
    v = o.item() if hasattr(o, "item") and getattr(o, "shape", None) == () else None
    if isinstance(v, (int, float, bool)):
        return v
    raise TypeError(f"a job's result holds a {type(o).__name__}, which JSON cannot hold")
