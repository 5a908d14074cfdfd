"""Property test of the INA slot protocol (docs/dataplane.md, "Slot protocol") against the
executable switch: seeded random interleavings of loss, duplication, reordering and
delays of up to ~15 rounds, 2-8 workers, hundreds of rounds per run. Every result the
switch emits must be the exact sum of its round's contributions, and every worker must
end with every chunk's exact sum (no round lost). The hosts follow the documented host
contract (tests/support/ina_sim.py). The same switch inputs replayed through BMv2 are in
tests/agents/softswitch/test_softswitch_bmv2_diff.py.
"""

from __future__ import annotations

import pytest
from support.ina_sim import HostSimulation, Network, ProtocolViolation, worker_port

from agents.softswitch.headers import (
    DROP_LATE,
    EVT_COMPLETED,
    EVT_RETX_ABSORBED,
    EVT_RETX_ANSWERED,
)
from agents.softswitch.pipeline import InaPipeline

GROUP, MCAST = 5, 77


def model_switch(workers: int, window: int, slot_base: int = 100) -> InaPipeline:
    p = InaPipeline()
    for a in range(window):
        p.add_group(GROUP, a, slot=slot_base + a, workers=workers, mcast=MCAST)
    for w in range(workers):
        p.bind_worker(GROUP, w, worker_port(w))
    p.pre.insert(MCAST, [(worker_port(w), 0) for w in range(workers)])
    return p


CASES = [
    # (seed, workers, window, chunks, network)
    *[(seed, 2 + seed % 7, 1 + seed % 4, 240, Network()) for seed in range(14)],
    (100, 8, 2, 400, Network(loss=0.25, dup=0.25, stale=0.1, stale_delay=40.0)),
    (101, 3, 1, 500, Network(loss=0.02, dup=0.5, stale=0.3, stale_delay=25.0)),
    (102, 5, 4, 400, Network(loss=0.3, dup=0.0, stale=0.0)),
    (103, 2, 1, 500, Network(loss=0.0, dup=0.0, stale=0.5, stale_delay=30.0)),
]


@pytest.mark.parametrize(("seed", "workers", "window", "chunks", "net"), CASES)
def test_every_result_is_the_exact_sum_and_no_round_is_lost(
    seed: int, workers: int, window: int, chunks: int, net: Network
) -> None:
    sw = model_switch(workers, window)
    sim = HostSimulation(
        sw.process, seed=seed, workers=workers, window=window, chunks=chunks, net=net
    )
    trace = sim.run()  # checks every emitted result and every worker's final sums
    assert trace.results_checked >= chunks  # at least one multicast per chunk
    ev = sw.ingress.ina_events.packets
    assert ev[EVT_COMPLETED] == chunks  # each round completes exactly once


def test_the_adversarial_paths_are_exercised() -> None:
    """Across a lossy, duplicating, delaying run the switch answered retransmissions,
    absorbed duplicates and dropped late packets: the property above covers them."""
    sw = model_switch(4, 2)
    sim = HostSimulation(
        sw.process,
        seed=7,
        workers=4,
        window=2,
        chunks=300,
        net=Network(loss=0.2, dup=0.3, stale=0.2, stale_delay=30.0),
    )
    trace = sim.run()
    ev = sw.ingress.ina_events.packets
    assert ev[EVT_RETX_ANSWERED] > 0 and ev[EVT_RETX_ABSORBED] > 0
    assert sw.ingress.ina_drops.packets[DROP_LATE] > 0
    assert trace.retransmissions > 0 and trace.ignored_results > 0


def test_the_old_rule_fails_the_same_property() -> None:
    """The check has teeth: SwitchML's rule (version bit only, clear the worker's bit in
    the other copy) emits a wrong sum under the same kind of interleavings."""

    class VersionOnly:
        """SwitchML's two-copy protocol before the generation byte, on the same packets."""

        def __init__(self, inner: InaPipeline) -> None:
            self.inner = inner

        def process(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
            gen_at = slice(14 + 20 + 8 + 12, 14 + 20 + 8 + 16)  # the 32-bit generation
            b = bytearray(frame)
            gen = bytes(b[gen_at])
            b[gen_at] = bytes(4)  # no generation: all rounds of a copy look alike
            ing = self.inner.ingress
            before = [ing.seen.read(i) for i in range(200, 202)]
            out = self.inner.process(port, bytes(b))
            # "Clear this worker's bit in the other copy" on a new contribution.
            for i in range(200, 202):
                added = ing.seen.read(i) & ~before[i - 200]
                if added:
                    ing.seen.write(i ^ 1, ing.seen.read(i ^ 1) & ~added)
            # The outputs carry the round the sender meant, as a host reads it.
            fixed = []
            for egress, f in out:
                o = bytearray(f)
                o[gen_at] = gen
                fixed.append((egress, bytes(o)))
            return fixed

    failures = 0
    for seed in range(6):
        sw = VersionOnly(model_switch(3, 1))
        sim = HostSimulation(
            sw.process,
            seed=seed,
            workers=3,
            window=1,
            chunks=200,
            net=Network(loss=0.1, dup=0.3, stale=0.2, stale_delay=20.0),
        )
        try:
            sim.run(max_events=200_000)
        except ProtocolViolation:
            failures += 1
    assert failures == 6  # every seed: a wrong sum went out
