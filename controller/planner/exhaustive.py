"""Brute force over groupings and schemes, for small clusters only: the yardstick for the
heuristic's optimality gap.

For every (TP, PP) candidate and phase it enumerates every partition of the phase's GPUs into
groups of TP (n! / ((TP!)^k k!) of them), prices each with the same evaluator as HeroServe
(INA at every candidate switch with NVLink-assisted routes, or ring, per group), and keeps
the partition with the most capacity (sum of instance rates); the search then combines the
phases exactly as Alg. 1 does. It refuses pools whose partitions exceed
``options.exhaustive_limit``.

Holds its ``POLICY``, ``exhaustive_grouper``, ``partitions`` and ``count_partitions``."""

from __future__ import annotations

import math
from collections.abc import Iterator

from controller.errors import InputError
from controller.planner.evaluate import Evaluator
from controller.planner.grouping import PodGroups
from controller.planner.heroserve import POLICY as HEROSERVE
from controller.planner.options import Policy

POLICY = Policy(
    "exhaustive",
    grouping="exhaustive",
    ina=HEROSERVE.ina,
    ina_relay=True,
    ina_cross_server_only=False,
    prefer_intra_server=False,
    hier=True,
    colocated_layouts=True,
)


def count_partitions(n: int, size: int) -> int:
    k = n // size
    return math.factorial(k * size) // (math.factorial(size) ** k * math.factorial(k))


def partitions(items: list[str], size: int) -> Iterator[list[list[str]]]:
    """Every split of ``items`` (len a multiple of ``size``) into unordered groups of ``size``."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    from itertools import combinations

    for mates in combinations(rest, size - 1):
        left = [x for x in rest if x not in mates]
        for tail in partitions(left, size):
            yield [[first, *mates], *tail]


def exhaustive_grouper(
    ev: Evaluator, role: str, pool: list[str], tp: int, pp: int, nbytes: float
) -> list[list[str]]:
    usable = len(pool) // (tp * pp) * tp * pp
    n = count_partitions(len(pool), tp) if usable == len(pool) else math.inf
    if usable != len(pool):
        # choosing which GPUs to leave out multiplies the space; enumerate subsets too
        n = math.comb(len(pool), usable) * count_partitions(usable, tp)
    limit = ev.problem.options.exhaustive_limit
    if n > limit:
        raise InputError(
            f"exhaustive planning would enumerate {n} groupings of {len(pool)} {role} GPUs "
            f"(TP={tp}); the limit is {limit}: use it on clusters of about 12 GPUs or fewer"
        )
    from itertools import combinations

    best, best_cap = None, -1.0
    subsets = combinations(pool, usable) if usable != len(pool) else [tuple(pool)]
    for subset in subsets:
        for part in partitions(list(subset), tp):
            one = [PodGroups(None, pool, part)]
            if role == "prefill":
                cap = ev.prefill_phase(tp, pp, one).capacity
            else:
                cap = ev.decode_phase(tp, pp, one, 0.0).capacity
            if cap > best_cap + 1e-12:
                best, best_cap = part, cap
    return [PodGroups(None, pool, best or [])]
