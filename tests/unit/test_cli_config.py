"""A person's defaults: `ftcluster config` sets the cluster (and model) spec used when --cluster
is left out, $FTCLUSTER_CLUSTER overrides the file; Slurm values on the command line override
the spec's, checked as the spec's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_cli_files import REPO



def ftc(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ftcluster", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env}, timeout=120, check=False)


def test_config_defaults_and_overrides(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert ftc("examples", str(tmp_path / "configs"), env=env, cwd=tmp_path).returncode == 0
    slurm = tmp_path / "configs" / "clusters" / "slurm-bare.yaml"
    demo = tmp_path / "configs" / "models" / "demo.yaml"
    shown = json.loads(ftc("config", "--json", env=env, cwd=tmp_path).stdout)
    assert shown["kind"] == "config" and shown["cluster"]["from"] == "embedded"
    assert ftc("config", "--cluster", str(slurm), "--model", str(demo), env=env, cwd=tmp_path).returncode == 0
    cfg = tmp_path / "xdg" / "ftcluster" / "config.yaml"
    assert cfg.is_file() and oct(cfg.parent.stat().st_mode & 0o777) == "0o700"
    shown = json.loads(ftc("config", "--json", env=env, cwd=tmp_path).stdout)
    assert shown["cluster"] == {"path": str(slurm), "from": str(cfg)}
    # No --cluster: the configured one (bare Slurm here), with the command line's Slurm values.
    out = tmp_path / "run"
    r = ftc("render", "--nodes", "2", "-p", "gpu2", "-A", "proj", "-q", "high", "-t", "1-00", "--out", str(out),
            env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    sbatch = (out / "scripts" / "job.sbatch").read_text()
    assert all(line in sbatch for line in ("#SBATCH --partition=gpu2\n", "#SBATCH --account=proj\n",
                                           "#SBATCH --qos=high\n", "#SBATCH --time=1-00\n"))
    bad = ftc("plan", "--nodes", "2", "-t", "1 day", "-p", "a b", env=env, cwd=tmp_path)
    # Both, each named by the option that gave it.
    assert bad.returncode == 3 and "--time: use a Slurm time" in bad.stderr and "--partition: " in bad.stderr, \
        bad.stderr
    # The variable wins over the file; --unset forgets.
    local = tmp_path / "configs" / "clusters" / "local.yaml"
    shown = json.loads(ftc("config", "--json", env={**env, "FTCLUSTER_CLUSTER": str(local)}, cwd=tmp_path).stdout)
    assert shown["cluster"] == {"path": str(local), "from": "$FTCLUSTER_CLUSTER"}
    assert ftc("config", "--unset", "cluster", env=env, cwd=tmp_path).returncode == 0
    assert json.loads(ftc("config", "--json", env=env, cwd=tmp_path).stdout)["cluster"]["from"] == "embedded"
    cfg.write_text("cluster: [1, 2]\n")
    broken = ftc("plan", env=env, cwd=tmp_path)
    assert broken.returncode == 3 and "config.yaml" in broken.stderr and "Traceback" not in broken.stderr


@pytest.mark.parametrize("content, says", [
    (b"cluster: !!int x\n", "line 1 column 10: invalid YAML: the value of cluster is no !!int value"),
    (b"cluster: !!set [[1]]\n", "invalid YAML: a value is not of its !!tag's type"),
    (b"\xff\xfe\x00", "not a text file"),
    (b"cluster: [1\n", "line 2 column 1: invalid YAML: expected ',' or ']'"),
])
def test_a_broken_config_file_is_one_line(tmp_path: Path, content: bytes, says: str) -> None:
    cfg = tmp_path / "xdg" / "ftcluster" / "config.yaml"
    cfg.parent.mkdir(parents=True)
    cfg.write_bytes(content)
    r = ftc("plan", env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")}, cwd=tmp_path)
    assert r.returncode == 3 and r.stderr.startswith("error: config: ") and r.stderr.count("\n") == 1, r.stderr
    assert says in r.stderr and str(cfg) in r.stderr
