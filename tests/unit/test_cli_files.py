"""Commands that write files: `examples`, `prepare`/`render --out` refusals, and the run
commands on a `convert` run of a local cluster (a job request run by the local launcher, for real)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TEST_CONVERTER = REPO / "tests" / "data" / "ft_converter"
TINY_REPO = REPO / "tests" / "data" / "models" / "tiny" / "repo"


def ftc(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ftcluster", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, timeout=timeout,
                          check=False)


def one_error_line(p: subprocess.CompletedProcess[str], code: int = 3) -> str:
    assert p.returncode == code, (p.returncode, p.stderr)
    assert p.stderr.startswith("error: ") and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    return p.stderr


def test_examples_written_refused_and_forced(tmp_path: Path) -> None:
    p = ftc("examples", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    written = sorted(Path(line) for line in p.stdout.split())
    assert tmp_path / "configs" / "clusters" / "pyxis.yaml" in [tmp_path / w for w in written]
    assert {w.parent.name for w in written} == {"clusters", "models"}
    # The written demo spec plans from its new place (its paths point into the package).
    plan = ftc("plan", "--cluster", "configs/clusters/local.yaml", "--model", "configs/models/demo.yaml",
               "--nodes", "2", "--json", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    # A second run refuses, naming the file, and changes nothing.
    target = tmp_path / "configs" / "clusters" / "local.yaml"
    target.write_text("# mine\n")
    err = one_error_line(ftc("examples", cwd=tmp_path))
    assert "configs/clusters/local.yaml already exists" in err and "--force" in err
    assert target.read_text() == "# mine\n"
    assert ftc("examples", "--force", cwd=tmp_path).returncode == 0
    assert "scheduler: local" in target.read_text()


def test_every_example_cluster_plans_and_renders_the_shipped_demo(tmp_path: Path) -> None:
    """As shipped: each example cluster (Pyxis 8 GPUs, Slurm + Docker, ssh + Docker, bare Slurm,
    local) plans and renders with the demo model (its checkpoint has 1-, 2-, 4- and 8-gpu
    layouts, and the container examples mount it at its own path)."""
    assert ftc("examples", cwd=tmp_path).returncode == 0
    clusters = sorted((tmp_path / "configs" / "clusters").glob("*.yaml"))
    assert len(clusters) == len(list((REPO / "configs" / "clusters").glob("*.yaml"))) >= 6
    for c in clusters:
        args = ("--cluster", str(c), "--model", "configs/models/demo.yaml", "--nodes", "2")
        plan = ftc("plan", *args, "--json", cwd=tmp_path)
        assert plan.returncode == 0, (c.name, plan.stderr)
        out = tmp_path / f"run-{c.stem}"
        render = ftc("render", *args, "--out", str(out), cwd=tmp_path)
        assert render.returncode == 0, (c.name, render.stderr)
        assert (out / "scripts" / "job.json").is_file() and (out / "model_repository").is_dir()


def test_plan_json_shape() -> None:
    p = ftc("plan", "--nodes", "2", "--json")
    doc = json.loads(p.stdout)
    assert doc["schema_version"] == 2 and doc["kind"] == "plan"
    assert doc["num_nodes"] == 2 and doc["pipeline_para_size"] == 2
    assert isinstance(doc["nodes"], list) and len(doc["nodes"]) == 2 and all(isinstance(n, str) for n in doc["nodes"])


def test_prepare_out_unwritable_is_one_line(tmp_path: Path) -> None:
    err = one_error_line(ftc("prepare", "--nodes", "1", "--out", "/proc/ftcluster-test/repo"))
    assert err.startswith("error: --out: cannot write /proc/ftcluster-test")
    if os.geteuid() != 0:  # root writes anywhere but /proc
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
        one_error_line(ftc("prepare", "--nodes", "1", "--out", str(locked / "repo")))


def test_refused_render_leaves_nothing_and_a_retry_works(tmp_path: Path) -> None:
    # Pyxis cannot mount a run folder holding ',' (--container-mounts syntax): refused.
    # (The example's mounts plus the demo checkpoint's: render refuses what launch refuses.)
    spec = yaml.safe_load((REPO / "configs/clusters/pyxis.yaml").read_text())
    demo = REPO / "ftcluster" / "demo" / "checkpoint"
    spec["container"]["mounts"].append(f"{demo}:{demo}:ro")
    (tmp_path / "pyxis.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "new" / "a,b"
    err = one_error_line(ftc("render", "--cluster", str(tmp_path / "pyxis.yaml"),
                             "--nodes", "1", "--gpus-per-node", "1", "--out", str(out)))
    assert "--out" in err and "holds ," in err
    assert not (tmp_path / "new").exists()
    # Nor does a checkpoint no mount shows inside the container (launch's refusal too): the
    # example without its demo mount.
    spec["container"]["mounts"] = [m for m in spec["container"]["mounts"][:-1]
                                   if not (isinstance(m, dict) and "demo" in m["src"])]
    (tmp_path / "nodemo.yaml").write_text(yaml.safe_dump(spec))
    err = one_error_line(ftc("render", "--cluster", str(tmp_path / "nodemo.yaml"),
                             "--nodes", "1", "--gpus-per-node", "1", "--out", str(tmp_path / "new" / "ok")))
    assert err.startswith("error: container.mounts: model_checkpoint_path ") and "not visible" in err
    assert not (tmp_path / "new").exists()
    # The same folder for a style that can use it: written.
    p = ftc("render", "--nodes", "1", "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert (out / "scripts" / "job.sh").is_file() and (out / "model_repository").is_dir()
    # What launch lays out for the job: its folders and run.json, the scripts' modes.
    for folder in ("logs", "state", "results"):
        assert (out / folder).is_dir(), folder
    assert json.loads((out / "run.json").read_text())["plan"]["nodes"] == 1
    assert (out / "scripts" / "job.sh").stat().st_mode & 0o777 == 0o755


@pytest.fixture
def convert_specs(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    (tmp_path / "ckpt").mkdir()
    model = {"name": "tinygpt", "model_type": "GPT", "repository": str(TINY_REPO), "ft_model": "fastertransformer",
             "checkpoint_root": str(tmp_path / "ckpt"), "data_type": "fp16"}
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(model))
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(
        {"scheduler": "local", "gpus_per_node": 2, "workspace": str(tmp_path / "runs")}))
    args = ["convert", "--cluster", str(tmp_path / "cluster.yaml"), "--model", str(tmp_path / "model.yaml"),
            "--converter-root", str(TEST_CONVERTER), "--input", str(TEST_CONVERTER / "hf_tiny_gpt")]
    return args, {"FTCLUSTER_STATE_DIR": str(tmp_path / "state")}


def test_status_logs_stop_of_a_local_convert(convert_specs: tuple[list[str], dict[str, str]]) -> None:
    args, env = convert_specs
    p = ftc(*args, "--python", sys.executable, env=env)
    assert p.returncode == 0, p.stderr
    run_id = p.stdout.split()[1].rstrip(":")
    st = json.loads(ftc("status", run_id, "--json", env=env).stdout)
    assert st["state"] == "COMPLETED" and st["style"] == "convert" and st["ranks"] == []
    logs = ftc("logs", run_id, "-f", env=env)
    assert logs.returncode == 0 and "TEST CONVERTER: wrote" in logs.stdout, logs.stderr
    assert ftc("stop", run_id, env=env).returncode == 0
    again = ftc(*args, "--python", sys.executable, "--json", env=env)
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    assert doc["kind"] == "convert" and doc["checked"] and doc["run"]["status"] == "COMPLETED"
    assert doc["output"].endswith("-gpu")


def test_stop_a_running_local_convert(convert_specs: tuple[list[str], dict[str, str]], tmp_path: Path) -> None:
    args, env = convert_specs
    slow = tmp_path / "slowpython"
    slow.write_text(f'#!/bin/bash\necho "$$" > {tmp_path}/slow.pid\nsleep 60\nexec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    # To a file, not a pipe: the detached job inherits the descriptors and would hold a pipe open.
    with open(tmp_path / "out.txt", "w+") as out:
        rc = subprocess.call([sys.executable, "-m", "ftcluster", *args, "--python", str(slow), "--detach"],
                             stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO), **env},
                             timeout=60)
    assert rc == 0, (tmp_path / "out.txt").read_text()
    run_id = (tmp_path / "out.txt").read_text().split()[1].rstrip(":")
    assert json.loads(ftc("status", run_id, "--json", env=env).stdout)["state"] == "RUNNING"
    deadline = time.monotonic() + 30
    while not (tmp_path / "slow.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    task = int((tmp_path / "slow.pid").read_text())
    stopped = ftc("stop", run_id, env=env)
    assert stopped.returncode == 0 and "Traceback" not in stopped.stderr
    st = json.loads(ftc("status", run_id, "--json", env=env).stdout)
    assert st["state"] != "RUNNING"
    assert not Path(f"/proc/{task}").exists() or "Z" in Path(f"/proc/{task}/stat").read_text().split()[2]


def test_convert_makes_its_output_folder(convert_specs: tuple[list[str], dict[str, str]], tmp_path: Path) -> None:
    # The walkthroughs' first step: checkpoint_root (c-models) does not exist before the conversion.
    model = yaml.safe_load((tmp_path / "model.yaml").read_text())
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({**model, "checkpoint_root": "c-models"}))
    args, env = convert_specs
    p = ftc(*args, "--python", sys.executable, env=env)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "c-models" / "2-gpu" / "config.ini").is_file()
    # Something else in its place is still refused, before anything runs.
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({**model, "checkpoint_root": "not-a-folder"}))
    (tmp_path / "not-a-folder").write_text("")
    p = ftc(*args, "--python", sys.executable, env=env)
    assert p.returncode == 3 and "checkpoint_root: folder" in p.stderr and "is not a folder" in p.stderr, p.stderr
