"""A serving run's successor job: before this job's time limit, and after a lost node.

Time limit: Slurm sends the batch shell (the supervisor) SIGUSR1 `handover_lead` seconds before
the limit (`#SBATCH --signal=B:USR1@LEAD`). The supervisor then submits a successor run of the
same plan on other nodes (`cfg.successor`: `python -m ftcluster successor RUN_DIR --exclude
NODES`, run with the launching Python, as the client is), and keeps serving while the successor
starts. When the successor serves, this job hands over (event handed_over) and ends gracefully:
rank 0 finishes its requests in flight. A successor that fails leaves this job serving to its
end; one that stays pending too (status shows it pending).

Lost node: a node of the job no longer answers (a restart in this allocation cannot work), so
the successor is submitted at once, without the lost nodes, and this job ends to free the rest.
Stdlib only: shipped with the supervisor.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import TYPE_CHECKING, Dict, List, Optional

from .names import EV, FILES
from .text import last_line, read_text, squeeze

if TYPE_CHECKING:
    from .supervisor import Job

# How often the successor's events file is read while it starts.
SUCCESSOR_POLL_S = 1.0
# The successor's submission (plan, prepare, render, sbatch) may take this long.
SUBMIT_LIMIT_S = 300.0


def submit_env(env: Dict[str, str]) -> Dict[str, str]:
    """The environment for an sbatch run inside a job: without this job's SLURM_* and SBATCH_*
    values, which sbatch would take as the new job's (its node count, its memory, its job id)."""
    return {k: v for k, v in env.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_")) or k == "SLURM_CONF"}


class HandOver:
    """The hand-over's steps, taken from the serving loop (never blocking it): submit, follow
    the successor's events, say when it serves."""

    def __init__(self, job: Job):
        self.job = job
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.successor: Dict[str, str] = {}
        self.events_at = 0.0
        self.started = 0.0
        self.excluded = ""
        self.failure = ""
        self.over = False      # nothing more to do: handed over, or given up (this job serves on)

    def step(self) -> Optional[str]:
        """One step; the successor's endpoint once it serves, else None."""
        if self.over:
            return None
        if self.proc is None and not self.successor:
            self._submit(self.job.style.job_nodes(), self.job.faults.still_counted(time.monotonic()))
        elif self.proc is not None:
            self._submitted()
        elif time.monotonic() >= self.events_at:
            self.events_at = time.monotonic() + SUCCESSOR_POLL_S
            return self._successor_serves()
        return None

    def _submit(self, nodes: List[str], faults: List[str], lost: bool = False) -> None:
        """The successor counts on from this job's faults still counted (a lost node's among
        them): with server.restarts of its own, so faults days apart never wear the run down."""
        job, cfg = self.job, self.job.cfg
        self.started = time.monotonic()
        self.excluded = ",".join(nodes)
        argv = [*cfg.successor, "--exclude", self.excluded, *(w for f in faults for w in ("--fault", f))]
        if not lost:
            job.say(f"ftcluster: the job nears its time limit; submitting a successor on other nodes than "
                    f"{' '.join(nodes)}")
        self.proc = job.start(argv, out=job.log_path(FILES.handover_log), whole_env=submit_env(job.child_env))

    def relocate(self, lost: List[str], faults: List[str]) -> Optional[str]:
        """Submit the successor without the lost nodes, waiting for the submission (not for it
        to serve: this job's nodes are freed for it by ending); the failure, or None."""
        if self.proc is not None:          # a hand-over's submission under way: let it finish
            self.proc.wait()
            self._submitted()
        if self.successor and not self.over:
            # A time-limit successor already submitted may include a lost node: it stays (its
            # own liveness and restarts take care of it); this job just ends.
            self.over = True
            return None
        self.over = False
        self._submit(lost, faults, lost=True)
        assert self.proc is not None
        try:
            self.proc.wait(timeout=SUBMIT_LIMIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._submitted()
        self.over = True
        return None if self.successor else self.failure

    def abandon(self) -> None:
        """The job is ending: a submission still under way is stopped (the run's `stop` stops
        the successors already recorded)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _submitted(self) -> None:
        assert self.proc is not None
        rc = self.proc.poll()
        if rc is None:
            if time.monotonic() - self.started > SUBMIT_LIMIT_S:
                self.proc.kill()
                self.proc.wait()
                self._give_up(f"submitting the successor took over {SUBMIT_LIMIT_S:.0f}s")
            return
        self.proc = None
        text = read_text(self.job.log_path(FILES.handover_log))
        try:
            found = json.loads(last_line(text))
            self.successor = {k: str(found[k]) for k in ("run_id", "job_id", "run_dir")}
        except (ValueError, KeyError, TypeError):
            self._give_up(f"submitting the successor failed (exit {rc}): "
                          f"{squeeze(last_line(text)) or 'see logs/' + FILES.handover_log}")
            return
        s = self.successor
        self.job.event(EV.successor_submitted, s["run_id"], s["job_id"], s["run_dir"], self.excluded)

    def _successor_serves(self) -> Optional[str]:
        s = self.successor
        events = read_text(os.path.join(s["run_dir"], "state", FILES.events))
        for line in events.splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            if parts[1] == EV.serving and len(parts) > 2:
                self.over = True
                self.job.event(EV.handed_over, s["run_id"], parts[2])
                return parts[2]
            if parts[1] in (EV.failed, EV.done):
                why = " ".join(parts[2:]) if parts[1] == EV.failed else f"it ended (exit {' '.join(parts[2:])})"
                self._give_up(f"the successor run {s['run_id']} (job {s['job_id']}) failed: {why}")
                return None
        return None

    def _give_up(self, why: str) -> None:
        self.over = True
        self.failure = why
        self.job.event(EV.handover_failed, why)
        self.job.say(f"ftcluster: hand-over failed: {why}; this job serves on until its time limit")
