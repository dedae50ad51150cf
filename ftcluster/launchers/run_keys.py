"""The Docker styles' per-run ssh keys: mpirun reaches the other containers over ssh with keys
made for the run in its state/ssh (ftcluster.launchers.keypairs). Their launchers own them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftcluster.launchers import keypairs as sshkeys
from ftcluster.launchers.base import Launcher, Submission

if TYPE_CHECKING:
    from ftcluster.run.layout import RunPaths


class RunKeysLauncher(Launcher):
    """A launcher whose job needs per-run ssh keys: made before submission, removed at the end."""

    def prepare_resources(self, request: Submission) -> None:
        sshkeys.generate(request.paths.state, request.paths.run_id)

    def release_resources(self, paths: RunPaths) -> None:
        sshkeys.remove(paths.state)
