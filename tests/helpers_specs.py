"""Helpers shared by the spec/plan/render tests: paths, small specs, and a CLI runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftcluster.engines.fastertransformer.checkpoint import CheckpointFacts, Split
from ftcluster.engines.fastertransformer.plan import ModelFacts
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.engines.fastertransformer.spec import FTModelSpec as ModelSpec

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA = REPO_ROOT / "tests" / "data"
MODELS = DATA / "models"
BAD_INPUTS = DATA / "bad_inputs"
# The real FT backend configs (never copied into the project); tests skip when absent.
FT_FIXTURES = REPO_ROOT / ".." / "shared" / "fixtures" / "fastertransformer_backend" / "all_models"


def cluster(**kw: Any) -> ClusterSpec:
    data: dict[str, Any] = {"name": "c", "scheduler": "local", "gpus_per_node": 1, "max_nodes": 8}
    data.update(kw)
    return ClusterSpec.model_validate(data)


def model(**kw: Any) -> ModelSpec:
    data: dict[str, Any] = {
        "name": "ensemble", "model_type": "GPT", "repository": "/repo", "checkpoint_root": "/ckpt",
    }
    data.update(kw)
    return ModelSpec.model_validate(data)


def facts(
    groups: tuple[tuple[int, str], ...] = ((1, "KIND_CPU"),), dynamic: bool = True,
    sequence: bool = False, mbs: int = 8,
) -> ModelFacts:
    return ModelFacts("fastertransformer", groups, dynamic, sequence, mbs, backends=("fastertransformer",))


def ckpt(
    tp: int = 1, heads: int = 12, layers: int = 6, ini_tp: int | None = None,
    available: tuple[int, ...] | None = None, gpu_dir: bool = True, ini: bool = True,
    splits: tuple[Split, ...] | None = None, root: str = "/ckpt",
) -> CheckpointFacts:
    r = Path(root)
    d = r / f"{tp}-gpu" if gpu_dir else None
    return CheckpointFacts(
        root=r,
        available_gpus=available if available is not None else ((tp,) if gpu_dir else ()),
        gpu_dir=d,
        ini_path=(d / "config.ini") if (d is not None and ini) else None,
        splits=(splits if splits is not None else (Split("gpt", heads, layers),)) if ini else (),
        ini_tensor_para_size=ini_tp,
        weight_data_type="fp32",
    )


@dataclass(frozen=True)
class CliResult:
    rc: int
    stdout: str
    stderr: str


def _cli_env() -> dict[str, str]:
    # This checkout first, then what the caller's PYTHONPATH brings (a machine whose packages
    # come that way, not installed).
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "COLUMNS": "200", "NO_COLOR": "1"}


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 60) -> CliResult:
    """The real CLI in a subprocess: `python -m ftcluster ARGS`."""
    env = _cli_env()
    p = subprocess.run(
        [sys.executable, "-m", "ftcluster", *args], cwd=cwd or REPO_ROOT, env=env,
        capture_output=True, text=True, timeout=timeout,
    )
    return CliResult(p.returncode, p.stdout, p.stderr)


def assert_one_line_error(res: CliResult, *fragments: str) -> str:
    """Non-zero exit, exactly one stderr line starting with `error:`, no traceback."""
    assert res.rc != 0, f"expected failure, got rc=0\nstdout={res.stdout}\nstderr={res.stderr}"
    assert "Traceback" not in res.stderr + res.stdout, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{res.stderr}"
    line = lines[0]
    assert line.startswith("error:"), line
    for frag in fragments:
        assert frag in line, f"{frag!r} not in {line!r}"
    return line


def run_cli_many(cases: list[tuple[list[str], Path]], timeout: float = 600) -> list[CliResult]:
    """run_cli for each (args, cwd), as many processes of the CLI, but forked from one that
    imported ftcluster once (tests/cli_batch.py): a corpus of hundreds of cases costs one
    interpreter's start, not hundreds."""
    with tempfile.TemporaryDirectory(prefix="ftc-cli-batch-") as d:
        spec = [{"args": list(a), "cwd": str(c), "out": f"{d}/{i}.out", "err": f"{d}/{i}.err"}
                for i, (a, c) in enumerate(cases)]
        p = subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "cli_batch.py")], input=json.dumps(spec),
                           env=_cli_env(), capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)
        assert p.returncode == 0, p.stderr
        codes = json.loads(p.stdout)
        return [CliResult(rc, Path(s["out"]).read_text(errors="replace"), Path(s["err"]).read_text(errors="replace"))
                for rc, s in zip(codes, spec)]
