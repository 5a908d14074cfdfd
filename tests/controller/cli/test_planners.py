"""One registry of planners for the command line (controller/cli/planners.py): it names every
planner of both families, exactly those each family's own table plans with, and the option
dataclasses' Literal choices name what the libraries know."""

from __future__ import annotations

import typing

from controller.cli.config import Scenario
from controller.cli.planners import REGISTRY, names, planner_list
from controller.costmodel.netparams import INA_LANES, InaLanes
from controller.evaluation.scenarios import SCENARIOS
from controller.models.engines import PROFILES
from controller.planner import BASELINES, PLANNERS
from controller.planner.options import PlannerOptions
from controller.related import HELIX_BASELINES, RELATED
from controller.topology.costmodes import COST_MODES, CostMode
from controller.topology.fabric import COST_MODES as FABRIC_COST_MODES


def test_the_registry_holds_each_family_exactly() -> None:
    assert names("heroserve") == list(PLANNERS)
    assert set(names("seed")) == set(RELATED + HELIX_BASELINES)
    assert [n for n, p in REGISTRY.items() if p.in_all] == ["heroserve", *BASELINES]


def test_planner_lists_are_checked_when_parsed() -> None:
    assert planner_list()("heroserve, helix") == ["heroserve", "helix"]
    for empty in ("", " , "):  # an empty list would run nothing and say nothing
        try:
            planner_list()(empty)
        except Exception as e:
            assert "name at least one planner" in str(e)
        else:
            raise AssertionError(f"{empty!r} passed as a list of planners")
    try:
        planner_list("heroserve")("helix")
    except Exception as e:  # argparse.ArgumentTypeError: one line naming the known ones
        assert "unknown planner 'helix'; known: heroserve" in str(e)
    else:
        raise AssertionError("a seed planner passed as one of HeroServe's family")


def test_literal_choices_are_what_the_libraries_know() -> None:
    assert typing.get_args(InaLanes) == tuple(INA_LANES)
    assert typing.get_args(CostMode) == COST_MODES == FABRIC_COST_MODES
    assert typing.get_args(Scenario) == tuple(SCENARIOS)
    engine = typing.get_type_hints(PlannerOptions)["engine"]
    assert set(typing.get_args(typing.get_args(engine)[0])) == set(PROFILES)
