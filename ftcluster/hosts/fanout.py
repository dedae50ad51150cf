"""Run one command on many hosts at once over SSH (fabric), a bounded number at a time.

The job script of scheduler `ssh` uses this where a Slurm job script uses an srun step:

    python -m ftcluster.hosts.fanout --config scripts/nodes.json [--hosts h1,h2] [--output LOG-%N.log] -- CMD...

Each host runs CMD with FTC_NODE=<host> in its environment (the node scripts' name for the
node, as SLURMD_NODENAME is under Slurm) and this side's FTC_INCARNATION (the servers' restart
count, which srun would pass on), under a pty so that a closed connection hangs up the
remote command. With --output, a host's output goes to that file (%N: the host), otherwise to
stdout. The exit status is 0 when every host exited 0, else the first failure's status (255 when
a host could not be reached: the reason is in its output). SIGINT/SIGTERM close every
connection, which ends the remote commands, like srun does with its tasks.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Sequence

from ftcluster.errors import UserError

UNREACHABLE = 255


@dataclass(frozen=True)
class FanoutConfig:
    """The node_ssh settings and host list of a run, as the job script passes them on."""

    hosts: tuple[str, ...]
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    parallel: int = 32
    connect_timeout: float = 20.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "FanoutConfig":
        data = json.loads(text)
        data["hosts"] = tuple(data["hosts"])
        return cls(**data)


@dataclass(frozen=True)
class HostResult:
    host: str
    exit_code: int
    error: str | None = None   # set when the host could not be reached


class _Lines:
    """A text sink for remote pty output: CRLF back to LF, one writer lock."""

    def __init__(self, fh: IO[str], lock: threading.Lock, prefix: str = ""):
        self.fh, self.lock, self.prefix = fh, lock, prefix

    def write(self, data: str) -> int:
        data = data.replace("\r\n", "\n")
        if self.prefix:
            data = "".join(self.prefix + line for line in data.splitlines(keepends=True))
        with self.lock:
            self.fh.write(data)
        return len(data)

    def flush(self) -> None:
        with self.lock:
            self.fh.flush()


class Fanout:
    def __init__(self, cfg: FanoutConfig):
        self.cfg = cfg
        self._conns: list[Any] = []
        self._lock = threading.Lock()
        self._closing = False

    def _connect(self, host: str) -> Any:
        # optional extra: ssh (paramiko) only when a host is dialled
        from ftcluster.hosts.login import SshTarget, connect

        target = SshTarget(host, self.cfg.user, self.cfg.port, self.cfg.identity_file, self.cfg.known_hosts)
        conn = connect(target, field="node_ssh", timeout=self.cfg.connect_timeout)
        with self._lock:
            if self._closing:
                conn.close()
                raise UserError("interrupted")
            self._conns.append(conn)
        return conn

    def run_one(self, host: str, argv: Sequence[str], sink: _Lines) -> HostResult:
        incarnation = os.environ.get("FTC_INCARNATION", "")
        passed = f" FTC_INCARNATION={incarnation}" if incarnation.isdigit() and incarnation.isascii() else ""
        command = f"env FTC_NODE={shlex.quote(host)}{passed} {shlex.join(argv)}"
        try:
            conn = self._connect(host)
        except UserError as exc:
            sink.write(f"ftcluster: {host}: {exc}\n")
            return HostResult(host, UNREACHABLE, str(exc))
        try:
            res = conn.run(command, pty=True, warn=True, hide=False, in_stream=False,
                           out_stream=sink, err_stream=sink)
            return HostResult(host, int(res.exited))
        except Exception as exc:  # noqa: BLE001 - a lost connection is this host's failure, not ours
            if self._closing:
                return HostResult(host, 128 + signal.SIGTERM, "interrupted")
            sink.write(f"ftcluster: {host}: the ssh session failed: {exc}\n")
            return HostResult(host, UNREACHABLE, f"the ssh session failed: {exc}")
        finally:
            conn.close()

    def run(self, hosts: Sequence[str], argv: Sequence[str], output: str | None,
            stream: IO[str] | None = None) -> list[HostResult]:
        """Without `output`, every host's lines go to `stream` (stdout), prefixed by the host."""
        stdout_lock = threading.Lock()

        def one(host: str) -> HostResult:
            if output is None:
                prefix = f"{host}: " if len(hosts) > 1 else ""
                return self.run_one(host, argv, _Lines(stream or sys.stdout, stdout_lock, prefix))
            path = Path(output.replace("%N", host))
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w") as fh:
                return self.run_one(host, argv, _Lines(fh, threading.Lock()))

        from concurrent.futures import ThreadPoolExecutor   # here: `launch` imports this module for its config

        with ThreadPoolExecutor(max_workers=max(1, min(self.cfg.parallel, len(hosts)))) as pool:
            return list(pool.map(one, hosts))

    def close_all(self) -> None:
        with self._lock:
            self._closing = True
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.close()
            except Exception:  # noqa: BLE001,S110 - closing on the way out; nothing to report
                pass


def exit_code(results: Sequence[HostResult]) -> int:
    return next((r.exit_code for r in results if r.exit_code != 0), 0)


def main(argv: Sequence[str] | None = None) -> int:
    # startup: only the module's own command line (`python -m ftcluster.hosts.fanout`) parses arguments
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ftcluster.hosts.fanout", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="nodes.json of the run (hosts and node_ssh)")
    ap.add_argument("--hosts", help="comma-separated subset of the hosts (default: all)")
    ap.add_argument("--output", help="per-host output file; %%N is the host")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command given")
    cfg = FanoutConfig.from_json(Path(args.config).read_text())
    hosts = args.hosts.split(",") if args.hosts else list(cfg.hosts)
    fan = Fanout(cfg)

    def stop(signum: int, _frame: Any) -> None:
        fan.close_all()
        sys.stdout.flush()
        os._exit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        results = fan.run(hosts, command, args.output)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for r in results:
        if r.error:
            print(f"ftcluster: {r.host}: {r.error}", file=sys.stderr)
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
