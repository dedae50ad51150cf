"""The job: containers, MPI check, a step or the servers, readiness, client, serving, teardown.

One flow for every style; what differs between styles (how a command reaches the nodes, how
containers go up and down, how rank 0 is asked to stop) is a `styles.JobStyle`: the run's
scheduler (`schedulers/`) and runtime (`runtimes/`), composed. `Job` keeps the
run's shared state, its events, failures and children, and runs the flow: the incarnations of
the servers and the restarts between them. Its parts each do one thing with it: `readiness`
(start to ready), `serving` (ready to a fault), `doors` (the proxy, the GPU exporter, the
Prometheus targets, a member's rotation) and `teardown` (every exit).

Signals: INT/TERM only set a flag. The flow acts on it at its waits (`nap`, `wait_child`) by
raising Interrupted; the teardown never looks at it, so a signal that arrives late (scancel
signals the batch shell and its steps, often twice) cannot cut the teardown short.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import IO, Any, Dict, List, NoReturn, Optional, Sequence, Tuple, Union

from .config import JobConfig
from .doors import Doors
from .gpu_samples import event_words, needing_reset
from .handover import HandOver
from .lifeline import lifeline
from .names import EV, FILES
from .ranks import ExitWatch, LoadWatch, RankFiles, keep_incarnation
from .readiness import Readiness
from .restarts import Faults, faults_of_events
from .styles import style_for
from .serving import Serving
from .teardown import Teardown
from .text import (ROOM_NEEDED, Room, append_line, free_bytes, keep_last_alive, last_line, mtime, no_room_in,
                   read_text, squeeze)

# The phase of a run whose servers are starting, as failure messages name it.
STARTING = "during start-up"

# The longest wait between restarts (the back-off doubles from server.restart_backoff).
MAX_BACKOFF = 300.0
# Events kept in memory while the run folder's filesystem has no room (Room): some days' worth.
MAX_UNWRITTEN = 10000
ROOM_WAIT_S = 10.0   # how often a restart waiting for room looks again
ROOM_RETRY_S = 5.0   # ... and a serving job writes again what waits
SLURM_WAIT_S = 5.0   # how often a job that found slurmctld silent asks again
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
        self.handover_due = False  # SIGUSR1: Slurm's notice of the time limit (cfg.handover_lead)
        self.handover = HandOver(self) if cfg.successor else None
        self.faults = Faults(cfg.restart_reset, cfg.carried_faults)   # those counted against cfg.restarts, and the restarts
        self.phase = STARTING     # where the run is, for failure messages
        self.rank0_host = ""
        self.rank0_url = ""
        self.client: Optional[subprocess.Popen[bytes]] = None
        self.foreground: Optional[subprocess.Popen[bytes]] = None   # a node, container or job step
        # This incarnation's exit and load lines (state/exits, state/loads), from its start.
        self.exits: Optional[ExitWatch] = None
        self.loads: Optional[LoadWatch] = None
        self.incarnation_since = 0.0   # when this incarnation's servers started: its GPU events count
        # The job's parts, each with what it alone keeps; they read the state above through the job.
        self.doors = Doors(self)
        self.readiness = Readiness(self)
        self.serving = Serving(self)
        self.teardown = Teardown(self)
        self.style = style_for(self)

    # --- events, signals, failure -----------------------------------------------------------------

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
            if self.doors.rotation is not None:
                self.doors.rotation.save()
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

    # --- children ---------------------------------------------------------------------------------

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

    # --- the flow ---------------------------------------------------------------------------------

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
            cause = self.serving.serve_until_fault()
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

    # --- restarts ---------------------------------------------------------------------------------

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

    def restart(self, tries: int, cause: str) -> None:
        """Every rank stopped at once, this incarnation's rank files and logs kept aside, a
        back-off, then the servers again and readiness as at the start."""
        cfg = self.cfg
        self.event(EV.restarting, tries, cause)
        self.say(f"ftcluster: {cause}; restarting the servers ({tries} of {cfg.restarts})")
        self.teardown.kill_servers()
        self.style.clear_servers()
        self.event(EV.servers_stopped)
        self.next_incarnation()
        self.phase = "while restarting"
        self.nap(min(cfg.restart_backoff * 2 ** (tries - 1), MAX_BACKOFF))
        self.wait_for_room()
        self.phase = STARTING
        self.restarting = True
        try:
            self.readiness.start_servers()
            self.readiness.wait_ready()
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
        self.teardown.kill_servers()
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

    # --- the run ----------------------------------------------------------------------------------

    def body(self) -> int:
        cfg = self.cfg
        died = os.environ.get(SUPERVISOR_DIED_ENV, "")
        if died:
            self.taken_back(died)
        else:
            self.event(EV.job_started, socket.gethostname(), self.style.job_id())
        if self.style.guarded:
            self.teardown.start_guard()
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
        if cfg.proxy is not None and self.doors.rotation is None:
            self.doors.start_proxy()   # a member's opens when it enters rotation
        self.check_room()
        self.readiness.start_servers()
        self.readiness.wait_ready()
        if cfg.run_client:
            rc = self.run_client()
            if rc:
                return rc
        if cfg.keep_serving:
            self.serve()
        return 0

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
