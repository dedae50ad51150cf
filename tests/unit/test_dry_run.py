"""`launch --dry-run` changes nothing: no run store, no run folder, no submission; it asks Slurm
only what a launch checks first (its partition) and refuses what a launch refuses; what it
prints is the submit command quoted for a shell."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SLURM_TOOLS = ("scontrol", "sinfo", "squeue", "sbatch", "srun", "sacct")


def test_dry_run_is_pure_and_quoted(tmp_path: Path) -> None:
    # Slurm's commands on PATH record any call (a dry run asks the partition, as a launch does first).
    shims = tmp_path / "bin"
    shims.mkdir()
    calls = tmp_path / "calls"
    for tool in SLURM_TOOLS:
        shim = shims / tool
        shim.write_text(f"#!/bin/sh\necho {tool} \"$@\" >> {shlex.quote(str(calls))}\nexit 1\n")
        shim.chmod(0o755)
    workspace = tmp_path / "runs with space $(touch PWNED)"
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({
        "name": "dry", "scheduler": "slurm", "partition": "batch", "gpus_per_node": 2,
        "workspace": str(workspace),  # bare Slurm: such a path is fine (Pyxis would refuse it)
    }))
    state = tmp_path / "state"
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "FTCLUSTER_STATE_DIR": str(state)}
    p = subprocess.run([sys.executable, "-m", "ftcluster", "launch", "--cluster", str(cluster),
                        "--nodes", "2", "--dry-run"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    assert calls.read_text() == "scontrol show partition -o batch\n"
    assert not state.exists() and not workspace.exists()
    assert not (tmp_path / "PWNED").exists()
    cmd = p.stdout.split("# ===== would run =====\n", 1)[1].strip()
    # The printed line, run by a shell, cds into the run folder and submits its script.
    words = shlex.split(cmd.replace(" && ", " ; "))
    cd, sbatch = words[: words.index(";")], words[words.index(";") + 1:]
    assert cd[0] == "cd" and Path(cd[1]).parent == workspace
    assert sbatch[:2] == ["sbatch", "--parsable"] and Path(sbatch[2]).parent == Path(cd[1]) / "scripts"


def test_a_dry_run_refuses_a_workspace_a_launch_cannot_write(tmp_path: Path) -> None:
    # Under a file: no run folder can be made there (as root, the one refusal a mode cannot give).
    (tmp_path / "a-file").write_text("")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"name": "dry", "scheduler": "slurm", "workspace": str(tmp_path / "a-file" / "ws")}))
    env = {**os.environ, "FTCLUSTER_STATE_DIR": str(tmp_path / "state")}
    said = []
    for extra in (["--dry-run"], []):
        p = subprocess.run([sys.executable, "-m", "ftcluster", "launch", "--cluster", str(cluster), "--nodes", "1", "--run-id", "r1",
                            *extra], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)
        assert p.returncode == 3 and "Traceback" not in p.stderr, p.stderr
        said.append(p.stderr)
    assert said[0] == said[1] and said[0].startswith("error: workspace: cannot make the run folder "), said
    assert f"{tmp_path / 'a-file'} is not a folder" in said[0]
