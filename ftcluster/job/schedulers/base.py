"""What a scheduler does for the job: its id, its nodes, a command on every node (the fan-out)
or on the first host, lost nodes, the one MPI world where the runtime brings none, the guard of
a job that no scheduler ends, ending a stopped job and an earlier supervisor's steps, and what
the run's killed ranks leave on the nodes when no container holds it."""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, List, Optional

from ..leftovers import kill_marked_argv, marked_grace, python_envs, shm_glob
from ..part import Part

if TYPE_CHECKING:
    from ..styles import JobStyle
    from ..world import World


class Scheduler(Part):
    # The job runs beside its launcher (local, ssh + Docker), where no scheduler ends the job's
    # processes with it: a guard does, should the supervisor die (scripts/session_guard.sh).
    guarded = False
    # Whether the job runs on rank 0's node (Slurm: the batch host is rank 0's; local: every
    # rank's), rather than on the launching machine (ssh).
    on_rank0_node = True

    def __init__(self, style: JobStyle):
        super().__init__(style)
        self.lost: List[str] = []   # nodes of the job that stopped answering (lost_nodes)

    # --- who am I -----------------------------------------------------------------------------

    def job_id(self) -> str:
        raise NotImplementedError

    def job_nodes(self) -> List[str]:
        """The job's nodes, as the scheduler names them."""
        raise NotImplementedError

    def hosts_rank0_first(self) -> List[str]:
        """The run's hosts, rank 0's first (a runtime that starts its own world places ranks so)."""
        raise NotImplementedError

    # --- commands on the nodes ----------------------------------------------------------------

    def every_node(self, output: str) -> List[str]:
        """The prefix that runs a command on every node at once (but a lost one), beside the
        other steps, its output to `output` (%N: the node)."""
        raise NotImplementedError

    def on_first_host(self) -> List[str]:
        """The prefix that runs a command on the first host, rank 0's (empty: this host)."""
        raise NotImplementedError

    def lost_nodes(self) -> List[str]:
        """The job's nodes that no longer answer (remembered in `lost`); none where the
        scheduler cannot lose one."""
        return self.lost

    def world(self) -> Optional[World]:
        """The one MPI world it starts where the runtime brings none (None: it has none)."""
        return None

    # --- the job beside its launcher ------------------------------------------------------------

    def guard_argv(self, mpi_folder: str = "") -> List[str]:
        session = os.getsid(0)
        return ["bash", self.script("session_guard.sh"), str(session) if session == os.getpid() else "", mpi_folder,
                self.cfg.run_id, shm_glob(self.cfg)]

    def end_stopped_job(self) -> None:
        """After a stop asked for (`ftcluster stop`), torn down: a scheduler with books of its
        own is told the job ended as its user asked. A job beside its launcher has none."""

    def end_earlier_steps(self) -> None:
        """A supervisor started again in the same job ends what the one before started: only a
        Slurm job's supervisor is started again in its job (job.sh.j2's serving_on_slurm)."""
        raise NotImplementedError

    # --- what the ranks leave on the nodes (no container holds it) ----------------------------

    def clear_marked(self) -> None:
        """Before a restart's servers start: a python backend stub that its server's end
        orphaned, found by the run's mark on every node (the step's end killed every rank)."""
        self.job.run([*self.every_node("/dev/null"), *kill_marked_argv(self.cfg, 0)], out=subprocess.DEVNULL,
                     limit=60, interruptible=False)

    def teardown_nodes(self) -> bool:
        """What SIGKILLed ranks (the servers', the MPI check's) leave on every node goes: the
        run's marked processes, its /dev/shm entries, the python backend's folders it claimed."""
        world = self.style.world
        if world.started_servers() or world.checked:
            self.job.run([*self.every_node("/dev/null"), "bash", self.script("node_teardown.sh"),
                          self.cfg.run_id, str(marked_grace(self.job)), shm_glob(self.cfg), *python_envs(self.cfg)],
                         out=subprocess.DEVNULL, limit=60, interruptible=False)
        return True
