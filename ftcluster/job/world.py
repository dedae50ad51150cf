"""The run's one MPI world: the servers, the MPI check and a job step, started by the scheduler
(srun --mpi on Slurm, mpirun on one host) or by a runtime that brings its own (Docker: mpirun
over ssh from rank 0's container). What every world does alike lives here: the servers'
process, the MPI check's flow, and reading which rank of a step crashed."""

from __future__ import annotations

import os
import re
import subprocess
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from .config import StepConfig
from .leftovers import shm_glob
from .names import EV, FILES
from .part import Part
from .text import read_text, squeeze

if TYPE_CHECKING:
    from .styles import JobStyle

# srun's line for a step's tasks that failed on a node: `srun: error: node2: task 1: Segmentation
# fault`, `srun: error: node1: tasks 0-1: Exited with exit code 14`.
_SRUN_FAILED = re.compile(r"^srun: error: ([^:\s]+): tasks? ([0-9][0-9,-]*): (.*)$", re.MULTILINE)


def srun_failures(log: str) -> List[Tuple[str, str, str]]:
    """(node, tasks as srun names them, what) for each failed-tasks line of srun's, in order."""
    return _SRUN_FAILED.findall(log)


# A rank that died by a crash signal, as srun (above) and Open MPI's mpirun (`... noticed that
# process rank 1 with PID 42 on node node2 exited on signal 11 (Segmentation fault).`, wrapped at
# any space by Open MPI 5) report it.
_CRASHES = ("Segmentation fault", "Bus error")
_MPIRUN_CRASH = re.compile(r"noticed\s+that\s+process\s+rank\s+([0-9]+)\s+with\s+PID\s+[0-9]+\s+on\s+node\s+(\S+)\s+"
                           r"exited\s+on\s+signal\s+(?:11|7)\s+\(([^)]+)\)")


def crashed_rank(log: str) -> Optional[str]:
    """`rank R on NODE (SIGNAL)` for the first rank of a step's log that crashed, else None. On
    one line: it goes into an event (Open MPI 5 may wrap inside the signal's name too)."""
    for node, tasks, what in srun_failures(log):
        crash = next((c for c in _CRASHES if what.startswith(c)), None)
        if crash:
            return f"rank {tasks} on {node} ({crash})"
    m = _MPIRUN_CRASH.search(log)
    if m:
        return f"rank {m.group(1)} on {m.group(2)} ({squeeze(m.group(3))})"
    return None


class World(Part):
    """One MPI world of the run's nodes; what differs between worlds is the subclass's."""

    ended_while_serving = "the server step ended while serving"
    # How long the world gets to end itself after a rank's death before it is killed (0: at once).
    world_ends_s = 0.0

    def __init__(self, style: JobStyle):
        super().__init__(style)
        self.servers: Optional[subprocess.Popen[bytes]] = None
        self.checked = False   # the MPI check ran on the nodes (what a killed rank of it leaves goes too)

    # --- what differs ---------------------------------------------------------------------------

    def mpi_world(self, *argv: str) -> List[str]:
        """One process per node of one MPI world (the MPI check's, a per-node step's)."""
        raise NotImplementedError

    def rank0_host(self) -> str:
        raise NotImplementedError

    def mpi_check_problem(self, log: str) -> str:
        raise NotImplementedError

    def step_command(self, step: StepConfig) -> Tuple[List[str], Dict[str, str]]:
        raise NotImplementedError

    def start_servers(self) -> None:
        raise NotImplementedError

    def where_rank0_runs(self, *argv: str) -> List[str]:
        """A command run beside rank 0 (its process ids as rank 0 sees them)."""
        raise NotImplementedError

    def term_rank0(self) -> bool:
        """SIGTERM to rank 0's wrapper where it runs, once identified as the recorded one
        (signal_rank.sh)."""
        pidfile = self.job.ranks.path(0, "pid")
        if not os.path.exists(pidfile):
            return False
        return self.job.run(self.where_rank0_runs("bash", self.script("signal_rank.sh"), "TERM", pidfile),
                            out=subprocess.DEVNULL, limit=30, interruptible=False) == 0

    def kill_servers(self) -> None:
        raise NotImplementedError

    # --- the MPI check ----------------------------------------------------------------------------

    def mpi_check(self) -> None:
        """The MPI world through the same path and container as the servers: a broken world
        otherwise shows up later as a tritonserver that hangs silently at model load. A check
        whose rank crashed (SIGSEGV, SIGBUS) runs once more: Open MPI 5 started by srun's PMIx
        now and then takes a peer's first message before its own MPI_Init is ready for it and
        crashes there (open-mpi/ompi#12495; seen here about once in a hundred checks on a busy
        node); a world that is really broken fails the second check too."""
        job = self.job
        log = job.log_path(FILES.mpicheck_log)
        job.event(EV.mpicheck_started)
        self.checked = True
        rc = self._run_mpi_check(log)
        crash = crashed_rank(read_text(log)) if rc else None
        if crash:
            aside = job.log_path(FILES.mpicheck_crash_log)
            os.replace(log, aside)
            job.event(EV.mpicheck_again, crash.replace(" ", "_"))
            job.say(f"ftcluster: a rank of the MPI check crashed, {crash}; Open MPI does so at start-up now and "
                    f"then (open-mpi/ompi#12495): checking once more (the first check's log: logs/{FILES.mpicheck_crash_log})")
            rc = self._run_mpi_check(log)
        if rc:
            text = read_text(log)
            job.say(text.rstrip("\n"))
            job.fail(f"MPI check failed: {squeeze(self.mpi_check_problem(text)) or 'see logs/' + FILES.mpicheck_log}")
        job.event(EV.mpicheck_ok)

    def _run_mpi_check(self, log: str) -> int:
        job, cfg = self.job, self.cfg
        backends = ["--backends", ",".join(cfg.backends)] if cfg.backends else []
        if cfg.backends and cfg.backend_directory:
            backends += ["--backend-directory", cfg.backend_directory]
        rc = job.run(self.mpi_world("python3", self.script("mpicheck.py"), "--nodes", str(cfg.nodes),
                                    "--tritonserver", cfg.tritonserver, "--rank0-host", self.rank0_host(),
                                    "--out", os.path.join(cfg.results, FILES.mpicheck_json),
                                    "--shm-prefix", shm_glob(cfg), *backends),
                     out=log, limit=cfg.mpi_check_timeout)
        self.style.runtime.first_step_seen(rc != 0, [log])
        return rc

    # --- the servers' process ---------------------------------------------------------------------

    def servers_alive(self) -> bool:
        return self.servers is not None and self.servers.poll() is None

    def started_servers(self) -> bool:
        return self.servers is not None

    def kill_server_process(self) -> None:
        if self.servers is not None and self.servers.poll() is None:
            self.servers.kill()

    def reap_servers(self) -> None:
        if self.servers is not None:
            try:
                self.servers.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.servers.kill()
                self.servers.wait()
