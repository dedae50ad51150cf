"""An MPI program beneath a local rank: a python-backend model that initialises MPI itself with
mpi4py (as independently written FT-faithful models do) joins the ranks' world and completes its
collectives over Open MPI's default transports (shared memory included), then serves."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch_helpers import launch_json, write_cluster

pytestmark = pytest.mark.triton

# Before the test model joins the world through ctmpi: mpi4py's MPI_Init, a 4 MiB broadcast (large
# enough for shared memory's rendezvous path) and an allreduce, each checked on every rank.
_MPI4PY = '''        from mpi4py import MPI as _MPI
        _c = _MPI.COMM_WORLD
        _blob = _c.bcast(bytes(range(256)) * 16384 if _c.Get_rank() == 0 else None)
        _total = _c.allreduce(_c.Get_rank() + 1)
        _want = _c.Get_size() * (_c.Get_size() + 1) // 2
        print(f"mpi4py rank {_c.Get_rank()}/{_c.Get_size()} bcast {len(_blob)} {_blob == bytes(range(256)) * 16384} "
              f"allreduce {_total == _want}", file=sys.stderr, flush=True)
'''


def _mpi4py_model(folder: Path) -> Path:
    """The embedded test model, copied, with mpi4py initialising MPI first in `initialize`."""
    demo = Path(__file__).resolve().parents[2] / "ftcluster" / "demo"
    shutil.copytree(demo / "checkpoint", folder / "checkpoint")
    shutil.copytree(demo / "model_repository", folder / "model_repository", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__"))
    model = folder / "model_repository" / "fastertransformer" / "1" / "model.py"
    text = model.read_text()
    anchor = "        self.world = ctmpi.World()\n"
    assert anchor in text
    model.write_text(text.replace(anchor, _MPI4PY + anchor, 1))
    shutil.copy(demo / "model.yaml", folder / "model.yaml")
    return folder / "model.yaml"


def test_an_mpi4py_model_completes_its_collectives_under_local_ranks(tmp_path: Path) -> None:
    # Which MPI, without initialising it (a singleton Open MPI 5 leaves its segment in /dev/shm).
    probe = subprocess.run([sys.executable, "-c", "import mpi4py; mpi4py.rc.initialize = False; "
                            "from mpi4py import MPI; print(MPI.Get_library_version())"],
                           capture_output=True, text=True, check=False)
    if probe.returncode:
        pytest.skip("mpi4py is not importable here")
    if "Open MPI" not in probe.stdout:
        pytest.skip(f"mpi4py is not on Open MPI here: {probe.stdout[:80]}")
    model = _mpi4py_model(tmp_path / "m")
    # No OMPI_MCA_btl in the environment: Open MPI's default transports, shared memory first.
    cluster = write_cluster(tmp_path)
    rc, out, err = launch_json(cluster, "--nodes", "3", model=model)
    assert rc == 0, (out, err[-3000:])
    run_dir = Path(out["run_dir"])
    lines = sorted(line for log in (run_dir / "logs").glob("server-rank*.log")
                   for line in log.read_text().splitlines() if line.startswith("mpi4py rank"))
    assert lines == [f"mpi4py rank {r}/3 bcast 4194304 True allreduce True" for r in range(3)], lines
