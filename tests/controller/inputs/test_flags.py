"""Flags made from dataclass fields (controller/inputs/flags.py): name, choices, bounds,
default, help with the unit, and the dataclass built back; a bad value is one line naming
the flag, before any dataclass is made."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

import pytest

from controller.errors import InputError
from controller.inputs.args import OneLineParser, parallelism
from controller.inputs.flags import add_flags, build, option


@dataclass(frozen=True)
class Inner:
    mode: Literal["a", "b"] = option("a", help="a mode")


@dataclass(frozen=True)
class Opts:
    rate: float = option(help="offered rate", unit="req/s", low=0, low_open=True)
    count: int = option(3, help="how many", low=1, high=10)
    par: tuple[int, int] | None = option(None, help="TPxPP", parse=parallelism, metavar="TPxPP")
    limit: int | None = option(None, help="at most", flag="--most", default_help="no limit")
    on: bool = option(True, help="turn it off")
    loud: bool = option(False, help="say more")
    items: dict[str, str] = option(
        help="K=V", default_factory=dict, many=True, parse=lambda s: tuple(s.split("=")),
        convert=dict,
    )  # fmt: skip
    inner: Inner = Inner()
    knob: float = 0.5  # not a flag


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="t")
    add_flags(p, Opts)
    return p


def test_flags_and_values_round_trip() -> None:
    a = parser().parse_args(
        ["--rate", "2", "--par", "4x2", "--most", "7", "--no-on", "--loud", "--items", "x=1",
         "--items", "y=2", "--mode", "b"]
    )  # fmt: skip
    o = build(Opts, a)
    assert o == Opts(2.0, 3, (4, 2), 7, False, True, {"x": "1", "y": "2"}, Inner("b"), 0.5)
    assert build(Opts, parser().parse_args(["--rate", "1"]), knob=0.25).knob == 0.25


def test_help_states_unit_and_default() -> None:
    text = parser().format_help()
    assert "offered rate (req/s)" in text
    assert "how many (default: 3)" in text
    assert "at most (default: no limit)" in text
    assert "{a,b}" in text and "--no-on" in text


@pytest.mark.parametrize(
    "argv, words",
    [
        ([], "--rate"),  # required: no default
        (["--rate", "0"], "argument --rate: must be positive"),
        (["--rate", "1", "--count", "11"], "argument --count: must be at most 10"),
        (["--rate", "1", "--mode", "c"], "argument --mode: invalid choice: 'c'"),
        (["--rate", "nan"], "argument --rate: must be a finite number"),
        (["--rate", "1", "--par", "4"], "argument --par: '4' is not TPxPP"),
    ],
)
def test_a_bad_value_names_its_flag(argv: list[str], words: str) -> None:
    with pytest.raises(InputError, match=words.replace("(", r"\(").replace("{", r"\{")):
        parser().parse_args(argv)


def test_a_type_without_a_parser_is_refused() -> None:
    @dataclass
    class Bad:
        x: list[int] = option(help="x", default_factory=list)

    with pytest.raises(TypeError, match="parse="):
        add_flags(argparse.ArgumentParser(), Bad)
