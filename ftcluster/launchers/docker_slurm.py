"""Slurm + Docker: the sbatch script starts one container per node and removes them at its end.

A plain `scancel` would end the job before that teardown can run: a cancelled job may start
no new job steps, and the teardown is one srun step over every node. So a cancel first sends
SIGTERM to the batch shell alone; its trap stops mpirun and removes every container of the
run on every node, then the job ends by itself. Only after a grace period is it scancelled.
"""

from __future__ import annotations

from ftcluster.launchers.ssh_keys import RunKeysLauncher
from ftcluster.launchers.slurm import SlurmLauncher


class DockerSlurmLauncher(RunKeysLauncher, SlurmLauncher):
    """Slurm + Docker: the job script removes the run's containers on every node at its end."""
