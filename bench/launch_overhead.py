"""What does ftcluster add to a 2-node launch on the real Slurm test cluster?

    python bench/launch_overhead.py [--repeats 5] [--nodes 2]

Per repeat, in one run:
- `ftcluster launch` (bare Slurm style, FT-shaped test model, with and without the MPI check)
  while an independent poller asks rank 0 every 10 ms whether it is ready (our --id, model
  ready). ftcluster's overhead = launch wall time - tritonserver's own start-up (rank 0's
  wrapper start -> first ready answer to the poller) - the client's run time. Readiness lag =
  the moment the launcher saw `ready` - the poller's first ready answer.
- a baseline: the hand recipe (sbatch a script that sruns tritonserver on every node, polls
  rank 0 with curl every 50 ms, runs the same client with srun --overlap, scancels itself),
  timed from sbatch to the end of the job; its overhead is computed the same way.
Prints medians and the ratio ftcluster / hand recipe.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report
import yaml  # noqa: E402

from ftcluster.run.events import parse_events  # noqa: E402
from ftcluster.launch.run import Launch, LaunchOptions  # noqa: E402
from ftcluster.engines import make_plan  # noqa: E402
from ftcluster.spec.defaults import embedded_model_path  # noqa: E402
from ftcluster.spec.load import load_cluster, load_model  # noqa: E402
from ftcluster.service.triton_local import find_tritonserver  # noqa: E402
from ftcluster.client.ready import ours_ready

# The columns every launch-overhead bench prints (metric, header, format).
COLUMNS = [("wall", "wall s", ".2f"), ("server_startup", "server s", ".2f"), ("client", "client s", ".2f"),
           ("overhead", "overhead s", ".2f")]
# Where the overhead goes, from the events (where a variant has them): until the job is
# submitted, until its batch script runs, until rank 0's server starts, from the first ready
# answer until the launcher (or the recipe) saw it, from the client's end to the command's.
PHASES = [("pre_submit", "submit s", ".2f"), ("batch_start", "batch s", ".2f"), ("to_rank0", "to rank0 s", ".2f"),
          ("ready_seen", "ready seen s", ".2f"), ("after_client", "after client s", ".2f")]


class Poller(threading.Thread):
    """Every 10 ms, independently of ftcluster, the readiness FT allows: rank 0 answers as ours
    (its --id) with the model ready, and every other rank's server log holds FT's
    model-instance line (those ranks never answer HTTP). Records when it first holds."""

    def __init__(self, ws: Path, model: str, nodes: int, port: int = 8000):
        super().__init__(daemon=True)
        self.ws, self.model, self.nodes, self.port = ws, model, nodes, port
        self.first_ready: float | None = None
        self.stop = threading.Event()

    def _ready(self) -> bool:
        runs = sorted(self.ws.glob("*/state")) if self.ws.exists() else []
        if not runs:
            return False
        state, run_id = runs[-1], runs[-1].parent.name
        host_file = state / "rank0.host"
        if not host_file.is_file() or not host_file.read_text().strip():
            return False
        if not ours_ready(host_file.read_text().strip(), self.port, f"ftc-{run_id}-rank0", self.model, 0.5):
            return False
        for r in range(1, self.nodes):
            log = state.parent / "logs" / f"server-rank{r}.log"
            if not log.is_file() or b") (instance_id " not in log.read_bytes():
                return False
        return True

    def run(self) -> None:
        while not self.stop.is_set() and self.first_ready is None:
            if self._ready():
                self.first_ready = time.time()
                return
            time.sleep(0.01)


def ftcluster_once(cluster_path: Path, ws: Path, nodes: int, mpi_check: bool) -> dict[str, float]:
    cluster = load_cluster(cluster_path)
    model = load_model(embedded_model_path())
    seen: dict[str, float] = {}

    def progress(phase: str, t: float, detail: str) -> None:
        seen.setdefault(phase, time.time())

    poller = Poller(ws, model.name, nodes)
    poller.start()
    t0 = time.time()
    plan = make_plan(cluster, model, nodes)
    outcome = Launch(cluster, model, plan, LaunchOptions(mpi_check=mpi_check), progress=progress).run()
    wall = time.time() - t0
    poller.stop.set()
    poller.join()
    assert outcome.ok, outcome.failure
    run = Path(outcome.record.run_dir)
    events = {e.kind: e.time for e in parse_events((run / "state" / "events").read_text())}
    rank0_start = (run / "state" / "rank0.host").stat().st_mtime
    assert poller.first_ready is not None
    server_startup = poller.first_ready - rank0_start
    client = events["client_done"] - events["client_started"]
    return {"wall": wall, "server_startup": server_startup, "client": client,
            "overhead": wall - server_startup - client,
            "lag_script_ms": (events["ready"] - poller.first_ready) * 1000,
            "lag_launcher_ms": (seen["ready"] - poller.first_ready) * 1000,
            "pre_submit": seen["submitted"] - t0, "batch_start": events["job_started"] - seen["submitted"],
            "to_rank0": rank0_start - events["job_started"], "ready_seen": seen["ready"] - poller.first_ready,
            "after_client": t0 + wall - events["client_done"]}


HAND = """\
#!/bin/bash
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --output={out}/slurm-%j.out
srun --mpi=pmix --ntasks-per-node=1 bash -c 'echo $(date +%s.%N) > {out}/rank$SLURM_PROCID.start; exec {triton} --model-repository={repo} --http-port=8000 --id=hand-$SLURM_PROCID' &
until curl -fsS -m 2 -o /dev/null http://$(hostname):8000/v2/models/{model}/ready; do sleep 0.05; done
echo $(date +%s.%N) > {out}/ready
echo $(date +%s.%N) > {out}/client_start
srun --overlap -N1 -n1 -w $(hostname) {python} -m ftcluster.client identity --url $(hostname):8000 --model {model} > {out}/client.log 2>&1
echo $(date +%s.%N) > {out}/client_end
scancel --signal=TERM $SLURM_JOB_ID
wait
"""


def hand_once(tmp: Path, repo: Path, nodes: int, model: str) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(dir=tmp))
    script = out / "hand.sbatch"
    script.write_text(HAND.format(nodes=nodes, out=out, triton=find_tritonserver(), repo=repo, model=model,
                                  python=sys.executable))
    t0 = time.time()
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True).stdout.strip()
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        time.sleep(0.05)
    wall = time.time() - t0
    f = {name: float((out / name).read_text()) for name in ("ready", "client_start", "client_end", "rank0.start")}
    server_startup = f["ready"] - f["rank0.start"]
    client = f["client_end"] - f["client_start"]
    return {"wall": wall, "server_startup": server_startup, "client": client,
            "overhead": wall - server_startup - client}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=2)
    args = ap.parse_args()
    from tests.cluster.testbed import running_testbed

    with running_testbed():
        tmp = Path(tempfile.mkdtemp(prefix="ftc-bench-"))
        os.environ["FTCLUSTER_STATE_DIR"] = str(tmp / "state")
        spec = {"name": "bench", "scheduler": "slurm", "partition": "debug", "gpus_per_node": 1,
                "request_gpus": False, "exclusive": False, "workspace": str(tmp / "ws"),
                "server": {"binary": str(find_tritonserver()), "ready_timeout": 120, "exit_grace": 10}}
        cluster_path = tmp / "cluster.yaml"
        cluster_path.write_text(yaml.safe_dump(spec))
        model = load_model(embedded_model_path())
        results: dict[str, list[dict[str, float]]] = {"ftcluster": [], "ftcluster+mpicheck": [], "hand": []}
        for i in range(args.repeats):
            results["ftcluster"].append(ftcluster_once(cluster_path, tmp / "ws", args.nodes, mpi_check=False))
            results["ftcluster+mpicheck"].append(ftcluster_once(cluster_path, tmp / "ws", args.nodes, mpi_check=True))
            # The hand recipe serves the same prepared repository as the last ftcluster run.
            repo = sorted((tmp / "ws").glob("*/model_repository"))[-1]
            results["hand"].append(hand_once(tmp, repo, args.nodes, model.name))
            print(f"repeat {i + 1}/{args.repeats} done", file=sys.stderr)
    med = report.medians(results)
    report.table(med, [*COLUMNS, ("lag_script_ms", "lag ms script", ".0f"),
                       ("lag_launcher_ms", "lag ms launcher", ".0f")])
    report.table(med, PHASES)
    report.print_ratios(med, "overhead", [("ftcluster", "hand"), ("ftcluster+mpicheck", "hand")])
    report.print_json(med, repeats=args.repeats, nodes=args.nodes)

if __name__ == "__main__":
    main()
