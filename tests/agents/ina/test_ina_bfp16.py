"""bfp16 lanes in the host library (agents/ina/lanes.py, transport.py) against the
executable switch on loopback: hand-worked scales and bounds, the headroom that keeps honest
sums inside int16, exact sums of the quantized values with members and blocks of different
exponents, bad data refused by every member alike, the int32 agreement's bad-data lane
(docs/dataplane.md, "Lane formats"), and the emulation's worker (agents/ina/worker.py) in
bfp16: its digest is the exact sum's."""

from __future__ import annotations

import math
import socket

import numpy as np
import pytest
from support.threads import in_threads

from agents.ina import lanes
from agents.ina.loopback import LoopbackSwitch
from agents.ina.packet import BFP16_LANES, EXP_BAD, EXP_BIAS
from agents.ina.ring import PeerListener
from agents.ina.transport import InaGroup, InaSession, Timeouts
from agents.ina.worker import CommandError, Worker, member_data, sums_digest

FAST = Timeouts(initial_rto_s=0.05, min_rto_s=0.01, max_rto_s=0.5, give_up_s=20.0)


def test_bfp16_scale_and_bound_hand_worked() -> None:
    # 4 members, a block below 0.75: E = 0 (byte 127), s = 14 - 2 - 0 = 12.
    x = np.array([0.75, -0.5, 2.0**-13, 2.0**-14])
    assert lanes.block_exponent(x) == EXP_BIAS
    assert lanes.bfp16_scale_exponent(4, EXP_BIAS) == 12
    q = lanes.to_bfp16(x, 4, EXP_BIAS)
    assert q[:4].tolist() == [3072, -2048, 0, 0] and not q[4:].any()  # 0.5 and 0.25 round to 0
    assert lanes.bfp16_error_bound(4, EXP_BIAS) == 2.0**-11  # 4 / (2 * 2**12)
    # A larger agreed exponent (a larger member) coarsens this member's lanes: E = 3, s = 9.
    assert lanes.to_bfp16(x, 4, EXP_BIAS + 3)[:2].tolist() == [384, -256]


def test_block_exponent_edges() -> None:
    assert lanes.block_exponent(np.zeros(4)) == 0  # E = EXP_MIN
    assert lanes.block_exponent(np.array([1.0])) == EXP_BIAS + 1  # 1.0 is not below 2**0
    assert lanes.block_exponent(np.array([np.nan, 1.0])) == EXP_BAD
    assert lanes.block_exponent(np.array([-np.inf])) == EXP_BAD
    assert lanes.block_exponent(np.array([2.0**127])) == EXP_BAD
    with pytest.raises(lanes.LaneError, match="cannot travel"):
        lanes.to_bfp16(np.ones(2), 2, EXP_BAD)
    with pytest.raises(lanes.LaneError, match="byte 129 exceeds the agreed 128 .*wrong proposal"):
        lanes.to_bfp16(np.array([3.0]), 2, EXP_BIAS + 1)


def test_no_honest_partial_sum_leaves_int16() -> None:
    for workers in (1, 2, 3, 4, 7, 8, 32):
        for e in (-20, 0, 5):
            x = np.full(BFP16_LANES, math.nextafter(2.0**e, 0.0))
            byte = lanes.block_exponent(x)
            hi = int(lanes.to_bfp16(x, workers, byte).max())
            lo = int(lanes.to_bfp16(-x, workers, byte).min())
            assert workers * hi < 2**15 and workers * lo >= -(2**15), (workers, e)


def test_saturating_add_flags() -> None:
    a = np.array([30000, -30000, 5], dtype=np.int16)
    s, sat = lanes.saturating_add16(a, a)
    assert s.tolist() == [32767, -32768, 10] and sat
    assert lanes.saturating_add16(a[2:], a[2:])[1] is False


def members(sw: LoopbackSwitch, group: int, workers: int, window: int) -> list[InaSession]:
    sw.add_group(group, window, [1 + w for w in range(workers)])
    out = []
    for w in range(workers):
        g = InaGroup(group, w, workers, window, sw.address[0], sw.address[1])
        s = InaSession.open(g, "127.0.0.1", 0, timeouts=FAST)
        sw.register(1 + w, s.sock.getsockname())
        out.append(s)
    return out


def reference(data: list[np.ndarray]) -> np.ndarray:
    """The exact sum of the quantized values: per block the largest member exponent, each
    member's lanes at it, the integer sum, scaled back."""
    w, n = len(data), data[0].size
    out = np.zeros(n)
    for b in range(0, n, BFP16_LANES):
        blocks = [d[b : b + BFP16_LANES] for d in data]
        byte = max(lanes.block_exponent(x) for x in blocks)
        total = sum(lanes.to_bfp16(x, w, byte).astype(np.int64) for x in blocks)
        out[b : b + BFP16_LANES] = lanes.from_bfp16(total, w, byte)[: len(blocks[0])]
    return out


