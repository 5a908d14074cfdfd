"""Differential test: the same packet sequences through the executable model
(agents/softswitch/pipeline.py) and through BMv2 running p4/heroserve_ina.p4 compiled by
p4c give the same output frames on every port, in order, and the same counters.

Sequences: normal rounds, loss and retransmission, duplication, reordering, late packets
(the delayed duplicate, stale generations), malformed packets (one of each drop
reason, truncations at every length, fragments, random mutations), L2 traffic, bfp16 lanes
(docs/dataplane.md "Lane formats": exponent proposals, saturation, a round's format, rounds
of both formats on one slot; their results also checked against hand-worked sums), and the
switch inputs of the property test's random interleavings (tests/support/ina_sim.py), so that
"the same sequences through BMv2 give the same results" holds for those too. Where
they differ, the P4 program is the reference and the model is to be fixed.

Needs the P4 toolchain on PATH and root (BMv2 runs in a namespace of its own); skipped
with the reason otherwise (tests/support/bmv2.py). The model half of every sequence also runs
without BMv2, so the sequences themselves stay valid.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from support.bmv2 import COUNTERS, Bmv2Netns, bmv2_missing, compile_v1model
from support.ina_sim import HostSimulation, Network, worker_port

from agents.ina.packet import BFP16_LANES, EXP_BAD, VECTOR_LEN, InaHeader, build_frame, unpack
from agents.softswitch.headers import DROP_LANE_FORMAT, DROP_RESERVED_BITS
from agents.softswitch.pipeline import InaPipeline
from agents.softswitch.tables import TableEntry

PORTS = 9  # 1..8 workers, 9 a host reached by L2
HOST9_MAC = 0x020000000909
FLOOD_MAC = 0xFFFFFFFFFFFF


def mac(port: int) -> str:
    return f"02:00:00:00:0{port}:0{port}"


def frame(
    group: int,
    agg: int,
    w: int,
    n: int,
    round_: int,
    port: int,
    *,
    values: list[int] | None = None,
    retx: bool = False,
    dst_mac: str = "02:00:00:00:00:fe",
    lanes: str = "int32",
    exp: int = 0,
) -> bytes:
    vals = (
        values
        if values is not None
        else [(port * 1000 + round_ * 10 + i) * (-1) ** i for i in range(VECTOR_LEN)]
    )
    return build_frame(
        InaHeader.at_round(group, agg, w, n, round_, is_retx=retx, lanes=lanes, exp=exp),
        vals,
        src_mac=mac(port),
        dst_mac=dst_mac,
        src_ip=f"10.1.0.{port}",
        dst_ip="10.1.0.254",
    )


# ---- table setups (the same entries for the model and for BMv2) -----------------------

BASE_SETUP: dict = {
    # group 7: 4 workers on ports 1-4, aggregators 0-2 on slots 10-12; index 5 points
    # past the registers. group 8: 2 workers on ports 5-6, one aggregator on slot 20.
    "aggregation": [
        [7, 0, 10, 4, 100],
        [7, 1, 11, 4, 100],
        [7, 2, 12, 4, 100],
        [7, 5, 1024, 4, 100],
        [8, 0, 20, 2, 101],
    ],
    "worker_port": [[7, w, w + 1] for w in range(4)] + [[8, 0, 5], [8, 1, 6]],
    "mcast": {"100": [1, 2, 3, 4], "101": [5, 6], "200": list(range(1, PORTS + 1))},
    "result_rewrite": [[1, 0x0A0000000001, 0x0A090001], [2, 0x0A0000000002, 0x0A090002]],
    "l2": [[HOST9_MAC, 9]],
    "l2_flood": [[FLOOD_MAC, 200]],
}


def sim_setup(workers: int, window: int) -> dict:
    """The property test's switch (tests/agents/softswitch/test_ina_protocol_property.py)."""
    return {
        "aggregation": [[5, a, 100 + a, workers, 77] for a in range(window)],
        "worker_port": [[5, w, worker_port(w)] for w in range(workers)],
        "mcast": {"77": [worker_port(w) for w in range(workers)]},
    }


