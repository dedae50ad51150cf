"""One incarnation's serving, from ready to its fault: the liveness probe through rank 0, the
metrics sampler, a member's rotation (out at a missed probe, back in at the next answer), the
hand-over to a successor at Slurm's notice of the time limit, records that waited for room, and
the logs kept within their size. It ends by naming the fault -- a rank that died, a hung world,
the servers' step gone -- or with None once a successor serves; the restarts that follow a
fault are the supervisor's (supervisor.py)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Optional

from .gpu_samples import gpu_words
from .liveness import Liveness
from .metrics import Sampler
from .names import EV, FILES
from .poll import LOG_CUT_S
from .ranks import ExitWatch, cut_log, cut_server_logs, cut_words

if TYPE_CHECKING:
    from .supervisor import Job


class Serving:
    def __init__(self, job: Job):
        self.job = job
        self.next_log_cut = 0.0     # when the serving loop next checks its logs' sizes (cut_log)

    def serve_until_fault(self) -> Optional[str]:
        """The fault that ended serving; None when the run was handed over to a successor."""
        job = self.job
        doors = job.doors
        job.phase = "while serving"
        # A member enters its set's rotation before it says it serves: a predecessor that hands
        # over to it on that word finds it already in its front's view.
        doors.enter_rotation()
        job.event(EV.serving, job.rank0_url)
        job.faults.serving(time.monotonic())
        live = None
        if job.cfg.liveness is not None:
            live = Liveness(job.cfg.liveness._replace(metrics_port=doors.metrics_port()), *doors.triton_at(),
                            os.path.join(job.cfg.state, FILES.health), doors.via(), job.room)
        sampler = Sampler(doors.triton_at()[0], doors.metrics_port(), os.path.join(job.cfg.state, FILES.metrics),
                          job.cfg.metrics_interval, job.cfg.metrics_max_bytes,
                          int(job.child_env.get("FTC_INCARNATION", "0")), doors.via(), job.room)
        doors.start_exporter()
        doors.publish_targets()
        # A rank's death is seen in its exit line within 0.1 s; srun or mpirun end the step
        # seconds later (Slurm) and the teardown need not wait for them.
        assert job.exits is not None
        return self._loop(live, sampler, job.exits)

    def _loop(self, live: Optional[Liveness], sampler: Sampler, exits: ExitWatch) -> Optional[str]:
        job = self.job
        doors = job.doors
        if job.ranks.first_died() is not None:
            return job.cause_of("a server rank exited")
        while job.style.servers_alive():
            died = exits.died()
            if died:
                doors.leave_rotation("a server rank exited")
                return job.cause_of("a server rank exited", died)
            fault = live.check() if live is not None else None
            sampler.tick()
            doors.mend_proxy()
            if fault:
                assert live is not None and live.missed_since is not None
                job.event(EV.unanswered, f"{live.missed_since:.3f}")
                doors.leave_rotation(fault)
                gpus = gpu_words(job.cfg.state, job.cfg.nodes)
                return f"{fault}; last log lines: {job.ranks.last_words()}" + (f"; GPUs: {gpus}" if gpus else "") \
                    + job.gpu_events_said()
            if doors.rotation is not None and live is not None:
                # Out of rotation at the first missed probe, back in at the next answer: the
                # balancer sends nothing to a world that may hang while the verdict is out.
                if live.misses and doors.rotation.on:
                    doors.leave_rotation(f"a liveness probe missed its deadline ({live.misses} of {live.cfg.failures})")
                elif not live.misses and not doors.rotation.on:
                    doors.enter_rotation()
            if job.handover_due and job.handover is not None:
                endpoint = job.handover.step()
                if endpoint:
                    job.say(f"ftcluster: the successor serves at {endpoint}; this job stops")
                    return None
            if job.room.since is not None or job.room.ended is not None:
                job.mend_records()
            # Every 30 s of serving, across restarts: the proxy's log outlives the incarnations (a
            # world restarted every few seconds never reached a per-incarnation 30 s).
            if time.monotonic() >= self.next_log_cut:
                self.next_log_cut = time.monotonic() + LOG_CUT_S
                self.cut_logs()
            job.nap(0.1)
        doors.leave_rotation(job.style.ended_while_serving)
        return job.cause_of(job.style.ended_while_serving)

    def cut_logs(self) -> None:
        """The ranks' server logs and the proxy's, each past log_max_bytes moved aside (cut_log)."""
        job = self.job
        limit = job.cfg.log_max_bytes
        for r in cut_server_logs(job.ranks, limit):
            job.say(cut_words(f"rank {r}'s server", FILES.server_log(r), limit))
        # The proxy logs each request it could not pass on (an outage under load).
        if job.doors.proxy is not None and cut_log(job.log_path(FILES.proxy_log), limit):
            job.say(cut_words("the proxy's", FILES.proxy_log, limit))
