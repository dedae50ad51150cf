"""Docker (a container per node, `docker run` by the job's node script): its per-run SSH keys,
with which mpirun reaches the other containers over ssh.

The runtime makes, in the run folder's state/ssh/ (0700), before submission:
  id_ed25519 / .pub           the client key; authorized only inside this run's containers
  host_ed25519 / .pub         the host key every container's sshd presents
The job script writes known_hosts from the host key once it knows the node names, so ssh
and mpirun verify hosts. Nothing comes from or goes to the user's ~/.ssh. `remove` deletes
the folder at the end of the run (and on stop).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ftcluster.runtimes.base import Runtime, Submission

if TYPE_CHECKING:
    from ftcluster.run.layout import RunPaths

SSH_SUBDIR = "ssh"
CLIENT_KEY = "id_ed25519"
HOST_KEY = "host_ed25519"


@dataclass(frozen=True)
class RunKeys:
    dir: Path

    @property
    def client_key(self) -> Path:
        return self.dir / CLIENT_KEY

    @property
    def host_key(self) -> Path:
        return self.dir / HOST_KEY


def ssh_dir(state_dir: Path) -> Path:
    return state_dir / SSH_SUBDIR


def _write(path: Path, data: bytes, mode: int) -> None:
    # Created with its final mode: the private key is never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)  # O_CREAT's mode is masked by the umask


def _pair(path: Path, comment: str) -> None:
    # Imported here: compute-node code imports this package too, where cryptography may be absent.
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    _write(path, private, 0o600)
    _write(path.with_name(path.name + ".pub"), public + f" {comment}\n".encode(), 0o644)


def generate(state_dir: Path, run_id: str) -> RunKeys:
    """A fresh client and host key pair for one run (refuses to overwrite existing keys)."""
    d = ssh_dir(state_dir)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    keys = RunKeys(d)
    _pair(keys.client_key, f"ftcluster-run-{run_id}")
    _pair(keys.host_key, f"ftcluster-host-{run_id}")
    return keys


def remove(state_dir: Path) -> bool:
    """Delete the run's keys; True when there were any."""
    d = ssh_dir(state_dir)
    if not d.exists():
        return False
    shutil.rmtree(d, ignore_errors=True)
    return not d.exists()


class DockerRuntime(Runtime):
    """The job needs per-run ssh keys: made before submission, removed at the end. The job
    script removes the run's containers on every node at its end."""

    name = "docker"

    def prepare_resources(self, request: Submission) -> None:
        generate(request.paths.state, request.paths.run_id)

    def release_resources(self, paths: RunPaths) -> None:
        remove(paths.state)
