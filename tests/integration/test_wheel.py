"""The built wheel, installed into a fresh virtual environment outside the checkout, renders,
dry-runs, writes the example specs and runs the embedded default launch.

The venv sees the test environment's packages (ftcluster's dependencies are big and already
here) but its own site-packages come first, so `ftcluster` is the wheel's, never the checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.triton_server import require_tritonserver

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.triton


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    p = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
              str(REPO)], cwd=base, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    (whl,) = dist.glob("ftcluster-*.whl")
    venv = base / "venv"
    assert _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], base,
                dict(os.environ)).returncode == 0
    py = venv / "bin" / "python"
    p = _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", str(whl)],
             base, dict(os.environ))
    assert p.returncode == 0, p.stderr
    work = base / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", FTCLUSTER_STATE_DIR=str(base / "state"), HOME=str(base))
    return whl, work, env


def test_wheel_holds_templates_examples_and_the_demo(wheel_venv: tuple[Path, Path, dict[str, str]]) -> None:
    whl, _, _ = wheel_venv
    names = set(zipfile.ZipFile(whl).namelist())
    assert "ftcluster/job_templates/job.sh.j2" in names and "ftcluster/job_templates/_node_guard.sh.j2" in names
    # The job supervisor, shipped into every run folder, and the rank-side shell files.
    assert {"ftcluster/job/supervisor.py", "ftcluster/job/__main__.py", "ftcluster/rank/local_rank.sh",
            "ftcluster/rank/signal_rank.sh"} <= names
    assert "ftcluster/configs/clusters/pyxis.yaml" in names
    assert "ftcluster/demo/model_repository/fastertransformer/1/model.py" in names
    # The test model's MPI binding is a link in the checkout; the wheel carries the file.
    assert "ftcluster/demo/model_repository/fastertransformer/1/ctmpi.py" in names


def test_installed_wheel_renders_and_dry_runs(wheel_venv: tuple[Path, Path, dict[str, str]]) -> None:
    _, work, env = wheel_venv
    p = _run(["python", "-c", "import ftcluster, sys; print(ftcluster.__file__)"], work, env)
    assert p.returncode == 0 and str(REPO) not in p.stdout and "venv" in p.stdout, p.stdout + p.stderr
    p = _run(["ftcluster", "examples", "configs"], work, env)
    assert p.returncode == 0, p.stderr
    model = work / "configs" / "models" / "demo.yaml"
    clusters = sorted((work / "configs" / "clusters").glob("*.yaml"))
    assert model.is_file() and len(clusters) >= 5, clusters
    # Every example cluster, as shipped, plans and renders the shipped demo model.
    for cluster in clusters:
        p = _run(["ftcluster", "plan", "--cluster", str(cluster), "--model", str(model), "--nodes", "2"], work, env)
        assert p.returncode == 0, (cluster.name, p.stderr)
        out = work / "r" / cluster.stem
        p = _run(["ftcluster", "render", "--cluster", str(cluster), "--model", str(model), "--nodes", "2",
                  "--out", str(out)], work, env)
        assert p.returncode == 0, (cluster.name, p.stderr)
        assert (out / "scripts").is_dir() and any((out / "scripts").iterdir()), cluster.name
    cluster = work / "configs" / "clusters" / "slurm-bare.yaml"
    assert (work / "r" / "slurm-bare" / "scripts" / "job.sbatch").is_file()
    p = _run(["ftcluster", "launch", "--cluster", str(cluster), "--nodes", "2", "--dry-run"], work, env)
    assert p.returncode == 0, p.stderr
    assert "# ===== would run =====" in p.stdout and "sbatch --parsable" in p.stdout


def test_installed_wheel_runs_the_embedded_default(wheel_venv: tuple[Path, Path, dict[str, str]]) -> None:
    require_tritonserver()
    _, work, env = wheel_venv
    p = _run(["ftcluster", "launch", "--nodes", "2", "--json"], work, env, timeout=400)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["ok"] is True and out["client"]["ok"] is True, out
    assert str(REPO) not in out["run_dir"]
