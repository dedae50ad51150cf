"""The Slurm scheduler: the rendered sbatch script submitted with sbatch (every runtime: none,
Pyxis, Charliecloud, Docker); its state from squeue/sacct/scontrol, a requeue seen as PENDING
after the start. The Slurm commands themselves are built in slurm_cli.py.

Every Slurm style's job ends with a teardown step on every node: it removes the run's containers
(Pyxis, Docker) and what the ranks left in /dev/shm. A plain `scancel` would end the job before
that step can run: a cancelled job may start no new job steps. So a cancel first sends SIGTERM
to the batch shell alone; the job stops rank 0 (it finishes its requests in flight), every rank,
runs the teardown, then ends by itself. Only after a grace period is it scancelled (the node
guards of the container styles then remove what is left).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ftcluster.errors import LaunchError, UserError
from ftcluster.schedulers.base import Scheduler
from ftcluster.hosts.runner import Runner
from ftcluster.run.job_info import JobInfo, JobState
from ftcluster.schedulers.slurm_cli import Slurm

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from ftcluster.runtimes.base import Runtime, Submission
    from ftcluster.run.layout import RunPaths
    from ftcluster.plan.parallel import Plan
    from ftcluster.spec.cluster import ClusterSpec


# The node-side teardown: one srun step over every node.
TEARDOWN_GRACE = 60.0


class SlurmScheduler(Scheduler):
    name = "slurm"
    time_limit_notice = True

    @staticmethod
    def submit_command(script: str) -> tuple[str, ...]:
        # Submitted from the run folder: #SBATCH --output paths are relative.
        return Slurm.submit_command(script)

    def __init__(self, runner: Runner, runtime: Runtime | None = None):
        super().__init__(runner, runtime)
        self.slurm = Slurm(runner)

    def check_limits(self, cluster: ClusterSpec, plan: Plan, servers: bool) -> None:
        total = self.slurm.partition_nodes(cluster.partition)
        if total is not None and plan.nodes > total:
            raise UserError(f"{plan.nodes} nodes requested but partition {cluster.partition!r} has {total}",
                            field="--nodes", hint="lower --nodes or choose a bigger partition")

    def submit(self, request: Submission) -> str:
        return self.slurm.submit(request.argv, cwd=str(request.cwd), clock=self.clock)

    def info(self, job_id: str, paths: RunPaths) -> JobInfo:
        return self.slurm.info(job_id)

    def infos(self, jobs: Sequence[tuple[str, RunPaths]]) -> dict[str, JobInfo]:
        return self.slurm.infos([job_id for job_id, _ in jobs])

    def requeued(self, info: JobInfo) -> str | None:
        # PENDING after it started: requeued after a node or slurmctld failure. The launch
        # fails and cancels it rather than wait for a run that starts from scratch.
        if info.state is not JobState.PENDING:
            return None
        return f"Slurm requeued the job after it had started{': ' + info.reason if info.reason else ''}; it was cancelled"

    def cancel(self, job_id: str, paths: RunPaths, grace: float = 10.0) -> None:
        """End the job and wait until Slurm has let it go: the job's `done` says when to look
        (watch.JobWatch), so the wait costs the scheduler a few queries, not one per 0.2 s."""
        # startup: the job watch only when a job is cancelled
        from ftcluster.schedulers.watch import JobWatch

        watch = JobWatch(self, job_id, paths, self.clock)
        try:
            # The job's teardown ends with its `done`, which brings the questions forward.
            # A job that is not running (pending, or requeued) has no batch shell to ask. One
            # COMPLETING (RUNNING here) after its attempt's `done` is over: stopped before.
            if self.slurm.info(job_id).state is JobState.RUNNING:
                self.slurm.cancel(job_id, signal="TERM", batch=True)
                if watch.wait_gone(grace + TEARDOWN_GRACE, told_done=True):
                    return
            self.slurm.cancel(job_id)
            if not watch.wait_gone(grace + 30) and watch.info is not None and watch.info.unreachable:
                raise LaunchError(f"Slurm took the cancel of job {job_id} but has not answered since "
                                  f"({watch.info.reason}): its end is not confirmed; `ftcluster status` once Slurm "
                                  f"answers, and stop again if it still runs")
        finally:
            watch.close()
