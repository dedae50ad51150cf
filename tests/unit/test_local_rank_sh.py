"""rank/local_rank.sh, as mpirun runs it for each rank of a local run: rank r's slice of the
GPUs, its output file, and the run's own wrapper run in the rank's very shell (". SCRIPT")."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ftcluster.resources import package_path

LOCAL_RANK = str(package_path("rank", "local_rank.sh"))


def _rank(r: int, pool: str | None, per_node: int, *cmd: str, out: str = "-") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_POOL", "CUDA_VISIBLE_DEVICES")}
    env.update({"OMPI_COMM_WORLD_RANK": str(r), "GPUS_PER_NODE": str(per_node)})
    if pool is not None:
        env["GPU_POOL"] = pool
    return subprocess.run(["bash", LOCAL_RANK, out, *cmd], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("pool,per_node,want", [
    ("0,1,2,3", 2, ["0,1", "2,3"]),
    ("4,5", 1, ["4", "5"]),
    ("", 1, ["", ""]),          # no GPUs: the ranks see none
    ("7", 2, ["7", ""]),        # fewer than the world asks: what there is, in order
])
def test_each_rank_sees_its_own_slice(pool: str, per_node: int, want: list[str]) -> None:
    got = [_rank(r, pool, per_node, "bash", "-c", 'printf "[%s]" "$CUDA_VISIBLE_DEVICES"').stdout for r in (0, 1)]
    assert got == [f"[{w}]" for w in want]


def test_a_sourced_script_runs_in_the_ranks_own_shell_with_its_arguments(tmp_path: Path) -> None:
    script = tmp_path / "wrapper.sh"
    script.write_text('printf "%s|" "$$" "$#" "$1" "$2" "$CUDA_VISIBLE_DEVICES" "${r-none}" "${pool-none}"\nexit 7\n')
    out = tmp_path / "rank{rank}.out"
    p = subprocess.Popen(["bash", LOCAL_RANK, str(out), ".", str(script), "a b", "c"],
                         env={**os.environ, "OMPI_COMM_WORLD_RANK": "1", "GPUS_PER_NODE": "1", "GPU_POOL": "3,4"})
    assert p.wait(30) == 7
    # The wrapper is the rank's process itself (what mpirun signals), not a child bash, and sees
    # none of local_rank.sh's own variables.
    assert (tmp_path / "rank1.out").read_text().split("|")[:-1] == [str(p.pid), "2", "a b", "c", "4", "none", "none"]


def test_a_rank_that_is_not_a_number_starts_nothing(tmp_path: Path) -> None:
    bad = subprocess.run(["bash", LOCAL_RANK, "-", "bash", "-c", "echo ran"], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "OMPI_COMM_WORLD_RANK": "$(touch PWNED)",
                                            "GPUS_PER_NODE": "1"})
    assert bad.returncode == 2 and "ran" not in bad.stdout and not (tmp_path / "PWNED").exists()
