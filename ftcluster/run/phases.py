"""Milestones of a run (event kinds in state/events) and their display labels.

A light module: `status` reads it without importing the launch machinery.
"""

from __future__ import annotations

from ftcluster.run.events import EV

PHASES = {
    "submitted": "queued",        # the launcher's own milestone, not an event of the job
    # status's word for a job that ran and waits in the queue again: Slurm requeued it.
    "requeued": "requeued: waiting to start again",
    EV.job_started: "job started",
    EV.mpicheck_started: "MPI check",
    EV.mpicheck_again: "MPI check again (a rank crashed)",
    EV.mpicheck_ok: "MPI check passed",
    EV.step_started: "running",
    EV.step_done: "step done",
    EV.servers_starting: "servers starting",
    EV.ready: "rank 0 ready",
    EV.client_started: "client running",
    EV.client_done: "client done",
    EV.serving: "serving",
    EV.restarting: "restarting the servers",
    EV.slurm_unanswered: "waiting for slurmctld to answer",
    EV.done: "done",
}
