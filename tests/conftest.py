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


# What runs leave when something was killed: in /dev/shm Open MPI's segments (5.x, 4.x), the
# python backend's regions and entries under a run's own prefix; in /tmp Open MPI's session
# folders, the python backend's folders and ftcluster's own.
LEFTOVER_KINDS = {"/dev/shm": ("sm_segment.", "vader_segment.", "triton_python_backend_shm_region", "ftc+"),
                  "/tmp": ("ompi.", "python_env_", "ftc-mpi.", "ftc-ranks-")}
LEFT: list[tuple[str, list[str]]] = []


def _leftovers() -> set[str]:
    found = set()
    for folder, kinds in LEFTOVER_KINDS.items():
        try:
            found |= {os.path.join(folder, n) for n in os.listdir(folder) if n.startswith(kinds)}
        except OSError:
            pass
    return found


# The fixtures that start or use the test bed. A test that takes one (directly or through
# another fixture) is marked `bed`; tests/run.sh runs the rest beside it, in a mount namespace
# with a /tmp and /dev/shm of their own, so each pass's leftovers are its own.
BED_FIXTURES = frozenset({"slurm_cluster", "sshd_nodes", "docker_nodes", "pyxis_bed"})


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if BED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.bed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Which test made what is still left at the end (the test bed's nodes share /dev/shm and
    /tmp with this machine), named in the session's summary."""
    before = _leftovers()
    yield
    made = sorted(_leftovers() - before)
    if made:
        LEFT.append((item.nodeid, made))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """How many tests this pass selected, for tests/run.sh (tests/selected.py): a run of the
    whole suite that selected almost none fails. $FTC_SELECTED: FD:DEVICE:INODE of its file."""
    fd, _, ident = os.environ.get("FTC_SELECTED", "").partition(":")
    try:
        # Only to run.sh's own file: a process that inherited the variable but not the
        # descriptor may hold another file at that number.
        st = os.fstat(int(fd))
        if f"{st.st_dev}:{st.st_ino}" == ident:
            os.write(int(fd), f"{session.testscollected}\n".encode())
    except (ValueError, OSError):
        pass


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name every test-bed daemon the supervisor had to restart (a crash the tests survived is
    still a finding), and what tests left in /dev/shm and /tmp that is still there."""
    from tests.cluster.fixtures import SESSION_RESTARTS

    still = _leftovers()
    left = [(nodeid, [p for p in paths if p in still]) for nodeid, paths in LEFT]
    if any(paths for _, paths in left):
        terminalreporter.section("left in /dev/shm and /tmp at the end, by the test that made it")
        for nodeid, paths in left:
            if paths:
                terminalreporter.line(f"{nodeid}: {' '.join(paths)}")
    if not SESSION_RESTARTS:
        return
    terminalreporter.section("test bed: daemons restarted by the supervisor")
    for r in SESSION_RESTARTS:
        terminalreporter.line(f"{r['name']}: pid {r['old_pid']} was gone, restarted as {r['new_pid']}; "
                              f"its log ended: {r['last_log']!r}")
