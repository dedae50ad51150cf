"""Milestones of a run (event kinds in state/events) and their display labels.

A light module: `status` reads it without importing the launch machinery.
"""

from __future__ import annotations

PHASES = {
    "submitted": "queued",
    "job_started": "job started",
    "mpicheck_started": "MPI check",
    "mpicheck_ok": "MPI check passed",
    "servers_starting": "servers starting",
    "ready": "rank 0 ready",
    "client_started": "client running",
    "client_done": "client done",
    "serving": "serving",
    "done": "done",
}
