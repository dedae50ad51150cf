"""One Docker daemon per test-bed node: Debian's dockerd started inside the node's namespaces.

Each daemon runs with the node's network and hostname (nsenter, as the test bed does), so a
`--network host` container lives in the node's network and is named like the node. Per node:
  socket    <sock_root>/<node>/docker.sock   (a cluster spec reaches it with
            container.docker_host: unix://<sock_root>/{node}/docker.sock)
  exec-root <sock_root>/<node>/exec          (containerd's state; gone after down())
  data-root <cache>/data/<node>              (kept: the test image is imported once, not per run)
Teardown removes every container, stops every daemon (and its containerd), and checks that
no process, mount or socket is left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Sequence

from tests.cluster.util import TestbedError, kill_pids, pid_alive, wait_until, which

from . import image

SOCK_ROOT = Path("/run/ftc-docker")
DAEMON_FLAGS = ("--iptables=false", "--ip-masq=false", "--ip-forward=false", "--bridge=none",
                "--userland-proxy=false", "--storage-driver=overlay2", "--log-level=warn",
                # No GPUs here: a runtime named "nvidia" that is plain runc, so a container
                # started the way GPU nodes start them (--runtime nvidia) runs for real.
                "--add-runtime=nvidia=runc")


def unavailable() -> str | None:
    """Why the Docker test bed cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "the Docker test bed needs root"
    for tool in ("dockerd", "containerd", "runc", "docker", "debootstrap"):
        try:
            which(tool)
        except TestbedError:
            return f"{tool} not found: run tests/docker/install.sh as root"
    return None


