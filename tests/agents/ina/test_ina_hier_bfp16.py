"""Hierarchical INA in bfp16 (agents/ina/hier.py, ``HierMember.allreduce_bfp16``) over the
executable switch on loopback and TCP rings: the servers' float32 sums in their rings' order,
each rail's bfp16 sum at the block exponent its members (one per server) agreed, checked bit
for bit against a block reference worked here from the documented rules alone
(docs/emulation.md, "Host INA library"; docs/dataplane.md, "Lane formats") and within the
documented bound of the exact sum; a block that cannot travel refused by every member, on
every rail; the emulation's worker (agents/ina/worker.py) running scheme hier in bfp16."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from support.threads import in_threads

from agents.ina import lanes
from agents.ina.hier import HierMember, hier_bfp16_reference
from agents.ina.loopback import LoopbackSwitch
from agents.ina.ring import PeerListener, Ring
from agents.ina.transport import InaGroup, InaSession, Timeouts
from agents.ina.worker import Worker, member_data, sums_digest

FAST = Timeouts(initial_rto_s=0.05, min_rto_s=0.01, max_rto_s=0.5, give_up_s=20.0)


def addr(listener: PeerListener) -> str:
    return f"127.0.0.1:{listener.sock.getsockname()[1]}"


def hier_members(
    sw: LoopbackSwitch, servers: int, m: int, window: int
) -> tuple[list[HierMember], list[PeerListener]]:
    """``servers`` servers of ``m`` members; member (j, k), server j and local rank k, is
    ``members[j * m + k]``, worker j of rail k's INA group (``30 + k``, one member per
    server) and rank k of server j's ring."""
    ls = [PeerListener.open("127.0.0.1", 0) for _ in range(servers * m)]
    rails: list[list[InaSession]] = []
    for k in range(m):
        ports = [1 + k * servers + j for j in range(servers)]
        sw.add_group(30 + k, window, ports)
        rail = []
        for j in range(servers):
            g = InaGroup(30 + k, j, servers, window, sw.address[0], sw.address[1])
            s = InaSession.open(g, "127.0.0.1", 0, timeouts=FAST)
            sw.register(ports[j], s.sock.getsockname())
            rail.append(s)
        rails.append(rail)

    def member(j: int, k: int) -> HierMember:
        nxt = ls[j * m + (k + 1) % m]
        return HierMember(Ring.connect(ls[j * m + k], 700 + j, [(k, m, addr(nxt))]), rails[k][j])

    hm = in_threads([lambda j=j, k=k: member(j, k) for j in range(servers) for k in range(m)])
    return hm, ls  # type: ignore[return-value]


def close(hm: list[HierMember], ls: list[PeerListener]) -> None:
    for h in hm:
        h.local.close()
        h.rail.close()
    for lst in ls:
        lst.close()


def block_reference(data: list[list[np.ndarray]]) -> tuple[np.ndarray, float, int]:
    """The sum worked from the documented rules alone, for ``data[j][k]`` = member (j, k):
    shard k is elements [k n / m, (k + 1) n / m); server j's sum of it is formed in float32
    in its ring's order (rank k + 1's values, then k + 2's added, ..., rank k's last); per
    block of 64 of the shard, E = the largest over the servers of frexp's exponent of the
    block's largest magnitude, s = 14 - ceil(log2 S), every server sum's round(x 2^s)
    summed as integers, scaled back. Also the largest bfp16 bound S / (2 2^s) over the
    blocks, and how many blocks' agreed E exceeds some server's own."""
    servers, m, n = len(data), len(data[0]), data[0][0].size
    out, bound, differs = np.zeros(n), 0.0, 0
    for k in range(m):
        lo, hi = k * n // m, (k + 1) * n // m
        sums = []
        for srv in data:
            acc = srv[(k + 1) % m][lo:hi].astype(np.float32)
            for step in range(2, m + 1):
                acc = acc + srv[(k + step) % m][lo:hi].astype(np.float32)
            assert acc.dtype == np.float32
            sums.append(acc.astype(np.float64))
        for b in range(0, hi - lo, 64):
            blocks = [x[b : b + 64] for x in sums]
            own = [int(np.frexp(np.max(np.abs(x)))[1]) if x.any() else -127 for x in blocks]
            e = max(own)
            differs += min(own) < e
            s = 14 - (servers - 1).bit_length() - e
            q = sum(np.rint(x * 2.0**s).astype(np.int64) for x in blocks)
            out[lo + b : lo + b + blocks[0].size] = q / 2.0**s
            bound = max(bound, servers / (2 * 2.0**s))
    return out, bound, differs