def apply_setup(p: InaPipeline, setup: dict) -> None:
    for group, index, slot, workers, mcast in setup.get("aggregation", []):
        p.add_group(group, index, slot=slot, workers=workers, mcast=mcast)
    for group, worker, port in setup.get("worker_port", []):
        p.bind_worker(group, worker, port)
    for port, dmac, dip in setup.get("result_rewrite", []):
        p.egress.result_rewrite.insert(
            TableEntry((port,), "InaEgress.set_result_dst", {"dmac": dmac, "dip": dip})
        )
    for m, port in setup.get("l2", []):
        p.add_l2(m, port)
    for m, group in setup.get("l2_flood", []):
        p.ingress.l2_forward.insert(
            TableEntry((m,), "InaIngress.l2_multicast", {"mcast_grp": group})
        )
    for group, ports in setup.get("mcast", {}).items():
        p.pre.insert(int(group), [(port, 0) for port in ports])


def run_model(setup: dict, frames: list[tuple[int, bytes]]) -> dict:
    """The model's side, in the driver's format (tests/support/bmv2.py)."""
    p = InaPipeline()
    apply_setup(p, setup)
    outputs: dict[str, list[str]] = {}
    for port, f in frames:
        for egress, out in p.process(port, f):
            outputs.setdefault(str(egress), []).append(out.hex())
    counters = {}
    for name, cells in COUNTERS.items():
        c = p.counters[name]
        with_bytes = c.unit == "BOTH"
        counters[name] = [[c.packets[i], c.bytes[i] if with_bytes else 0] for i in range(cells)]
    return {"outputs": outputs, "counters": counters}


# ---- the sequences ---------------------------------------------------------------------


def seq_normal() -> list[tuple[int, bytes]]:
    out = []
    for r in range(4):
        for a in range(3):
            for w in range(4):
                out.append((w + 1, frame(7, a, w, 4, r, w + 1)))
        for w in range(2):
            out.append((5 + w, frame(8, 0, w, 2, r, 5 + w)))
    return out


def seq_loss() -> list[tuple[int, bytes]]:
    out = []
    for r in range(3):
        # worker 3's first packet is lost: the others wait; it retransmits.
        for w in range(3):
            out.append((w + 1, frame(7, 0, w, 4, r, w + 1)))
        out.append((4, frame(7, 0, 3, 4, r, 4, retx=True)))
        # worker 1 lost the result: its retransmission is answered.
        out.append((2, frame(7, 0, 1, 4, r, 2, retx=True)))
    return out


def seq_duplication() -> list[tuple[int, bytes]]:
    out = []
    for r in range(3):
        for w in range(4):
            f = frame(7, 1, w, 4, r, w + 1)
            out += [(w + 1, f)] * (1 + (w + r) % 3)
        out += [(1, frame(7, 1, 0, 4, r, 1, retx=True))] * 2  # after completion
    return out


def seq_reordering() -> list[tuple[int, bytes]]:
    rng = random.Random(13)
    pkts = [
        (w + 1, frame(7, a, w, 4, r, w + 1)) for r in range(4) for a in range(3) for w in range(4)
    ]
    rng.shuffle(pkts)
    return pkts


def seq_late() -> list[tuple[int, bytes]]:
    out = []
    late = frame(8, 0, 0, 2, 0, 5, values=[10] * VECTOR_LEN)
    out.append((5, late))
    out.append((6, frame(8, 0, 1, 2, 0, 6, values=[2] * VECTOR_LEN)))
    out += [(5, frame(8, 0, 0, 2, 1, 5)), (6, frame(8, 0, 1, 2, 1, 6))]
    out.append((5, late))  # answered: round 0 still on its copy
    out.append((5, frame(8, 0, 0, 2, 2, 5, values=[5] * VECTOR_LEN)))
    out.append((5, late))  # late: the copy holds round 2 (dropped, counted)
    out.append((6, frame(8, 0, 1, 2, 2, 6, values=[7] * VECTOR_LEN)))  # 12, not 17
    # Generations far behind and far ahead of copy 0 (generation 1 now).
    for gen in (0, 1, 2, 127, 128, 129, 200, 255, 2**31, 2**32 - 1):
        h = InaHeader(8, 0, 0, 2, generation=gen)
        out.append((5, build_frame(h, [gen & 0xFFFF] * VECTOR_LEN, src_mac=mac(5))))
    # A newer session takes copy 0 over at its generation; the older one is late from then.
    for session, gen in ((2**31 - 1, 9), (0, 1), (2**31 - 1, 9), (2**31, 10)):
        h = InaHeader(8, 0, 1, 2, generation=gen, session=session)
        out.append((6, build_frame(h, [session & 0xFF] * VECTOR_LEN, src_mac=mac(6))))
    return out


