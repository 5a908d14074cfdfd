"""What an emulation run leaves if it dies without tearing down (SIGKILL, a crash, a
power-cut process tree), and how it is swept (docs/emulation.md, "Tear-down").

A run's processes all carry ``HEROSERVE_EMULATION=<tag>`` in their environment, its
interfaces in the root namespace and its shared-memory segments start with the tag, and its
work dir is ``$TMPDIR/heroserve-emulate-<tag>-*``. So a run can be swept by its tag alone:
:func:`sweep_tag` kills the tagged processes, deletes the interfaces and segments and removes
the work dir.

Two things sweep a dead run:

- a **watchdog** (:func:`start_watchdog`), a small process of its own session that each run
  starts first. It holds the read end of a pipe whose write end only the run holds (Python
  makes pipes non-inheritable, so no child of the run has it). A clean tear-down writes
  ``done`` before it closes the pipe; end of file without it means the run died, and the
  watchdog sweeps its tag. It waits on the pipe, never on a timer.
- the **next run** (:func:`sweep_dead_runs`): each run writes ``run.json`` (its pid and the
  pid's start time in clock ticks, from ``/proc/PID/stat``) into its work dir; a work dir whose
  process is gone, or whose pid now belongs to a process started at another time (a reused
  pid), is a dead run's, and is swept. A live run is never touched: its pid is there with the
  same start time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ENV_TAG = "HEROSERVE_EMULATION"
SHM_DIR = Path("/dev/shm")
WORKDIR_PREFIX = "heroserve-emulate-"
RUN_FILE = "run.json"
DONE = b"done\n"


def shm_prefix(tag: str) -> str:
    """HEROSERVE_SHM_PREFIX of this run's GPU agents (segments ``heroserve-<tag>-<group>``)."""
    return f"{tag}-"


def tagged_pids(tag: str) -> dict[int, str]:
    """Processes (pid -> command line) whose environment carries this run's tag."""
    out: dict[int, str] = {}
    needle = f"{ENV_TAG}={tag}".encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle not in (d / "environ").read_bytes().split(b"\0"):
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        out[int(d.name)] = cmd.strip()[:120]
    return out


def root_interfaces(prefix: str) -> list[str]:
    """Interfaces of the root namespace whose name starts with ``prefix`` (none where
    Mininet is not installed: no run made any)."""
    from controller.emulate.mn import load_network_module
    from controller.errors import InputError

    try:
        return load_network_module().root_interfaces(prefix)
    except InputError:
        return []


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: fields follow the last ')'
    return int(stat.rpartition(")")[2].split()[19])


def write_run_file(workdir: Path, tag: str) -> None:
    """Record that this process owns ``workdir`` (read by :func:`sweep_dead_runs`)."""
    pid = os.getpid()
    doc = {"tag": tag, "pid": pid, "start_time": start_time(pid)}
    (workdir / RUN_FILE).write_text(json.dumps(doc) + "\n")


def sweep_tag(tag: str, workdir: Path | None) -> dict[str, list[str]]:
    """Kill the processes, delete the interfaces and segments of run ``tag`` and remove its
    work dir; what was swept."""
    procs = []
    for pid, cmd in tagged_pids(tag).items():
        try:
            os.kill(pid, signal.SIGKILL)
            procs.append(f"{pid} {cmd}")
        except ProcessLookupError:
            pass
    ifs = root_interfaces(tag)
    for name in ifs:  # deleting one end of a veth pair deletes both
        subprocess.run(["ip", "link", "del", name], capture_output=True, timeout=30)
    shm = sorted(SHM_DIR.glob(f"heroserve-{shm_prefix(tag)}*"))
    for seg in shm:
        seg.unlink(missing_ok=True)
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"processes": procs, "interfaces": ifs, "shm": [p.name for p in shm]}


def dead_runs(tmp: Path | None = None) -> dict[str, Path]:
    """Work dirs (tag -> dir) under ``tmp`` whose run's process is gone."""
    out: dict[str, Path] = {}
    for d in Path(tmp or tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            doc = json.loads((d / RUN_FILE).read_text())
            tag, pid, started = str(doc["tag"]), int(doc["pid"]), doc["start_time"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a run's (or one still writing its file): left alone
        if not d.name.startswith(f"{WORKDIR_PREFIX}{tag}-"):
            continue  # a file naming another run's tag is not trusted
        if start_time(pid) != started:
            out[tag] = d
    return out


def sweep_dead_runs(tmp: Path | None = None) -> dict[str, dict[str, list[str]]]:
    """Sweep every dead run found under ``tmp`` (the temporary folder by default)."""
    return {tag: sweep_tag(tag, d) for tag, d in dead_runs(tmp).items()}


class Watchdog:
    """The run's end of the watchdog's pipe (:func:`start_watchdog`)."""

    def __init__(self, fd: int, proc: subprocess.Popen) -> None:
        self.fd = fd
        self.proc = proc

    def release(self) -> None:
        """The run tore down by itself: the watchdog exits without sweeping."""
        if self.fd < 0:
            return
        try:
            os.write(self.fd, DONE)
        finally:
            os.close(self.fd)
            self.fd = -1
        self.proc.wait(30)


def start_watchdog(tag: str, workdir: Path) -> Watchdog:
    """A process that sweeps run ``tag`` if this process dies before :meth:`Watchdog.release`
    (module docstring). It does not carry the tag, so a sweep never kills it."""
    read_end, write_end = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != ENV_TAG}
    argv = [sys.executable, "-m", "controller.emulate.sweep", "--fd", str(read_end),
            "--tag", tag, "--workdir", str(workdir)]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        pass_fds=(read_end,),
        start_new_session=True,  # a Ctrl-C or a group kill of the run does not reach it
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
    )
    os.close(read_end)
    return Watchdog(write_end, proc)


def _watch(fd: int, tag: str, workdir: Path) -> int:
    got = b""
    with os.fdopen(fd, "rb") as pipe:
        while chunk := pipe.read(64):  # blocks until the run writes or is gone
            got += chunk
    if got == DONE:
        return 0
    swept = sweep_tag(tag, workdir)
    print(f"heroserve emulate watchdog: run {tag} died; swept {swept}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m controller.emulate.sweep")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--workdir", type=Path, required=True)
    a = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe ends it
    return _watch(a.fd, a.tag, a.workdir)


if __name__ == "__main__":
    sys.exit(main())
