"""The fluid network's shortcuts give the same numbers, to the last bit, as the plain
formulas: the stretched singles found from the few stretched links, and the time alone
remembered per scale (controller/sim/flows.py)."""

import random

from controller.sim.flows import Work, alone_time, envelope


def _kv_like(n_links: int, seed: int) -> Work:
    """A pipelined KV transfer's shape: one flow per link, distinct k and latency."""
    rng = random.Random(seed)
    flows = [(((e, rng.uniform(1e-10, 4e-9)),), rng.uniform(0.0, 3e-5)) for e in range(n_links)]
    return Work.single(flows, pipelined=True)


def test_singles_from_stretched_links_match_every_flow():
    work = _kv_like(300, 1)
    rng = random.Random(2)
    for _ in range(50):
        stretch = [1.0] * 400
        hot = set(rng.sample(range(400), rng.randint(0, 40)))  # some beyond the route
        for e in hot:
            stretch[e] = 1.0 + rng.random() * 3
        scale = float(rng.randint(1, 4000))
        plain = work.time(0.5, scale, work.sums(stretch))
        fast = work.time(0.5, scale, work.sums(stretch, hot))
        assert fast == plain  # exact: the same terms, only their order differs
    # the hot set is read only when it is the smaller side, and then every stretched flow
    # of the route is found: 2 hot links on the route, both stretched 2x
    stretch = [1.0] * 400
    for e in (3, 250):
        stretch[e] = 2.0
    got = sorted(work.sums(stretch, {3, 250, 399}))
    want = sorted(work.sums(stretch))
    assert got == want and len(got) == 2


def test_time_alone_remembered_per_scale_is_bit_identical():
    rng = random.Random(3)
    # three parts, as a hierarchical all-reduce: the sum is added term by term
    flows = [
        (((e, rng.uniform(1e-10, 1e-8)), (e + 1, 1e-9)), rng.uniform(0, 1e-5)) for e in range(9)
    ]
    parts = ((3.0, 0, 3), (7.0, 3, 6), (5.0, 6, 9))
    envs = tuple(envelope(flows[lo:hi], True) for _, lo, hi in parts)
    work = Work(tuple(flows), parts, envs, True)
    for _ in range(200):
        scale = float(rng.choice([1e3, 2.5e6, 12288.0, 3.3e7]))
        fixed = rng.random()
        assert work.time_alone(fixed, scale) == alone_time(fixed, scale, parts, envs)
