"""sshd inside each node namespace, with a dedicated key pair, for mpirun over ssh."""

from __future__ import annotations

import socket
from pathlib import Path

from .netns import Net
from .util import run, which

SSH_PORT = 11068


def key_path(root: Path) -> Path:
    return root / "ssh" / "id_ed25519"


def ssh_options(root: Path) -> list[str]:
    """Client options: our key, our port, no known_hosts (every node has the same host key)."""
    return ["-p", str(SSH_PORT), "-i", str(key_path(root)), "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes"]


def _keys(root: Path) -> None:
    d = root / "ssh"
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    keygen = which("ssh-keygen")
    for key in (key_path(root), d / "ssh_host_ed25519_key"):
        if not key.exists():
            run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", "ftc-testbed", "-f", str(key)])
    (d / "authorized_keys").write_text(key_path(root).with_suffix(".pub").read_text())
    (d / "sshd_config").write_text("\n".join([
        f"Port {SSH_PORT}",
        f"HostKey {d / 'ssh_host_ed25519_key'}",
        f"AuthorizedKeysFile {d / 'authorized_keys'}",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        # The cluster dir lives under world-writable /tmp and PAM is not set up here.
        "StrictModes no",
        "UsePAM no",
        "Subsystem sftp internal-sftp",  # remote use moves files over SFTP
        "PrintMotd no",
        "AcceptEnv LANG LC_*",
        "",
    ]))


def log_path(root: Path, node: str) -> Path:
    return root / "log" / f"sshd-{node}.log"


def prepare(root: Path) -> None:
    """Keys, config and the privilege separation dir, before any sshd starts."""
    _keys(root)
    Path("/run/sshd").mkdir(exist_ok=True)


def argv(net: Net, root: Path, node: str) -> list[str]:
    """One node's sshd in the foreground (what the supervisor restarts), logging to log_path."""
    sshd = which("sshd")  # absolute: sshd refuses to re-exec itself otherwise
    return [*net.enter(node), sshd, "-D", "-E", str(log_path(root, node)),
            "-f", str(root / "ssh" / "sshd_config"), "-o", f"PidFile={root / 'run' / f'sshd-{node}.pid'}"]


def listening(net: Net, node: str) -> bool:
    """True once the node's sshd accepts connections (reached over the bridge)."""
    try:
        with socket.create_connection((net.ip(net.index(node)), SSH_PORT), timeout=0.5):
            return True
    except OSError:
        return False
