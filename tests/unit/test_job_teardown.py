"""The job scripts' teardown runs to its end: a SIGTERM that arrived after the last interrupt
point (INTERRUPTED=1 when the EXIT trap starts the teardown) must not end it at its first nap,
which skipped containers_down and the `done` event."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.unit.test_render import render_style


@pytest.mark.parametrize("style", ["local", "none", "pyxis", "docker", "ssh_docker"])
def test_a_late_interrupt_does_not_cut_the_teardown_short(style: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    scripts = render_style(style, run_dir=run_dir, server={"exit_grace": 1})
    name = "job.sh" if style in ("local", "ssh_docker") else "job.sbatch"
    text = scripts.files[name]
    head, sep, _ = text.partition("\ntrap cleanup EXIT\n")
    assert sep, "the job script no longer installs its teardown as this test expects"
    (run_dir / "state").mkdir(parents=True)
    probe = tmp_path / "containers_down.ran"
    # The script's own functions; a live "server" so that stop_rank0 waits (naps) for rank 0;
    # the hook that must still run afterwards; then the late signal's flag, and the exit.
    body = f"""{head}
sleep 30 >/dev/null 2>&1 &
SERVER_PID=$!
SLURM_JOB_ID=1
MPIRUN_PID=$SERVER_PID
MPI_TMP=$(mktemp -d)
servers_alive() {{ kill -0 "$SERVER_PID" 2>/dev/null; }}
term_rank0() {{ :; }}
kill_server_step() {{ kill -KILL "$SERVER_PID"; }}
scancel() {{ return 1; }}
containers_down() {{ : >{str(probe)!r}; }}
trap cleanup EXIT
INTERRUPTED=1
exit 0
"""
    job = tmp_path / "job"
    job.write_text(body)
    r = subprocess.run(["bash", str(job)], capture_output=True, text=True, timeout=60, check=False)
    events_file = run_dir / "state" / "events"
    events = events_file.read_text().split("\n") if events_file.exists() else [f"0 none {r.stderr[-2000:]}"]
    kinds = [line.split(" ", 2)[1] for line in events if line]
    assert "done" in kinds and probe.exists(), (r.returncode, kinds, r.stderr[-2000:])
    assert r.returncode == 0
