"""A rank's way from mpirun to its server: the run's own wrappers against `mpirun bash -c 'exec server'`.

    python bench/rank_start.py [--repeats 9] [--nodes 2]

One local launch (untimed) writes a run folder; its scripts/ are then started as the local
style starts them (mpirun -np N bash local_rank.sh OUT . rank_server.sh), with the run's server
binary replaced by a stand-in that records when it was exec'd (and answers --help as a
tritonserver does), interleaved per repeat with mpirun starting the same stand-in directly.
Prints, per rank, the medians of mpirun's start -> the server's exec, and the wrappers' cost
over the bare start.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import launch_vs_bare  # noqa: E402
import report  # noqa: E402

STAND_IN = """#!/bin/bash
if [ "${1:-}" = --help ]; then echo "--model-repository --metrics-config"; exit 0; fi
printf '%s' "$EPOCHREALTIME" > "$BENCH_OUT/exec.$FTC_RANK"
"""


def one_world(argv: list[str], out: Path, env: dict[str, str], nodes: int) -> list[float]:
    out.mkdir(parents=True)
    t0 = time.time()
    subprocess.run(argv, env={**env, "BENCH_OUT": str(out)}, capture_output=True, timeout=120, check=False)
    return [float((out / f"exec.{r}").read_text()) - t0 for r in range(nodes)]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--nodes", type=int, default=2)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ftc-bench-"))
    os.environ.setdefault("FTCLUSTER_STATE_DIR", str(tmp / "state"))
    try:
        cluster = tmp / "cluster.yaml"
        launch_vs_bare.write_cluster(cluster, tmp, 1)
        _, run = launch_vs_bare.ftcluster_once(cluster, launch_vs_bare.embedded_model_path(), args.nodes, 1, {})
        stand_in = tmp / "server"
        stand_in.write_text(STAND_IN)
        stand_in.chmod(0o755)
        job = json.loads((run / "scripts" / "job.json").read_text())
        env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
               "GPUS_PER_NODE": "1", "GPU_POOL": ",".join(map(str, range(args.nodes))),
               "FTC_RANK_HOST": "127.0.0.1", "FTC_INCARNATION": "0"}
        mpi = [job["mpirun"], "-np", str(args.nodes), "--oversubscribe", "--bind-to", "none",
               "-x", "GPUS_PER_NODE", "-x", "GPU_POOL", "-x", "FTC_INCARNATION", "-x", "BENCH_OUT"]
        got: dict[str, list[list[float]]] = {"wrappers": [], "bare": []}
        for i in range(args.repeats):
            # A fresh copy of the run's scripts each time: its state/ and logs/ as a first start finds them.
            d = tmp / f"run{i}"
            shutil.copytree(run / "scripts", d / "scripts")
            (d / "model_repository").mkdir()
            wrapper = (d / "scripts" / "rank_server.sh").read_text().replace(str(run), str(d))
            wrapper = re.sub(r"^TRITON=.*$", f"TRITON={stand_in}", wrapper, flags=re.M)
            (d / "scripts" / "rank_server.sh").write_text(wrapper)
            local_rank = d / "scripts" / "local_rank.sh"
            # A run folder of a version before `. SCRIPT` started its wrapper with a bash of its own.
            how = "." if '"${1:-}" = .' in local_rank.read_text() else "bash"
            got["wrappers"].append(one_world([*mpi, "bash", str(local_rank), str(d / "logs" / "rank{rank}.stdout"),
                                              how, str(d / "scripts" / "rank_server.sh")], d / "out", env, args.nodes))
            got["bare"].append(one_world([*mpi, "bash", "-c", f"FTC_RANK=$OMPI_COMM_WORLD_RANK exec {stand_in}"],
                                         tmp / f"bare{i}", env, args.nodes))
            for e in Path("/dev/shm").glob(f"ftc+{run.name}+*"):
                shutil.rmtree(e, ignore_errors=True)
        med = {k: {f"rank{r}_ms": 1000 * statistics.median(x[r] for x in v) for r in range(args.nodes)}
               for k, v in got.items()}
        report.table(med, [(f"rank{r}_ms", f"mpirun -> rank {r}'s server ms", ".1f") for r in range(args.nodes)])
        over = {f"rank{r}_ms": med["wrappers"][f"rank{r}_ms"] - med["bare"][f"rank{r}_ms"] for r in range(args.nodes)}
        print("the wrappers' cost over the bare start: "
              + ", ".join(f"rank {r} {over[f'rank{r}_ms']:.1f} ms" for r in range(args.nodes)))
        report.print_json(med, over=over, repeats=args.repeats, nodes=args.nodes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