def _mutate(f: bytes, offset: int, value: int) -> bytes:
    b = bytearray(f)
    b[offset] = value
    return bytes(b)


def seq_malformed() -> list[tuple[int, bytes]]:
    good = frame(7, 0, 0, 4, 0, 1)
    ina = 14 + 20 + 8
    out = [
        (1, frame(7, 0, 4, 4, 0, 1)),  # worker id 4 of 4
        (1, frame(7, 0, 0, 33, 0, 1)),  # 33 workers
        (1, frame(7, 0, 0, 3, 0, 1)),  # worker count mismatch
        (1, frame(9, 0, 0, 4, 0, 1)),  # group not aggregated here, no L2 route
        (1, frame(9, 0, 0, 4, 0, 1, dst_mac="02:00:00:00:09:09")),  # transit to port 9
        (1, frame(7, 3, 0, 4, 0, 1)),  # agg_index outside group 7
        (1, frame(7, 5, 0, 4, 0, 1)),  # slot out of range
        (2, frame(7, 0, 0, 4, 0, 2)),  # worker 0 claimed from port 2
        (1, _mutate(good, ina + 6, 0x01)),  # reserved bit
        (1, _mutate(good, 14 + 6, 0x20)),  # first fragment (More-Fragments)
        (1, _mutate(good, 14 + 7, 0x08)),  # a later fragment (offset 8): plain L2
        (1, _mutate(good, 14, 0x46)),  # IPv4 options: plain L2
        (1, _mutate(good, 14 + 9, 6)),  # TCP: plain L2
        (1, _mutate(good, 12, 0x86)),  # not IPv4
        (9, build_frame(InaHeader(7, 0, 0, 4, is_result=True), [1] * VECTOR_LEN, dst_mac=mac(1))),
        (9, _mutate(frame(7, 0, 0, 4, 0, 9), ina + 6, 0x20 | 0x02)),  # result, reserved bit
        (3, bytes.fromhex("ffffffffffff0200000003030806") + bytes(28)),  # ARP: flooded
    ]
    for cut in range(14, len(good)):  # every truncation
        out.append((1, good[:cut]))
    rng = random.Random(2026)
    for _ in range(250):  # random mutations of the INA header and the IPv4/UDP fields
        b = bytearray(frame(7, rng.randrange(3), rng.randrange(4), 4, rng.randrange(3), 1))
        for _ in range(rng.randrange(1, 4)):
            b[rng.choice([14 + 6, 14 + 9, 36, 37, *range(ina, ina + 8)])] = rng.randrange(256)
        port = rng.randrange(1, PORTS + 1)
        out.append((port, bytes(b[: rng.choice([len(b), len(b), rng.randrange(14, len(b))])])))
    return out


def b16(group: int, agg: int, w: int, n: int, round_: int, values: list[int], exp: int) -> bytes:
    """A bfp16 contribution of worker ``w`` (on port w + 1 for group 7, w + 5 for group 8)."""
    port = w + 1 if group == 7 else w + 5
    return frame(group, agg, w, n, round_, port, values=values, lanes="bfp16", exp=exp)


def honest16(w: int) -> list[int]:
    # Mixed signs up to the largest an honest member of 4 sends (|q| <= 2**12).
    return [(-1) ** (i + w) * ((i * 67 + w * 1013) % 4097) for i in range(BFP16_LANES)]


