"""Charliecloud: the job's every task inside `ch-run IMAGE`
(job_templates/charliecloud_node.sh.j2). Nothing to remove at the end: a ch-run container ends
with its command. What is checked here, before anything is submitted, where the image folder
is visible (it must be on a filesystem every node sees): that it exists and has every folder a
read-only image needs as a mount point.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ftcluster.errors import UserError
from ftcluster.runtimes.base import Runtime

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from ftcluster.hosts.runner import Runner
    from ftcluster.plan.parallel import Plan
    from ftcluster.spec.cluster import ClusterSpec


def mount_points(cluster: ClusterSpec) -> list[tuple[str, str]]:
    """(field, folder inside the image) for every bind the job makes from the spec: its mounts
    and the workspace (the run folder's parent). ch-run shares /tmp with the node: nothing there
    is bound."""
    points = [(f"container.mounts.{i}", m.dst) for i, m in enumerate(cluster.container.mounts)]
    points.append(("workspace", cluster.workspace))
    return [(f, p) for f, p in points if not (p + "/").startswith("/tmp/")]


class CharliecloudRuntime(Runtime):
    name = "charliecloud"

    def check(self, cluster: ClusterSpec, plan: Plan, runner: Runner) -> None:
        image = cluster.container.image or ""
        if not runner.exists(image):
            raise UserError(f"{image} does not exist here", field="container.image",
                            hint="unpack the image with ch-convert (e.g. ch-convert -i docker triton_with_ft:22.12 "
                                 f"{image}) on a filesystem every node sees")
        missing = [(f, p) for f, p in mount_points(cluster) if not runner.exists(os.path.join(image, p.lstrip("/")))]
        if missing:
            raise UserError("; ".join(f"{f}: the image has no folder {p} to mount on (ch-run binds only onto folders "
                                      f"a read-only image has)" for f, p in missing),
                            field="container.image",
                            hint="create them once: " + " ".join(f"mkdir -p {os.path.join(image, p.lstrip('/'))}"
                                                                 for _, p in missing))
