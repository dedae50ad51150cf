"""run_local_ranks with real processes: per-rank env, output files, and nothing left behind."""

from __future__ import annotations

import _thread
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from ftcluster.schedulers.local_ranks import gpu_slices, run_local_ranks

# Each rank records its pid and a child's pid, so the test can prove both are gone.
SPAWN = """
import os, subprocess, sys, time
d, r = sys.argv[1], int(os.environ["FTC_RANK"])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(os.path.join(d, f"pids-{r}"), "w").write(f"{os.getpid()} {child.pid}")
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _assert_all_gone(d: Path, ranks: int) -> None:
    pids = [int(p) for r in range(ranks) for p in (d / f"pids-{r}").read_text().split()]
    deadline = time.monotonic() + 5
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]


def _wait_for_pidfiles(d: Path, ranks: int) -> str:
    # Ranks must not die before writing their pid files (else the test proves nothing).
    return (f"import glob, time\nwhile len(glob.glob(os.path.join(d, 'pids-*'))) < {ranks}: "
            "time.sleep(0.02)\n")


@pytest.fixture(autouse=True)
def _no_inherited_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_env_per_rank_and_output_files(tmp_path: Path) -> None:
    code = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
            "['FTC_RANK','FTC_WORLD_SIZE','FTC_LOCAL_RANK','FTC_MASTER_ADDR','FTC_MASTER_PORT',"
            "'CUDA_VISIBLE_DEVICES','NCCL_NVLS_ENABLE','TORCH_SYMM_MEM_DISABLE_MULTICAST',"
            "'NVSHMEM_DISABLE_NVLS','EXTRA']})); import sys; print('err', file=sys.stderr)")
    results = run_local_ranks([sys.executable, "-c", code], 3, 2,
                              env={"EXTRA": "x y", "NCCL_NVLS_ENABLE": "1"}, timeout=60,
                              log_dir=tmp_path / "logs")
    assert [r.rank for r in results] == [0, 1, 2]
    envs = [json.loads(r.stdout()) for r in results]
    assert all(r.ok and not r.killed for r in results)
    assert [e["FTC_RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["FTC_WORLD_SIZE"] for e in envs} == {"3"}
    assert {e["FTC_LOCAL_RANK"] for e in envs} == {"0"}
    assert {e["FTC_MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert len({e["FTC_MASTER_PORT"] for e in envs}) == 1
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "2,3", "4,5"]
    # NVLS stays off even when the caller asks otherwise.
    assert {e["NCCL_NVLS_ENABLE"] for e in envs} == {"0"}
    assert {e["TORCH_SYMM_MEM_DISABLE_MULTICAST"] for e in envs} == {"1"}
    assert {e["NVSHMEM_DISABLE_NVLS"] for e in envs} == {"1"}
    assert {e["EXTRA"] for e in envs} == {"x y"}
    assert results[1].stdout_path == tmp_path / "logs" / "rank-1.out"
    assert results[2].stderr().strip() == "err"


def test_gpu_slices_from_visible_devices() -> None:
    assert gpu_slices(2, 2, "4,5,6,7") == ["4,5", "6,7"]
    assert gpu_slices(2, 1, None) == ["0", "1"]
    with pytest.raises(ValueError, match="need 4 GPUs"):
        gpu_slices(2, 2, "0,1")
    with pytest.raises(ValueError):
        gpu_slices(1, 1, "")


def test_no_gpu_slices_leaves_cuda_visible_devices_alone(tmp_path: Path) -> None:
    code = "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'))"
    res = run_local_ranks([sys.executable, "-c", code], 2, None, timeout=60, log_dir=tmp_path)
    assert [r.stdout().strip() for r in res] == ["None", "None"]


def test_failing_rank_kills_the_others(tmp_path: Path) -> None:
    code = SPAWN + _wait_for_pidfiles(tmp_path, 3) + (
        "if r == 1:\n    sys.exit(3)\ntime.sleep(120)\n")
    t0 = time.monotonic()
    results = run_local_ranks([sys.executable, "-c", code, str(tmp_path)], 3, None,
                              timeout=100, grace=2, log_dir=tmp_path / "logs")
    assert time.monotonic() - t0 < 30
    assert results[1].returncode == 3 and not results[1].killed
    for r in (results[0], results[2]):
        assert r.killed and r.returncode < 0 and not r.timed_out
    _assert_all_gone(tmp_path, 3)


def test_timeout_kills_all_even_when_sigterm_is_ignored(tmp_path: Path) -> None:
    code = SPAWN + _wait_for_pidfiles(tmp_path, 2) + (
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)\n")
    t0 = time.monotonic()
    results = run_local_ranks([sys.executable, "-c", code, str(tmp_path)], 2, None,
                              timeout=1.5, grace=0.5, log_dir=tmp_path / "logs")
    assert time.monotonic() - t0 < 30
    assert all(r.timed_out and r.killed for r in results)
    assert all(r.returncode == -9 for r in results)  # SIGKILL after the grace
    _assert_all_gone(tmp_path, 2)


def test_interrupt_kills_all(tmp_path: Path) -> None:
    code = SPAWN + "time.sleep(120)\n"
    def interrupt() -> None:
        while len(list(tmp_path.glob("pids-*"))) < 2:
            time.sleep(0.02)
        _thread.interrupt_main()

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_local_ranks([sys.executable, "-c", code, str(tmp_path)], 2, None, timeout=100,
                        grace=1, log_dir=tmp_path / "logs")
    _assert_all_gone(tmp_path, 2)


def test_successful_rank_leaves_no_children(tmp_path: Path) -> None:
    code = SPAWN  # exits 0 at once, its sleeping child still in its process group
    results = run_local_ranks([sys.executable, "-c", code, str(tmp_path)], 2, None, timeout=60,
                              log_dir=tmp_path / "logs")
    assert all(r.ok for r in results)
    _assert_all_gone(tmp_path, 2)
    assert os.getpgrp() != results[0].pid
