"""``pairs._minplus``, one ``minimum`` per switch, is the min-plus product as written (the
(N, N, S) broadcast and its reduction), element for element, with unreachable (inf)
entries, on square and rectangular shapes."""

from __future__ import annotations

import numpy as np
import pytest

from controller.costmodel.pairs import _minplus


def broadcast(exit_a: np.ndarray, sd: np.ndarray, exit_b: np.ndarray) -> np.ndarray:
    via = np.min(exit_a[:, :, None] + sd[None, :, :], axis=1)
    return np.min(via[:, None, :] + exit_b[None, :, :], axis=2)


@pytest.mark.parametrize("n,m,s", [(1, 1, 1), (5, 7, 3), (64, 64, 8), (40, 33, 17)])
def test_minplus_is_the_broadcast_product(n: int, m: int, s: int) -> None:
    rng = np.random.default_rng(n * 1000 + s)
    ea, eb, sd = rng.random((n, s)) * 1e-5, rng.random((m, s)) * 1e-5, rng.random((s, s)) * 1e-5
    ea[rng.random((n, s)) < 0.3] = np.inf
    sd[rng.random((s, s)) < 0.3] = np.inf
    assert np.array_equal(_minplus(ea, sd, eb), broadcast(ea, sd, eb))


def test_minplus_by_hand() -> None:
    # GPU 0 reaches switch 0 for 1, switch 1 for 5; GPU 1 only switch 1 for 2; 0 -> 1 costs 1
    ea = np.array([[1.0, 5.0], [np.inf, 2.0]])
    sd = np.array([[0.0, 1.0], [1.0, 0.0]])
    d = _minplus(ea, sd, ea)
    assert d.tolist() == [[2.0, 4.0], [4.0, 4.0]]
