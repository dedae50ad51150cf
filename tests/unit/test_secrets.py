"""The spec's env may hold secrets (an HF token): its values live in scripts/env.sh and
scripts/job.json, 0600, written so from the start; no other file of a run folder, no --dry-run
and no `docker run` option carries them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from ftcluster.launch import LaunchOptions, job_request
from ftcluster.layout import RunPaths
from tests.helpers_specs import run_cli
from tests.unit.test_render import SPECS, _model, _plan, cluster

SECRET = "hf_Secret-Token-4711"


@pytest.mark.parametrize("style", list(SPECS))
def test_no_env_value_in_a_world_readable_file(style: str, tmp_path: Path) -> None:
    c = cluster(**{**SPECS[style], "env": {"HF_TOKEN": SECRET}, "workspace": str(tmp_path)})
    paths = RunPaths("r1", tmp_path / "r1")
    old = os.umask(0o022)
    try:
        request = job_request(c, _model(), _plan(c, 2), paths, LaunchOptions(keep_serving=False), build=False)
        request.write_files()
    finally:
        os.umask(old)
    holders = []
    for folder, _, names in os.walk(paths.run_dir):
        for name in names:
            p = Path(folder, name)
            if SECRET in p.read_text(errors="replace"):
                holders.append(p.name)
                assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert sorted(holders) == ["env.sh", "job.json"]
    assert SECRET not in str(request)                 # the dry run
    assert all(SECRET not in a for f in request.files for a in (f.shown or "",))
    assert "HF_TOKEN" in str(request)                 # the names stay visible


def test_dry_run_hides_env_values(tmp_path: Path) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text(yaml.safe_dump({"name": "c", "scheduler": "local", "gpus_per_node": 1, "max_nodes": 4,
                                    "workspace": str(tmp_path / "ws"), "env": {"HF_TOKEN": SECRET}}))
    res = run_cli("launch", "--cluster", str(spec), "--nodes", "2", "--dry-run", cwd=tmp_path)
    assert res.rc == 0, res.stderr
    assert SECRET not in res.stdout + res.stderr and "export HF_TOKEN='<hidden>'" in res.stdout
