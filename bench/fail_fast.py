"""How fast does a run end when one FT rank dies? (goal: <= 1 s on local and on Slurm)

    python bench/fail_fast.py [--repeats 5] [--nodes 2]

Per repeat and style (local: one mpirun world on this machine; Slurm: the real test cluster,
bare srun --mpi=pmix), with the faithful test model: `ftcluster launch --keep-serving
--no-client` with server.restarts 0 (a death ends the run rather than restarting the world),
then SIGKILL rank 1's tritonserver (a crashing FT rank) and measure, polling every 5 ms, the
time until no process of the run is left (all ranks stopped) and until the scheduler says the
job has ended, separately; and, from the job's events, when it saw the death and when it was
done. Prints medians; also the time to ready from the same runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report
import yaml

from ftcluster.job.names import FILES
from ftcluster.launch.run import Launch, LaunchOptions
from ftcluster.schedulers import scheduler_for
from ftcluster.engines import make_plan
from ftcluster.render.scripts import RunPaths
from ftcluster.spec.defaults import embedded_model_path
from ftcluster.spec.load import load_cluster, load_model
from ftcluster.service.triton_local import find_tritonserver
from tests.launch_helpers import processes_matching


def _server_of(wrapper_pid: int) -> int:
    """The tritonserver child of a rank's wrapper (same process table on the test bed)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == wrapper_pid and b"--model-repository" in cmd:
            return int(pid)
    raise RuntimeError(f"no tritonserver under wrapper {wrapper_pid}")


def once(cluster_path: Path, nodes: int) -> dict[str, float]:
    cluster, model = load_cluster(cluster_path), load_model(embedded_model_path())
    t0 = time.time()
    outcome = Launch(cluster, model, make_plan(cluster, model, nodes),
                     LaunchOptions(keep_serving=True, client=False)).run()
    assert outcome.ok, outcome.failure
    ready = time.time() - t0
    rec = outcome.record
    paths = RunPaths(rec.run_id, Path(rec.run_dir))
    launcher = scheduler_for(cluster)
    try:
        return _kill_and_time(rec.run_id, rec.job_id or "", paths, launcher, ready)
    except BaseException:
        launcher.cancel(rec.job_id or "", paths)   # a failed repeat leaves no serving run behind
        raise


def _kill_and_time(run_id: str, job_id: str, paths: RunPaths, launcher: Any, ready: float,
                   rank: int = 1) -> dict[str, float]:
    victim = _server_of(int((paths.state / f"rank{rank}.pid").read_text().split()[0]))   # "PID STARTTIME"
    killed = time.time()
    os.kill(victim, signal.SIGKILL)
    stopped = 0.0
    while True:
        if not stopped and not processes_matching(run_id):
            stopped = time.time() - killed
        if stopped and launcher.info(job_id, paths).state.terminal:
            break
        if time.time() - killed > 60:
            raise RuntimeError(f"run {run_id} still alive 60 s after rank {rank} died")
        time.sleep(0.005)
    ended = time.time() - killed
    # Every rank stopped: the last rank wrapper's exit line (written once its server ended), when
    # every rank wrote one after the kill (a wrapper SIGKILLed by its step writes none).
    ranks = len(list(paths.state.glob("rank*.pid")))
    exits = [float(p[2]) for p in (ln.split() for ln in (paths.state / FILES.rank_exits).read_text().splitlines())
             if len(p) >= 4 and float(p[2]) >= killed]
    ranks_s = max(exits) - killed if len(exits) >= ranks else float("nan")
    # Where the job's own time went: its events, each as seconds after the kill.
    names = ("rank_failed", "failed", "servers_stopped", "containers_stopped", "done")
    marks = {f"{n}_s": float("nan") for n in names}
    for line in (paths.state / "events").read_text().splitlines():
        parts = line.split()
        key = f"{parts[1]}_s" if len(parts) >= 2 else ""
        if key in marks and marks[key] != marks[key]:   # the first of each (NaN until seen)
            marks[key] = float(parts[0]) - killed
    return {"ready_s": ready, "ranks_s": ranks_s, "stopped_s": stopped, "ended_s": ended, **marks}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[1])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=2)
    args = ap.parse_args()
    from tests.cluster.testbed import running_testbed

    with running_testbed():
        tmp = Path(tempfile.mkdtemp(prefix="ftc-bench-"))
        os.environ["FTCLUSTER_STATE_DIR"] = str(tmp / "state")
        # restarts 0: a rank's death while serving ends the run (the default restarts the world).
        server = {"binary": str(find_tritonserver()), "ready_timeout": 120, "exit_grace": 10, "restarts": 0}
        specs = {
            "local": {"name": "bench-local", "scheduler": "local", "gpus_per_node": 1, "workspace": str(tmp / "wl"),
                      "ports": {"http": 28000, "grpc": 28001, "metrics": 28002}, "server": server},
            "slurm": {"name": "bench", "scheduler": "slurm", "partition": "debug", "gpus_per_node": 1,
                      "request_gpus": False, "exclusive": False, "workspace": str(tmp / "ws"), "server": server},
        }
        # Pyxis, where the bed has the test image as a squashfs (tests/pyxis/image.py makes it).
        from tests.pyxis.image import sqsh_path

        if sqsh_path().is_file():
            checkpoint = str(embedded_model_path().parent / "checkpoint")
            specs["pyxis"] = {**specs["slurm"], "name": "bench-pyxis", "workspace": str(tmp / "wp"),
                              "container": {"runtime": "pyxis", "image": str(sqsh_path()),
                                            "mounts": [f"{checkpoint}:{checkpoint}:ro"]},
                              "server": {**server, "binary": "tritonserver"}}
        results: dict[str, list[dict[str, float]]] = {k: [] for k in specs}
        for i in range(args.repeats):
            for style, spec in specs.items():
                path = tmp / f"{style}.yaml"
                path.write_text(yaml.safe_dump(spec))
                results[style].append(once(path, args.nodes))
            print(f"repeat {i + 1}/{args.repeats} done", file=sys.stderr)
    med = report.medians(results)
    report.table(med, [("ready_s", "ready s", ".2f"), ("rank_failed_s", "death seen s", ".3f"),
                       ("ranks_s", "every rank stopped s", ".3f"), ("stopped_s", "no process of the run s", ".3f"),
                       ("ended_s", "job ended s", ".3f")],
                 label="style")
    report.print_json(med, repeats=args.repeats, nodes=args.nodes, all=results)

if __name__ == "__main__":
    main()
