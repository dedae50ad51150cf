"""The whole `ftcluster launch` against its servers' own start (goal <= 1.1x).

    python bench/launch_vs_bare.py [--repeats 5] [--nodes 2] [--gpus-per-node 1] [--model SPEC] [--cluster SPEC]
                                   [--compare CHECKOUT]

Local style (every rank on this machine under one mpirun), interleaved per repeat:
- ftcluster: `ftcluster launch --keep-serving --no-client --json` as a user types it, from the
  command's start to its return at `ready` (prepare, render, the job's start-up, the ranks,
  readiness), then `ftcluster stop` (not timed);
- bare: the repository that launch prepared, served by `mpirun -np N tritonserver` (the run's
  own mpirun and tritonserver, each rank its own ports, the run's env.sh sourced: the same
  environment), from mpirun's start to rank
  0 answering as ours (its --id) with the model ready, asked every 50 ms by a poller that
  starts with it; then mpirun is ended.
- floor: what any launcher built as ftcluster is (a Python command on its libraries, a Python
  job) pays before its servers even with no code of its own: an interpreter importing the
  command's libraries, then one with the least a job's supervisor needs of the standard
  library (-S, as the job runs it), each started and timed to its exit.
Prints the medians and the ratio ftcluster / bare, the best ratio the floor leaves, (bare +
floor) / bare, and ftcluster's time split by phase (from the run's events). On a GPU machine pass a CUDA model spec
(--model) and a cluster spec with its GPUs (--cluster): the ranks get them as launch gives them
(rank r sees GPUs r*g..r*g+g-1).
`--compare CHECKOUT` launches the ftcluster of another checkout too (before/after), in the same
repeats, the two launches' order alternating: each command runs from its checkout's root with
that root on PYTHONPATH (this checkout's too, then), its bytecode cached there as an install
has it; the bare run and the floor once per repeat. Prints both, their ratios to bare and
after/before.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402
import yaml  # noqa: E402

from ftcluster.run.events import parse_events  # noqa: E402
from ftcluster.job.fileops import remove_entry  # noqa: E402
from ftcluster.spec.defaults import embedded_model_path  # noqa: E402
from ftcluster.service.triton_local import find_tritonserver  # noqa: E402
from ftcluster.client.ready import ours_ready  # noqa: E402

BARE_PORT = 29500
BARE_SHM = "ftc-bench-bare-"   # the bare ranks' python backend regions in /dev/shm

# The libraries `launch` needs before its job starts (its CLI, the specs and their checks, the
# templates, config.pbtxt), and the least a Python job needs (its config, mpirun, signals);
# both end as the command and the job do, without the interpreter's teardown.
COMMAND_LIBS = ("import os, click, yaml, jinja2, google.protobuf.text_format; "
                "from pydantic import BaseModel; os._exit(0)")
JOB_STDLIB = "import os, json, subprocess, signal; os._exit(0)"


# The command runs as an installed one does: its modules' bytecode cached (pip compiles a
# wheel's at install). A machine that sets PYTHONDONTWRITEBYTECODE=1 would recompile every
# module at every launch (+0.15 s), which no user's install does.
def user_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}


def phases_of(run_dir: Path, epoch0: float, wall: float) -> dict[str, float]:
    """Where the command's time went, from the job's own events (this machine's clock): before
    the job (the command's start-up, checks, preparation, rendering, records), the job's start
    (its shell and supervisor) up to mpirun's start (servers_starting), the servers up to
    ready (what the bare run also spends, with mpirun's start), and after ready (the event seen,
    the record, the output, the command's exit)."""
    first: dict[str, float] = {}
    for ev in parse_events((run_dir / "state" / "events").read_text()):
        first.setdefault(ev.kind, ev.time - epoch0)
    return {"before_job_s": first["job_started"], "job_start_s": first["servers_starting"] - first["job_started"],
            "servers_s": first["ready"] - first["servers_starting"], "after_ready_s": wall - first["ready"]}


def checkout_env(root: Path | None) -> tuple[dict[str, str], Path | None]:
    """The command's environment and cwd: as the user's (None), or that checkout's ftcluster
    (`python -m` puts its cwd first on sys.path, before PYTHONPATH)."""
    if root is None:
        return user_env(), None
    return {**user_env(), "PYTHONPATH": str(root)}, root


def ftcluster_once(cluster: Path, model: Path, nodes: int, gpus: int, split: dict[str, float],
                   root: Path | None = None) -> tuple[float, Path]:
    argv = [sys.executable, "-m", "ftcluster", "launch", "--cluster", str(cluster), "--model", str(model),
            "--nodes", str(nodes), "--gpus-per-node", str(gpus), "--keep-serving", "--no-client", "--json"]
    env, cwd = checkout_env(root)
    t0, epoch0 = time.perf_counter(), time.time()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    out = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}
    if out.get("run_dir"):
        split.update(phases_of(Path(out["run_dir"]), epoch0, wall))
    if out.get("run_id"):   # stopped whatever came of it, before its folder may go
        stop = subprocess.run([sys.executable, "-m", "ftcluster", "stop", out["run_id"]], capture_output=True,
                              text=True, timeout=300, check=False, env=env, cwd=cwd)
        if stop.returncode:
            raise RuntimeError(f"stop failed (rc {stop.returncode}): {stop.stderr[-2000:]}")
    if r.returncode or not out.get("ok"):
        raise RuntimeError(f"launch failed (rc {r.returncode}): {out.get('failure') or r.stderr[-2000:]}")
    return wall, Path(out["run_dir"])


def bare_once(run_dir: Path, model: str, nodes: int, gpus: int) -> float:
    job = json.loads((run_dir / "scripts" / "job.json").read_text())
    # The launch's own tritonserver and mpirun: the one the run resolved (Open MPI's beside the
    # interpreter), not whatever `mpirun` on PATH is (a version manager's shim costs ~60 ms).
    triton, mpirun = job["tritonserver"], job["mpirun"]
    pool = os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(str(i) for i in range(nodes * gpus))
    rank = (f'r=$OMPI_COMM_WORLD_RANK; IFS=, read -ra pool <<<"{pool}"; '
            f'export CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${{pool[*]:r*{gpus}:{gpus}}}"); '
            f'source {run_dir}/scripts/env.sh; cd {run_dir}; '
            f'exec {triton} --model-repository=model_repository --id=bare-$r --log-verbose=0 '
            f'--http-port=$(({BARE_PORT}+r*10)) --grpc-port=$(({BARE_PORT}+1+r*10)) '
            f'--metrics-port=$(({BARE_PORT}+2+r*10)) '
            f'--backend-config=python,shm-region-prefix-name={BARE_SHM}$r-')
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    envs_before = set(glob.glob("/tmp/python_env_*"))
    log = open(run_dir / "logs" / "bare.log", "wb")
    t0 = time.perf_counter()
    p = subprocess.Popen([mpirun, "-np", str(nodes), "--oversubscribe", "--bind-to", "none", "bash", "-c", rank],
                         stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        while not ours_ready("127.0.0.1", BARE_PORT, "bare-0", model, 1.0):
            if p.poll() is not None:
                raise RuntimeError(f"bare mpirun ended (rc {p.returncode}): see {run_dir}/logs/bare.log")
            if time.perf_counter() - t0 > 900:
                raise RuntimeError("bare servers not ready in 900 s")
            time.sleep(0.05)
        return time.perf_counter() - t0
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.close()
        # What the ended servers' python backend left: its shared memory and /tmp folders.
        for path in [*glob.glob(f"/dev/shm/{BARE_SHM}*"), *(set(glob.glob("/tmp/python_env_*")) - envs_before)]:
            remove_entry(path)


def floor_once() -> float:
    """The interpreters' and libraries' part alone: the command's, then the job's."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", COMMAND_LIBS], env=user_env(), check=True, timeout=300)
    subprocess.run([sys.executable, "-S", "-c", JOB_STDLIB], env=user_env(), check=True, timeout=300)
    return time.perf_counter() - t0


def write_cluster(path: Path, tmp: Path, gpus_per_node: int) -> None:
    """A local cluster spec: its workspace under tmp, the CPU tritonserver."""
    path.write_text(yaml.safe_dump({
        "name": "bench-local", "scheduler": "local", "gpus_per_node": gpus_per_node,
        "workspace": str(tmp / "ws"), "ports": {"http": 28000, "grpc": 28001, "metrics": 28002},
        "server": {"binary": str(find_tritonserver()), "ready_timeout": 600, "exit_grace": 10}}))


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[1])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus-per-node", type=int, default=1)
    ap.add_argument("--model", type=Path, default=embedded_model_path())
    ap.add_argument("--cluster", type=Path, help="a local cluster spec (default: one written here)")
    ap.add_argument("--goal", type=float, default=1.1)
    ap.add_argument("--compare", type=Path, default=None, help="A checkout launched in the same repeats (before).")
    args = ap.parse_args()
    # name -> its checkout: "ftcluster" is this one (the user's when alone), "ftcluster before" --compare's.
    sides: dict[str, Path | None] = {"ftcluster": ROOT if args.compare else None}
    if args.compare:
        sides["ftcluster before"] = args.compare.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="ftc-bench-"))
    os.environ.setdefault("FTCLUSTER_STATE_DIR", str(tmp / "state"))
    cluster = args.cluster
    if cluster is None:
        cluster = tmp / "cluster.yaml"
        write_cluster(cluster, tmp, args.gpus_per_node)
    model = yaml.safe_load(args.model.read_text())["name"]
    results: dict[str, list[dict[str, float]]] = {**{name: [] for name in sides}, "bare": [], "floor": []}
    # Once, untimed: the bytecode cache, as an install leaves it.
    for root in sides.values():
        env, cwd = checkout_env(root)
        subprocess.run([sys.executable, "-m", "ftcluster", "launch", "--cluster", str(cluster), "--model",
                        str(args.model), "--nodes", str(args.nodes), "--gpus-per-node", str(args.gpus_per_node),
                        "--keep-serving", "--dry-run"], capture_output=True, timeout=300, check=False, env=env, cwd=cwd)
    try:
        for i in range(args.repeats):
            said = []
            for name in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
                split: dict[str, float] = {}
                wall, run_dir = ftcluster_once(cluster, args.model, args.nodes, args.gpus_per_node, split, sides[name])
                results[name].append({"ready_s": wall, **split})
                said.append(f"{name} {wall:.2f} s")
            results["bare"].append({"ready_s": bare_once(run_dir, model, args.nodes, args.gpus_per_node)})
            floor = floor_once()
            results["floor"].append({"ready_s": results["bare"][-1]["ready_s"] + floor, "floor_s": floor})
            print(f"repeat {i + 1}/{args.repeats}: {', '.join(said)}, bare {results['bare'][-1]['ready_s']:.2f} s",
                  file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = report.medians(results)
    report.table(med, [("ready_s", "to ready s", ".2f"), ("before_job_s", "before the job s", ".3f"),
                       ("job_start_s", "job start s", ".3f"), ("servers_s", "servers to ready s", ".3f"),
                       ("after_ready_s", "after ready s", ".3f"), ("floor_s", "floor s", ".3f")])
    r = report.ratio(med, "ready_s", "ftcluster", "bare")
    best = report.ratio(med, "ready_s", "floor", "bare")
    print(f"ratio ftcluster / bare: {r:.2f} (goal <= {args.goal})")
    changes = {}
    if args.compare:
        before = report.ratio(med, "ready_s", "ftcluster before", "bare")
        changes = {"before_ratio": before, "after_before": report.ratio(med, "ready_s", "ftcluster", "ftcluster before"),
                   "before_job_after_before": report.ratio(med, "before_job_s", "ftcluster", "ftcluster before")}
        print(f"ratio ftcluster before / bare: {before:.2f}; to ready after / before: {changes['after_before']:.3f}, "
              f"before the job after / before: {changes['before_job_after_before']:.3f}")
    print(f"the floor's ratio (bare + floor) / bare: {best:.2f}: what a Python command on these libraries "
          f"with a Python job leaves, before any code of its own")
    report.print_json(med, ratio=r, floor_ratio=best, repeats=args.repeats, nodes=args.nodes,
                      gpus_per_node=args.gpus_per_node, all=results, **changes,
                      **({"compare": str(sides["ftcluster before"])} if args.compare else {}))
    sys.exit(0 if r <= args.goal else 1)


if __name__ == "__main__":
    main()
