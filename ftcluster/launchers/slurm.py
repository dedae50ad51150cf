"""Slurm launch style: the rendered sbatch script (bare or Pyxis) submitted with sbatch."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from ftcluster.errors import UserError
from ftcluster.launchers.base import Launcher
from ftcluster.runner import Runner
from ftcluster.slurm import JobInfo, Slurm

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from ftcluster.layout import RunPaths
    from ftcluster.plan import Plan
    from ftcluster.spec import ClusterSpec


class SlurmLauncher(Launcher):
    def __init__(self, runner: Runner):
        super().__init__(runner)
        self.slurm = Slurm(runner)

    def check(self, cluster: ClusterSpec, plan: Plan) -> None:
        total = self.slurm.partition_nodes(cluster.partition)
        if total is not None and plan.nodes > total:
            raise UserError(f"{plan.nodes} nodes requested but partition {cluster.partition!r} has {total}",
                            field="--nodes", hint="lower --nodes or choose a bigger partition")

    def submit(self, paths: RunPaths, script: Path) -> str:
        # Submitted from the run folder: the script's #SBATCH --output paths are relative.
        return self.slurm.submit(str(script), cwd=str(paths.run_dir))

    def info(self, job_id: str, paths: RunPaths) -> JobInfo:
        return self.slurm.info(job_id)

    def cancel(self, job_id: str, paths: RunPaths, grace: float = 10.0) -> None:
        self.slurm.cancel(job_id)
        deadline = time.monotonic() + grace + 30
        while time.monotonic() < deadline:
            info = self.slurm.info(job_id)
            if info.state.terminal or info.source == "none":
                return
            time.sleep(0.2)
