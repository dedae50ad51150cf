"""The Pyxis path's node teardown and its pre-submission image check, without a cluster.

pyxis_node.sh runs against a stand-in `enroot` that behaves as Enroot 4.1.2 does for what the
script uses: `enroot list` prints one container name per line; `enroot remove -f NAME` removes
it, or fails with "No such file or directory" when it is not there. The names are Pyxis
0.24.0's (pyxis_slurmstepd.c): pyxis_NAME under container_scope=global, pyxis_JOBID_NAME under
container_scope=job.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ftcluster.errors import UserError
from ftcluster.runtimes.pyxis import PyxisRuntime
from ftcluster.schedulers import scheduler_for
from ftcluster.schedulers.slurm import SlurmScheduler
from ftcluster.hosts.runner import LocalRunner
from tests.unit.test_render import RUN_DIR, render_style, write_env_file

FAKE_ENROOT = r"""#!/bin/bash
store=$FAKE_ENROOT_DATA
case $1 in
  list) ls -1 "$store" ;;
  remove)
    [ "$2" = -f ] || exit 2
    [ -d "$store/$3" ] || { echo "[ERROR] No such file or directory: $store/$3" >&2; exit 1; }
    [ ! -e "$store/$3/busy" ] || { echo "[ERROR] Device or resource busy" >&2; exit 1; }
    rm -rf "${store:?}/$3" ;;
  *) exit 2 ;;
esac
"""


def _node_script(tmp_path: Path, containers: list[str], job: str = "77",
                 busy: set[str] = frozenset()) -> tuple[subprocess.CompletedProcess[str], Path, Path]:  # type: ignore[assignment]
    run_dir = tmp_path / "run"
    scripts = render_style("pyxis", run_dir=run_dir)
    write_env_file(scripts, run_dir)
    script = tmp_path / "pyxis_node.sh"
    script.write_text(scripts.files["pyxis_node.sh"])
    bin_dir, data = tmp_path / "bin", tmp_path / "data"
    bin_dir.mkdir()
    data.mkdir()
    (bin_dir / "enroot").write_text(FAKE_ENROOT)
    (bin_dir / "enroot").chmod(0o755)
    for c in containers:
        (data / c).mkdir()
        if c in busy:
            (data / c / "busy").touch()
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_ENROOT_DATA": str(data),
           "SLURM_JOB_ID": job, "SLURMD_NODENAME": "nodeA"}
    p = subprocess.run(["bash", str(script), "down"], capture_output=True, text=True, env=env, timeout=30)
    return p, data, run_dir


def test_down_removes_the_runs_container_under_both_scopes_and_nothing_else(tmp_path: Path) -> None:
    others = ["pyxis_ftc-gpt-2n-other", "pyxis_78_ftc-gpt-2n", "pyxis_77_ftc-gpt-2nx", "ftc-gpt-2n", "pyxis_77.0"]
    p, data, run_dir = _node_script(tmp_path, ["pyxis_ftc-gpt-2n", "pyxis_77_ftc-gpt-2n", *others])
    assert p.returncode == 0, p.stderr
    assert sorted(e.name for e in data.iterdir()) == sorted(others)
    assert (run_dir / "state" / "pyxis" / "nodeA.down").read_text() == "ok\n"


def test_down_with_nothing_to_remove_is_ok(tmp_path: Path) -> None:
    p, _, run_dir = _node_script(tmp_path, [])
    assert p.returncode == 0 and (run_dir / "state" / "pyxis" / "nodeA.down").read_text() == "ok\n"


def test_down_reports_a_failed_removal(tmp_path: Path) -> None:
    p, data, run_dir = _node_script(tmp_path, ["pyxis_ftc-gpt-2n", "pyxis_77_ftc-gpt-2n"], busy={"pyxis_ftc-gpt-2n"})
    assert p.returncode == 1
    st = (run_dir / "state" / "pyxis" / "nodeA.down").read_text()
    assert st.startswith("failed enroot remove -f pyxis_ftc-gpt-2n: [ERROR] Device or resource busy"), st
    assert [e.name for e in data.iterdir()] == ["pyxis_ftc-gpt-2n"]   # the other one went


def test_job_guards_and_tears_down_every_node_through_the_node_script() -> None:
    from ftcluster.job.config import JobConfig
    from ftcluster.job.runtimes.pyxis import PyxisRuntime
    from ftcluster.job.supervisor import Job

    files = render_style("pyxis").files
    job = Job(JobConfig.from_json(files["job.json"]))
    assert isinstance(job.style.runtime, PyxisRuntime)
    node_script = str(RUN_DIR / "scripts" / "pyxis_node.sh")
    for what in ("guard", "down"):
        argv = job.style.runtime.containers.node_step(what, what)
        assert argv[:2] == ["srun", "--overlap"] and argv[-3:] == ["bash", node_script, what]
    assert "pyxis_node.sh" in files
    bare = render_style("none").files
    assert "pyxis_node.sh" not in bare and "pyxis" not in bare["job.json"]


def _pyxis_cluster(image: str):  # type: ignore[no-untyped-def]
    from tests.helpers_specs import cluster

    return cluster(scheduler="slurm", container={"runtime": "pyxis", "image": image})


def test_launcher_refuses_a_relative_or_missing_sqsh(tmp_path: Path) -> None:
    launcher = SlurmScheduler(LocalRunner(), PyxisRuntime())
    launcher.slurm.partition_nodes = lambda partition: None  # type: ignore[method-assign]
    with pytest.raises(UserError, match=r"^container.image: .*relative.*absolute path"):
        launcher.check(_pyxis_cluster("./images/triton.sqsh"), _plan())  # type: ignore[arg-type]
    with pytest.raises(UserError, match=r"^container.image: .*nowhere.sqsh does not exist \(import the image"):
        launcher.check(_pyxis_cluster(str(tmp_path / "nowhere.sqsh")), _plan())  # type: ignore[arg-type]
    sqsh = tmp_path / "t.sqsh"
    sqsh.touch()
    launcher.check(_pyxis_cluster(str(sqsh)), _plan())  # type: ignore[arg-type]
    launcher.check(_pyxis_cluster("nvcr.io#nvidia/tritonserver:22.12-py3"), _plan())  # type: ignore[arg-type]
    found = scheduler_for(_pyxis_cluster(str(sqsh)))
    assert isinstance(found, SlurmScheduler) and isinstance(found.runtime, PyxisRuntime)


def _plan():  # type: ignore[no-untyped-def]
    class P:
        nodes = 1
    return P()
