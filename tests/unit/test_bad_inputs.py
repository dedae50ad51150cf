"""The bad-input corpus (issue 2, "Done when"): every entry of tests/data/bad_inputs/index.yaml
runs the real CLI in a subprocess and must fail with one clear line naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers_specs import BAD_INPUTS, CliResult, assert_one_line_error, run_cli, run_cli_many


CASES: list[dict[str, Any]] = yaml.safe_load((BAD_INPUTS / "index.yaml").read_text())


def _id(case: dict[str, Any]) -> str:
    return str(case.get("id") or Path(case.get("cluster") or case["model"]).stem)


def test_corpus_is_big_and_every_file_is_used() -> None:
    assert len(CASES) >= 25
    ids = [_id(c) for c in CASES]
    assert len(set(ids)) == len(ids), "duplicate ids"
    used = {c.get(k) for c in CASES for k in ("cluster", "model")}
    specs = {p.name for p in BAD_INPUTS.glob("*.yaml")} - {"index.yaml"}
    assert specs <= used, f"spec files without an index entry: {sorted(specs - used)}"


def _args(case: dict[str, Any]) -> list[str]:
    return [case.get("cmd", "plan"),
            "--cluster", case.get("cluster", "ok/cluster.yaml"),
            "--model", case.get("model", "ok/model.yaml"),
            *[str(a) for a in case.get("args", [])]]


@pytest.fixture(scope="module")
def results() -> dict[str, CliResult]:
    """Every case's real CLI run, each a process of its own (the tests then judge them)."""
    return dict(zip((_id(c) for c in CASES), run_cli_many([(_args(c), BAD_INPUTS) for c in CASES])))


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_bad_input(case: dict[str, Any], results: dict[str, CliResult]) -> None:
    res = results[_id(case)]
    line = assert_one_line_error(res, *case["expect"])
    for frag in case.get("absent", []):
        assert frag not in line, f"{frag!r} in {line!r}"
    assert len(line) < 600, "one clear message, not a dump"
    assert res.rc in (1, 3)  # a run that failed, or a user error (never 2: usage)
    assert not (BAD_INPUTS / "PWNED").exists()


def test_good_pair_plans() -> None:
    res = run_cli("plan", "--cluster", "ok/cluster.yaml", "--model", "ok/model.yaml", "--nodes", "2", "--json",
                  cwd=BAD_INPUTS)
    assert res.rc == 0, res.stderr


@pytest.mark.parametrize("args", [["--nodes", "abc"], ["--out", "index.yaml"]], ids=["nodes_abc", "out_is_file"])
def test_click_usage_errors_are_one_line(args: list[str]) -> None:
    res = run_cli("prepare", "--cluster", "ok/cluster.yaml", "--model", "ok/model.yaml", *args, cwd=BAD_INPUTS)
    assert_one_line_error(res)
