"""The front of a replica set: Caddy on the set's endpoint, its upstreams the members in rotation.

Runs as the front run's one job step (on one node; standard library only, Python 3.8:
`python3 scripts/ftcluster_job front scripts/front.json`). Every `poll` seconds it reads each
member's state/rotation (written by the member's own job from its liveness verdict), following
a member's successors (its events name them). The upstreams are the members' addresses: when one
is added (a member started, restarted elsewhere or succeeded), it loads Caddy's config with them
through Caddy's admin API on a 0600 unix socket (a gone address goes with the next load). In and out of rotation is the
member's own proxy opening and closing (rotation.py): no config load, which Caddy cannot do
without giving up on the retries of requests in flight. state/rotation.json says what is in
rotation (`status` reads it).

A config load is graceful: requests in flight finish on the old upstreams; idle client
connections are closed (clients reconnect).

Its time limit (a front on Slurm): Slurm's notice (USR1 to the job's steps, `handover_lead`
before the limit) makes the front submit its own job script again, on its own node, and that
job's front takes over the endpoint in place: Caddy binds its ports with SO_REUSEPORT, so both
listen until the new one serves (it writes state/front-job.json); the old one then records the
new job as the run's, stops its Caddy gracefully (its listener closes first, so clients'
reconnects reach the new one) and ends. The endpoint's address never changes.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from .handover import submit_env
from .lifeline import lifeline
from .names import FILES
from .poll import LOG_CUT_S
from .ranks import cut_log, cut_words
from .rotation import ROTATION
from .submit import SubmitFailed, nothing_to_cancel, queue_state, submit
from .text import Room, keep_last_alive, squeeze, write_json

CADDY_RESTARTS = 5
# How often a successor that has not served yet is looked for in Slurm's queue.
SUCCESSOR_LOOK_S = 5.0
# Caddy's own output, in the front's logs/ (appended to: a Caddy started again keeps the last one's).
CADDY_LOG = "front_caddy.log"


def successor_decision(now: float, notice_at: Optional[float], lead: float) -> str:
    """What a front that is told to stop does with a successor that does not serve yet: at its
    time limit ("keep": it starts when this job's node is free, a short gap), else ("cancel") it
    is a stop of the run. Slurm's TERM at the limit comes `lead` seconds after the notice."""
    if notice_at is not None and now >= notice_at + lead - 60:
        return "keep"
    return "cancel"


def read_json(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_word(run_dir: str) -> Tuple[Optional[str], bool]:
    """What a run's events say of it: the run folder of its successor (the last one submitted,
    if any), and whether its job has ended: a `done` after its last `job_started` (Slurm
    requeues a preempted serving job, which then starts again after its earlier attempt's
    `done`)."""
    nxt, done = None, False
    try:
        with open(os.path.join(run_dir, "state", "events")) as f:
            for line in f:
                words = line.split()
                if len(words) >= 5 and words[1] == "successor_submitted":
                    nxt = words[4]
                elif words[1:2] == ["done"]:
                    done = True
                elif words[1:2] == ["job_started"]:
                    done = False
    except OSError:
        pass
    return nxt, done


class Chains:
    """Each member's runs in order: its first, then a successor per hand-over or lost node. A
    run that handed over and ended says nothing more (its successor was named before its
    `done`, and a job that ended so is not requeued), so it is read once: over days of hourly
    hand-overs a look reads a member's live runs only, not every run it ever had. One that
    ended with no successor is read again: preempted, Slurm may start it again."""

    def __init__(self) -> None:
        self.over: Dict[str, Optional[str]] = {}   # an ended run -> its successor's folder

    def runs(self, run_dir: str) -> List[Tuple[str, bool]]:
        """(run folder, ended) of each run of the member whose first run is `run_dir`."""
        chain: List[Tuple[str, bool]] = []
        seen = set()
        here: Optional[str] = run_dir
        while here is not None and here not in seen:
            seen.add(here)
            if here in self.over:
                nxt, done = self.over[here], True
            else:
                nxt, done = run_word(here)
                if done and nxt is not None:
                    self.over[here] = nxt
            chain.append((here, done))
            here = nxt
        return chain


def needs_load(applied: List[Tuple[str, int, int]], wanted: List[Tuple[str, int, int]]) -> bool:
    """Only an address to add loads a config. One that went (a member stopped, ended or moved)
    refuses connections, is passed over, and goes with the next load: a load gives up the
    retries of requests in flight, and a request that a gone member refused waits try_interval
    before its retry."""
    return bool(set(wanted) - set(applied))


# How long a request to Caddy's admin API is asked again while its admin server is replaced.
ADMIN_RETRY_S = 3.0


class CaddyAdmin(http.client.HTTPConnection):
    """HTTP to Caddy's admin API on its unix socket (reached through an open folder, so that a
    long run folder path still fits a socket address)."""

    def __init__(self, path: str, timeout: float = 30.0):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.socket_path)
        self.sock = s


class Front:
    def __init__(self, settings: Dict[str, Any]):
        self.s = settings
        self.state = settings["state"]
        self.template = read_json(settings["config"]) or {}
        self.caddy: Optional["subprocess.Popen[bytes]"] = None
        self.caddy_starts = 0
        self.stopping = False
        self.applied: Optional[List[Tuple[str, int, int]]] = None
        self.said: Optional[List[str]] = None
        # The run folder's filesystem may fill while the set serves: a look's record that finds no
        # room is skipped (the next look writes it again), as the members' jobs do (text.Room).
        self.room = Room()
        self.chains = Chains()
        self.env = dict(os.environ)
        if settings.get("token_file"):
            with open(settings["token_file"]) as f:
                self.env["FTC_PROXY_TOKEN"] = f.read().strip()
        self.dir_fd = os.open(self.state, os.O_RDONLY)
        self.job_id = os.environ.get("SLURM_JOB_ID", "")
        # Per job: two fronts of the run (a hand-over) run side by side in the same state folder.
        tag = self.job_id or str(os.getpid())
        self.admin_name = f"admin-{tag}.sock"
        self.config_path = os.path.join(self.state, f"front_caddy-{tag}.json")
        self.socket = f"/proc/self/fd/{self.dir_fd}/{self.admin_name}"
        self.serving = False
        self.notice_at: Optional[float] = None     # Slurm's notice of the time limit (USR1)
        self.successor: Optional[str] = None       # the job that takes over the endpoint
        self.successor_looked = 0.0
        self.handing_over = True                   # False once a hand-over was given up
        self.taken_over = False                    # the successor serves and the record names it

    def config(self, ups: List[Tuple[str, int, int]]) -> Dict[str, Any]:
        cfg = json.loads(json.dumps(self.template))
        # Its own admin socket per job (the rendered config has the admin API off).
        cfg["admin"] = {"listen": f"unix/{self.admin_name}|0600", "config": {"persist": False}}
        for name, servers in cfg["apps"]["http"]["servers"].items():
            for route in servers["routes"]:
                for h in route.get("handle", []):
                    if h.get("handler") == "reverse_proxy":
                        port = 1 if name == "http" else 2
                        h["upstreams"] = [{"dial": f"{u[0]}:{u[port]}"} for u in ups]
        return cfg

    def start_caddy(self) -> None:
        path = self.config_path
        config = self.config(self.applied or [])
        # A Caddy that died while the filesystem is full starts again from the config file of its
        # last start (write_json leaves it whole), then loads the present one through its admin
        # socket: the endpoint does not wait for room.
        fresh = self.room.attempt(path, lambda: write_json(path, config))
        if not fresh and not os.path.exists(path):
            raise OSError(errno.EIO, f"the balancer's config could not be written ({self.room.why})")
        try:
            os.unlink(os.path.join(self.state, self.admin_name))
        except OSError:
            pass
        log = open(os.path.join(self.s["logs"], CADDY_LOG), "ab")
        self.caddy_starts += 1
        # It dies with this process (lifeline). Its ports are not checked for another listener
        # (as a member's proxy's are): a front's successor on the node shares them on purpose
        # while it takes over.
        self.caddy = subprocess.Popen([self.s["caddy"], "run", "--config", path], cwd=self.state, env=self.env,
                                      stdout=log, stderr=log, stdin=subprocess.DEVNULL, preexec_fn=lifeline())
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.caddy.poll() is not None:
                raise SystemExit(f"ftcluster: the balancer (Caddy) exited {self.caddy.returncode} at its start; "
                                 f"see logs/{CADDY_LOG}")
            try:
                self.admin("GET", "/config/admin")
            except OSError:
                time.sleep(0.1)
                continue
            if not fresh:
                self.admin("POST", "/load", json.dumps(config).encode())
            return
        raise SystemExit("ftcluster: the balancer's admin socket did not answer within 30 s")

    def admin(self, method: str, path: str, body: Optional[bytes] = None) -> bytes:
        """One request to Caddy's admin API. Caddy replaces its admin server on every config it
        loads (caddy.replaceLocalAdminServer: the old one shuts down in the background), so a
        request right after a /load may find the old one closing: a connection dropped or
        refused is asked again, for ADMIN_RETRY_S (every request here is idempotent)."""
        deadline = time.monotonic() + ADMIN_RETRY_S
        while True:
            conn = CaddyAdmin(self.socket)
            try:
                conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
            except (ConnectionError, FileNotFoundError):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
                continue
            finally:
                conn.close()
            if r.status >= 300:
                raise OSError(f"Caddy's admin API: {method} {path}: {r.status} {data[:300]!r}")
            return data

    def wanted(self) -> Tuple[List[Tuple[str, int, int]], List[Dict[str, Any]]]:
        """The members' addresses (in rotation or not: one out refuses connections) and what
        each member says."""
        members = (read_json(self.s["members"]) or {}).get("members", [])
        ups: List[Tuple[str, int, int]] = []
        seen: List[Dict[str, Any]] = []
        for m in members:
            chain = self.chains.runs(m["run_dir"])
            for k, (run_dir, gone) in enumerate(chain):
                if gone and k + 1 < len(chain):
                    continue   # handed over: its successor is the member now
                r = read_json(os.path.join(run_dir, "state", ROTATION))
                if r is None or not r.get("host"):
                    continue
                on = bool(r.get("in")) and not gone
                seen.append({"replica": m.get("replica"), "run_dir": run_dir, "in": on,
                             "why": r.get("why", "") if not on else "", "endpoint": f"{r['host']}:{r['http']}"})
                if not gone:
                    ups.append((str(r["host"]), int(r["http"]), int(r["grpc"])))
        return sorted(set(ups)), seen

    def step(self) -> None:
        ups, seen = self.wanted()
        if self.caddy is None or self.caddy.poll() is not None:
            if self.caddy is not None:
                print(f"ftcluster: the balancer (Caddy) exited {self.caddy.returncode}; starting it again",
                      flush=True)
                if self.caddy_starts > CADDY_RESTARTS:
                    raise SystemExit(f"ftcluster: the balancer (Caddy) kept exiting; see logs/{CADDY_LOG}")
            self.applied = ups
            self.start_caddy()
        elif needs_load(self.applied or [], ups):
            self.admin("POST", "/load", json.dumps(self.config(ups)).encode())
            self.applied = ups
            print(f"ftcluster: members at {' '.join(f'{h}:{p}' for h, p, _ in ups) or 'none'}", flush=True)
        in_rotation = [m["endpoint"] for m in seen if m["in"]]
        if in_rotation != self.said:
            self.said = in_rotation
            print(f"ftcluster: in rotation: {' '.join(in_rotation) or 'none'}", flush=True)
        rotation = {"time": time.time(), "upstreams": [f"{h}:{p}" for h, p, _ in self.applied or []],
                    "in_rotation": in_rotation, "members": seen}
        self.room.attempt("state/rotation.json", lambda: write_json(os.path.join(self.state, "rotation.json"), rotation))
        if not self.serving:
            # Caddy answers with the members loaded: this front serves the endpoint (a predecessor
            # on this node waits for this word to go; said again at the next look if no room).
            word = {"job_id": self.job_id, "host": socket.gethostname(), "time": time.time()}
            self.serving = self.room.attempt(FILES.front_job,
                                             lambda: write_json(os.path.join(self.state, FILES.front_job), word))

    # --- the hand-over before the time limit ----------------------------------------------

    def on_notice(self, signum: int, frame: Any) -> None:
        if self.notice_at is None:
            self.notice_at = time.time()

    def hand_over_step(self) -> None:
        """Submit this job's script again on this node; once that job's front serves, record it
        as the run's job and stop (the main loop ends). A successor that fails leaves this front
        serving to its end."""
        if self.successor is None:
            self.successor = self.submit()
            if self.successor is None:
                self.handing_over = False
            return
        serving = read_json(os.path.join(self.state, FILES.front_job)) or {}
        if serving.get("job_id") == self.successor:
            if self.record_successor():
                self.stopping = True
            return
        if time.monotonic() - self.successor_looked >= SUCCESSOR_LOOK_S:
            self.successor_looked = time.monotonic()
            state = queue_state(self.run, self.successor)
            if state is not None and state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                print(f"ftcluster: the balancer's successor job {self.successor} ended ({state or 'gone'}) before "
                      "it served; this balancer serves to its time limit", flush=True)
                self.handing_over = False

    def run(self, argv: List[str], cwd: Optional[str], timeout: float) -> Tuple[int, str, str]:
        """A Slurm command of this job's (submit.Run): without this job's SLURM_* values."""
        try:
            r = subprocess.run(argv, cwd=cwd, env=submit_env(dict(os.environ)), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        except subprocess.TimeoutExpired:
            return 124, "", f"{argv[0]} timed out after {timeout:.0f}s"
        except OSError as e:
            return 127, "", f"{argv[0]}: {e}"
        return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")

    def submit(self) -> Optional[str]:
        """This job's script again, on this node: the successor's job id, or None. An sbatch
        that slurmctld did not answer is looked for before it runs again (submit.py), as long
        as Slurm stays silent, up to submit.PATIENCE_S: the front's looks wait meanwhile (Caddy
        serves on)."""
        host = socket.gethostname()
        argv = ["sbatch", "--parsable", f"--nodelist={host}", self.s["script"]]
        try:
            job = submit(self.run, argv, self.s["run_dir"], newer_than=int(self.job_id or 0))
        except SubmitFailed as e:
            print(f"ftcluster: the balancer's successor could not be submitted: {squeeze(str(e))[:500]}", flush=True)
            return None
        print(f"ftcluster: the time limit is near: job {job} takes the balancer over on {host}", flush=True)
        return job

    def record_successor(self) -> bool:
        """The run's record names the job that serves it now (`status`, `stop` and `logs` follow
        it); this job's last events go apart. False where the record could not be changed: the
        successor is cancelled (a job no record names would outlive `stop`) and this front
        serves on to its time limit."""
        assert self.successor is not None
        argv = [*self.s["record"], self.successor]
        try:
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=120)
            said = squeeze(r.stdout.decode(errors="replace"))[-500:] if r.returncode else ""
        except (OSError, subprocess.TimeoutExpired) as e:
            said = str(e) or type(e).__name__
        if said:
            print(f"ftcluster: the run's record could not be given job {self.successor} ({said}); that job is "
                  "cancelled and this balancer serves to its time limit", flush=True)
            self.cancel_successor()
            return False
        # The marker diverts this job's last events (supervisor.event) from the run's events file.
        with open(os.path.join(self.state, FILES.taken_over.format(job=self.job_id)), "w"):
            pass
        self.taken_over = True
        print(f"ftcluster: job {self.successor} serves the endpoint; this balancer stops", flush=True)
        return True

    def cancel_successor(self) -> None:
        assert self.successor is not None
        self.handing_over = False
        rc, _, err = self.run(["scancel", self.successor], None, 60.0)
        if rc and not nothing_to_cancel(err):
            print(f"ftcluster: the balancer's successor job {self.successor} could not be cancelled: "
                  f"{squeeze(err)[:300] or f'exit {rc}'}", flush=True)

    def keep_last_look(self) -> None:
        """The time of the last look of the front before this one (rotation.json's, written at
        each look) goes to state/last-alive before this front's first look replaces it: a front
        whose node was lost wrote no last word, and `report` ends its span there."""
        last = read_json(os.path.join(self.state, "rotation.json")) or {}
        if isinstance(last.get("time"), (int, float)):
            keep_last_alive(self.room, self.state, last["time"], str(self.job_id or os.getpid()))

    def on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def stop(self) -> None:
        if self.successor is not None and self.handing_over and not self.taken_over:
            if successor_decision(time.time(), self.notice_at, float(self.s.get("handover_lead", 0))) == "cancel":
                self.cancel_successor()
        if self.caddy is not None and self.caddy.poll() is None:
            # Caddy's graceful stop: requests in flight finish.
            self.caddy.send_signal(signal.SIGTERM)
            try:
                self.caddy.wait(60)
            except subprocess.TimeoutExpired:
                self.caddy.kill()
                self.caddy.wait()
        for path in (os.path.join(self.state, self.admin_name), self.config_path):
            try:
                os.unlink(path)
            except OSError:
                pass

    def main(self) -> int:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        if self.s.get("handover_lead") and self.job_id:
            signal.signal(signal.SIGUSR1, self.on_notice)
        print(f"ftcluster: the balancer starts on {socket.gethostname()}", flush=True)
        self.keep_last_look()
        next_cut = time.monotonic() + LOG_CUT_S
        try:
            while not self.stopping:
                try:
                    self.step()
                    if self.notice_at is not None and self.handing_over and self.serving:
                        self.hand_over_step()
                    if time.monotonic() >= next_cut:
                        next_cut = time.monotonic() + LOG_CUT_S
                        limit = int(self.s.get("log_max_bytes", 256 << 20))
                        if cut_log(os.path.join(self.s["logs"], CADDY_LOG), limit):
                            print(cut_words("the balancer's Caddy", CADDY_LOG, limit), flush=True)
                except OSError as e:
                    print(f"ftcluster: the balancer: {e}", flush=True)
                time.sleep(float(self.s.get("poll", 0.5)))
        finally:
            self.stop()
        return 0


def main(argv: List[str]) -> int:
    if len(argv) != 1:
        print("usage: ftcluster_job front FRONT_JSON", file=sys.stderr)
        return 2
    settings = read_json(argv[0])
    if settings is None:
        print(f"ftcluster_job front: cannot read {argv[0]}", file=sys.stderr)
        return 2
    return Front(settings).main()


