"""An incarnation's servers, from their start to ready: their exit and load lines followed from
before the start, rank 0 asked until it answers with the run's id and model, every other rank
seen inside model load, and a start that cannot succeed failed in words -- a rank that died, a
step that ended, a load that stalls, the ready timeout with what was still missing. The first
start and every restart's go through the same `Readiness` (supervisor.py)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, NoReturn

from .names import EV, FILES
from .poll import RANK_FILES
from .ranks import ExitWatch, LoadWatch, load_progress, rank0_ready
from .text import last_line, no_room_in, read_text, squeeze

if TYPE_CHECKING:
    from .supervisor import Job


class Readiness:
    def __init__(self, job: Job):
        self.job = job
        self.next_stall_check = 0.0

    def start_servers(self) -> None:
        """The servers of a new incarnation, their exit and load lines followed from before
        their start (a reader opened later would miss a quick one)."""
        job = self.job
        self.close_watches()
        job.incarnation_since = time.time()
        job.exits = ExitWatch(job.cfg.state)
        job.loads = LoadWatch(job.cfg.state, job.cfg.nodes)
        job.style.start_servers()

    def close_watches(self) -> None:
        job = self.job
        for watch in (job.exits, job.loads):
            if watch is not None:
                watch.close()
        job.exits = job.loads = None

    def check_servers(self, deadline: float) -> None:
        job = self.job
        assert job.exits is not None
        died = job.exits.died()
        if died is not None:
            job.fail(job.cause_of("a server rank exited", died), named=True)
        if not job.style.servers_alive():
            self.server_step_ended()
        if time.monotonic() >= deadline:
            job.fail(f"not ready after {job.cfg.ready_timeout}s (server.ready_timeout): {self.not_ready_why()}")
        self.check_stalls()

    def server_step_ended(self) -> NoReturn:
        """The servers' step ended by itself: where it was the first in the image, the style
        says first whether its containers came up."""
        job = self.job
        logs = sorted(os.path.join(job.cfg.logs, n) for n in os.listdir(job.cfg.logs)
                      if n.startswith("rank") and n.endswith(".stdout"))
        job.style.first_step_seen(True, logs)
        job.fail("the server step ended")

    def check_stalls(self) -> None:
        """A rank whose load has not moved for server.stall_timeout fails the start, named: the
        wrapper's figures on its node (what its server read, its log, its GPU memory)."""
        job = self.job
        limit = job.cfg.stall_timeout
        if not limit or time.monotonic() < self.next_stall_check:
            return
        # A tenth of the limit, 1-10 s: every rank's file is read then (a path lookup each).
        self.next_stall_check = time.monotonic() + min(10.0, max(1.0, limit / 10))
        assert job.loads is not None
        for r in range(job.cfg.nodes):
            if job.loads.has(r):
                continue
            p = load_progress(job.ranks.read(r, "progress"))
            if p is not None and p.still_for > limit:
                last = squeeze(last_line(read_text(job.log_path(FILES.server_log(r))))) or "nothing"
                job.fail(f"rank {r} on {job.ranks.node(r)} made no progress loading for {p.still_for:.0f} s "
                         f"(server.stall_timeout {limit:g} s): it had {p.words()}; its last log line: {last[:300]}",
                         named=True)

    def is_ready(self) -> bool:
        job = self.job
        return rank0_ready(*job.doors.triton_at(), f"{job.cfg.id_prefix}-rank0", job.cfg.served_model,
                           job.doors.via())

    def not_ready_why(self) -> str:
        job = self.job
        why = []
        if not self.is_ready():
            why.append(f"rank 0 gives no answer on {job.rank0_url or 'its HTTP port'} with our id and model "
                       f"{job.cfg.served_model} ready")
        no_room = no_room_in(job.cfg.state)
        if no_room is not None:   # the ranks' own files could not be written: say that first
            why.append(f"the run folder's filesystem takes no writes ({no_room}): the ranks could not write "
                       f"their files in state/")
        assert job.loads is not None
        for r in job.loads.not_loaded():
            if not (job.ranks.read(r, "host") or "").strip():
                why.append(f"rank {r} never started")
            else:
                why.append(f"rank {r} on {job.ranks.node(r)} never reached model load (no FT "
                           f"TRITONBACKEND_ModelInstanceInitialize line in logs/{FILES.server_log(r)})")
        return "; ".join(why)

    def wait_ready(self) -> None:
        """Ready = rank 0 answers with our id and its models ready, AND every other rank's server
        is alive and inside model load. FT's ranks != 0 never leave model load, so they never
        answer HTTP and are never asked: rank_server.sh marks them loaded from their log. Every
        10 ms rank 0 is asked (a refused connect until it listens) and the servers' liveness
        checked (no file access); the ranks' exit and load lines are read on the RANK_FILES
        back-off (every 250 ms through a long load, every 10 ms once rank 0's model is loaded),
        each a read() on a descriptor held open, whatever the number of ranks."""
        job = self.job
        deadline = time.monotonic() + job.cfg.ready_timeout
        loads = job.loads
        assert loads is not None
        files = RANK_FILES.backoff()
        while not (job.ranks.read(0, "host") or "").strip():
            self.check_servers(deadline)
            job.nap(files.next(False))
        job.rank0_host = job.ranks.node(0)
        job.rank0_url = f"{job.rank0_host}:{job.cfg.http_port}"
        job.style.first_step_seen(False, [])   # rank 0's task ran its wrapper: its / is recorded
        job.doors.check_rank0_here()
        job.event(EV.servers_starting, job.rank0_host)
        files_at = 0.0
        while not (self.is_ready() and not loads.not_loaded()):
            now = time.monotonic()
            if now >= files_at:
                self.check_servers(deadline)
                files_at = now + files.next(loads.has(0))
            elif not job.style.servers_alive():
                self.server_step_ended()
            job.nap(RANK_FILES.fast)
        self.check_servers(deadline)
        job.doors.wait_proxy()
        job.event(EV.ready, job.rank0_url)
