"""The KV transfer's share of a request's TPOT (``InstancePricer.tpot_kv_share``): T_f / q by
default (TPOT measured as DistServe and the simulator do, T_f paid once over the output
tokens) and T_f with ``--tpot-mode eq4`` (the paper's Eq. 4 as written), the mode taken from
the command line as ``heroserve plan`` builds its options.

Hand-worked q: 100 requests with 1, 3, 11 and 51 output tokens (5, 5, 40 and 50 of them),
attainment 90%. Tokens after the first: 0 (never misses: no TPOT), 2, 10, 50. At q = 10 the
requests with fewer than 10 tokens after the first, whose TPOT takes more than T_f / 10, are
the five with 2: 5% <= 10%; at any q above 10 the forty with 10 join them (45%). q = 10."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from controller.cli.plan import add_args
from controller.inputs.flags import build
from controller.models import model_spec
from controller.plan import SLA
from controller.planner.evaluate import Evaluator
from controller.planner.heroserve import POLICY as HEROSERVE
from controller.planner.instances import tpot_quantile
from controller.planner.options import PlannerOptions, Problem
from controller.topology import testbed as make_testbed
from controller.workload.base import Workload

OUTPUTS = np.array([1] * 5 + [3] * 5 + [11] * 40 + [51] * 50)
T_F = 6e-3


def _pricer(argv: list[str]):
    p = argparse.ArgumentParser()
    add_args(p)
    opts = build(PlannerOptions, p.parse_args(argv), seed=0)
    w = Workload("hand", np.full(len(OUTPUTS), 100), OUTPUTS)
    problem = Problem(make_testbed(), model_spec("OPT-66B"), w, SLA(2.5, 0.15, 0.9), opts)
    return opts, Evaluator(problem, HEROSERVE).instance


def test_q_is_hand_worked():
    assert tpot_quantile(OUTPUTS, 0.9) == 10.0


@pytest.mark.parametrize(
    "argv, mode, share",
    [([], "amortized", T_F / 10), (["--tpot-mode", "eq4"], "eq4", T_F)],
)
def test_kv_share_of_tpot(argv: list[str], mode: str, share: float):
    opts, pricer = _pricer(argv)
    assert opts.tpot_mode == mode
    assert pricer.tpot_kv_share(T_F) == pytest.approx(share, rel=1e-12)
    assert pricer.tpot_kv_share(0.0) == 0.0  # no transfer, no share
