"""pytest fixtures of the Pyxis tests: the Slurm test bed with real Enroot + Pyxis, the test
image as a squashfs, and the check that a test left nothing on the nodes.

Policy: no ../shared/third_party (the sources) -> skipped, under CI=true too; sources there but
Enroot/Pyxis not installed, or a running test bed started without Pyxis -> skipped, except under
CI=true where that is an error (tests/run.sh installs them when the sources are there).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from . import bed, image

__all__ = ["pyxis_bed", "PyxisBed"]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _skip_or_fail(why: str) -> None:
    if _in_ci():
        pytest.fail(f"CI=true but the Pyxis tests cannot run: {why}", pytrace=False)
    pytest.skip(why)


@dataclass
class PyxisBed:
    tb: Any                 # the SlurmTestbed, with Pyxis loaded
    sqsh: Path              # the test image as an Enroot squashfs
    import_seconds: float | None   # how long `ftcluster image import` took (None: cached)

    @property
    def nodes(self) -> list[str]:
        return list(self.tb.nodes)

    def scope(self, value: str) -> Any:
        """Jobs submitted inside this context run under Pyxis container_scope=value."""
        return bed.plugstack_args(self.tb.plugstack, [f"container_scope={value}"])

    def jobs(self) -> list[str]:
        out = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True,
                             env=self.tb.env, timeout=30).stdout
        return out.split()

    def assert_clean(self, timeout: float = 30) -> None:
        """No job, no pyxis_* container, no Pyxis squashfs and no container process left."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self.jobs() or bed.leftovers(self.nodes) or _container_procs()):
            time.sleep(0.2)
        jobs, left, procs = self.jobs(), bed.leftovers(self.nodes), _container_procs()
        if left:
            bed.remove_leftovers(self.nodes)   # so that one failure does not fail the next tests
        assert not jobs and not left and not procs, f"left: jobs {jobs}, {left}, processes {procs}"


def _container_procs() -> list[str]:
    """Processes of a container run (the nodes share the process table): the image's
    tritonserver, enroot's helpers, the run's node script."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if any(m in cmd for m in ("/opt/tritonserver/", "enroot-", "pyxis_node.sh")):
            found.append(f"{pid} {cmd[:120]}")
    return found


@pytest.fixture(scope="session")
def pyxis_bed(slurm_cluster: Any, request: pytest.FixtureRequest) -> Iterator[PyxisBed]:
    if not bed.sources_present():
        pytest.skip(f"no Enroot/Pyxis sources in {bed.THIRD_PARTY} (../shared/third_party)")
    why = bed.unavailable()
    if why:
        _skip_or_fail(why)
    if not slurm_cluster.pyxis:
        _skip_or_fail("the running test bed was started without Pyxis (python -m tests.cluster down; "
                      "the next test session starts one with it)")
    sqsh, took = image.sqsh_path(), None
    if not sqsh.is_file():
        dn = request.getfixturevalue("docker_nodes")
        sqsh, took = image.build(f"unix://{dn.socket(dn.nodes[0])}")
    pb = PyxisBed(slurm_cluster, sqsh, took)
    pb.assert_clean(timeout=5)
    yield pb
    pb.assert_clean()
