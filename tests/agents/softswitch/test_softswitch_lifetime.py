"""Packets delayed past the old 128-generation lifetime, against the executable switch
(agents/softswitch): a worker's duplicate re-injected 512 and 300 rounds later, and a worker
restarted mid-session. Before the 32-bit generation and the one-generation rule
(docs/dataplane.md, "Slot protocol"), the first gave the sum 1,512 instead of 2,024, the second
opened a bogus round that made every later packet of the copy late (no result ever again),
and a restarted worker's round 0 was answered with the last session's sum.

Two workers on one aggregator; worker w's value in every lane of round r is
``r + 1000 * w``, so round r's exact sum is ``2 r + 1000``.
"""

from __future__ import annotations

from agents.ina.packet import INA_UDP_PORT, VECTOR_LEN, InaHeader, build_frame, unpack
from agents.softswitch.headers import DROP_LATE, EVT_COMPLETED
from agents.softswitch.pipeline import InaPipeline

GROUP, MCAST, SESSION = 9, 40, 0
PORTS = (1, 2)
_L2_L3_L4 = 14 + 20 + 8


def switch() -> InaPipeline:
    sw = InaPipeline()
    sw.add_group(GROUP, 0, slot=3, workers=2, mcast=MCAST)
    for w, port in enumerate(PORTS):
        sw.bind_worker(GROUP, w, port)
    sw.pre.insert(MCAST, [(p, 0) for p in PORTS])
    return sw


def frame(w: int, rnd: int, session: int = SESSION, value: int | None = None) -> bytes:
    """Worker w's round ``rnd``, sent from UDP port 40000 + w."""
    kw = {"session": session} if session else {}  # session 0: the header's default
    h = InaHeader.at_round(GROUP, 0, w, 2, rnd, **kw)
    v = rnd + 1000 * w if value is None else value
    return build_frame(h, [v] * VECTOR_LEN, src_ip=f"10.0.0.{w + 1}", src_port=40000 + w)


def results(out: list[tuple[int, bytes]]) -> list[tuple[int, int, int]]:
    """(egress port, lane 0, UDP source port) of every result the switch sent."""
    got = []
    for port, f in out:
        msg = unpack(f[_L2_L3_L4:])
        assert msg.header.is_result and len(set(msg.values)) == 1
        got.append((port, msg.values[0], int.from_bytes(f[34:36], "big")))
    return got


def run_rounds(sw: InaPipeline, rounds: range, stale: dict[int, bytes]) -> list[int]:
    """Both workers send each round (worker 1 first); ``stale[r]`` enters before worker 0's
    round-r packet. The multicast sums, one per round."""
    sums = []
    for r in rounds:
        out = sw.process(PORTS[1], frame(1, r))
        if r in stale:
            out += sw.process(PORTS[0], stale[r])
        out += sw.process(PORTS[0], frame(0, r))
        res = results(out)
        assert [p for p, _, _ in res] == list(PORTS), f"round {r}: {res}"
        assert len({v for _, v, _ in res}) == 1
        sums.append(res[0][1])
    return sums


def test_a_duplicate_delayed_512_rounds_is_late_not_added() -> None:
    sw = switch()
    sums = run_rounds(sw, range(600), {512: frame(0, 0)})
    assert sums[512] == 2024  # 1,512 when the round-0 duplicate was taken as worker 0's
    assert sums == [2 * r + 1000 for r in range(600)]
    assert sw.ingress.ina_drops.packets[DROP_LATE] == 1


def test_a_duplicate_delayed_300_rounds_does_not_wedge_the_copy() -> None:
    sw = switch()
    sums = run_rounds(sw, range(400), {300: frame(0, 0), 301: frame(0, 1)})
    assert sums == [2 * r + 1000 for r in range(400)]
    assert sw.ingress.ina_events.packets[EVT_COMPLETED] == 400
    assert sw.ingress.ina_drops.packets[DROP_LATE] == 2


def test_a_restarted_session_is_never_answered_with_the_old_sum() -> None:
    """Session A completes rounds 0 and 1; the group restarts as session A + 1 from round 0
    with other values. Its round 0 opens a new round (no answer until both contribute),
    and a delayed packet of session A is late from then on."""
    sw = switch()
    assert run_rounds(sw, range(2), {}) == [1000, 1002]
    new = SESSION + 1
    assert sw.process(PORTS[0], frame(0, 0, session=new, value=5)) == []  # opens, waits
    out = sw.process(PORTS[1], frame(1, 0, session=new, value=7))
    assert [(p, v) for p, v, _ in results(out)] == [(1, 12), (2, 12)]
    assert sw.process(PORTS[1], frame(1, 0)) == []  # session A again: late
    assert sw.ingress.ina_drops.packets[DROP_LATE] == 1
    # Results leave from the INA port whatever port the last contributor used.
    assert {sport for _, _, sport in results(out)} == {INA_UDP_PORT}