BIG16 = [30000, -30000] * (BFP16_LANES // 2)
# Group 7's bfp16 rounds, in the order their results leave on port 1: (the members'
# proposals, their lanes) per round; the hand-worked results are in BFP16_RESULTS.
BFP16_ROUNDS = [
    (0, 0, [130, 127, 140, 0], [[0] * BFP16_LANES] * 4),  # proposal round: E = 3, 0, 13, -127
    (0, 1, [1, 2, 3, 4], [honest16(w) for w in range(4)]),
    (1, 0, [127] * 4, [BIG16, BIG16, [1] * BFP16_LANES, [1] * BFP16_LANES]),  # saturates
    (1, 1, [127] * 4, [[-32768] * BFP16_LANES, [0] * BFP16_LANES, [5] * 64, [-5] * 64]),
    (2, 0, [9, 8, 7, 6], [[1] * BFP16_LANES] * 4),  # worker 1's int32 packet dropped first
    (2, 1, [10, 10, EXP_BAD, 10], [[w] * BFP16_LANES for w in range(4)]),  # EXP_BAD wins
]
# (exp byte, overflow flag, lanes) of each result above, worked by hand.
BFP16_RESULTS = [
    (140, False, [0] * BFP16_LANES),
    (4, False, [sum(honest16(w)[i] for w in range(4)) for i in range(BFP16_LANES)]),
    # Lane 0: 30000 + 30000 saturates at 32767, + 1 + 1 stays there (saturated each time);
    # lane 1: -30000 - 30000 saturates at -32768, + 1 + 1 = -32766: never wrapped.
    (127, True, [32767, -32766] * (BFP16_LANES // 2)),
    (127, False, [-32768] * BFP16_LANES),  # -32768 + 0 + 5 - 5: the extreme, no overflow
    (9, False, [4] * BFP16_LANES),
    (EXP_BAD, False, [6] * BFP16_LANES),
]
# Contributions that saturated a lane: workers 1, 2, 3 of group 7's agg 1 round 0, and
# group 8's second member in its bfp16 round.
BFP16_OVERFLOWS = 4


def seq_bfp16() -> list[tuple[int, bytes]]:
    out = []
    for agg, rnd, exps, lanes in BFP16_ROUNDS:
        for w in range(4):
            if (agg, rnd, w) == (2, 0, 1):  # another format on the open round: dropped
                out.append((2, frame(7, 2, 1, 4, 0, 2, values=[1] * VECTOR_LEN)))
            if (agg, rnd, w) == (1, 1, 0):  # agg 1 round 0's result lost at worker 2
                out.append((3, frame(7, 1, 2, 4, 0, 3, retx=True, lanes="bfp16", exp=127,
                                     values=[1] * BFP16_LANES)))  # fmt: skip
            out.append((w + 1, b16(7, agg, w, 4, rnd, lanes[w], exps[w])))
    # Group 8: one slot running int32, bfp16, int32 rounds; reserved uses of exp/overflow.
    for rnd in range(3):
        for w in range(2):
            if rnd == 1:
                out.append((5 + w, b16(8, 0, w, 2, rnd, [-32768 + w] * BFP16_LANES, 127 + w)))
            else:
                out.append((5 + w, frame(8, 0, w, 2, rnd, 5 + w)))
    bad = bytearray(b16(8, 0, 0, 2, 3, [1] * BFP16_LANES, 127))
    bad[14 + 20 + 8 + 6] |= 0x08  # the overflow flag on a contribution
    int32_exp = bytearray(frame(8, 0, 0, 2, 3, 5))
    int32_exp[14 + 20 + 8 + 7] = 127  # an exp byte on an int32 packet
    return out + [(5, bytes(bad)), (5, bytes(int32_exp))]


def seq_property(seed: int, workers: int, window: int, chunks: int) -> list[tuple[int, bytes]]:
    p = InaPipeline()
    apply_setup(p, sim_setup(workers, window))
    sim = HostSimulation(
        p.process,
        seed=seed,
        workers=workers,
        window=window,
        chunks=chunks,
        net=Network(loss=0.15, dup=0.2, stale=0.1, stale_delay=30.0),
    )
    return sim.run().inputs


def sequences() -> list[tuple[str, dict, list[tuple[int, bytes]]]]:
    return [
        ("normal", BASE_SETUP, seq_normal()),
        ("loss", BASE_SETUP, seq_loss()),
        ("duplication", BASE_SETUP, seq_duplication()),
        ("reordering", BASE_SETUP, seq_reordering()),
        ("late", BASE_SETUP, seq_late()),
        ("malformed", BASE_SETUP, seq_malformed()),
        ("bfp16", BASE_SETUP, seq_bfp16()),
        ("property-4w", sim_setup(4, 2), seq_property(3, 4, 2, 60)),
        ("property-8w", sim_setup(8, 1), seq_property(5, 8, 1, 30)),
        ("property-2w", sim_setup(2, 3), seq_property(6, 2, 3, 90)),
    ]


def test_sequences_exercise_every_drop_reason_and_event() -> None:
    """Without BMv2: the model half, so the sequences keep covering what they claim."""
    drops = [0] * 16
    events = [0] * 8
    for _name, setup, frames in sequences():
        c = run_model(setup, frames)["counters"]
        drops = [a + b[0] for a, b in zip(drops, c["InaIngress.ina_drops"], strict=True)]
        events = [a + b[0] for a, b in zip(events, c["InaIngress.ina_events"], strict=True)]
    assert all(drops[i] > 0 for i in range(11)), drops
    assert all(events[i] > 0 for i in range(5)), events


@pytest.fixture(scope="module")
def bmv2_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, list]:
    reason = bmv2_missing()
    if reason:
        pytest.skip(reason)
    out_json, _ = compile_v1model(Path(tmp_path_factory.mktemp("p4c")))
    seqs = sequences()
    jobs = [{"setup": s, "frames": [[p, f.hex()] for p, f in fr]} for _, s, fr in seqs]
    with Bmv2Netns(PORTS) as sw:
        got = sw.run(out_json, jobs)
    return seqs, got


@pytest.mark.slow
@pytest.mark.needs_root
@pytest.mark.parametrize(
    "index",
    range(10),
    ids=[
        "normal",
        "loss",
        "duplication",
        "reordering",
        "late",
        "malformed",
        "bfp16",
        "prop4",
        "prop8",
        "prop2",
    ],
)
def test_model_and_bmv2_agree(bmv2_results: tuple[list, list], index: int) -> None:
    seqs, got = bmv2_results
    name, setup, frames = seqs[index]
    want = run_model(setup, frames)
    bm = got[index]
    for port in sorted(set(want["outputs"]) | set(bm["outputs"]), key=int):
        w, b = want["outputs"].get(port, []), bm["outputs"].get(port, [])
        assert len(w) == len(b), f"{name}: port {port}: model sent {len(w)}, BMv2 {len(b)}"
        for i, (x, y) in enumerate(zip(w, b, strict=True)):
            assert x == y, f"{name}: port {port} frame {i}:\nmodel {x}\nbmv2  {y}"
    for counter, cells in want["counters"].items():
        assert cells == bm["counters"][counter], f"{name}: counter {counter}"


def bfp16_results(outputs: dict[str, list[str]], port: int) -> list[tuple[int, bool, list[int]]]:
    """(exp byte, overflow flag, lanes) of each bfp16 result frame sent on ``port``."""
    msgs = [unpack(bytes.fromhex(f)[14 + 20 + 8 :]) for f in outputs.get(str(port), [])]
    return [
        (m.header.exp, m.header.overflow, list(m.values))
        for m in msgs
        if m.header.is_result and m.header.lanes == "bfp16"
    ]


def check_bfp16(run: dict) -> None:
    """One switch's results of seq_bfp16 against the hand-worked ones: the exact int16 sums,
    the maximum of the proposals as the result's exponent, saturation flagged and counted."""
    for port in (1, 2, 4):  # group 7's results go to every member
        assert bfp16_results(run["outputs"], port) == BFP16_RESULTS
    # Worker 2 (port 3) retransmitted after agg 1 round 0 completed: the flagged result again.
    again = [*BFP16_RESULTS[:3], BFP16_RESULTS[2], *BFP16_RESULTS[3:]]
    assert bfp16_results(run["outputs"], 3) == again
    # Group 8's bfp16 round between int32 rounds on one slot: -32768 + -32767 saturates.
    assert bfp16_results(run["outputs"], 5) == [(128, True, [-32768] * BFP16_LANES)]
    assert run["counters"]["InaIngress.lane_overflows"] == [[BFP16_OVERFLOWS, 0]]
    drops = [c[0] for c in run["counters"]["InaIngress.ina_drops"]]
    assert drops[DROP_LANE_FORMAT] == 1 and drops[DROP_RESERVED_BITS] == 2


def test_model_bfp16_results_are_the_hand_worked_ones() -> None:
    check_bfp16(run_model(BASE_SETUP, seq_bfp16()))


@pytest.mark.slow
@pytest.mark.needs_root
def test_bmv2_bfp16_results_are_the_hand_worked_ones(bmv2_results: tuple[list, list]) -> None:
    """BMv2's own bfp16 results, not only its agreement with the model."""
    seqs, got = bmv2_results
    index = next(i for i, (name, _, _) in enumerate(seqs) if name == "bfp16")
    check_bfp16(got[index])
