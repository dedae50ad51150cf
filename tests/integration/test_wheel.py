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
import yaml

from tests.triton_server import require_tritonserver

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.triton


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    p = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
              str(REPO)], cwd=dist, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    (whl,) = dist.glob("ftcluster-*.whl")
    return whl


def _venv(base: Path, whl: Path, *venv_args: str, pip_args: tuple[str, ...] = ()) -> tuple[Path, dict[str, str]]:
    """A fresh venv in `base` with the wheel installed; its work folder and environment (no
    PYTHONPATH: the checkout's metadata there would pass for an installed ftcluster)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv = base / "venv"
    p = _run([sys.executable, "-m", "venv", *venv_args, str(venv)], base, env)
    assert p.returncode == 0, p.stderr
    py = venv / "bin" / "python"
    p = _run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pip_args, str(whl)],
             base, env)
    assert p.returncode == 0, p.stderr
    work = base / "work"
    work.mkdir()
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", FTCLUSTER_STATE_DIR=str(base / "state"), HOME=str(base))
    return work, env


@pytest.fixture(scope="module")
def wheel_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    return (wheel, *_venv(tmp_path_factory.mktemp("wheel"), wheel, "--system-site-packages", pip_args=("--no-deps",)))


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


def _every_example_plans_and_renders(work: Path, env: dict[str, str], runs_here: bool = True) -> None:
    """Every example cluster, as shipped, plans, renders and dry-runs the shipped demo model.
    runs_here False: no tritonserver or Open MPI here, which the local cluster's run folder
    names: its render says so, naming the extra to install."""
    p = _run(["ftcluster", "examples", "configs"], work, env)
    assert p.returncode == 0, p.stderr
    model = work / "configs" / "models" / "demo.yaml"
    clusters = sorted((work / "configs" / "clusters").glob("*.yaml"))
    assert model.is_file() and len(clusters) >= 6, clusters
    for cluster in clusters:
        spec = ["--cluster", str(cluster), "--model", str(model), "--nodes", "2"]
        p = _run(["ftcluster", "plan", *spec], work, env)
        assert p.returncode == 0, (cluster.name, p.stderr)
        out = work / "r" / cluster.stem
        p = _run(["ftcluster", "render", *spec, "--out", str(out)], work, env)
        if cluster.stem == "local" and not runs_here:
            assert p.returncode == 3 and p.stderr.count("\n") == 1 and "ftcluster[cpu-triton]" in p.stderr, p.stderr
            continue
        assert p.returncode == 0, (cluster.name, p.stderr)
        assert (out / "scripts").is_dir() and any((out / "scripts").iterdir()), cluster.name
        p = _run(["ftcluster", "launch", *spec, "--dry-run"], work, env)
        if p.returncode == 3:
            # A dry run checks what a launch checks of the cluster it would run on (the shipped
            # Pyxis image's file, a partition Slurm here does not have): refused in one line per
            # problem, naming the field, no traceback.
            assert p.stderr.startswith("error: ") and "Traceback" not in p.stderr, (cluster.name, p.stderr)
            assert all(line.removeprefix("error: ").split(":")[0] in ("container.image", "partition")
                       for line in p.stderr.splitlines() if line.startswith("error: ")), (cluster.name, p.stderr)
            continue
        assert p.returncode == 0 and "# ===== would run =====" in p.stdout, (cluster.name, p.stderr)


@pytest.fixture(scope="module")
def base_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """`pip install ftcluster` with no extras, into a venv of its own: its dependencies as pip
    resolves them today (from pip's cache where it has them)."""
    work, env = _venv(tmp_path_factory.mktemp("base"), wheel)
    p = _run(["python", "-c", "import importlib.util as u; print([m for m in ('nvidia_pytriton', 'pytriton', "
              "'fabric', 'docker') if u.find_spec(m)])"], work, env)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr   # no extra came along
    return work, env


def test_the_base_install_plans_and_renders_every_example(base_venv: tuple[Path, dict[str, str]]) -> None:
    work, env = base_venv
    _every_example_plans_and_renders(work, env, runs_here=False)
    # It reads the checkpoint (the demo's has no weight files, which it says), no traceback.
    p = _run(["ftcluster", "check-checkpoint", "--model", str(work / "configs" / "models" / "demo.yaml"), "--gpus", "1"],
             work, env)
    assert p.returncode in (0, 3) and "Traceback" not in p.stderr and "1-gpu" in p.stdout + p.stderr, p.stderr


@pytest.mark.parametrize("name", ["slurm-docker", "ssh-docker"])
def test_the_base_install_renders_a_docker_run_with_its_keys(base_venv: tuple[Path, dict[str, str]],
                                                            name: str) -> None:
    # The Docker styles' per-run ssh keys are made where the run folder is written (render, as
    # launch does): the folder submits with plain sbatch. Readable by its owner alone, and never
    # in a dry run's output.
    work, env = base_venv
    _run(["ftcluster", "examples", "configs"], work, env)   # written once; later calls keep them
    spec = ["--cluster", str(work / "configs" / "clusters" / f"{name}.yaml"),
            "--model", str(work / "configs" / "models" / "demo.yaml"), "--nodes", "2"]
    out = work / "keys" / name
    p = _run(["ftcluster", "render", *spec, "--out", str(out)], work, env)
    assert p.returncode == 0, p.stderr
    keys = sorted((out / "state" / "ssh").glob("*_ed25519"))
    assert [k.name for k in keys] == ["host_ed25519", "id_ed25519"], keys
    assert all(k.stat().st_mode & 0o077 == 0 and "PRIVATE KEY" in k.read_text() for k in keys)
    p = _run(["ftcluster", "launch", *spec, "--dry-run"], work, env)
    assert p.returncode == 0 and "PRIVATE KEY" not in p.stdout + p.stderr, p.stderr


def test_installed_wheel_renders_and_dry_runs(wheel_venv: tuple[Path, Path, dict[str, str]]) -> None:
    _, work, env = wheel_venv
    p = _run(["python", "-c", "import ftcluster, sys; print(ftcluster.__file__)"], work, env)
    assert p.returncode == 0 and str(REPO) not in p.stdout and "venv" in p.stdout, p.stdout + p.stderr
    _every_example_plans_and_renders(work, env)
    cluster = work / "configs" / "clusters" / "slurm-bare.yaml"
    assert (work / "r" / "slurm-bare" / "scripts" / "job.sbatch").is_file()
    # A dry run checks the cluster as a launch does: this machine's Slurm (the test bed's, when
    # it is up) has not the shipped spec's partition, nor its workspace.
    here = work / "slurm-bare-here.yaml"
    here.write_text(yaml.safe_dump({**{k: v for k, v in yaml.safe_load(cluster.read_text()).items() if k != "partition"},
                                    "workspace": str(work / "ws")}))
    p = _run(["ftcluster", "launch", "--cluster", str(here), "--nodes", "2", "--dry-run"], work, env)
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
