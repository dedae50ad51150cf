"""The one teardown, run on every exit of the job (`job.teardown(rc)`), and the ways the servers
are stopped: rank 0 first on a normal end, every rank killed on a failure or a restart. Also the
session guard that does the teardown's work for a supervisor killed without it (scripts/session_guard.sh),
told at the end that there is nothing left to do. Nothing here acts on INT/TERM: a signal that
arrives late cannot cut the teardown short (supervisor.py)."""

from __future__ import annotations

import os
import subprocess
import time
from typing import TYPE_CHECKING, Optional

from .names import EV

if TYPE_CHECKING:
    from .supervisor import Job


class Teardown:
    def __init__(self, job: Job):
        self.job = job
        self.guard: Optional[subprocess.Popen[bytes]] = None   # scripts/session_guard.sh, and its pipe's end
        self.guard_pipe = -1

    def __call__(self, rc: int) -> int:
        """The one teardown, on every exit: client, an interrupted foreground step, the servers,
        then the style's containers. Runs to its end: nothing in it acts on INT/TERM, and a stage
        that breaks is reported and the next one still runs. The guard ends last."""
        job = self.job
        doors = job.doors
        ok = True
        # The proxy before the servers: it ends gracefully (its requests in flight finish) and lets
        # go of its connections to rank 0, which would hold rank 0's own graceful exit up.
        for stage in (self._stop_client, self._end_foreground, doors.withdraw_targets, doors.stop_exporter,
                      doors.drain, doors.stop_proxy,
                      self._stop_servers, job.style.down, self._abandon_successor, job.readiness.close_watches):
            try:
                ok = stage() is not False and ok
            except Exception as e:  # noqa: BLE001  (what is left must still be removed)
                job.say(f"ftcluster: teardown: {stage.__name__} failed: {type(e).__name__}: {e}")
                ok = False
        if not ok and not rc:
            rc = 1
        job.event(EV.done, rc)
        self.end_guard()
        return rc

    def _abandon_successor(self) -> None:
        if self.job.handover is not None:
            self.job.handover.abandon()

    def _stop_client(self) -> None:
        client = self.job.client
        if client is not None and client.poll() is None:
            client.terminate()

    def _end_foreground(self) -> None:
        # An interrupted node or container step ends first, so no container appears after the teardown.
        job = self.job
        if job.foreground is not None:
            job.end_child(job.foreground)
            job.foreground = None

    def _stop_servers(self) -> None:
        job = self.job
        if job.style.started_servers():
            if not job.failing:
                self.stop_rank0()
            self.kill_servers()
            job.event(EV.servers_stopped)

    # --- stopping the servers ---------------------------------------------------------------------

    def stop_rank0(self) -> None:
        """A normal end stops rank 0 first: FT's other ranks must live while its last requests
        finish. Waits until its wrapper recorded its exit, the servers ended or the exit grace ran
        out; the style then SIGKILLs every rank: the others sit in model load for good."""
        job = self.job
        if not (job.style.servers_alive() and job.style.term_rank0()):
            return
        deadline = time.monotonic() + job.cfg.exit_grace
        while (job.style.servers_alive() and not job.ranks.exists(0, "exit")
               and time.monotonic() < deadline):
            time.sleep(0.1)

    def kill_servers(self) -> None:
        """Every rank killed. After a rank's death, where the style's launcher ends the world
        itself (srun), it is given the style's world_ends_s for that first."""
        job = self.job
        servers = job.style.servers
        if job.style.world_ends_s and servers is not None and job.exits is not None and job.exits.any_died():
            try:
                servers.wait(timeout=job.style.world_ends_s)
            except subprocess.TimeoutExpired:
                pass
        job.style.kill_servers()

    # --- the guard --------------------------------------------------------------------------------

    def start_guard(self) -> None:
        """The guard that ends what is left of the job if this process dies without its teardown
        (scripts/session_guard.sh): it waits on a pipe whose one writer is this process (os.pipe's
        ends are not inherited by the job's other children)."""
        job = self.job
        read_end, self.guard_pipe = os.pipe()
        try:
            self.guard = subprocess.Popen(job.style.guard_argv(), stdin=read_end, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True, env=job.child_env)
        finally:
            os.close(read_end)

    def end_guard(self) -> None:
        """The teardown ran: the guard ends with nothing to do."""
        if self.guard is not None:
            try:
                os.write(self.guard_pipe, b"done\n")
            except OSError:
                pass
            os.close(self.guard_pipe)
            try:
                self.guard.wait(timeout=5)
            except subprocess.TimeoutExpired:   # stopped by someone: our child, not reaped, so ours to kill
                self.guard.kill()
                self.guard.wait()
            self.guard = None