def test_hier_bfp16_sums_the_server_sums_at_each_rails_agreed_exponents() -> None:
    """2 servers of 3 members (3 rails of 2), 1000 elements: shards of 333 and 334, 6 blocks
    each on a window of 2 (the proposals ride on the data), twice (rounds continue). Member
    0 (server 0) holds 100 x [-1, 1): its server's sums propose E = 7 where server 1's
    propose 1 or 2, so every block's agreed exponent exceeds server 1's own."""
    servers, m, n = 2, 3, 1000
    with LoopbackSwitch() as sw:
        hm, ls = hier_members(sw, servers, m, window=2)
        for seed in (11, 12):
            data = [[member_data(seed, j * m + k, n) for k in range(m)] for j in range(servers)]
            flat = [x for srv in data for x in srv]
            got = in_threads([lambda i=i, f=flat: hm[i].allreduce_bfp16(f[i]) for i in range(6)])
            want, bfp16_bound, differs = block_reference(data)
            assert differs == 3 * 6  # every block of every shard
            for g in got:
                assert g.dtype == np.float32 and np.array_equal(g, want)  # type: ignore[union-attr]
            # The library's reference (the emulation's) is the same sum, its bound the bfp16
            # one plus float32's rounding in the reduce-scatter: 2 additions per server,
            # gamma_2 = 2u / (1 - 2u) times the largest sum of |x| over the 6 members.
            ref, bound = hier_bfp16_reference(data)
            assert np.array_equal(ref, want)
            assert bfp16_bound == 2 / (2 * 2.0 ** (14 - 1 - 7))  # E = 7, s = 6
            u = 2.0**-24
            abs_sum = float(np.max(sum(np.abs(x.astype(float)) for x in flat)))
            rounding = 2 * u / (1 - 2 * u) * abs_sum
            assert bound == pytest.approx(bfp16_bound + rounding, rel=1e-12)
            exact = np.sum(np.stack(flat).astype(np.float64), axis=0)
            err = float(np.max(np.abs(want - exact)))
            assert 0 < err <= bound
        close(hm, ls)


def test_the_server_sum_is_float32_hand_worked() -> None:
    """Server 0's members hold 100 + 2^-7 and 2^-20 in element 0 (shard 0), server 1's
    zeros: in float32 (ulp 2^-17 at 100) the server sum is 100 + 2^-7, so with E = 7 and
    s = 14 - 1 - 7 = 6 its lanes are round(6400.5) = 6400 (ties to even) and the sum is
    100.0; a float64 server sum, 2^-20 above the tie, would give 6401 / 64 = 100.015625."""
    with LoopbackSwitch() as sw:
        hm, ls = hier_members(sw, 2, 2, window=1)
        flat = [np.array([100 + 2.0**-7, 0.0]), np.array([2.0**-20, 0.0]), np.zeros(2), np.zeros(2)]
        got = in_threads([lambda i=i: hm[i].allreduce_bfp16(flat[i]) for i in range(4)])
        close(hm, ls)
    assert all(g.tolist() == [100.0, 0.0] for g in got)  # type: ignore[union-attr]
    ref, bound = hier_bfp16_reference([flat[:2], flat[2:]])
    assert ref.tolist() == [100.0, 0.0]
    assert bound == 2 / (2 * 2.0**6) + 2.0**-24 / (1 - 2.0**-24) * (100 + 2.0**-7 + 2.0**-20)


