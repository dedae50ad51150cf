"""ftcluster on real GPUs: launch (scheduler local, ranks under mpirun) for tp=1 x pp=1, tp=2 x pp=1
and tp=1 x pp=2, the identity of every plan against tp=1 x pp=1, nothing left on the GPUs after
teardown. Runs bench/gpu_serve.py once (one repeat, short bench); skipped without 2 CUDA GPUs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cuda_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(_cuda_gpus() < 2, reason="needs 2 CUDA GPUs and torch with CUDA (none here)"),
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun"),
]


def test_every_plan_serves_the_same_tokens_and_leaves_no_gpu_process(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_serve.py"), "--repeats", "1",
                        "--no-preflight", "--duration", "1", "--concurrency", "1", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900, check=False)
    report = json.loads((tmp_path / "gpu_serve.json").read_text())
    summary = report["summary"]
    assert set(summary) == {"1x1", "2x1", "1x2"}, p.stdout + p.stderr
    for plan, s in summary.items():
        assert not s["launch_failures"], (plan, s, p.stdout[-3000:])
        assert s["identity"] == ["PASS"], (plan, s)
        assert s["gpu_apps_after_teardown"] == [], (plan, s)
    roles = {r["plan"]: r["identity_role"] for r in report["runs"]}
    assert roles == {"1x1": "--save", "2x1": "--against", "1x2": "--against"}
    assert p.returncode == 0, p.stdout[-3000:]
