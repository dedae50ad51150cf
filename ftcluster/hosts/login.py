"""Remote use from a workstation: the same commands, carried out on the cluster's login node.

A cluster spec with `login_host` makes launch/check/status/logs/stop run on the login node over
one SSH connection (fabric/paramiko): the specs move over SFTP, the command runs there with a
pty (so Ctrl-C reaches it and cancels the job), and its output streams back live. The user's
ssh config, keys, agent and known_hosts are used; unknown host keys are refused, never added
silently.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ftcluster.errors import UserError
from ftcluster.extras import need
from ftcluster.hosts.runner import CommandResult
from ftcluster.spec.cluster import ClusterSpec

# Set on the login node so that the forwarded command does not forward again.
HOP_ENV = "FTCLUSTER_ON_LOGIN_NODE"


def needs_forwarding(cluster: ClusterSpec) -> bool:
    return bool(cluster.login_host) and not os.environ.get(HOP_ENV)


@dataclass(frozen=True)
class SshTarget:
    host: str
    user: str | None
    port: int | None
    identity_file: str | None
    known_hosts: str | None

    @classmethod
    def from_spec(cls, cluster: ClusterSpec) -> "SshTarget":
        assert cluster.login_host
        text = cluster.login_host
        user, _, hostport = text.rpartition("@")
        host, _, port = hostport.partition(":")
        return cls(host=host, user=user or None, port=int(port) if port else None,
                   identity_file=cluster.login_identity_file, known_hosts=cluster.login_known_hosts)


def connect(target: SshTarget, field: str = "login_host", timeout: float = 20) -> Any:
    fabric = need("fabric", "SSH (login_host, the ssh scheduler, tunnel)")
    paramiko = need("paramiko", "SSH (login_host, the ssh scheduler, tunnel)")

    kwargs: dict[str, Any] = {}
    if target.identity_file:
        kwargs["key_filename"] = os.path.expanduser(target.identity_file)
    conn = fabric.Connection(target.host, user=target.user, port=target.port, connect_kwargs=kwargs,
                             connect_timeout=timeout)
    # fabric adds unknown host keys silently; refuse them instead.
    conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    conn.client.load_system_host_keys()
    # The spec names one file (its path may hold spaces); ssh_config may list several.
    configured = conn.ssh_config.get("userknownhostsfile")
    files = [target.known_hosts] if target.known_hosts else (configured.split() if configured else [])
    for path in files:
        path = os.path.expanduser(path)
        if os.path.isfile(path):
            conn.client.load_host_keys(path)
    try:
        conn.open()
    except paramiko.SSHException as exc:
        raise UserError(f"cannot connect to {target.host}: {exc}", field=field,
                        hint="check the host key in known_hosts (ssh once by hand) and your key/agent") from None
    except (OSError, UnicodeError) as exc:   # UnicodeError: a name the IDNA codec refuses, before any lookup
        raise UserError(f"cannot reach {target.host}: {exc}", field=field) from None
    return conn


class SSHRunner:
    """The Runner protocol over one SSH connection: commands over exec, files over SFTP."""

    def __init__(self, conn: Any):
        self.conn = conn
        self._sftp: Any = None

    @property
    def sftp(self) -> Any:
        if self._sftp is None:
            # optional extra: ssh (paramiko)
            import paramiko

            try:
                self._sftp = self.conn.sftp()
            except paramiko.SSHException as exc:
                raise UserError(f"the login node offers no SFTP ({exc})", field="login_host",
                                hint="ftcluster moves specs over SFTP; ask for the sftp subsystem") from None
        return self._sftp

    def run(self, argv: list[str], *, cwd: str | None = None, timeout: float | None = 60.0) -> CommandResult:
        cmd = shlex.join(argv)
        if cwd:
            cmd = f"cd {shlex.quote(cwd)} && {cmd}"
        res = self.conn.run(cmd, hide=True, warn=True, timeout=timeout, in_stream=False)
        return CommandResult(tuple(argv), res.exited, res.stdout, res.stderr)

    def stream(self, command: str) -> int:
        """Run with a pty, output shown live; Ctrl-C is passed on to the remote command."""
        res = self.conn.run(command, pty=True, warn=True)
        return int(res.exited)

    def read_text(self, path: str) -> str:
        with self.sftp.open(path, "r") as fh:
            return fh.read().decode(errors="replace")

    def write_text(self, path: str, text: str, mode: int = 0o644) -> None:
        with self.sftp.open(path, "w") as fh:
            fh.write(text)
        self.sftp.chmod(path, mode)

    def exists(self, path: str) -> bool:
        try:
            self.sftp.stat(path)
            return True
        except FileNotFoundError:
            return False

    def open_binary(self, path: str) -> IO[bytes]:
        return self.sftp.open(path, "rb")  # type: ignore[no-any-return]

    def which(self, name: str) -> str | None:
        res = self.run(["sh", "-c", f"command -v {shlex.quote(name)}"])
        return res.stdout.strip() or None

    def mkdirs(self, path: str) -> None:
        self.run(["mkdir", "-p", path])


def upload_spec(runner: SSHRunner, local: Path) -> str:
    """Copy a spec file to the login node's cache; returns its remote path."""
    data = local.read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:12]
    home = runner.run(["sh", "-c", "echo $HOME"]).stdout.strip() or "."
    folder = f"{home}/.cache/ftcluster/specs/{digest}"
    runner.mkdirs(folder)
    remote = f"{folder}/{local.name}"
    runner.write_text(remote, data.decode())
    return remote


def forward(cluster: ClusterSpec, args: list[str], specs: dict[str, str | None]) -> int:
    """Run `ftcluster ARGS` on the login node; `specs` maps an option (--cluster) to a local file."""
    target = SshTarget.from_spec(cluster)
    conn = connect(target)
    try:
        runner = SSHRunner(conn)
        remote_args = list(args)
        for option, local in specs.items():
            if local:
                remote_args += [option, upload_spec(runner, Path(local))]
        command = f"{HOP_ENV}=1 {cluster.login_command} {shlex.join(remote_args)}"
        return runner.stream(command)
    finally:
        conn.close()
