"""FT's rank protocol on the local style, for real (one mpirun world of CPU tritonservers with the
faithful test model): every rank's death or hang is named, every rank stopped, nothing left."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch_helpers import (
    ftcluster,
    launch_json,
    processes_matching,
    rank_exit,
    wait_for,
    write_cluster,
)

pytestmark = pytest.mark.triton


def _nothing_left(run_id: str) -> None:
    assert wait_for(lambda: not processes_matching(run_id), 15), processes_matching(run_id)


@pytest.mark.parametrize(("fault", "rank", "code", "phase"), [
    ("FTCLUSTER_TEST_BREAK_NODE", "1", "1", "during start-up"),       # rank k dies in load
    ("FTCLUSTER_TEST_DIE_NODE", "1", "137", "during the client run"),  # rank k dies mid-request
    ("FTCLUSTER_TEST_DIE_NODE", "0", "137", "during the client run"),  # rank 0 dies
])
def test_a_dying_rank_is_named_and_every_rank_stopped(tmp_path: Path, fault: str, rank: str, code: str,
                                                      phase: str) -> None:
    cluster = write_cluster(tmp_path, env={fault: f"rank{rank}"})
    t0 = time.monotonic()
    rc, out, err = launch_json(cluster, "--nodes", "3")
    assert rc == 1 and out["ok"] is False, err
    assert (out["failed_rank"]["rank"], out["failed_rank"]["node"]) == (rank, "127.0.0.1"), out
    if out["failed_rank"]["exit_code"] == "?":
        # The test model's MPI process is the python stub, which can end before its server does:
        # mpirun then ends the whole world, the dying rank's wrapper too, before it records its
        # exit. The rank is named from its log's first error instead.
        assert out["failure"].startswith(f"rank {rank} on 127.0.0.1 failed {phase} (the step was ended with it)"), \
            out["failure"]
    else:
        assert out["failed_rank"]["exit_code"] == code, out
        assert out["failure"].startswith(f"rank {rank} on 127.0.0.1 exited (code {code}) {phase}"), out["failure"]
        assert rank_exit(Path(out["run_dir"]), int(rank)) == (code, "died")
        if phase == "during start-up":
            # What the server said of why it ended, its error's own line (no Python traceback).
            assert out["failure"].endswith(f": failed to load 'fastertransformer' version 1: Internal: RuntimeError: "
                                           f"FTCLUSTER_TEST_BREAK_NODE: test model refuses to load on rank {rank} "
                                           f"({socket.gethostname()})"), out["failure"]
    assert time.monotonic() - t0 < 30
    _nothing_left(out["run_id"])


def test_a_rank_that_hangs_before_joining_the_world_is_named(tmp_path: Path) -> None:
    cluster = write_cluster(tmp_path, env={"FTCLUSTER_TEST_HANG_NODE": "rank2"}, server={"ready_timeout": 6})
    rc, out, err = launch_json(cluster, "--nodes", "3")
    assert rc == 1
    failure = out["failure"]
    assert failure.startswith("not ready after 6s (server.ready_timeout): "), failure
    # Every rank waits in MPI_Init for the missing one, so none has loaded; rank 2 is named with them.
    assert "rank 2 on 127.0.0.1 never reached model load" in failure, failure
    _nothing_left(out["run_id"])


def test_a_rank_dying_while_serving_ends_the_run(tmp_path: Path) -> None:
    # Rank 1 dies 3 s after loading, while the run serves with no client attached; no restarts
    # (test_liveness.py has the restarts).
    cluster = write_cluster(tmp_path, env={"FTCLUSTER_TEST_DIE_NODE": "rank1@3"}, server={"restarts": 0})
    rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--no-client")
    assert rc == 0 and out["ok"], err
    run_dir = Path(out["run_dir"])
    assert wait_for(lambda: rank_exit(run_dir, 1) is not None, 20)
    assert wait_for(lambda: json.loads(ftcluster("status", out["run_id"], "--json").stdout)["state"] != "RUNNING", 10)
    status = json.loads(ftcluster("status", out["run_id"], "--json").stdout)
    assert status["failure"] == "rank 1 on 127.0.0.1 exited (code 137) while serving", status
    assert (status["ranks"][1]["state"], status["ranks"][1]["exit_code"]) == ("died", 137)
    _nothing_left(out["run_id"])


def test_ctrl_c_while_ranks_are_stuck_in_load(tmp_path: Path) -> None:
    cluster = write_cluster(tmp_path, env={"FTCLUSTER_TEST_HANG_NODE": "rank1"})
    proc = subprocess.Popen([sys.executable, "-m", "ftcluster", "launch", "--cluster", str(cluster), "--nodes", "2",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ws = tmp_path / "ws"
    assert wait_for(lambda: any(ws.glob("*/state/rank1.host")) and any(ws.glob("*/state/rank0.host")), 60)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "interrupted" in err and "cancelled" in err
    run_id = next(ws.iterdir()).name
    _nothing_left(run_id)