def test_bfp16_allreduce_exact_with_different_exponents() -> None:
    rng = np.random.default_rng(7)
    n = 1000  # 16 blocks on 4 aggregators: rounds continue across the two calls
    # Member w's data is scaled by 8**w and block b by 2**(b % 5): exponents differ by member
    # and by block, so the agreed maximum matters for every packet.
    scales = np.repeat(2.0 ** (np.arange(16) % 5), BFP16_LANES)[:n]
    with LoopbackSwitch() as sw:
        ms = members(sw, 9, 3, window=4)
        for _trial in range(2):
            data = [rng.standard_normal(n) * 8.0**w * scales for w in range(3)]
            got = in_threads(
                [lambda s=s, d=d: s.allreduce_bfp16(d) for s, d in zip(ms, data, strict=True)]
            )
            want = reference(data)
            assert np.array_equal(lanes.bfp16_reference(data)[0], want)
            exact = np.sum(data, axis=0)
            for g in got:
                assert np.array_equal(g, want)
            # And within the documented bound of the real sum, block by block.
            for b in range(0, n, BFP16_LANES):
                byte = max(lanes.block_exponent(d[b : b + BFP16_LANES]) for d in data)
                err = np.abs(got[0][b : b + BFP16_LANES] - exact[b : b + BFP16_LANES]).max()
                assert err <= lanes.bfp16_error_bound(3, byte)
        for s in ms:
            s.close()


def test_a_bad_block_is_refused_by_every_member_and_the_session_goes_on() -> None:
    with LoopbackSwitch() as sw:
        ms = members(sw, 4, 2, window=2)
        data = [np.ones(300), np.ones(300)]
        data[1][200] = np.nan  # block 3 of member 1
        errors = in_threads(
            [
                lambda s=s, d=d: _error_of(lambda: s.allreduce_bfp16(d))
                for s, d in zip(ms, data, strict=True)
            ]
        )
        assert all("block 3" in e for e in errors), errors
        ok = in_threads([lambda s=s: s.allreduce_bfp16(np.full(100, 0.5)) for s in ms])
        assert all(np.array_equal(g, np.full(100, 1.0)) for g in ok)
        for s in ms:
            s.close()


def test_int32_agreement_bad_data_lane_reaches_every_member() -> None:
    with LoopbackSwitch() as sw:
        ms = members(sw, 5, 3, window=2)
        proposals = [3, None, 1]  # member 1 holds NaN
        errors = in_threads(
            [
                lambda s=s, e=e: _error_of(lambda: s.agree_exponent(e))
                for s, e in zip(ms, proposals, strict=True)
            ]
        )
        assert all("1 member(s) hold data that cannot travel" in e for e in errors), errors
        for s in ms:
            s.close()


def test_emulation_worker_sums_bfp16_exactly() -> None:
    """Three emulation workers (agents/ina/worker.py) run scheme ina in bfp16 twice over the
    loopback switch: every member's digest is the float64 sums' of the exact sum of the
    quantized values (lanes.bfp16_reference), no exponent round is run apart, and a lane
    format the host library does not run is refused (hierarchical INA in bfp16:
    tests/agents/ina/test_ina_hier_bfp16.py)."""
    n, w = 300, 3  # 5 blocks on a window of 2: proposals ride on the data
    with LoopbackSwitch() as sw:
        sw.add_group(6, 2, [1, 2, 3])
        workers = []
        for i in range(w):
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            udp.bind(("127.0.0.1", 0))
            sw.register(1 + i, udp.getsockname())
            listener = PeerListener.open("127.0.0.1", 0)
            workers.append(Worker(f"g{i}", udp, listener, FAST, switch_port=sw.address[1]))
        ina = {"group_id": 6, "num_workers": w, "window": 2, "switch_ip": sw.address[0],
               "lanes": "bfp16"}  # fmt: skip
        base = {"op": "prepare", "run": 1, "scheme": "ina", "elements": n, "repeat": 2,
                "seed": 5, "workers": w}  # fmt: skip
        for i, wk in enumerate(workers):
            wk.prepare({**base, "index": i, "ina": {**ina, "worker_id": i}})
        replies = in_threads([lambda wk=wk: wk.go({"op": "go", "run": 1}) for wk in workers])
        with pytest.raises(CommandError, match="ina.lanes must be int32 or bfp16, got 'fp16'"):
            workers[0].prepare({**base, "index": 0, "ina": {**ina, "lanes": "fp16"}})
        for wk in workers:
            wk.listener.close()
            wk.udp.close()
    want, _bound = lanes.bfp16_reference([member_data(5, i, n) for i in range(w)])
    assert [r["digest"] for r in replies] == [sums_digest(want)] * w
    assert all(r["exponent"] is None and r["agree_s"] == 0.0 for r in replies)
    assert all(len(r["seconds"]) == 2 for r in replies)


def _error_of(call) -> str:
    try:
        call()
    except lanes.LaneError as exc:
        return str(exc)
    return "no error"
