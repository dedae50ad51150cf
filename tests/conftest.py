"""Shared pytest set-up: the real test bed fixtures and a weird_tmp_path."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

# The real test beds' session fixtures (slurm_cluster, sshd_nodes, docker_nodes, pyxis_bed), defined once
# here: a session fixture imported into several test modules would be set up once per module.
from tests.cluster.fixtures import *  # noqa: F401,F403
from tests.docker.fixtures import docker_nodes  # noqa: F401
from tests.pyxis.fixtures import pyxis_bed  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_FIXTURES = REPO_ROOT.parent / "shared" / "fixtures"


@pytest.fixture
def weird_tmp_path(tmp_path: Path) -> Path:
    """A tmp folder whose path holds spaces, quotes and shell syntax."""
    weird = tmp_path / "a b'c\"d $(touch PWNED) '; touch PWNED2 #"
    weird.mkdir()
    return weird


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A short folder under /tmp, which every test-bed node sees (tmp_path's names carry the
    test's parameters, '[' and ']', which mount specs refuse); removed after the test, so a
    test-suite run leaves no folder of its own in /tmp."""
    d = Path(tempfile.mkdtemp(prefix="ftc-test-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An isolated run store for tests that launch."""
    d = tmp_path / "state"
    monkeypatch.setenv("FTCLUSTER_STATE_DIR", str(d))
    yield d


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # Never touch the developer's own run store from tests.
    if "FTCLUSTER_STATE_DIR" not in os.environ:
        monkeypatch.setenv("FTCLUSTER_STATE_DIR", str(tmp_path_factory.mktemp("ftc-state")))


# What runs leave in /dev/shm when something was killed: Open MPI's segments (5.x, 4.x), the
# python backend's regions, and entries under a run's own prefix.
SHM_KINDS = ("sm_segment.", "vader_segment.", "triton_python_backend_shm_region", "ftc+")
SHM_LEFT: list[tuple[str, list[str]]] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Which test left what in /dev/shm (the test bed's nodes share it), named at the end."""
    before = set(os.listdir("/dev/shm"))
    yield
    left = sorted(n for n in set(os.listdir("/dev/shm")) - before if n.startswith(SHM_KINDS))
    if left:
        SHM_LEFT.append((item.nodeid, left))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name every test-bed daemon the supervisor had to restart (a crash the tests survived is
    still a finding), and every test after which /dev/shm held more of what runs leave."""
    from tests.cluster.fixtures import SESSION_RESTARTS

    if SHM_LEFT:
        terminalreporter.section("left in /dev/shm, by test")
        for nodeid, names in SHM_LEFT:
            terminalreporter.line(f"{nodeid}: {' '.join(names)}")
    if not SESSION_RESTARTS:
        return
    terminalreporter.section("test bed: daemons restarted by the supervisor")
    for r in SESSION_RESTARTS:
        terminalreporter.line(f"{r['name']}: pid {r['old_pid']} was gone, restarted as {r['new_pid']}; "
                              f"its log ended: {r['last_log']!r}")