def test_a_block_that_cannot_travel_is_refused_on_every_rail_and_the_group_goes_on() -> None:
    """Member (1, 0) holds a NaN in shard 0: rail 0 refuses that block; rail 1's members
    see the NaN its shard gathers as and refuse too. The next all-reduce is exact."""
    servers, m, n = 2, 2, 300
    with LoopbackSwitch() as sw:
        hm, ls = hier_members(sw, servers, m, window=2)
        data = [[member_data(3, j * m + k, n) for k in range(m)] for j in range(servers)]
        data[1][0][70] = np.nan  # element 70: shard 0 (0..149), block 1
        flat = [x for srv in data for x in srv]

        def error_of(i: int) -> str:
            try:
                hm[i].allreduce_bfp16(flat[i])
            except lanes.LaneError as exc:
                return str(exc)
            return "no error"

        errors = in_threads([lambda i=i: error_of(i) for i in range(4)])
        refused = "bfp16 all-reduce refused: block 1: a member's block cannot travel"
        assert [errors[0], errors[2]] == [f"{refused} (NaN, infinity or too large) (1 in all)"] * 2
        other = "another rail refused its shard of the bfp16 all-reduce"
        assert [errors[1], errors[3]] == [other] * 2
        data[1][0][70] = 0.5
        got = in_threads([lambda i=i: hm[i].allreduce_bfp16(flat[i]) for i in range(4)])
        want = block_reference(data)[0]
        assert all(np.array_equal(g, want) for g in got)
        close(hm, ls)


def test_emulation_worker_runs_hier_in_bfp16_exactly() -> None:
    """Four emulation workers, 2 servers x 2 members, scheme hier with ``lanes: bfp16`` on
    both rails, twice: every member's digest is the float64 widening of the block
    reference's sums, no exponent round is run apart."""
    n, servers, m = 500, 2, 2
    with LoopbackSwitch() as sw:
        workers = []
        for k in range(m):
            sw.add_group(50 + k, 2, [1 + k * servers + j for j in range(servers)])
        for j in range(servers):
            for k in range(m):
                udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                udp.bind(("127.0.0.1", 0))
                sw.register(1 + k * servers + j, udp.getsockname())
                listener = PeerListener.open("127.0.0.1", 0)
                workers.append(Worker(f"g{j}{k}", udp, listener, FAST, switch_port=sw.address[1]))
        base = {"op": "prepare", "run": 1, "scheme": "hier", "elements": n, "repeat": 2,
                "seed": 9, "workers": servers * m}  # fmt: skip

        def prepare(j: int, k: int) -> None:
            ina = {"group_id": 50 + k, "worker_id": j, "num_workers": servers, "window": 2,
                   "switch_ip": sw.address[0], "lanes": "bfp16"}  # fmt: skip
            nxt = workers[j * m + (k + 1) % m].listener
            ring = {"token": 900 + j, "channels": [[k, m, addr(nxt)]]}
            workers[j * m + k].prepare({**base, "index": j * m + k, "ina": ina, "ring": ring})

        in_threads([lambda j=j, k=k: prepare(j, k) for j in range(servers) for k in range(m)])
        replies = in_threads([lambda wk=wk: wk.go({"op": "go", "run": 1}) for wk in workers])
        for wk in workers:
            wk.listener.close()
            wk.udp.close()
    data = [[member_data(9, j * m + k, n) for k in range(m)] for j in range(servers)]
    want = block_reference(data)[0]
    assert [r["digest"] for r in replies] == [sums_digest(want)] * 4  # type: ignore[index]
    assert all(r["exponent"] is None and r["agree_s"] == 0.0 for r in replies)  # type: ignore[index]
    assert all(len(r["seconds"]) == 2 for r in replies)  # type: ignore[index]
