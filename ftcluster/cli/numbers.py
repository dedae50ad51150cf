"""The CLI's number types. Every number a command takes is finite and bounded, so no inf, nan
or 10**30 reaches a timer, an int() or a protocol field; click refuses the rest naming the
option. (click's FloatRange lets nan through: every comparison with nan is false.)"""

from __future__ import annotations

import math
from typing import Any

import click

DAY = 24 * 3600.0
WEEK = 7 * DAY
# A bound for counts that have no natural one (lengths, ranks, nodes): large enough for any
# real use, small enough that nothing built from it exhausts memory or wraps a C int.
BIG = 1 << 20


class Finite(click.ParamType):
    """A finite float in [low, high], or (low, high] with low_open."""

    name = "number"

    def __init__(self, low: float, high: float, low_open: bool = False) -> None:
        self.low, self.high, self.low_open = low, high, low_open

    def _range(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return f"SECONDS{self._range()}" if self.high >= DAY else f"NUMBER{self._range()}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            v = float(value)
        except (TypeError, ValueError, OverflowError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(v) or v > self.high or v < self.low or (self.low_open and v == self.low):
            self.fail(f"{value!r} is not a finite number in {self._range()}", param, ctx)
        return v


def seconds(high: float = WEEK, zero_ok: bool = False) -> Finite:
    """A duration: more than 0 s (or 0 itself with zero_ok), at most `high`."""
    return Finite(0.0, high, low_open=not zero_ok)


def fraction() -> Finite:
    return Finite(0.0, 1.0, low_open=True)


def count(low: int | None = 1, high: int = BIG) -> click.IntRange:
    """An integer up to `high`; from `low`, or with low None from wherever the command checks
    it itself (the planner names --tp and --pp together)."""
    return click.IntRange(low, high)


def tcp_port() -> click.IntRange:
    return click.IntRange(1, 65535)

