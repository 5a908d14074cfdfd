"""The role splits priced on a cluster too large to price them all: around the balance point
of the per-server rates, and where a role's pool holds a whole number of its instances."""

from controller.planner.roles import (
    balanced_counts,
    balanced_splits,
    role_space,
    whole_instance_counts,
)
from controller.topology.generators import two_tracks

# 2tracks-96 summarization, HeroServe's rates (req/s per server) and best candidates:
# prefill TP 2 x PP 6 (12 GPUs), decode TP 16 x PP 3 (48 GPUs, six servers of 8 GPUs)
PREFILL, DECODE = 2.065852773622254, 7.024779211487524


def test_balance_point_by_hand():
    # k p = (96 - k) d  =>  k = 96 d / (p + d) = 74.18...
    (k,) = balanced_counts([96], [PREFILL], [DECODE])
    assert k == 96 * DECODE / (PREFILL + DECODE)
    assert 74 < k < 75


def test_whole_instance_counts_by_hand():
    """At k = 74.18 prefill servers the prefill pool has 593.5 GPUs: 588 (49 instances of 12)
    needs 74 servers, 600 (50) needs 75. The decode pool has 174.5 GPUs: 144 (3 instances of
    48) is 18 servers, so 78 prefill; 192 (4) is 24 servers, so 72 prefill."""
    space = role_space(two_tracks(96))
    frac = balanced_counts([96], [PREFILL], [DECODE])
    assert whole_instance_counts(space, frac, 0, (12, 48)) == {72, 74, 75, 78}


def test_the_splits_around_the_balance_point():
    """Rounded down and up (74, 75), one server further either way (73, 76), and the whole
    instance counts: 72 is where the decode pool holds a fourth instance, the split the
    planners' plans take (148.741 req/s against 126.113 at 75)."""
    space = role_space(two_tracks(96))
    splits = balanced_splits(space, [PREFILL], [DECODE], instance_gpus=(12, 48))
    assert [sp.counts for sp in splits] == [(72,), (73,), (74,), (75,), (76,), (78,)]
    assert len(splits[0].prefill) == 72 * 8 and len(splits[0].decode) == 24 * 8
    # one GPU an instance: no step beyond the neighbours
    assert [sp.counts for sp in balanced_splits(space, [PREFILL], [DECODE])] == [
        (73,),
        (74,),
        (75,),
        (76,),
    ]
