"""Slurm + Docker: the sbatch script starts one container per node and removes them at its end.

A plain `scancel` would end the job before that teardown can run: a cancelled job may start
no new job steps, and the teardown is one srun step over every node. So a cancel first sends
SIGTERM to the batch shell alone; its trap stops mpirun and removes every container of the
run on every node, then the job ends by itself. Only after a grace period is it scancelled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftcluster.events import EV, parse_events
from ftcluster.launchers.run_keys import RunKeysLauncher
from ftcluster.launchers.slurm import SlurmLauncher

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from ftcluster.layout import RunPaths


def teardown_state(paths: RunPaths) -> str:
    """'none' (no container was started), 'done', 'failed' or 'pending', from the events."""
    try:
        kinds = [e.kind for e in parse_events(paths.events.read_text())]
    except FileNotFoundError:
        return "none"
    if EV.containers_starting not in kinds:
        return "none"
    if EV.teardown_failed in kinds:
        return "failed"
    return "done" if EV.containers_stopped in kinds else "pending"


class DockerSlurmLauncher(RunKeysLauncher, SlurmLauncher):
    """Slurm + Docker: the job script removes the run's containers on every node at its end."""

    node_teardown = True