class DockerNodes:
    """Daemons for the nodes of a running SlurmTestbed (anything with .nodes and .net.enter)."""

    def __init__(self, testbed: object, sock_root: Path = SOCK_ROOT, cache: Path | None = None):
        self.tb = testbed
        self.nodes: list[str] = list(testbed.nodes)  # type: ignore[attr-defined]
        self.sock_root = sock_root
        self.data_root = (cache or image.cache_dir()) / "data"
        self.pids: dict[str, int] = {}
        self.timings: dict[str, float] = {}

    # ---- facts ---------------------------------------------------------------------------
    def socket(self, node: str) -> Path:
        return self.sock_root / node / "docker.sock"

    @property
    def docker_host_template(self) -> str:
        """The cluster spec's container.docker_host for these daemons."""
        return f"unix://{self.sock_root}/{{node}}/docker.sock"

    def env(self, node: str) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": f"unix://{self.socket(node)}"}

    def docker(self, node: str, args: Sequence[str], check: bool = False,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([which("docker"), *args], capture_output=True, text=True,
                           env=self.env(node), timeout=timeout, check=False)
        if check and p.returncode != 0:
            raise TestbedError(f"docker {' '.join(args)} on {node}: {p.stderr.strip()}")
        return p

    def containers(self, node: str, label: str | None = None) -> list[str]:
        args = ["ps", "-aq"] + (["--filter", f"label={label}"] if label else [])
        return self.docker(node, args, check=True).stdout.split()

    # ---- lifecycle -----------------------------------------------------------------------
    def up(self) -> DockerNodes:
        why = unavailable()
        if why:
            raise TestbedError(why)
        t0 = time.monotonic()
        self.down()  # daemons of an earlier, interrupted session
        try:
            for node in self.nodes:
                self._start(node)
            for node in self.nodes:
                wait_until(lambda: self._answers(node), 60, f"dockerd on {node}", interval=0.1)
            self.timings["daemons"] = time.monotonic() - t0
        except BaseException:
            self.down()
            raise
        return self

    def _start(self, node: str) -> None:
        d = self.sock_root / node
        (d / "exec").mkdir(parents=True, exist_ok=True)
        (self.data_root / node).mkdir(parents=True, exist_ok=True)
        log = open(d / "dockerd.log", "ab")
        pidfile = d / "dockerd.pid"
        # For a restart after a crash: dockerd refuses to start while its pid file names a
        # process (a crashed dockerd stays a zombie until this process reaps it), and its new
        # containerd times out while the old one is still going down: remove the file, wait
        # (up to 10 s) for the old containerd.
        restart = ('rm -f "$0"; old=$(cat "$1" 2>/dev/null); shift; i=0; '
                   'while [ -n "$old" ] && kill -0 "$old" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done; '
                   'exec "$@"')
        argv = [*self.tb.net.enter(node), "/bin/sh", "-c", restart, str(pidfile),  # type: ignore[attr-defined]
                str(d / "exec" / "containerd" / "containerd.pid"),
                which("dockerd"), f"--data-root={self.data_root / node}", f"--exec-root={d / 'exec'}",
                f"--pidfile={pidfile}", "-H", f"unix://{self.socket(node)}", *DAEMON_FLAGS]
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True)
        log.close()
        self.pids[node] = p.pid  # nsenter execs dockerd: same pid
        # The bed's supervisor restarts it if it dies, as it does slurmd (systemd on a real node).
        supervise = getattr(self.tb, "supervise", None)
        if supervise:
            supervise(self.daemon_name(node), p.pid, argv, log=d / "dockerd.log")

    @staticmethod
    def daemon_name(node: str) -> str:
        """The dockerd's name in the test bed's supervisor (SlurmTestbed.crash takes it)."""
        return f"dockerd-{node}"

    def _answers(self, node: str) -> bool:
        pid = self._pid(node) or self.pids[node]
        if not pid_alive(pid):
            tail = (self.sock_root / node / "dockerd.log").read_text(errors="replace")[-1500:]
            raise TestbedError(f"dockerd on {node} exited:\n{tail}")
        return self.socket(node).exists() and self.docker(node, ["version"], timeout=10).returncode == 0

    def ensure_image(self) -> dict[str, float]:
        """The test image on every node (built and cached on first use); seconds per node."""
        tar = image.build()
        took: dict[str, float] = {}
        for node in self.nodes:
            t0 = time.monotonic()
            have = self.docker(node, ["image", "inspect", "--format",
                                      f'{{{{ index .Config.Labels "{image.RECIPE_LABEL}" }}}}', image.IMAGE])
            if have.returncode != 0 or have.stdout.strip() != image.recipe_key():
                p = subprocess.run(image.import_argv([which("docker")], tar), capture_output=True,
                                   text=True, env=self.env(node), timeout=600, check=False)
                if p.returncode != 0:
                    raise TestbedError(f"docker import on {node}: {p.stderr.strip()}")
            took[node] = time.monotonic() - t0
        return took

    def save_image(self, tag: str, out: Path) -> Path:
        """A `docker save` tar of the test image under another tag (for container.image_tar)."""
        node = self.nodes[0]
        self.docker(node, ["tag", image.IMAGE, tag], check=True)
        try:
            self.docker(node, ["save", "-o", str(out), tag], check=True, timeout=600)
        finally:
            self.docker(node, ["rmi", tag])
        return out

    def down(self) -> None:
        """Remove every container, stop every daemon; safe to repeat and after a failed up()."""
        t0 = time.monotonic()
        unsupervise = getattr(self.tb, "unsupervise", None)
        if unsupervise:  # first: the supervisor would start them again
            unsupervise(*(self.daemon_name(n) for n in self.nodes))
        for node in self.nodes:
            if self.socket(node).exists() and self._pid(node):
                ids = self.docker(node, ["ps", "-aq"], timeout=30).stdout.split()
                if ids:
                    self.docker(node, ["rm", "-f", *ids], timeout=60)
        pids = [p for p in (self._pid(n) for n in self.nodes) if p]
        pids += self._children(pids)  # the managed containerd and its shims
        kill_pids(pids, grace=15)
        # dockerd leaves its bind-mounted network namespace (exec-root/netns/default) mounted.
        for mnt in sorted(self._mounts(), reverse=True):
            subprocess.run([which("umount"), "-l", mnt], capture_output=True, check=False)
        for node in self.nodes:
            shutil.rmtree(self.sock_root / node, ignore_errors=True)
        try:
            self.sock_root.rmdir()
        except OSError:
            pass
        self.pids = {}
        self.timings["down"] = time.monotonic() - t0

    def _pid(self, node: str) -> int | None:
        """The node's live dockerd: ours, else the one its pid file names (a restarted one)."""
        candidates = [self.pids[node]] if node in self.pids else []
        try:
            candidates.append(int((self.sock_root / node / "dockerd.pid").read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
        return next((p for p in candidates if pid_alive(p) and _comm(p) == "dockerd"), None)

    @staticmethod
    def _children(parents: list[int]) -> list[int]:
        out: list[int] = []
        todo = list(parents)
        while todo:
            ppid = todo.pop()
            for d in os.listdir("/proc"):
                if d.isdigit() and _ppid(int(d)) == ppid:
                    out.append(int(d))
                    todo.append(int(d))
        return out

    def _own_roots(self) -> list[str]:
        # Only this instance's folders: another DockerNodes may share data_root (the image cache).
        return [str(self.sock_root), *(str(self.data_root / n) for n in self.nodes)]

    def _mounts(self) -> list[str]:
        roots = self._own_roots()
        points = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines()]
        return [m for m in points if any(m == r or m.startswith(r + "/") for r in roots)]

    def leftovers(self) -> list[str]:
        """What of the daemons is still there (empty after down())."""
        out = [f"dockerd {p}" for p in (self._pid(n) for n in self.nodes) if p]
        out += [f"mount {m}" for m in self._mounts()]
        out += [f"socket {self.socket(n)}" for n in self.nodes if self.socket(n).exists()]
        for d in os.listdir("/proc"):
            if d.isdigit():
                cmd = _cmdline(int(d)) + " "
                if any(f"{r}/" in cmd or f"{r} " in cmd for r in self._own_roots()):
                    out.append(f"process {d} {cmd[:80]}")
        return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
