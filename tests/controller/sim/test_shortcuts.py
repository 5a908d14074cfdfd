"""The simulator's exact shortcuts against the unabridged run (``SimOptions.shortcuts``,
``heroserve simulate --exact``): whole-pass decode steps and lazy decode step ends give every
request the same times, at low load and in overload with preemptions, and the same run
statistics."""

import numpy as np
import pytest

from controller.cli import main
from controller.sim import SimOptions, Simulator, build_model, make_requests
from controller.sim.decode import DecodeSide


def _same_run(a, b) -> None:
    """Two runs of the same requests gave the same schedule and statistics (sums associate
    differently, hence 1e-9 and not bit equality)."""
    assert a.per_request.keys() == b.per_request.keys()
    for key, values in a.per_request.items():
        assert values == pytest.approx(b.per_request[key], rel=1e-9, abs=1e-12, nan_ok=True)
    assert a.preemptions == b.preemptions
    assert a.policy_use == b.policy_use  # every stage iteration counted once
    assert a.allreduce_throughput_Bps == pytest.approx(b.allreduce_throughput_Bps)
    assert a.link_util == pytest.approx(b.link_util)
    assert a.peak_kv_fraction == pytest.approx(b.peak_kv_fraction)
    # Little's law over the whole system: lazy step ends correct the area they were late for
    assert a.little["L_system"] == pytest.approx(b.little["L_system"], rel=1e-9)
    assert a.little["L"] == pytest.approx(b.little["L"], rel=1e-9)
    # the KV timeline: the same samples, but its last one may differ (sampling stops when
    # nothing else is left to happen, and a lazy instance's last wake-up can come later)
    n = min(len(a.kv_timeline), len(b.kv_timeline))
    assert abs(len(a.kv_timeline) - len(b.kv_timeline)) <= 1 and n > 100
    for i in (0, 1):  # sample times, then the KV memory in use at each
        assert [x[i] for x in a.kv_timeline[:n]] == pytest.approx([x[i] for x in b.kv_timeline[:n]])


@pytest.mark.parametrize("which", ["pp2_plan", "many_plan"])
@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_shortcuts_equal_the_unabridged_run(which, factor, monkeypatch, request):
    g, w, p = request.getfixturevalue(which)
    reqs = make_requests(w, factor * p.predicted.rate, 400, seed=2)
    model = build_model(p, g, w)
    fast = Simulator(model, SimOptions()).run(reqs)
    exact = Simulator(model, SimOptions(shortcuts=False)).run(reqs)
    _same_run(fast, exact)
    # the same with lazy step ends turned off: whole passes, one event per step end
    with monkeypatch.context() as mp:
        mp.setattr(DecodeSide, "_settle", lambda self, ds: None)
        eager = Simulator(model, SimOptions()).run(reqs)
    _same_run(eager, exact)
    # each shortcut did take its path: fewer events at every step
    assert fast.events < eager.events < exact.events
    if which == "pp2_plan" and factor > 1:  # the cache fills: instances step eagerly near it
        assert fast.preemptions > 0
    assert np.isfinite(fast.per_request["finish_s"]).all()


def test_lazy_steps_switch_to_events_when_a_transfer_waits_for_room(pp2_plan):
    """A decode instance with a request waiting for KV room steps with events (a step end
    must start that transfer at its own time); with room again it goes lazy."""
    g, w, p = pp2_plan
    model = build_model(p, g, w)
    sim = Simulator(model, SimOptions())
    modes: list[tuple[bool, bool]] = []
    settle = DecodeSide._settle

    def spy(self, ds):
        settle(self, ds)
        modes.append((bool(ds.pending), ds.lazy))

    sim._settle = spy.__get__(sim)
    sim.run(make_requests(w, 2.0 * p.predicted.rate, 400, seed=2))
    assert any(pending for pending, _ in modes)  # the cache did fill
    assert all(not lazy for pending, lazy in modes if pending)
    assert any(lazy for _, lazy in modes)


def test_cli_simulate_exact_gives_the_same_result(pp2_plan, tmp_path, capsys):
    g, w, p = pp2_plan
    path = tmp_path / "plan.json"
    p.save(path)
    outs = []
    for extra in ([], ["--exact"]):
        out = tmp_path / f"res{len(extra)}.json"
        args = ["simulate", "--plan", str(path), "--rate", "2", "--requests", "200"]
        assert main(args + ["--json", str(out)] + extra) == 0
        outs.append(out.read_text())
    capsys.readouterr()
    import json

    a, b = (json.loads(x) for x in outs)
    assert a["attainment"] == b["attainment"]
    assert a["ttft_s"] == pytest.approx(b["ttft_s"], rel=1e-9)
    assert a["tpot_s"] == pytest.approx(b["tpot_s"], rel=1e-9)
    assert a["events"] < b["events"]


def test_a_run_does_not_depend_on_the_runs_before_it(pp2_plan):
    """A run marks the KV routes it uses as risky links; the next run on the same priced plan
    (a rate sweep) starts from the plan's own risky links again, so it gives what a run on a
    freshly priced plan gives."""
    g, w, p = pp2_plan
    model = build_model(p, g, w)
    start = list(model.links.risky)
    reqs = make_requests(w, 2.0 * p.predicted.rate, 400, seed=2)
    first = Simulator(model, SimOptions(shortcuts=False)).run(reqs)
    assert model.links.risky != start  # the run did add links
    model.links.reset()  # what every run starts with
    assert model.links.risky == start
    again = Simulator(model, SimOptions(shortcuts=False)).run(reqs)
    _same_run(again, first)
