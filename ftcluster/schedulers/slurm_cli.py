"""Slurm knowledge in one place: submit, state, cancel, partitions. Every Slurm command that
ftcluster runs from the login side (sbatch, squeue, sacct, scontrol, sinfo, scancel) is built
here; the job's own (srun, scancel, squeue, scontrol inside the allocation) are built by the job
supervisor (ftcluster/job/schedulers/slurm.py), which is shipped standard-library-only.

Job states map to a few launch-level states in one table. State comes from `squeue` first
(live jobs) and `sacct` when accounting exists; clusters without accounting (sacct exits 1)
fall back to `scontrol show job` while Slurm still remembers the job.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ftcluster.errors import LaunchError, UserError
from ftcluster.job.poll import CLOCK, Clock
from ftcluster.job.submit import PATIENCE_S, SubmitFailed, nothing_to_cancel, submit
from ftcluster.hosts.runner import CommandResult, Runner
from ftcluster.run.job_info import NO_SUCH_JOB, UNREACHABLE, JobInfo, JobState


# Slurm's job states (squeue %T / sacct State / scontrol JobState) -> ours.
SLURM_STATES: dict[str, JobState] = {
    "PENDING": JobState.PENDING, "CONFIGURING": JobState.PENDING, "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING, "REQUEUE_FED": JobState.PENDING, "RESV_DEL_HOLD": JobState.PENDING,
    "SUSPENDED": JobState.PENDING, "STOPPED": JobState.PENDING,
    "RUNNING": JobState.RUNNING, "COMPLETING": JobState.RUNNING, "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING, "RESIZING": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED, "NODE_FAIL": JobState.FAILED, "BOOT_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED, "DEADLINE": JobState.FAILED, "REVOKED": JobState.FAILED,
    "PREEMPTED": JobState.FAILED, "SPECIAL_EXIT": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT,
}


def map_state(raw: str) -> JobState:
    # sacct prints "CANCELLED by 0"; squeue may print abbreviations in other formats.
    word = raw.strip().split()[0].rstrip("+") if raw.strip() else ""
    return SLURM_STATES.get(word.upper(), JobState.UNKNOWN)


def expand_nodelist(nodelist: str) -> tuple[str, ...]:
    if not nodelist or nodelist in ("(null)", "None", "None assigned"):
        return ()

    # startup: python-hostlist only where Slurm names nodes (not on a local launch's way to its job)
    import hostlist

    return tuple(hostlist.expand_hostlist(nodelist))


class Slurm:
    def __init__(self, runner: Runner):
        self.runner = runner
        self._has_sacct: bool | None = None

    @staticmethod
    def submit_command(script: str) -> tuple[str, ...]:
        """The argv that submits a job script; --parsable: sbatch prints the job id alone."""
        return ("sbatch", "--parsable", script)

    def submit(self, argv: Sequence[str], cwd: str, clock: Clock = CLOCK, patience: float = PATIENCE_S) -> str:
        """Run a submit_command argv (a job request's) in cwd; the job id it prints. A silent
        slurmctld never leaves a job unknown or twice (ftcluster/job/submit.py)."""
        def run(cmd: list[str], folder: str | None, timeout: float) -> tuple[int, str, str]:
            res = self.runner.run(cmd, cwd=folder, timeout=timeout)
            return res.returncode, res.stdout, res.stderr

        try:
            return submit(run, list(argv), cwd, patience=patience, monotonic=clock.monotonic, sleep=clock.sleep)
        except SubmitFailed as e:
            if e.code == 127:
                raise UserError("sbatch not found", hint="run on a Slurm login node or set login_host") from None
            if e.refused:
                raise UserError(f"sbatch refused the job: {e}", field="cluster",
                                hint="check partition, account, node count and time limit") from None
            raise LaunchError(str(e) + (" (scancel it, or launch again)" if e.unknown else "")) from None

    def cancel(self, job_id: str, signal: str | None = None, batch: bool = False) -> None:
        """End the job; with a signal, send it that instead (batch: to the batch shell alone,
        not to its steps)."""
        argv = ["scancel"] + (["--batch"] if batch else []) + ([f"--signal={signal}"] if signal else [])
        res = self.runner.run([*argv, job_id], timeout=60)
        problem = "" if res.ok or nothing_to_cancel(res.stderr) else self._query_problem(res)
        if problem:
            raise LaunchError(f"scancel of job {job_id} failed: {problem}; the job may still run: try again once "
                              f"Slurm answers (`ftcluster status` says whether it does)")

    def info(self, job_id: str) -> JobInfo:
        """The job's state; JobInfo.gone and .unreachable say whether Slurm knows it no more
        or could not be asked."""
        problem = ""
        for probe in (self._squeue, self._sacct, self._scontrol):
            if problem and probe == self._scontrol:
                break   # slurmctld did not answer squeue: scontrol asks it too (another timeout)
            got = probe(job_id)
            if isinstance(got, JobInfo):
                return got
            problem = problem or got
        if problem:
            return JobInfo(job_id, JobState.UNKNOWN, "UNKNOWN", reason=problem, source=UNREACHABLE)
        return JobInfo(job_id, JobState.UNKNOWN, "UNKNOWN", source=NO_SUCH_JOB)

    def infos(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        """Many jobs' states at the cost of one squeue, and one sacct for the jobs it shows no
        more (as submitit's InfoWatcher asks for all its jobs at once); a job neither knows is
        NO_SUCH_JOB. One job is asked as `info` asks."""
        ids = list(dict.fromkeys(job_ids))
        if len(ids) <= 1:
            return {i: self.info(i) for i in ids}
        # With more than one id squeue loads the job table and filters it: an id it does not
        # know is left out, not an error.
        res = self.runner.run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%T|%R|%N"], timeout=30)
        if not res.ok:
            problem = self._query_problem(res) or f"exit {res.returncode}"
            return {i: JobInfo(i, JobState.UNKNOWN, "UNKNOWN", reason=problem, source=UNREACHABLE) for i in ids}
        got: dict[str, JobInfo] = {}
        for line in res.stdout.splitlines():
            job_id, *fields = line.split("|")
            if job_id in ids:
                got[job_id] = self._squeue_info(job_id, fields)
        missing = [i for i in ids if i not in got]
        rows = self._accounting(missing, "JobID,State,ExitCode,NodeList") if missing else None
        for line in (rows or "").splitlines():
            job_id, *fields = line.split("|")
            if job_id in missing:
                got[job_id] = self._sacct_info(job_id, fields)
        return {i: got.get(i) or JobInfo(i, JobState.UNKNOWN, "UNKNOWN", source=NO_SUCH_JOB) for i in ids}

    @staticmethod
    def _query_problem(res: CommandResult) -> str:
        """'' when a failed query means "no such job"; else what went wrong (Slurm unreachable)."""
        text = (res.stderr or res.stdout).strip()
        if "invalid job id" in text.lower():
            return ""
        return text.splitlines()[-1] if text else f"exit {res.returncode}"

    def _squeue(self, job_id: str) -> JobInfo | str:
        res = self.runner.run(["squeue", "-h", "-j", job_id, "-o", "%T|%R|%N"], timeout=30)
        if not res.ok:
            return self._query_problem(res)
        if not res.stdout.strip():
            return ""  # squeue forgets jobs shortly after they end
        return self._squeue_info(job_id, res.stdout.strip().splitlines()[0].split("|"))

    @staticmethod
    def _squeue_info(job_id: str, fields: list[str]) -> JobInfo:
        """A job from squeue's `%T|%R|%N` fields."""
        raw, reason, nodes = (fields + ["", ""])[:3]
        state = map_state(raw)
        # squeue says "None" (or "(None)") when there is no reason to show, and %R is a running
        # job's node list (JobInfo.nodes), not a reason.
        reason = "" if reason.strip("()") == "None" or state is JobState.RUNNING else reason
        return JobInfo(job_id, state, raw, expand_nodelist(nodes), reason, source="squeue")

    def _sacct(self, job_id: str) -> JobInfo | str:
        rows = (self._accounting([job_id], "State,ExitCode,NodeList") or "").strip()
        if not rows:
            return ""
        return self._sacct_info(job_id, rows.splitlines()[0].split("|"))

    def _accounting(self, job_ids: Sequence[str], fields: str) -> str | None:
        """sacct's rows of these jobs; None on a cluster without accounting (remembered)."""
        if self._has_sacct is False:
            return None
        res = self.runner.run(["sacct", "-n", "-P", "-X", "-j", ",".join(job_ids), "-o", fields], timeout=30)
        # "accounting storage is disabled" on clusters without slurmdbd
        self._has_sacct = res.ok
        return res.stdout if res.ok else None

    @staticmethod
    def _sacct_info(job_id: str, fields: list[str]) -> JobInfo:
        """A job from sacct's `State|ExitCode|NodeList` fields."""
        raw, code, nodes = (fields + ["", ""])[:3]
        return JobInfo(job_id, map_state(raw), raw, expand_nodelist(nodes), exit_code=code, source="sacct")

    def _scontrol(self, job_id: str) -> JobInfo | str:
        res = self.runner.run(["scontrol", "show", "job", "-o", job_id], timeout=30)
        if not res.ok:
            return self._query_problem(res)
        fields = dict(re.findall(r"(\w+)=(\S*)", res.stdout))
        raw = fields.get("JobState", "")
        if not raw:
            return ""
        return JobInfo(job_id, map_state(raw), raw, expand_nodelist(fields.get("NodeList", "")),
                       fields.get("Reason", ""), fields.get("ExitCode", ""), source="scontrol")

    def partition_nodes(self, partition: str | None) -> int | None:
        """Nodes in a partition (None: not checked); raise when the partition does not exist."""
        if not partition:
            return None
        res = self.runner.run(["scontrol", "show", "partition", "-o", partition], timeout=30)
        if res.returncode == 127:
            raise UserError("scontrol not found", hint="run on a Slurm login node or set login_host")
        if not res.ok:
            if "not found" in (res.stderr + res.stdout).lower():
                listing = self.runner.run(["sinfo", "-h", "-o", "%R"], timeout=30).stdout.split()
                raise UserError(f"unknown partition {partition!r}", field="partition",
                                hint=f"this cluster has: {', '.join(sorted(set(listing))) or 'none'}")
            return None
        total = re.search(r"\bTotalNodes=(\d+)", res.stdout)
        return int(total.group(1)) if total else None
