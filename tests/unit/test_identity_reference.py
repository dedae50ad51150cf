"""identity --save / --against: a run's request and tokens, checked against another run's."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftcluster.client.identity import (
    Check,
    IdentityResult,
    check_against,
    load_reference,
    reference_of,
)
from ftcluster.errors import UserError


def _result(ids: list[list[int]], lens: list[int], seed: int = 0) -> IdentityResult:
    r = IdentityResult("h:1", "http", "m", "decoder", len(ids), 2, 3, ["input_ids"], seed=seed,
                       prompt_ids=[row[:2] for row in ids])
    r.checks = [Check("shape", True)]
    r.outputs = {"output_ids": [[row] for row in ids], "sequence_length": [[n] for n in lens]}
    return r


def test_the_same_tokens_pass_and_a_different_token_is_located() -> None:
    ref = reference_of(_result([[1, 2, 7, 8, 9], [3, 4, 5, 6, 0]], [5, 4]))
    assert check_against(_result([[1, 2, 7, 8, 9], [3, 4, 5, 6, 42]], [5, 4]), ref).ok  # past seq len
    bad = check_against(_result([[1, 2, 7, 8, 9], [3, 4, 5, 1, 0]], [5, 4]), ref)
    assert not bad.ok and "row 1 from position 3" in bad.detail


def test_another_request_is_refused_and_a_failed_run_is_no_reference(tmp_path: Path) -> None:
    ref = reference_of(_result([[1, 2, 7]], [3]))
    with pytest.raises(UserError, match="seed"):
        check_against(_result([[1, 2, 7]], [3], seed=5), ref)
    failed = _result([[1, 2, 7]], [3])
    failed.checks = [Check("shape", False)]
    with pytest.raises(UserError, match="no reference"):
        reference_of(failed)
    (tmp_path / "x.json").write_text("[1]")
    with pytest.raises(UserError, match="not an identity reference"):
        load_reference(str(tmp_path / "x.json"))
