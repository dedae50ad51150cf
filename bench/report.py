"""Medians of repeated measurements and their report: a table, ratios, one JSON line.

Every bench that repeats a set of measurements per variant keeps them as
`{variant: [{metric: value, ...} per repeat]}` and reports them through here, so the
tables, ratio lines and the machine-readable last line read the same everywhere.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

Runs = Mapping[str, Sequence[Mapping[str, float]]]     # variant -> one {metric: value} per repeat
Medians = dict[str, dict[str, float]]


def medians(runs: Runs) -> Medians:
    """Per variant, the median of every metric over its repeats."""
    return {k: {m: statistics.median(r[m] for r in rs) for m in rs[0]} for k, rs in runs.items() if rs}


def table(med: Medians, columns: Sequence[tuple[str, str, str]], label: str = "") -> None:
    """One row per variant; columns are (metric, header, format spec); a missing metric prints '-'."""
    width = max([len(label), *map(len, med)])
    print(f"{label:{width}} " + " ".join(f"{head:>{max(len(head), 8)}}" for _, head, _ in columns))
    for variant, m in med.items():
        cells = [format(m[key], spec) if key in m else "-" for key, _, spec in columns]
        print(f"{variant:{width}} " + " ".join(f"{c:>{max(len(h), 8)}}" for c, (_, h, _) in zip(cells, columns)))


def ratio(med: Medians, metric: str, num: str, den: str) -> float:
    return med[num][metric] / med[den][metric]


def print_ratios(med: Medians, metric: str, pairs: Sequence[tuple[str, str]], what: str | None = None) -> None:
    """`METRIC ratio NUM / DEN: R` for each (num, den) pair."""
    for num, den in pairs:
        print(f"{what or metric} ratio {num} / {den}: {ratio(med, metric, num, den):.2f}")


def print_json(med: Medians, **extra: Any) -> None:
    """The last line: every median plus the run's settings, for scripts."""
    print(json.dumps({"medians": med, **extra}, default=float))
