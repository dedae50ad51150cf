"""What does ftcluster add to a 2-node launch on the Pyxis path (real Enroot + Pyxis on the
Slurm test cluster), against the FT backend README's hand recipe?

    python bench/pyxis_launch_overhead.py [--repeats 5] [--nodes 2]

Needs the test bed with Pyxis (tests/pyxis/install.sh) and the test image's squashfs (made by
the Pyxis tests: tests/pyxis/image.py). Per repeat, in one run, measured as
bench/launch_overhead.py does (an independent poller; overhead = wall - tritonserver's own
start-up - the client):
- `ftcluster launch` on `runtime: pyxis`, with and without the MPI check (both create the
  named container on every node, prove the step ran in the image, and remove the container
  on every node at the end);
- the hand recipe: sbatch a script that sruns tritonserver with --container-image/-mounts/-name
  on every node (`--mpi=pmix`), polls rank 0 with curl every 50 ms, runs the same client on the
  host, ends the servers' step (scancel --signal=KILL JOB.0) and removes its named containers
  (`srun enroot remove`): the end state ftcluster leaves (Pyxis's default container_scope=global
  keeps them otherwise).
Both public (access: cluster): the hand recipe has no proxy in front.
Prints medians and the ratio ftcluster / hand recipe.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report
import yaml  # noqa: E402
from launch_overhead import COLUMNS, PHASES, ftcluster_once  # noqa: E402

from ftcluster.spec.defaults import embedded_model_path  # noqa: E402
from ftcluster.spec.load import load_model  # noqa: E402
from tests.pyxis import bed, image  # noqa: E402

TRITON = "/opt/tritonserver/bin/tritonserver"
DEMO_CHECKPOINT = ROOT / "ftcluster" / "demo" / "checkpoint"

HAND = """\
#!/bin/bash
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --output={out}/slurm-%j.out
echo $(date +%s.%N) > {out}/script_start
srun --mpi=pmix --ntasks-per-node=1 --container-image={sqsh} --container-mounts={mounts} \\
  --container-name={name} bash -c 'echo $(date +%s.%N) > {out}/rank$SLURM_PROCID.start; exec {triton} --model-repository={repo} --http-port=8000 --id=hand-$SLURM_PROCID' &
until curl -fsS -m 2 -o /dev/null http://$(hostname):8000/v2/models/{model}/ready; do sleep 0.05; done
echo $(date +%s.%N) > {out}/ready
echo $(date +%s.%N) > {out}/client_start
{python} -m ftcluster.client identity --url $(hostname):8000 --model {model} > {out}/client.log 2>&1
echo $(date +%s.%N) > {out}/client_end
# The same end state as ftcluster's: the servers' step ended, then the named containers removed.
scancel --signal=KILL $SLURM_JOB_ID.0
wait
srun --ntasks-per-node=1 enroot remove -f pyxis_{name}
"""


def hand_once(tmp: Path, repo: Path, nodes: int, model: str, sqsh: Path, i: int) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(dir=tmp))
    script = out / "hand.sbatch"
    mounts = f"{DEMO_CHECKPOINT}:{DEMO_CHECKPOINT}:ro,{repo.parent}:{repo.parent},{out}:{out}"
    script.write_text(HAND.format(nodes=nodes, out=out, sqsh=sqsh, mounts=mounts, name=f"hand-{os.getpid()}-{i}",
                                  triton=TRITON, repo=repo, model=model, python=sys.executable))
    t0 = time.time()
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True).stdout.strip()
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        time.sleep(0.05)
    wall = time.time() - t0
    f = {name: float((out / name).read_text())
         for name in ("ready", "client_start", "client_end", "rank0.start", "script_start")}
    return {"wall": wall, "server_startup": f["ready"] - f["rank0.start"],
            "client": f["client_end"] - f["client_start"],
            "overhead": wall - (f["ready"] - f["rank0.start"]) - (f["client_end"] - f["client_start"]),
            "pre_submit": 0.0, "batch_start": f["script_start"] - t0, "to_rank0": f["rank0.start"] - f["script_start"],
            "after_client": t0 + wall - f["client_end"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=2)
    args = ap.parse_args()
    from tests.cluster.testbed import running_testbed

    sqsh = image.sqsh_path()
    if not sqsh.is_file():
        sys.exit(f"no {sqsh}: run the Pyxis tests once (tests/integration/test_pyxis_launch.py)")
    with running_testbed() as tb:
        if not tb.pyxis:
            sys.exit("the running test bed has no Pyxis: python -m tests.cluster down, then up")
        tmp = Path(tempfile.mkdtemp(prefix="ftc-bench-pyxis-"))
        os.environ["FTCLUSTER_STATE_DIR"] = str(tmp / "state")
        spec = {"name": "bench-pyxis", "scheduler": "slurm", "partition": "debug", "gpus_per_node": 1,
                "request_gpus": False, "exclusive": False, "workspace": str(tmp / "ws"), "access": "cluster",
                "container": {"runtime": "pyxis", "image": str(sqsh),
                              "mounts": [f"{DEMO_CHECKPOINT}:{DEMO_CHECKPOINT}:ro"]},
                "server": {"binary": TRITON, "ready_timeout": 120, "exit_grace": 10}}
        cluster_path = tmp / "cluster.yaml"
        cluster_path.write_text(yaml.safe_dump(spec))
        model = load_model(embedded_model_path())
        results: dict[str, list[dict[str, float]]] = {"ftcluster": [], "ftcluster+mpicheck": [], "hand": []}
        try:
            for i in range(args.repeats):
                results["ftcluster"].append(ftcluster_once(cluster_path, tmp / "ws", args.nodes, mpi_check=False))
                results["ftcluster+mpicheck"].append(
                    ftcluster_once(cluster_path, tmp / "ws", args.nodes, mpi_check=True))
                repo = sorted((tmp / "ws").glob("*/model_repository"))[-1]
                results["hand"].append(hand_once(tmp, repo, args.nodes, model.name, sqsh, i))
                bed.remove_leftovers(tb.nodes)   # the hand recipe's containers
                print(f"repeat {i + 1}/{args.repeats} done", file=sys.stderr)
        finally:
            bed.remove_leftovers(tb.nodes)
            shutil.rmtree(tmp, ignore_errors=True)
    med = report.medians(results)
    report.table(med, COLUMNS)
    report.table(med, PHASES)
    report.print_ratios(med, "overhead", [("ftcluster", "hand"), ("ftcluster+mpicheck", "hand")])
    report.print_json(med, repeats=args.repeats, nodes=args.nodes)

if __name__ == "__main__":
    main()
