"""A real multi-node Slurm 22.05 cluster made of namespaces on this one machine.

    with SlurmTestbed("/tmp/ftc-testbed", n_nodes=3) as tb:
        tb.node_exec("node2", ["hostname"])  # -> "node2"

State (dir, node count, pids) is kept in <dir>/state.json so that another
process (`python -m tests.cluster down`) can tear the cluster down.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from ftcluster.job.fileops import remove_entry
from tests.pyxis import bed as pyxis_bed

from . import netns, slurmconf, sshd
from .netns import Net
from .statefile import locked_update, read_state
from .util import (
    REQUIRED_TOOLS,
    SSH_TOOLS,
    TestbedError,
    cmdline,
    comm,
    kill_pids,
    missing_tools,
    pid_alive,
    pids_in_namespace,
    processes_mentioning,
    run,
    tail,
    wait_until,
    which,
)

DEFAULT_DIR = Path("/tmp/ftc-testbed")
DAEMONS = {"slurmctld", "slurmd", "slurmstepd", "munged", "sshd"}


class SlurmTestbed:
    """One test cluster: nodes <prefix>1..N at 10.<octet>.0.(10+i), controller at .1.

    system_conf=True writes /etc/slurm/slurm.conf (so plain sbatch/srun work);
    False leaves it alone and tools must get `env` (SLURM_CONF) instead, which
    lets a second, independent cluster run next to the first.
    pyxis=True loads the Pyxis SPANK plugin (tests/pyxis/install.sh) through <dir>/plugstack.conf;
    None (the default): when Enroot and Pyxis are installed.
    """

    partition = "debug"  # Default=YES, all nodes
    small_partition = "small"  # only the first node

    def __init__(self, dir: str | Path = DEFAULT_DIR, n_nodes: int = 3, *, octet: int = 77,
                 prefix: str = "node", sshd: bool = False, system_conf: bool = True,
                 pyxis: bool | None = None) -> None:
        self.dir = Path(dir).resolve()
        self.net = Net(octet=octet, nodes=n_nodes, prefix=prefix)
        self.with_sshd = sshd
        self.system_conf = system_conf
        self.pyxis = pyxis if pyxis is not None else pyxis_bed.unavailable() is None
        self.pids: dict[str, int] = {}
        self.timings: dict[str, float] = {}
        # How each supervised daemon was started, for the supervisor's restarts.
        self.argv: dict[str, dict[str, Any]] = {}
        self.supervisor: int | None = None

    # ---- facts ---------------------------------------------------------------------------
    @property
    def nodes(self) -> list[str]:
        return self.net.names

    @property
    def conf_path(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm tools that talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf_path)}

    @property
    def key_path(self) -> Path:
        return sshd.key_path(self.dir)

    @property
    def ssh_options(self) -> list[str]:
        return sshd.ssh_options(self.dir)

    @property
    def mpirun_rsh_args(self) -> str:
        """Value for `mpirun -mca plm_rsh_args ...`."""
        return " ".join(self.ssh_options)

    def ip(self, node: str) -> str:
        return self.net.ip(self.net.index(node))

    @property
    def plugstack(self) -> Path:
        """Pyxis's plugstack file (its arguments may be changed between jobs)."""
        return self.dir / pyxis_bed.PLUGSTACK_NAME

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge" / "munge.socket"

    # ---- running commands ----------------------------------------------------------------
    def node_exec(self, node: str, argv: Sequence[str], *, check: bool = False,
                  timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run argv inside the node's network and UTS namespaces (hostname is the node's)."""
        return subprocess.run([*self.net.enter(node), *argv], capture_output=True, text=True,
                              env=kw.pop("env", self.env), timeout=timeout, check=check, **kw)

    def slurm(self, argv: Sequence[str], *, check: bool = True,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client tool (by absolute path) against this cluster."""
        return run([which(argv[0]), *argv[1:]], env=self.env, check=check, timeout=timeout)

    # ---- lifecycle -----------------------------------------------------------------------
    @staticmethod
    def unavailable(sshd: bool = False) -> str | None:
        """Why a test bed cannot run here (None when it can)."""
        if os.geteuid() != 0:
            return "the Slurm test bed needs root (namespaces, /etc/hosts)"
        missing = missing_tools(REQUIRED_TOOLS + (SSH_TOOLS if sshd else ()))
        if missing:
            return f"missing tools {missing}: run tests/cluster/install.sh as root"
        return None

    def up(self) -> Self:
        why = self.unavailable(self.with_sshd)
        if why:
            raise TestbedError(why)
        t0 = time.monotonic()
        if self.state_file.exists():  # a previous run, maybe half-made: start clean
            self.down()
        for sub in ("state", "run", "log", "munge", *(f"spool/{n}" for n in self.nodes),
                    *(f"tmp/{n}" for n in self.nodes)):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        # munged wants every directory above its socket searchable by all.
        self.dir.chmod(self.dir.stat().st_mode | 0o011)
        self._save()  # before anything exists, so that down() finds it after any failure
        try:
            netns.create(self.net)
            self.timings["network"] = time.monotonic() - t0
            self._start_munge()
            self._write_conf()
            self._start_slurm()
            if self.with_sshd:
                self.start_sshd()
            self._start_supervisor()
        except BaseException:
            self._save()
            self.down()
            raise
        self.timings["up"] = time.monotonic() - t0
        self._save()
        return self

    def down(self) -> None:
        """Stop and remove everything; safe to call repeatedly and after a failed up()."""
        t0 = time.monotonic()
        state = self._load()
        if state:
            self.net = Net(octet=state["octet"], nodes=state["nodes"], prefix=state["prefix"])
            self.pids.update(state.get("pids", {}))
            self.system_conf = state.get("system_conf", self.system_conf)
        # The supervisor first, or it restarts what is stopped below.
        sup = state.get("supervisor") if state else None
        if sup and "tests.cluster.supervise" in cmdline(sup):
            kill_pids([sup], term=False)
        # Everything in a node namespace first: slurmd, sshd and the job steps that
        # slurmd double-forked away (they would keep running otherwise).
        self._cancel_jobs()
        # SIGKILL at once: slurmstepd ignores SIGTERM, and nothing there needs a clean exit.
        kill_pids([p for i in range(1, 65) for p in pids_in_namespace(self.net.netns_file(i))],
                  term=False)
        # Recorded pids only while they still name one of our daemons (pids get reused).
        victims = [p for p in self.pids.values() if comm(p) in DAEMONS]
        kill_pids(victims + self._daemons_of_this_dir())
        netns.destroy(self.net)
        if state.get("pyxis"):
            # Named containers a killed job left (Pyxis's default container_scope is global).
            pyxis_bed.remove_leftovers(self.nodes)
        if self.system_conf:
            slurmconf.restore_system(self._header(), self.dir / "slurm.conf.orig")
        shutil.rmtree(self.dir / "munge", ignore_errors=True)  # the key is per cluster
        self.state_file.unlink(missing_ok=True)
        self.pids = {}
        self.timings["down"] = time.monotonic() - t0

    def _cancel_jobs(self) -> None:
        """Cancel every job while slurmctld still runs: that is what tells waiting srun
        clients (in the root namespace, outside our reach) to exit."""
        ctld = self.pids.get("slurmctld")
        if not ctld or comm(ctld) != "slurmctld" or not self.conf_path.exists():
            return
        jobs = self.slurm(["squeue", "-h", "-o", "%A"], check=False, timeout=10).stdout.split()
        if not jobs:
            return
        self.slurm(["scancel", *jobs], check=False, timeout=10)
        try:
            wait_until(lambda: not self.slurm(["squeue", "-h", "-o", "%A"], check=False,
                                              timeout=10).stdout.split(), 5, "jobs to end", 0.1)
        except TestbedError:
            pass  # stuck in completing: the SIGKILL below ends them anyway

    def is_up(self) -> bool:
        state = self._load()
        return bool(state) and all(pid_alive(p) for p in state.get("pids", {}).values())

    def leftovers(self) -> list[str]:
        """What of this cluster still exists (empty after down())."""
        out = netns.leftovers(self.net)
        out += [f"process {p}" for p in self.pids.values() if pid_alive(p)]
        out += [f"process {p}" for p in self._daemons_of_this_dir()]
        if self.system_conf and slurmconf.is_ours(self._header()):
            out.append(str(slurmconf.SYSTEM_CONF))
        return out

    def __enter__(self) -> Self:
        return self.up()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.down()

    # ---- pieces --------------------------------------------------------------------------
    def _start_munge(self) -> None:
        # Our own munged and key: a system munged (if any) is left alone.
        d = self.dir / "munge"
        key = d / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        for path in (d, key):
            shutil.chown(path, "munge", "munge")
        d.chmod(0o755)  # munged: clients need to reach the socket in it
        t0 = time.monotonic()
        p = self._spawn("munged", [which("munged"), "-F", f"--socket={self.munge_socket}",
                                   f"--key-file={key}", f"--pid-file={d / 'munged.pid'}",
                                   f"--log-file={d / 'munged.log'}",
                                   f"--seed-file={d / 'munged.seed'}"], user="munge")
        wait_until(lambda: self.munge_socket.exists() or not pid_alive(p), 10, "munged socket")
        if not pid_alive(p):
            raise TestbedError(f"munged exited: {tail(d / 'munged.log')}")
        self.timings["munged"] = time.monotonic() - t0

    def _write_conf(self) -> None:
        if self.pyxis:
            why = pyxis_bed.unavailable()
            if why:
                raise TestbedError(why)
            pyxis_bed.write_plugstack(self.plugstack)
        text = f"# {self._header()}\n" + slurmconf.render(self.net, self.dir, self.munge_socket,
                                                         self.plugstack if self.pyxis else None)
        self.conf_path.write_text(text)
        if self.system_conf:
            slurmconf.install_system(text, self._header(), self.dir / "slurm.conf.orig")

    def _start_slurm(self) -> None:
        t0 = time.monotonic()
        conf = str(self.conf_path)
        # -c: a clean start, no jobs carried over from an earlier cluster in this dir.
        ctld = self._spawn("slurmctld", [which("slurmctld"), "-D", "-c", "-f", conf])
        for n in self.nodes:
            self._spawn(f"slurmd-{n}", [*self.net.enter(n), which("slurmd"), "-D", "-N", n,
                                        "-f", conf])
        wait_until(lambda: self._ctld_ready(ctld), 30, "slurmctld to answer")
        self.timings["slurmctld"] = time.monotonic() - t0
        wait_until(self._all_idle, 60, f"nodes {self.nodes} to be idle", interval=0.1)
        self.timings["slurmd_idle"] = time.monotonic() - t0

    def _ctld_ready(self, pid: int) -> bool:
        if not pid_alive(pid):
            raise TestbedError(f"slurmctld exited: {tail(self.dir / 'log/slurmctld.log')}")
        return "UP" in self.slurm(["scontrol", "ping"], check=False, timeout=10).stdout

    def _all_idle(self) -> bool:
        for n in self.nodes:
            if not pid_alive(self.current_pid(f"slurmd-{n}")):
                log = self.dir / "log" / f"slurmd-{n}.log"
                raise TestbedError(f"slurmd on {n} exited: {tail(log)}")
        out = self.slurm(["sinfo", "-h", "-N", "-p", self.partition, "-o", "%N %t"],
                         check=False, timeout=10).stdout.split()
        states = dict(zip(out[::2], out[1::2]))
        return all(states.get(n) == "idle" for n in self.nodes)

    def start_sshd(self) -> None:
        """Start sshd on every node (also on an already running cluster)."""
        missing = missing_tools(SSH_TOOLS)
        if missing:
            raise TestbedError(f"missing {missing}: run tests/cluster/install.sh")
        old = [k for k in self.pids if k.startswith("sshd-")]
        self.unsupervise(*old)  # before the kill: the supervisor would start them again
        kill_pids([self.pids.pop(k) for k in old])
        t0 = time.monotonic()
        sshd.prepare(self.dir)
        self.with_sshd = True
        for n in self.nodes:
            self._spawn(f"sshd-{n}", sshd.argv(self.net, self.dir, n), log=sshd.log_path(self.dir, n))
        for n in self.nodes:
            wait_until(functools.partial(sshd.listening, self.net, n), 15, f"sshd on {n}")
        self.timings["sshd"] = time.monotonic() - t0

    def _spawn(self, name: str, argv: list[str], user: str | None = None, log: Path | None = None) -> int:
        # A new session: the daemons outlive the CLI process that started them.
        with open(log or self.dir / "log" / f"{name}.out", "ab") as out:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                 start_new_session=True, env=self.env, user=user,
                                 group=user, extra_groups=[] if user else None)
        # nsenter execs its command: this is the daemon's pid
        self.supervise(name, p.pid, argv, user=user, log=log)
        return p.pid

    def supervise(self, name: str, pid: int, argv: list[str], *, user: str | None = None,
                  log: Path | None = None) -> None:
        """Hand a running daemon to the supervisor: restarted with argv (output to log) if it dies."""
        self.pids[name] = pid
        self.argv[name] = {"argv": argv, "user": user, **({"log": str(log)} if log else {})}
        self._save()

    def unsupervise(self, *names: str) -> None:
        """Stop watching these daemons (before stopping them on purpose)."""
        for name in names:
            self.argv.pop(name, None)
            self.pids.pop(name, None)
        self._save()

    def _start_supervisor(self) -> None:
        with open(self.dir / "log" / "supervisor.out", "ab") as log:
            p = subprocess.Popen([sys.executable, "-m", "tests.cluster.supervise", str(self.dir)],
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                 env=self.env, cwd=str(Path(__file__).resolve().parents[2]))
        self.supervisor = p.pid
        self._save()

    def supervised(self) -> bool:
        sup = read_state(self.dir).get("supervisor")
        return isinstance(sup, int) and pid_alive(sup) and "tests.cluster.supervise" in cmdline(sup)

    def crash(self, name: str, timeout: float = 30) -> int:
        """SIGKILL a daemon, as a crash would, and wait for the supervisor's restart; the killed pid.

        A killed slurmctld loses what it had not saved yet: a job that ended just before comes
        back as running and stays queued for ever (no slurmd reports it again). Those are
        cancelled here, so that one test's crash does not leave jobs to the next tests."""
        if name == "slurmctld":
            # A job that has just ended stays COMPLETING until its node's epilog reports; killed
            # then, slurmctld comes back from its saved state with the job running. Let such
            # jobs finish first, and count any that did not as ghosts below.
            with contextlib.suppress(TestbedError):
                wait_until(lambda: "CG" not in self._queued_states().values(), 15,
                           "completing jobs to end", interval=0.1)
        queued = {j for j, st in self._queued_states().items() if st != "CG"}
        old = self.current_pid(name)
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: self.current_pid(name) != old and pid_alive(self.current_pid(name)),
                   timeout, f"the supervisor to restart {name}")
        if name == "slurmctld":
            wait_until(lambda: "UP" in self.slurm(["scontrol", "ping"], check=False, timeout=10).stdout,
                       timeout, "slurmctld to answer again")
            ghosts = sorted(set(self._queued()) - queued)
            if ghosts:
                self.slurm(["scancel", *ghosts], check=False, timeout=30)
        if not queued:
            # Nothing was running: the next test gets the cluster as a restart leaves it, every
            # node registered again and idle.
            wait_until(self._all_idle, 60, f"nodes {self.nodes} to be idle after {name} restarted",
                       interval=0.2)
        return old

    @contextlib.contextmanager
    def node_lost(self, node: str, job_id: str) -> Iterator[None]:
        """The machine `node` lost while job `job_id` runs there, as a hung or unplugged host
        looks to Slurm: its slurmd stopped (SIGSTOP: alive, so the bed's supervisor leaves it,
        and silent, so slurmctld marks the node DOWN after SlurmdTimeout) and every process of
        the job on it killed (its slurmstepd, ranks, a supervisor on the batch host). Afterwards
        slurmd resumes and the node is brought back to service."""
        slurmd = self.current_pid(f"slurmd-{node}")
        os.kill(slurmd, signal.SIGSTOP)
        left: set[str] = set()
        try:
            pids = self._job_processes_on(node, job_id)
            left = self._node_local_files_of(pids)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            yield
        finally:
            # The machine comes back rebooted: what the job's processes had in its /dev/shm and
            # /tmp is gone (the bed's nodes share this host's, so it goes by hand).
            for path in left:
                remove_entry(path)
            os.kill(slurmd, signal.SIGCONT)
            self.slurm(["scontrol", "update", f"nodename={node}", "state=resume"], check=False, timeout=30)
            wait_until(lambda: self._node_state(node) in ("idle", "mix", "alloc"), 90,
                       f"{node} back in service", interval=0.5)

    @staticmethod
    def _node_local_files_of(pids: list[int]) -> set[str]:
        """What processes hold in /dev/shm and /tmp/python_env_*: their mapped and open files,
        their working folders and Open MPI's segment folders named in their environment."""
        found: set[str] = set()

        def keep(path: str) -> None:
            if path.startswith("/dev/shm/"):
                found.add("/dev/shm/" + path.split("/")[3])   # the top entry: a region or a folder
            elif path.startswith("/tmp/python_env_"):
                found.add("/".join(path.split("/")[:3]))

        for pid in pids:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                    parts = line.split(maxsplit=5)
                    if len(parts) == 6:
                        keep(parts[5].removesuffix(" (deleted)"))
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        keep(os.readlink(f"/proc/{pid}/fd/{fd}"))
                keep(os.readlink(f"/proc/{pid}/cwd"))
                for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    name, _, value = entry.decode(errors="replace").partition("=")
                    if name.startswith("OMPI_MCA_btl_") and name.endswith("_backing_directory"):
                        keep(value)
        return found

    def _node_state(self, node: str) -> str:
        return self.slurm(["sinfo", "-h", "-n", node, "-o", "%t"], check=False, timeout=10).stdout.strip()

    def _job_processes_on(self, node: str, job_id: str) -> list[int]:
        """Processes in the node's UTS namespace that belong to the job: its slurmstepds (by
        name) and whatever carries the job's id in its environment."""
        ns = os.stat(self.net.uts_file(self.net.index(node))).st_ino
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}/ns/uts").st_ino != ns:
                    continue
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd.startswith(b"slurmstepd: [" + job_id.encode() + b".") or f"SLURM_JOB_ID={job_id}".encode() in env:
                found.append(int(entry))
        return found

    def _queued(self) -> list[str]:
        return list(self._queued_states())

    def _queued_states(self) -> dict[str, str]:
        out = self.slurm(["squeue", "-h", "-o", "%A %t"], check=False, timeout=30).stdout
        return dict(line.split(None, 1) for line in out.splitlines() if len(line.split()) == 2)

    def restarts(self) -> list[dict[str, Any]]:
        """The daemons the supervisor restarted (name, at, old_pid, new_pid, last_log)."""
        found: list[dict[str, Any]] = read_state(self.dir).get("restarts", [])
        return found

    def current_pid(self, name: str) -> int:
        """A daemon's pid now (the supervisor may have restarted it)."""
        pid: int = read_state(self.dir).get("pids", {}).get(name, self.pids.get(name, 0))
        return pid

    def _daemons_of_this_dir(self) -> list[int]:
        """Our daemons found by command line: a safety net when state.json is gone."""
        return processes_mentioning(str(self.dir) + "/", DAEMONS)

    def _header(self) -> str:
        return f"ftcluster testbed {self.net.tag} {self.dir}"

    def _save(self) -> None:
        def merge(state: dict[str, Any]) -> None:
            # A pid the supervisor put there (alive, ours dead) wins over our stale one.
            for name, pid in state.get("pids", {}).items():
                if name in self.pids and pid != self.pids[name] and pid_alive(pid) and not pid_alive(self.pids[name]):
                    self.pids[name] = pid
            restarts = state.get("restarts", []) if state.get("dir") == str(self.dir) and self.pids else []
            state.clear()
            state.update({"dir": str(self.dir), "nodes": self.net.nodes, "octet": self.net.octet,
                          "prefix": self.net.prefix, "sshd": self.with_sshd,
                          "system_conf": self.system_conf, "pyxis": self.pyxis, "node_names": self.nodes,
                          "ips": {n: self.ip(n) for n in self.nodes}, "conf": str(self.conf_path),
                          "key_path": str(self.key_path), "pids": self.pids, "timings": self.timings,
                          "argv": self.argv, "supervisor": self.supervisor, "restarts": restarts})

        locked_update(self.dir, merge)

    def _load(self) -> dict[str, Any]:
        return read_state(self.dir)

    @classmethod
    def from_state(cls, dir: str | Path = DEFAULT_DIR) -> SlurmTestbed:
        """The test bed recorded in dir (defaults if nothing is recorded there)."""
        tb = cls(dir)
        s = tb._load()
        if s:
            tb = cls(dir, s["nodes"], octet=s["octet"], prefix=s["prefix"], sshd=s["sshd"],
                     system_conf=s["system_conf"], pyxis=s.get("pyxis", False))
            tb.pids = dict(s.get("pids", {}))
            tb.timings = dict(s.get("timings", {}))
            tb.argv = dict(s.get("argv", {}))
            tb.supervisor = s.get("supervisor")
        return tb


@contextlib.contextmanager
def running_testbed(nodes: int = 3) -> Iterator[SlurmTestbed]:
    """The test cluster at $FTC_TESTBED_DIR (default DEFAULT_DIR): the running one, else one
    started here and stopped on exit (for benchmarks run by hand)."""
    folder = os.environ.get("FTC_TESTBED_DIR", str(DEFAULT_DIR))
    tb = SlurmTestbed.from_state(folder)
    started = not tb.is_up()
    if started:
        tb = SlurmTestbed(folder, nodes).up()
    try:
        yield tb
    finally:
        if started:
            tb.down()
