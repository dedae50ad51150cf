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
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from .rotation import ROTATION
from .text import write_json

CADDY_RESTARTS = 5


def read_json(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def ended(run_dir: str) -> bool:
    """The run's job has ended (its events' last word, `done`)."""
    try:
        with open(os.path.join(run_dir, "state", "events")) as f:
            return any(line.split()[1:2] == ["done"] for line in f)
    except OSError:
        return False


def successors(run_dir: str) -> List[str]:
    """The run folders of a member's successors, in order (their events name them)."""
    chain: List[str] = []
    seen = {run_dir}
    here = run_dir
    while True:
        nxt = None
        try:
            with open(os.path.join(here, "state", "events")) as f:
                for line in f:
                    words = line.split()
                    if len(words) >= 5 and words[1] == "successor_submitted":
                        nxt = words[4]
        except OSError:
            pass
        if nxt is None or nxt in seen:
            return chain
        chain.append(nxt)
        seen.add(nxt)
        here = nxt


def needs_load(applied: List[Tuple[str, int, int]], wanted: List[Tuple[str, int, int]]) -> bool:
    """Only an address to add loads a config. One that went (a member stopped, ended or moved)
    refuses connections, is passed over, and goes with the next load: a load gives up the
    retries of requests in flight, and a request that a gone member refused waits try_interval
    before its retry."""
    return bool(set(wanted) - set(applied))


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
        self.env = dict(os.environ)
        if settings.get("token_file"):
            with open(settings["token_file"]) as f:
                self.env["FTC_PROXY_TOKEN"] = f.read().strip()
        self.dir_fd = os.open(self.state, os.O_RDONLY)
        self.socket = f"/proc/self/fd/{self.dir_fd}/admin.sock"

    def config(self, ups: List[Tuple[str, int, int]]) -> Dict[str, Any]:
        cfg = json.loads(json.dumps(self.template))
        for name, servers in cfg["apps"]["http"]["servers"].items():
            for route in servers["routes"]:
                for h in route.get("handle", []):
                    if h.get("handler") == "reverse_proxy":
                        port = 1 if name == "http" else 2
                        h["upstreams"] = [{"dial": f"{u[0]}:{u[port]}"} for u in ups]
        return cfg

    def start_caddy(self) -> None:
        path = os.path.join(self.state, "front_caddy.json")
        write_json(path, self.config(self.applied or []))
        try:
            os.unlink(os.path.join(self.state, "admin.sock"))
        except OSError:
            pass
        log = open(os.path.join(self.s["logs"], "front_caddy.log"), "ab")
        self.caddy_starts += 1
        self.caddy = subprocess.Popen([self.s["caddy"], "run", "--config", path], cwd=self.state, env=self.env,
                                      stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.caddy.poll() is not None:
                raise SystemExit(f"ftcluster: the balancer (Caddy) exited {self.caddy.returncode} at its start; "
                                 "see logs/front_caddy.log")
            try:
                self.admin("GET", "/config/admin")
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("ftcluster: the balancer's admin socket did not answer within 30 s")

    def admin(self, method: str, path: str, body: Optional[bytes] = None) -> bytes:
        conn = CaddyAdmin(self.socket)
        try:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            if r.status >= 300:
                raise OSError(f"Caddy's admin API: {method} {path}: {r.status} {data[:300]!r}")
            return data
        finally:
            conn.close()

    def wanted(self) -> Tuple[List[Tuple[str, int, int]], List[Dict[str, Any]]]:
        """The members' addresses (in rotation or not: one out refuses connections) and what
        each member says."""
        members = (read_json(self.s["members"]) or {}).get("members", [])
        ups: List[Tuple[str, int, int]] = []
        seen: List[Dict[str, Any]] = []
        for m in members:
            for run_dir in [m["run_dir"], *successors(m["run_dir"])]:
                r = read_json(os.path.join(run_dir, "state", ROTATION))
                if r is None or not r.get("host"):
                    continue
                gone = ended(run_dir)
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
                    raise SystemExit("ftcluster: the balancer (Caddy) kept exiting; see logs/front_caddy.log")
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
        write_json(os.path.join(self.state, "rotation.json"),
                   {"time": time.time(), "upstreams": [f"{h}:{p}" for h, p, _ in self.applied or []],
                    "in_rotation": in_rotation, "members": seen})

    def on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def stop(self) -> None:
        if self.caddy is not None and self.caddy.poll() is None:
            # Caddy's graceful stop: requests in flight finish.
            self.caddy.send_signal(signal.SIGTERM)
            try:
                self.caddy.wait(60)
            except subprocess.TimeoutExpired:
                self.caddy.kill()
                self.caddy.wait()
        try:
            os.unlink(os.path.join(self.state, "admin.sock"))
        except OSError:
            pass

    def main(self) -> int:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        print(f"ftcluster: the balancer starts on {socket.gethostname()}", flush=True)
        try:
            while not self.stopping:
                try:
                    self.step()
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


