"""Pyxis: the first step that runs in the image (the MPI check, a job step or the servers)
creates the named container on every node, and the later steps reuse it (mounts repeated: a
named container keeps its filesystem, not its mounts). Nothing enters it while the servers
run: the client runs here."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, List

from ..names import EV
from ..text import first_match, read_text, squeeze
from ..thisnode import this_node
from .base import Runtime
from .node_containers import NodeContainers

if TYPE_CHECKING:
    from ..styles import JobStyle


class PyxisRuntime(Runtime):
    def __init__(self, style: JobStyle):
        super().__init__(style)
        self.containers = NodeContainers(style, "pyxis", self.script("pyxis_node.sh"),
                                         f"enroot remove -f pyxis_{self.cfg.container_name}", guards_record=True)
        self.proven = False   # a step ran in the image: the containers exist

    def container_flags(self) -> List[str]:
        return list(self.cfg.container_flags)

    def up(self) -> None:
        """The guards; the containers come with the first step that runs in the image (one
        step launch and one container start fewer than a step of their own)."""
        self.job.event(EV.containers_starting)
        self.containers.start_guards()

    def in_image(self, argv: List[str]) -> List[str]:
        """Until a step has run in the image, a step's tasks prove where they run first."""
        if self.proven:
            return list(argv)
        return ["bash", self.script("prove_in_image.sh"), self.containers.dir(), *argv]

    def first_step_seen(self, failed: bool, logs: List[str]) -> None:
        """Proof that the steps run in the image: a step's / must not be this node's /. Pyxis
        loaded by srun but not by the nodes' slurmd accepts --container-image and runs the step
        on the host. A step that failed before its task wrote its / did not get its container."""
        if self.proven:
            return
        job = self.job
        node0 = this_node()
        root = read_text(os.path.join(self.containers.dir(), f"{node0}.root")).strip()
        st = os.stat("/")
        if root == f"{st.st_dev}:{st.st_ino}":
            job.fail(f"Pyxis is not active on the compute nodes: a step with --container-image ran on {node0}'s own "
                     "filesystem, not in the image (srun accepts the flags when only the submitting side loads "
                     "Pyxis; check plugstack.conf on the nodes)", named=True)
        # Any task that ran in the image shows the containers come up: a step that failed after
        # that (a rank that ended at once, and srun killed the others, even before they started)
        # failed for its own reasons, which the step's caller names.
        ran = root or any(n.endswith(".root") for n in os.listdir(self.containers.dir()))
        if failed and not ran:
            problem = next(filter(None, (first_match(read_text(log), r"pyxis|enroot") for log in logs)), "")
            job.fail(f"the container did not start: {squeeze(problem) or 'see ' + ', '.join(logs)}", named=True)
        if ran:
            self.proven = True
            job.event(EV.containers_ready)

    def clear_servers(self) -> None:
        self.containers.reap()

    def clean_left_over(self) -> None:
        self.containers.started = True   # the earlier supervisor's: they go
        self.down()

    def down(self) -> bool:
        scheduler = self.style.scheduler
        return self.containers.down([n for n in scheduler.job_nodes() if n not in scheduler.lost])
