"""The spec's env may hold secrets (an HF token): its values live in scripts/env.sh and
scripts/job.json, 0600, written so from the start; no other file of a run folder, no --dry-run
and no `docker run` option carries them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from ftcluster.launch.run import LaunchOptions, job_request
from ftcluster.run.layout import RunPaths
from ftcluster.run.store import RunStore
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
    # And the run folder itself is the user's alone, whatever the umask.
    assert stat.S_IMODE(paths.run_dir.stat().st_mode) == 0o700
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


def test_the_run_folder_and_the_store_are_private_under_a_wide_umask(tmp_path: Path) -> None:
    """A launch's run folder (0700) and the run store (folder 0700, file 0600) under umask 000,
    on the real CLI: a local run that is refused by readiness still made both."""
    spec = tmp_path / "c.yaml"
    spec.write_text(yaml.safe_dump({"name": "c", "scheduler": "local", "gpus_per_node": 1, "max_nodes": 4,
                                    "workspace": str(tmp_path / "ws"), "env": {"HF_TOKEN": SECRET}}))
    state = tmp_path / "state"
    old = os.umask(0)
    try:
        res = run_cli("render", "--cluster", str(spec), "--nodes", "1", "--out", str(tmp_path / "out"),
                      cwd=tmp_path)
        RunStore(state / "runs.sqlite")
    finally:
        os.umask(old)
    assert res.rc == 0, res.stderr
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o700
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((state / "runs.sqlite").stat().st_mode) == 0o600
