"""Slurm launch style: the rendered sbatch script (bare or Pyxis) submitted with sbatch."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ftcluster.errors import UserError
from ftcluster.launchers.base import Launcher
from ftcluster.runner import Runner
from ftcluster.slurm import JobInfo, Slurm

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from ftcluster.layout import RunPaths
    from ftcluster.plan import Plan
    from ftcluster.request import JobRequest
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

    @staticmethod
    def command(script: str) -> tuple[str, ...]:
        # Submitted from the run folder (the request's cwd): #SBATCH --output paths are relative.
        return ("sbatch", "--parsable", script)

    def submit(self, request: JobRequest) -> str:
        return self.slurm.submit(request.argv, cwd=str(request.cwd))

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
