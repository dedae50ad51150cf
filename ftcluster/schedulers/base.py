"""The one interface every scheduler implements (as torchx's schedulers/api.py): submit, state,
cancel, requeue detection, the ports and limits of its own. A scheduler holds the container
runtime of its run (ftcluster.runtimes): the image's check and the run's resources are the
runtime's, asked through the scheduler."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from ftcluster.job.poll import CLOCK, Clock
from ftcluster.hosts.runner import Runner
from ftcluster.run.job_info import JobInfo
from ftcluster.runtimes.base import Runtime, Submission

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from ftcluster.run.layout import RunPaths
    from ftcluster.plan.parallel import Plan
    from ftcluster.spec.cluster import ClusterSpec


class Scheduler(ABC):
    name: str
    # The scheduler gives the job notice of its time limit (a signal before it: Slurm's
    # `--signal`, which the job template sets from the leads that render works out): a serving
    # run hands over to a successor then, which this scheduler submits; and it may requeue a job.
    time_limit_notice: ClassVar[bool] = False
    # The clock its waits run on (tests: a virtual one, to count what a long wait costs).
    clock: Clock = CLOCK

    def __init__(self, runner: Runner, runtime: Runtime | None = None):
        self.runner = runner
        self.runtime = runtime or Runtime()

    @staticmethod
    def submit_command(script: str) -> tuple[str, ...]:
        """The argv that starts a job script from the run folder (the request's cwd): here, as a
        process of the launching command."""
        return ("bash", script)

    def with_ports(self, cluster: ClusterSpec, plan: Plan) -> ClusterSpec:
        """The spec with the ports the servers will take, where the launcher picks them (a spec
        that leaves `ports` out); the spec itself elsewhere."""
        return cluster

    def check(self, cluster: ClusterSpec, plan: Plan, servers: bool = True) -> None:
        """Refuse what the cluster cannot run, before anything is written or submitted
        (servers=False: a job step, no server ports): the scheduler's own limits, then the
        runtime's image."""
        self.check_limits(cluster, plan, servers)
        self.runtime.check(cluster, plan, self.runner)

    def check_limits(self, cluster: ClusterSpec, plan: Plan, servers: bool) -> None:
        """What this scheduler can run: its nodes, its ports."""

    @abstractmethod
    def submit(self, request: Submission) -> str:
        """Run the request's argv in its cwd (its files are written); return a job id for info/cancel."""

    @abstractmethod
    def info(self, job_id: str, paths: RunPaths) -> JobInfo:
        """The job's state now."""

    def infos(self, jobs: Sequence[tuple[str, RunPaths]]) -> dict[str, JobInfo]:
        """Several jobs' states by job id; a scheduler that can be asked once for all overrides this."""
        return {job_id: self.info(job_id, paths) for job_id, paths in jobs}

    def identifies(self, job_id: str) -> bool:
        """Whether `info` about this job id can be trusted to say it has ended."""
        return True

    @abstractmethod
    def cancel(self, job_id: str, paths: RunPaths, grace: float = 10.0) -> None:
        """Stop the job and everything it started; returns when it is gone (or after grace)."""

    def prepare_resources(self, request: Submission) -> None:
        """Make what the run's job needs beside the request's files (the runtime's)."""
        self.runtime.prepare_resources(request)

    def release_resources(self, paths: RunPaths) -> None:
        """Remove what prepare_resources made: the run has ended or was stopped."""
        self.runtime.release_resources(paths)

    def requeued(self, info: JobInfo) -> str | None:
        """Asked once the job has started: the failure to report when the scheduler has put it
        back in the queue (its ranks are gone; a re-run would start from scratch), else None."""
        return None
