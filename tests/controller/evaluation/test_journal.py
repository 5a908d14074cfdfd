"""The journal of finished jobs (``evaluation.journal``) and the runner's use of it: a job
recorded is read back instead of run, a run that dies keeps what finished, and what the
file holds is checked before it is believed."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

import controller.evaluation.journal as journal_mod
from controller.errors import InputError, WorkerLost
from controller.evaluation.ablation_sim import Job
from controller.evaluation.journal import MISSING, Journal, job_key
from controller.evaluation.sweep import Runner


def _ran(x: int, log: Path) -> list[int]:
    with log.open("a") as f:  # one line per call, whichever process runs it
        f.write(f"{x}\n")
    return [x, x * x]


def _square(item: tuple[int, str]) -> tuple[int, int]:
    x, log = item
    _ran(x, Path(log))
    return x, x * x


def _calls(log: Path) -> list[int]:
    return sorted(int(s) for s in log.read_text().split()) if log.exists() else []


@pytest.mark.parametrize("workers", [1, 2])
def test_a_recorded_job_is_read_back_not_run(tmp_path, workers):
    log = str(tmp_path / "calls")
    items = [(3, log), (1, log), (2, log)]
    with Runner(workers, journal=Journal(tmp_path / "j.db")) as run:
        first = run.call(_square, items)
    assert _calls(Path(log)) == [1, 2, 3]
    j = Journal(tmp_path / "j.db")
    with Runner(workers, journal=j) as run:
        again = run.call(_square, [*items, (4, log)])
    # the three finished jobs come back from the file; only the new one runs
    assert _calls(Path(log)) == [1, 2, 3, 4]
    assert (j.hits, j.recorded) == (3, 1)
    # results pass through JSON either way: lists, in the items' order
    assert first == [[3, 9], [1, 1], [2, 4]]
    assert again == [*first, [4, 16]]
    assert run.resumed().startswith(f" (3 jobs read back from the journal {j.path}, which took ")
    assert "; 1 run here, " in run.resumed()


def _sleep(s: float) -> float:
    time.sleep(s)  # a job whose duration is known from below: at least s
    return s


@pytest.mark.parametrize("workers", [1, 2])
def test_a_job_s_duration_is_recorded_and_told_when_read_back(tmp_path, workers):
    j = Journal(tmp_path / "j.db")
    with Runner(workers, journal=j) as run:
        run.call(_sleep, [0.2, 0.3])
    assert run.job_seconds >= 0.5  # measured in the worker, so at least the sleeps
    rows = dict(j._db.execute("SELECT result, seconds FROM job").fetchall())
    assert rows["0.2"] >= 0.2 and rows["0.3"] >= 0.3
    again = Journal(tmp_path / "j.db")
    with Runner(workers, journal=again) as run:
        assert run.call(_sleep, [0.2, 0.3]) == [0.2, 0.3]
    assert (again.hits, again.recorded, run.job_seconds) == (2, 0, 0.0)
    assert again.hit_seconds == pytest.approx(rows["0.2"] + rows["0.3"])
    assert f"which took {again.hit_seconds:.0f} s in their workers" in run.resumed()


def test_a_duration_that_is_not_a_number_is_not_believed(tmp_path):
    j = Journal(tmp_path / "j.db")
    for key, seconds in [("text", "'ten'"), ("neg", "-5"), ("inf", "9e999"), ("ok", "2.5")]:
        j._db.execute(
            f"INSERT INTO job VALUES (?, ?, '1', {seconds})", (key, journal_mod.code_digest())
        )
    assert [j.get(k) for k in ("text", "neg", "inf", "ok")] == [1, 1, 1, 1]
    assert j.hit_seconds == 2.5


def test_a_journal_written_before_durations_is_read(tmp_path):
    db = tmp_path / "j.db"
    with sqlite3.connect(db) as c:  # the schema of the journals that kept no durations
        c.execute(
            "CREATE TABLE job (key TEXT PRIMARY KEY, code TEXT NOT NULL, result TEXT NOT NULL)"
        )
        c.execute("INSERT INTO job VALUES ('old', ?, '[1, 2]')", (journal_mod.code_digest(),))
    j = Journal(db)
    assert j.get("old") == [1, 2] and j.hit_seconds == 0.0
    j.put("new", 3, 1.5)
    assert j._db.execute("SELECT seconds FROM job WHERE key = 'new'").fetchone() == (1.5,)


def _wait_for_file(item: tuple[int, str]) -> int:
    x, flag = item
    deadline = time.monotonic() + 120
    while x == 1 and not Path(flag).exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # the job after the read-back one waits for the caller's word
    return x if Path(flag).exists() or x == 0 else -1  # -1: the word never came


def test_jobs_read_back_are_told_before_the_others_finish(tmp_path):
    flag = str(tmp_path / "go")
    j = Journal(tmp_path / "j.db")
    j.put(job_key(_wait_for_file, (0, flag)), 0)
    said: list[str] = []

    def progress(m: str) -> None:
        said.append(m)
        Path(flag).touch()  # job 1 finishes only once job 0's line is out

    with Runner(2, progress=progress, journal=j) as run:
        assert run.call(_wait_for_file, [(0, flag), (1, flag)], "jobs") == [0, 1]
    assert said == ["jobs: 1/2 done (2 worker(s))", "jobs: 2/2 done (2 worker(s))"]
    assert (j.hits, j.recorded) == (1, 2)  # the result put above, then job 1's


def test_fresh_runs_every_job_again(tmp_path):
    log = str(tmp_path / "calls")
    with Runner(1, journal=Journal(tmp_path / "j.db")) as run:
        run.call(_square, [(1, log)])
    with Runner(1, journal=Journal(tmp_path / "j.db", fresh=True)) as run:
        run.call(_square, [(1, log)])
    assert _calls(Path(log)) == [1, 1]


def test_the_key_names_the_function_the_argument_and_the_code(monkeypatch):
    k = job_key(_square, (1, "x"))
    assert k == job_key(_square, (1, "x"))
    assert k != job_key(_square, (2, "x"))
    assert k != job_key(_ran, (1, "x"))
    monkeypatch.setattr(journal_mod, "code_digest", lambda: "other code")
    assert k != job_key(_square, (1, "x"))


def test_jobs_of_other_code_are_dropped_when_the_journal_opens(tmp_path, monkeypatch):
    j = Journal(tmp_path / "j.db")
    j.put("a", 1)
    j.close()
    assert len(Journal(tmp_path / "j.db")) == 1
    monkeypatch.setattr(journal_mod, "code_digest", lambda: "other code")
    assert len(Journal(tmp_path / "j.db")) == 0


def test_a_row_that_is_not_json_is_missing(tmp_path):
    j = Journal(tmp_path / "j.db")
    j.put("good", {"a": [1, 2.5, None]})
    j._db.execute(
        "INSERT INTO job (key, code, result) VALUES ('bad', ?, '{\"a\": [1,')",
        (journal_mod.code_digest(),),
    )
    assert j.get("good") == {"a": [1, 2.5, None]}
    assert j.get("bad") is MISSING
    assert j.get("never") is MISSING
    assert j.hits == 1


def test_a_file_that_is_not_a_journal_is_one_line(tmp_path):
    f = tmp_path / "j.db"
    f.write_text("not a database\n" * 100)
    with pytest.raises(
        InputError, match=r"^--journal: cannot use .*j\.db: file is not a database$"
    ):
        Journal(f)


def test_a_result_json_cannot_hold_is_refused(tmp_path):
    j = Journal(tmp_path / "j.db")
    with pytest.raises(TypeError, match="holds a set"):
        j.put("k", {1, 2})


def _die_when_two_recorded(item: tuple[int, str]) -> int:
    x, db = item
    if x != 0:
        return x
    # wait for the condition (two results committed by the parent), not for a time
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with sqlite3.connect(db) as c:
            if c.execute("SELECT COUNT(*) FROM job").fetchone()[0] >= 2:
                break
        time.sleep(0.01)
    os._exit(9)  # as the kernel's out-of-memory killer leaves a worker: gone mid-job


def test_a_run_that_dies_keeps_what_finished(tmp_path):
    db = str(tmp_path / "j.db")
    items = [(0, db), (1, db), (2, db)]  # the first job dies once the others are recorded
    with (
        Runner(2, journal=Journal(db)) as run,
        pytest.raises(WorkerLost, match=r"worker process died .* kept in .*j\.db, and the same"),
    ):
        run.call(_die_when_two_recorded, items)
    j = Journal(db)
    assert [j.get(job_key(_die_when_two_recorded, x)) for x in items[1:]] == [1, 2]
    assert j.get(job_key(_die_when_two_recorded, items[0])) is MISSING


def test_an_ablation_job_survives_the_round_trip(testbed_ablation_job):
    job = testbed_ablation_job
    back = Job.from_dict(json.loads(json.dumps(job.to_dict())), "j.db")
    assert back == job
    assert any(r.plan is not None for r in back.rows)


def test_a_tampered_ablation_job_is_one_line(testbed_ablation_job):
    d = json.loads(json.dumps(testbed_ablation_job.to_dict()))
    i = next(i for i, r in enumerate(d["rows"]) if r["plan"] is not None)
    d["rows"][i]["plan"]["decode"]["tp"] = -1
    with pytest.raises(InputError, match=rf"^j\.db: rows\[{i}\]\.plan: the plan: decode\.tp: "):
        Job.from_dict(d, "j.db")
    d["rows"][i]["plan"] = None
    d["rows"][i]["rate"] = "fast"
    with pytest.raises(InputError, match=rf"^j\.db: rows\[{i}\]\.rate: "):
        Job.from_dict(d, "j.db")
    with pytest.raises(InputError, match=r"^j\.db: must be a mapping \(an ablation job\)"):
        Job.from_dict([], "j.db")


@pytest.fixture(scope="module")
def testbed_ablation_job() -> Job:
    from controller.evaluation.ablation_report import _job

    return Job.from_dict(_job(("testbed-chatbot", {})), "fresh")


# The run-again test's points start at this many requests (``fidelity --requests``): every job
# kind still runs (both testbed scenarios planned in both cost modes, their ablations planned,
# every deployment's max rate searched over three seeds, undecided points doubled), in a
# tenth of the scenario's 2,000 (the report's own took 27 minutes under load: past the
# suite's 600 s per test).
QUICK_REQUESTS = 200


def test_fidelity_run_again_reads_back_every_job_and_writes_the_same_report(tmp_path, capsys):
    import re

    from controller.cli import main

    args = ["fidelity", "--quick", "--workers", "2", "--quiet", "--eval-dir", str(tmp_path),
            "--requests", str(QUICK_REQUESTS)]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "a.md")]) == 0
    assert main([*args, "--out", str(tmp_path / "b.md"), "--journal",
                 str(tmp_path / "a-journal.db")]) == 0  # fmt: skip
    a, b = ((tmp_path / f).read_text().splitlines() for f in ("a.md", "b.md"))
    footers = [i for i, line in enumerate(a) if line.startswith("*")]
    # every figure the same; only the footers (times, what was read back) differ
    assert [x for i, x in enumerate(a) if i not in footers] == [
        x for i, x in enumerate(b) if i not in footers
    ]
    assert all("jobs read back from the journal" not in a[i] for i in footers)
    assert "; 0 run here, 0 s)" in b[-1] and "jobs read back from the journal" in b[-1]
    # every job the first run recorded was read back: scenarios, ablations, points
    held = len(Journal(tmp_path / "a-journal.db"))
    assert f"({held} jobs read back from the journal" in b[-1]
    # every job kind ran: each testbed scenario's ablation rows carry a simulated H
    for name in ("testbed-chatbot", "testbed-summarization"):
        sim = re.compile(rf"^\| {name} \| distserve \| [0-9.]+ \| 16 \| - \| 1\.000x \| "
                         r"[0-9.]+ \([0-9.]+-[0-9.]+\) \|")  # fmt: skip
        assert any(sim.match(line) for line in a), name
    assert f"--requests {QUICK_REQUESTS}" in a[-1]  # the footer names the smaller run
