"""Pyxis (srun --container-image, Enroot): the job script removes the run's named container on
every node at its end. What is checked here, before anything is submitted: a squashfs image
given as a path exists where the scheduler's commands run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftcluster.errors import UserError
from ftcluster.runtimes.base import Runtime

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from ftcluster.hosts.runner import Runner
    from ftcluster.plan.parallel import Plan
    from ftcluster.spec.cluster import ClusterSpec


class PyxisRuntime(Runtime):
    name = "pyxis"

    def check(self, cluster: ClusterSpec, plan: Plan, runner: Runner) -> None:
        image = cluster.container.image or ""
        # Pyxis takes an image that starts with '/' or '.' as a squashfs file on the nodes (the
        # spec refuses other paths); a registry name is pulled by Enroot at run time.
        if image[:1] not in ("/", "."):
            return
        if not image.startswith("/"):
            raise UserError(f"{image!r} is relative: Pyxis would look for it in the job's working "
                            "directory, the run folder", field="container.image",
                            hint="give the .sqsh file's absolute path")
        if not runner.exists(image):
            raise UserError(f"{image} does not exist", field="container.image",
                            hint="import the image first (ftcluster image import) or correct the path")
