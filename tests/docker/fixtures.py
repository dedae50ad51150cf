"""pytest fixture `docker_nodes`: one dockerd per node of the Slurm test bed, test image loaded.

Skips when not root or docker.io is missing, except under CI=true, where it must run.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import pytest

from .daemons import DockerNodes, unavailable


@pytest.fixture(scope="session")
def docker_nodes(slurm_cluster: Any) -> Iterator[DockerNodes]:
    why = unavailable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the Docker test bed cannot run: {why}")
        pytest.skip(why)
    nodes = DockerNodes(slurm_cluster).up()
    stray: list[str] = []
    try:
        nodes.timings.update({f"image_{n}": t for n, t in nodes.ensure_image().items()})
        yield nodes
        # Every test removes its own containers; any still here is a teardown bug.
        stray = [f"{n}:{c}" for n in nodes.nodes for c in nodes.containers(n)]
    finally:
        nodes.down()
    left = nodes.leftovers()
    assert not stray and not left, f"the Docker tests left containers {stray}, test bed left {left}"
