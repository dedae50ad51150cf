"""A workspace that takes no more (full, or a file size limit) and a run store that cannot be
used (full, or damaged): one line naming the place and the fix, exit 3, nothing submitted and
nothing left behind; never a traceback."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ftcluster.errors import os_error_words

FSIZE = 16 << 10   # a run folder's model repository holds larger files; the store is smaller


def ftc(*args: str, tmp: Path, fsize: int | None = None) -> subprocess.CompletedProcess[str]:
    def limit() -> None:   # CPython ignores SIGXFSZ: a write past the limit is an EFBIG OSError
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    env = {**os.environ, "FTCLUSTER_STATE_DIR": str(tmp / "state"), "HOME": str(tmp / "home")}
    return subprocess.run([sys.executable, "-m", "ftcluster", *args], capture_output=True, text=True, timeout=120,
                          env=env, preexec_fn=limit, check=False, cwd=tmp)


def test_a_cache_that_takes_no_more(tmp_path: Path) -> None:
    # The CPU tritonserver is laid out in the user's cache on first use.
    r = ftc("launch", "--nodes", "2", tmp=tmp_path, fsize=FSIZE)
    assert r.returncode == 3 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: server.binary: cannot set up the CPU tritonserver in {tmp_path}/home/.cache/"
                               "ftcluster: "), r.stderr
    assert "File too large" in r.stderr and "point FTCLUSTER_CACHE at a folder with room" in r.stderr
    assert [p.name for p in (tmp_path / "home" / ".cache" / "ftcluster").iterdir() if p.name.startswith(
        (".tritonserver", "tritonserver"))] == []   # no half-built bundle left
    assert not (tmp_path / "home" / "ftcluster-runs").exists() or not any((tmp_path / "home" / "ftcluster-runs").iterdir())


def test_a_workspace_that_takes_no_more(tmp_path: Path) -> None:
    # The CPU tritonserver laid out in the cache first, with room.
    subprocess.run([sys.executable, "-c", "from ftcluster.service.triton_local import find_tritonserver; find_tritonserver()"],
                   env={**os.environ, "HOME": str(tmp_path / "home")}, check=True, timeout=120)
    r = ftc("launch", "--nodes", "2", tmp=tmp_path, fsize=FSIZE)
    assert r.returncode == 3 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: workspace: cannot write the run folder {tmp_path}/home/ftcluster-runs/")
    assert ": File too large (and " in r.stderr and "; nothing was submitted (free space there" in r.stderr
    assert list((tmp_path / "home" / "ftcluster-runs").iterdir()) == []
    listed = ftc("list", tmp=tmp_path)
    assert listed.returncode == 0 and "no runs yet" in listed.stdout + listed.stderr


@pytest.mark.parametrize("command", [["list"], ["status"], ["launch", "--nodes", "1"]])
def test_a_damaged_run_store(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "runs.sqlite").write_text("not a database, whatever it was\n" * 200)
    r = ftc(*command, tmp=tmp_path)
    assert r.returncode == 3 and r.stderr == (
        f"error: FTCLUSTER_STATE_DIR: the run store {tmp_path}/state/runs.sqlite cannot be used: file is not a "
        "database (free space there, move a damaged file aside (the run folders stay), or point "
        "FTCLUSTER_STATE_DIR at another folder)\n"), r.stderr
    assert not (tmp_path / "home" / "ftcluster-runs").exists() or not any((tmp_path / "home" / "ftcluster-runs").iterdir())


def test_a_copy_s_failures_in_words(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a", "b"):   # links to nothing: copytree gathers each failure into one shutil.Error
        (src / name).symlink_to(tmp_path / f"no-{name}")
    with pytest.raises(shutil.Error) as caught:
        shutil.copytree(src, tmp_path / "dst")
    said = os_error_words(caught.value)   # the first failure, in the order the folder lists them
    assert said in (f"{tmp_path}/dst/{n}: No such file or directory (and 1 more)" for n in "ab"), said
    with pytest.raises(OSError) as plain:
        open(tmp_path / "nowhere" / "x")
    assert os_error_words(plain.value) == f"{tmp_path}/nowhere/x: No such file or directory"
