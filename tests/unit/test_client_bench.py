"""Pure parts of the load test: step parsing, splitting, summaries, output files."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ftcluster.client.bench import (
    BenchResult,
    LoadSpec,
    Records,
    Step,
    _split,
    format_table,
    parse_steps,
    summarize,
    write_csv,
)
from ftcluster.client.endpoint import Endpoint
from ftcluster.errors import UserError

SPEC = LoadSpec(Endpoint("h:1"), "m", {}, [], warmup_s=1.0, duration_s=3.0)


def test_parse_steps() -> None:
    steps = parse_steps("1,4,16", "100,2.5")
    assert steps == [Step("concurrency", 1), Step("concurrency", 4), Step("concurrency", 16),
                     Step("rate", 100), Step("rate", 2.5)]
    assert [s.label for s in steps[2:4]] == ["c=16", "rate=100/s"]
    for bad in ("1,x", "0", "-2", "1.5"):
        with pytest.raises(UserError):
            parse_steps(bad, None)
    with pytest.raises(UserError, match="nothing to run"):
        parse_steps(None, None)


def test_split_over_processes() -> None:
    assert _split(Step("concurrency", 16), 3) == [6, 5, 5]
    assert _split(Step("concurrency", 1), 2) == [1, 0]
    assert _split(Step("rate", 90), 3) == [30, 30, 30]


def test_summarize_counts_only_the_window() -> None:
    start = 100.0
    rec = Records()
    # 10 req/s during the 3 s window, plus some before (warm-up) and after.
    ends = [99.5, 99.9] + [start + 0.05 + i * 0.1 for i in range(30)] + [103.2]
    rec.end = ends
    rec.latency = [0.010] * len(ends)
    rec.errors_end = [99.0, 101.0]
    s = summarize(Step("concurrency", 4), rec, start, SPEC, batch_size=2, output_len=8, windows=3,
                  stability=0.1)
    assert s.requests == 30 and s.errors == 1
    assert s.req_per_s == pytest.approx(10.0)
    assert s.seq_per_s == pytest.approx(20.0) and s.tokens_per_s == pytest.approx(160.0)
    assert s.window_req_per_s == pytest.approx([10.0, 10.0, 10.0]) and s.stable
    assert s.latency_ms.p50 == pytest.approx(10.0) and s.latency_ms.max == pytest.approx(10.0)


def test_summarize_flags_an_unstable_step() -> None:
    rec = Records()
    rec.end = [0.1 * i for i in range(10)] + [2.0 + 0.01 * i for i in range(50)]
    rec.latency = list(np.linspace(0.001, 0.1, len(rec.end)))
    s = summarize(Step("rate", 20), rec, 0.0, SPEC, 1, 1, 3, 0.1)
    assert not s.stable
    assert s.latency_ms.p50 < s.latency_ms.p90 < s.latency_ms.p99 <= s.latency_ms.max


def test_empty_step_is_not_ok_and_prints(tmp_path: Path) -> None:
    s = summarize(Step("concurrency", 1), Records(), 0.0, SPEC, 1, 1, 3, 0.1)
    result = BenchResult("h:1", "http", "m", "decoder", 1, 8, 8, 1.0, 3.0, 1, [s])
    assert not result.ok and s.requests == 0 and not s.stable
    assert "c=1" in format_table(result)
    write_csv(result, str(tmp_path / "x.csv"))
    with open(tmp_path / "x.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert rows[0]["mode"] == "concurrency" and rows[0]["requests"] == "0"
    assert set(result.to_dict()) >= {"steps", "ok", "protocol"}


@pytest.mark.parametrize("args", [
    ["identity", "--result-file", "/proc/no-such/r.json"],
    ["identity", "--save", "{tmp}/file/ref.json"],
    ["bench", "--concurrency", "1", "--csv", "/proc/no-such/b.csv"],
    ["bench", "--concurrency", "1", "--plot", "{tmp}/file/p.png"],
])
def test_an_output_file_that_cannot_be_written_is_refused_before_any_request(tmp_path: Path, args: list[str]) -> None:
    # Nothing listens at the URL: a refusal that came after a request would name the server instead.
    (tmp_path / "file").write_text("a file, not a folder\n")
    args = [a.format(tmp=tmp_path) for a in args]
    r = subprocess.run([sys.executable, "-m", "ftcluster", "client", *args, "--url", "127.0.0.1:9"],
                       capture_output=True, text=True, timeout=60, check=False)
    option, path = args[1] if args[0] == "identity" else args[3], args[2] if args[0] == "identity" else args[4]
    assert r.returncode == 3 and r.stderr.startswith(f"error: {option}: cannot write {path}: "), r.stderr
    assert "; nothing was sent" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
