"""The teardown's sweep of a run's leftover server processes (scripts/kill_marked.sh), on real processes:
exactly those whose environment holds FTC_SERVER_OF=<this run>/..., whatever else is alike."""

from __future__ import annotations

import os
import subprocess
import time

from pathlib import Path

from tests.unit.test_render import render_style


def _kill_marked(tmp_path: Path) -> str:
    """The rendered script, as the job runs it: `bash kill_marked.sh RUN_ID GRACE`."""
    script = tmp_path / "kill_marked.sh"
    script.write_text(render_style("local").files["kill_marked.sh"])
    return str(script)


def _sleeper(entry: str) -> subprocess.Popen[bytes]:
    name, value = entry.split("=", 1)
    return subprocess.Popen(["sleep", "60"], env={**os.environ, name: value})


def test_only_the_runs_marked_processes_are_killed(tmp_path: Path) -> None:
    mine = [_sleeper("FTC_SERVER_OF=run-1.a/rank0/11"), _sleeper("FTC_SERVER_OF=run-1.a/rank1/12")]
    others = [_sleeper("FTC_SERVER_OF=run-1Xa/rank0/13"),      # '.' is no wildcard
              _sleeper("FTC_SERVER_OF=run-1.a2/rank0/14"),     # another run, same prefix
              _sleeper("XFTC_SERVER_OF=run-1.a/rank0/15")]     # not the mark
    try:
        time.sleep(0.1)
        subprocess.run(["bash", _kill_marked(tmp_path), "run-1.a"], check=True, timeout=30)
        for p in mine:
            assert p.wait(timeout=5) == -9
        assert all(p.poll() is None for p in others)
    finally:
        for p in mine + others:
            p.kill()
            p.wait()


def test_the_grace_ends_when_none_of_them_goes(tmp_path: Path) -> None:
    # A 3 s grace, two marked processes: one ends by itself within it (it is given the time), the
    # other never does (a stub blocked in its model's initialize): killed half a second after the
    # last one went, not at the end of the grace.
    going = subprocess.Popen(["sleep", "0.4"], env={**os.environ, "FTC_SERVER_OF": "run-2/rank0/1"})
    stuck = _sleeper("FTC_SERVER_OF=run-2/rank1/2")
    try:
        time.sleep(0.1)
        t0 = time.monotonic()
        subprocess.run(["bash", _kill_marked(tmp_path), "run-2", "30"], check=True,
                       timeout=30)
        took = time.monotonic() - t0
        assert going.wait(timeout=5) == 0 and stuck.wait(timeout=5) == -9
        assert 0.4 < took < 2.0, took
    finally:
        for p in (going, stuck):
            p.kill()
            p.wait()
