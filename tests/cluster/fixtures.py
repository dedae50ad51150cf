"""pytest fixtures for the Slurm test bed; tests/conftest.py star-imports this module.

Policy: when the test bed cannot run here (not root, tools missing) the tests that
use it are skipped, except under CI=true where that is an error.
Env: FTC_TESTBED_DIR (default /tmp/ftc-testbed), FTC_TESTBED_NODES (default 3).
A cluster already up in that dir (e.g. `python -m tests.cluster up --sshd`) is reused
and left running.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import pytest

from .testbed import DEFAULT_DIR, SlurmTestbed
from .util import TestbedError

__all__ = ["SESSION_RESTARTS", "require_testbed", "slurm_cluster", "sshd_nodes"]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_testbed(sshd: bool = False) -> None:
    """Skip (or, under CI=true, fail) when the test bed cannot run on this machine."""
    why = SlurmTestbed.unavailable(sshd)
    if why is None:
        return
    if _in_ci():
        pytest.fail(f"CI=true but the Slurm test bed cannot run: {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmTestbed]:
    """A running N-node cluster (node1..N, partitions `debug` and `small`) for the session.

    /etc/slurm/slurm.conf points at it, so plain srun/sbatch/squeue work; its
    `env` (SLURM_CONF) works too.
    """
    require_testbed()
    d = os.environ.get("FTC_TESTBED_DIR", str(DEFAULT_DIR))
    # One pytest session at a time on a test bed (and on /etc/slurm/slurm.conf, node names in
    # /etc/hosts and the per-node dockerds it shares): a second session waits here.
    with open(Path(d).parent / f".{Path(d).name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            t0 = time.monotonic()
            print(f"\nwaiting for another test session to release the test bed {d} ...", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
            print(f"got the test bed after {time.monotonic() - t0:.0f}s", file=sys.stderr)
        yield from _session_testbed(d)


# The daemons the supervisor restarted during this session, for the session's summary.
SESSION_RESTARTS: list[dict[str, Any]] = []


def _session_testbed(d: str) -> Iterator[SlurmTestbed]:
    existing = SlurmTestbed.from_state(d)
    if existing.is_up() and existing.supervised():
        try:
            yield existing
        finally:
            SESSION_RESTARTS.extend(existing.restarts())
        return
    if existing.is_up():  # started by a harness without a supervisor: start it afresh
        existing.down()
    tb = SlurmTestbed(d, int(os.environ.get("FTC_TESTBED_NODES", "3")))
    try:
        tb.up()
    except TestbedError as e:
        pytest.fail(f"the Slurm test bed did not come up: {e}", pytrace=False)
    try:
        yield tb
    finally:
        SESSION_RESTARTS.extend(tb.restarts())
        tb.down()


@pytest.fixture(scope="session")
def sshd_nodes(slurm_cluster: SlurmTestbed) -> SlurmTestbed:
    """The same cluster with sshd on port 11068 in every node (key: .key_path;
    ssh options: .ssh_options; for mpirun: -mca plm_rsh_args .mpirun_rsh_args)."""
    require_testbed(sshd=True)
    if not slurm_cluster.with_sshd:
        try:
            slurm_cluster.start_sshd()
        except TestbedError as e:
            pytest.fail(f"sshd did not start in the nodes: {e}", pytrace=False)
    return slurm_cluster
