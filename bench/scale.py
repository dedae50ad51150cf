"""How do launch, status, logs, stop and fail-fast grow with the number of nodes?

    python bench/scale.py [--sizes 2,4,8,16] [--repeats 3] [--serve 20]

Starts its own bare-Slurm test cluster of max(--sizes) nodes (slurmd per network namespace, no
dockerd or Pyxis; its own folder, subnet and slurm.conf, so a running test bed is untouched),
then per size and repeat, with the FT-shaped test model, one rank per node:
- `launch --keep-serving --no-client`: wall time to the launcher's `ready`, and beyond the
  slowest server's own start (per rank: its wrapper's start, state/rank<R>.pid, to its model
  instance loaded, state/rank<R>.loaded; rank 0 to the job's `ready`);
- while it serves, --serve seconds with nothing else asking: slurmctld's RPCs (sdiag, reset
  first) and the run folder's writes (files changed, bytes added) -- what a serving run costs
  Slurm and the shared filesystem per minute;
- `status RUN --json`, `logs RUN --all --tail 20` (wall, each a fresh CLI as a user runs it),
  `logs RUN -f` latency (a line appended to the last rank's log to the CLI printing it);
- `stop RUN`: wall, and beyond rank 0's own exit (state/rank0.exit);
- fail-fast (a second launch, server.restarts 0): the last rank's tritonserver SIGKILLed, to
  every rank stopped and to the job ended (bench/fail_fast.py's measure).
The test model's ranks != 0 wait for requests without spinning (FTCLUSTER_TEST_IDLE_WAIT): on a
real cluster each rank spins on a node of its own, here all share 2 cores.
Prints medians per size and the per-node slope (least squares over the sizes) of each figure.
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
import threading
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402
import yaml  # noqa: E402
from fail_fast import _kill_and_time  # noqa: E402

from ftcluster.run.events import EV, parse_events  # noqa: E402
from ftcluster.launch.run import Launch, LaunchOptions  # noqa: E402
from ftcluster.schedulers import scheduler_for  # noqa: E402
from ftcluster.engines import make_plan  # noqa: E402
from ftcluster.render.scripts import RunPaths  # noqa: E402
from ftcluster.spec.defaults import embedded_model_path  # noqa: E402
from ftcluster.spec.load import load_cluster, load_model  # noqa: E402
from ftcluster.service.triton_local import find_tritonserver  # noqa: E402

CLI = [sys.executable, "-m", "ftcluster"]


def cli(*args: str, timeout: float = 120) -> float:
    t0 = time.perf_counter()
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False)
    took = time.perf_counter() - t0
    if r.returncode:
        raise RuntimeError(f"ftcluster {' '.join(args)}: rc {r.returncode}: {r.stderr[-2000:]}")
    return took


MODEL: list[Path] = []   # the model spec of this run (scale_model)


def scale_model(tmp: Path) -> Path:
    """The demo test model with 48 layers (12 do not divide into 8 or 16 pipeline stages)."""
    dst = tmp / "model"
    shutil.copytree(embedded_model_path().parent, dst, ignore=shutil.ignore_patterns("__pycache__"))
    for ini in (dst / "checkpoint").glob("*/config.ini"):
        ini.write_text(ini.read_text().replace("num_layer=12", "num_layer=48"))
    return dst / "model.yaml"


def launch(cluster_path: Path, nodes: int) -> tuple[Any, float, Path]:
    """A serving launch; (record, seconds to the launcher's `ready`, run folder)."""
    cluster, model = load_cluster(cluster_path), load_model(MODEL[0])
    seen: dict[str, float] = {}

    def progress(phase: str, t: float, detail: str) -> None:
        seen.setdefault(phase, time.time())

    t0 = time.time()
    outcome = Launch(cluster, model, make_plan(cluster, model, nodes),
                     LaunchOptions(keep_serving=True, client=False), progress=progress).run()
    if not outcome.ok:
        raise RuntimeError(f"launch failed: {outcome.failure}")
    return outcome.record, seen.get("ready", time.time()) - t0, Path(outcome.record.run_dir)


def server_starts(run: Path, nodes: int) -> tuple[float, float, float]:
    """(the slowest server's own start, the spread of the ranks' wrapper starts, the MPI
    check's step), seconds."""
    state = run / "state"
    events = {e.kind: e.time for e in parse_events((state / "events").read_text())}
    starts = {r: (state / f"rank{r}.pid").stat().st_mtime for r in range(nodes)}
    own = [events["ready"] - starts[0]]
    own += [(state / f"rank{r}.loaded").stat().st_mtime - starts[r] for r in range(1, nodes)]
    check = events[EV.mpicheck_ok] - events[EV.mpicheck_started] if EV.mpicheck_ok in events else 0.0
    return max(own), max(starts.values()) - min(starts.values()), check


def sdiag_rpcs(env: dict[str, str], reset: bool = False) -> int:
    if reset:
        subprocess.run(["sdiag", "-r"], env=env, capture_output=True, check=False, timeout=30)
        return 0
    out = subprocess.run(["sdiag"], env=env, capture_output=True, text=True, check=False, timeout=30).stdout
    part = out.split("Remote Procedure Call statistics by message type", 1)[-1]
    part = part.split("Remote Procedure Call statistics by user", 1)[0]
    return sum(int(n) for n in re.findall(r"count:(\d+)", part))


def folder_snapshot(run: Path) -> dict[str, tuple[int, float]]:
    snap = {}
    for p in run.rglob("*"):
        try:
            st = p.stat()
        except OSError:
            continue
        if p.is_file():
            snap[str(p)] = (st.st_size, st.st_mtime)
    return snap


def serving_cost(run: Path, env: dict[str, str], seconds: float) -> dict[str, float]:
    """What the serving run asks of slurmctld and writes to its folder, per minute."""
    before = folder_snapshot(run)
    sdiag_rpcs(env, reset=True)
    time.sleep(seconds)
    rpcs = sdiag_rpcs(env)
    after = folder_snapshot(run)
    changed = [p for p, v in after.items() if before.get(p) != v]
    grown = sum(after[p][0] - before.get(p, (0, 0))[0] for p in changed)
    per_min = 60.0 / seconds
    return {"rpc_per_min": rpcs * per_min, "files_changed_per_min": len(changed) * per_min,
            "bytes_per_min": grown * per_min}


def follow_latency(run_id: str, log: Path, lines: int = 5) -> float:
    """Median seconds from a line appended to a rank's log to `logs -f` printing it."""
    proc = subprocess.Popen([*CLI, "logs", run_id, "-f", "--server"], stdout=subprocess.PIPE, text=True,
                            stderr=subprocess.DEVNULL, bufsize=1)
    lat: list[float] = []
    done = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "SCALEBENCH " in line:
                lat.append(time.time() - float(line.rsplit("SCALEBENCH ", 1)[1]))
                if len(lat) >= lines:
                    break
        done.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        time.sleep(1.5)   # let the follower start and print the existing lines
        for _ in range(lines):
            with log.open("a") as f:
                f.write(f"SCALEBENCH {time.time():.6f}\n")
            time.sleep(0.3)
        done.wait(10)
    finally:
        proc.terminate()
        proc.wait(10)
    if len(lat) < lines:
        raise RuntimeError(f"logs -f printed {len(lat)} of {lines} appended lines")
    return statistics.median(lat)


def stop(run_id: str, run: Path) -> dict[str, float]:
    t0 = time.time()
    cli("stop", run_id)
    end = time.time()
    exit_line = (run / "state" / "rank0.exit").read_text().split()   # "CODE EPOCH stopped"
    return {"stop_s": end - t0, "stop_beyond_rank0_s": end - float(exit_line[1])}


def serving_round(cluster_path: Path, nodes: int, env: dict[str, str], serve: float) -> dict[str, float]:
    rec, ready, run = launch(cluster_path, nodes)
    try:
        slowest, spread, check = server_starts(run, nodes)
        # The MPI check (one Python + MPI start-up per node) runs in parallel on a real cluster;
        # here every node's shares 2 cores: what grows beyond it is shown apart.
        row: dict[str, float] = {"ready_s": ready, "slowest_server_s": slowest,
                                 "ready_beyond_s": ready - slowest, "mpi_check_s": check,
                                 "beyond_but_check_s": ready - slowest - check, "start_spread_s": spread}
        row.update(serving_cost(run, env, serve))
        row["status_s"] = statistics.median(cli("status", rec.run_id, "--json") for _ in range(3))
        row["logs_tail_s"] = statistics.median(cli("logs", rec.run_id, "--all", "--tail", "20") for _ in range(3))
        row["follow_s"] = follow_latency(rec.run_id, run / "logs" / f"server-rank{nodes - 1}.log")
        row.update(stop(rec.run_id, run))
        return row
    except BaseException:
        scheduler_for(load_cluster(cluster_path)).cancel(rec.job_id or "", RunPaths(rec.run_id, run))
        raise


def fail_fast_round(cluster_path: Path, nodes: int) -> dict[str, float]:
    rec, ready, run = launch(cluster_path, nodes)
    paths = RunPaths(rec.run_id, run)
    launcher = scheduler_for(load_cluster(cluster_path))
    try:
        got = _kill_and_time(rec.run_id, rec.job_id or "", paths, launcher, ready, rank=nodes - 1)
    except BaseException:
        launcher.cancel(rec.job_id or "", paths)
        raise
    return {"ff_ranks_s": got["ranks_s"], "ff_stopped_s": got["stopped_s"], "ff_ended_s": got["ended_s"]}


def retried(measure: Callable[[], dict[str, float]]) -> dict[str, float]:
    """A round once more when its launch failed (16 ranks' MPI start-up on 2 cores has crashed
    once in Open MPI itself); a second failure ends the bench."""
    try:
        return measure()
    except RuntimeError as e:
        print(f"round failed, once more: {e}", file=sys.stderr)
        return measure()


def slope(xs: list[int], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (per node)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float("nan")


COLUMNS = [("ready_s", "ready s", ".2f"), ("slowest_server_s", "slowest server s", ".2f"),
           ("ready_beyond_s", "ready beyond s", ".2f"), ("mpi_check_s", "MPI check s", ".2f"),
           ("beyond_but_check_s", "beyond but the check s", ".2f"), ("start_spread_s", "start spread s", ".2f"),
           ("status_s", "status s", ".3f"), ("logs_tail_s", "logs --tail s", ".3f"),
           ("follow_s", "logs -f lag s", ".3f"), ("stop_s", "stop s", ".2f"),
           ("stop_beyond_rank0_s", "stop beyond rank 0 s", ".2f"), ("ff_ranks_s", "ff ranks stopped s", ".3f"),
           ("ff_stopped_s", "ff no process left s", ".3f"),
           ("ff_ended_s", "ff ended s", ".3f"), ("rpc_per_min", "RPC/min", ".1f"),
           ("files_changed_per_min", "files/min", ".1f"), ("bytes_per_min", "bytes/min", ".0f")]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[1])
    ap.add_argument("--sizes", default="2,4,8,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--serve", type=float, default=20.0, help="seconds of undisturbed serving per round")
    args = ap.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    from tests.cluster.testbed import SlurmTestbed
    from tests.cluster.util import TestbedError

    tmp = Path(tempfile.mkdtemp(prefix="ftc-scale-"))
    octet = next(o for o in range(120, 160) if not Path(f"/sys/class/net/ftc{o}br").exists())
    # Its own folder (munged, running as munge, must reach its socket: mkdtemp's 0700 parent would stop it).
    bed_dir = Path(tempfile.mkdtemp(prefix="ftc-scale-bed-"))
    tb = SlurmTestbed(bed_dir, max(sizes), octet=octet, prefix="scale", system_conf=False, pyxis=False)
    try:
        t0 = time.monotonic()
        tb.up()
        print(f"bed of {max(sizes)} nodes up in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        env = tb.env
        os.environ["SLURM_CONF"] = str(tb.conf_path)
        os.environ["FTCLUSTER_STATE_DIR"] = str(tmp / "state")
        server = {"binary": str(find_tritonserver()), "ready_timeout": 300, "exit_grace": 10}
        spec = {"name": "scale", "scheduler": "slurm", "partition": "debug", "gpus_per_node": 1,
                "request_gpus": False, "exclusive": False, "workspace": str(tmp / "ws"),
                "max_nodes": max(sizes), "server": server,
                # The test model's ranks != 0 wait on MPI_Test every 2 ms instead of MPI's busy
                # poll: on a real cluster each has a node of its own; here 15 spinning ranks on 2
                # cores would starve every command measured (status took 2.2 s at 16 nodes).
                "env": {"FTCLUSTER_TEST_IDLE_WAIT": "0.002"}}
        serving, failing = tmp / "serving.yaml", tmp / "failing.yaml"
        serving.write_text(yaml.safe_dump(spec))
        failing.write_text(yaml.safe_dump({**spec, "server": {**server, "restarts": 0}}))
        MODEL.append(scale_model(tmp))
        results: dict[str, list[dict[str, float]]] = {str(n): [] for n in sizes}
        for i in range(args.repeats):
            for n in sizes:
                row = retried(lambda: serving_round(serving, n, env, args.serve))
                row.update(retried(lambda: fail_fast_round(failing, n)))
                results[str(n)].append(row)
                print(f"repeat {i + 1}/{args.repeats}, {n} nodes: " +
                      ", ".join(f"{k} {v:.3g}" for k, v in row.items()), file=sys.stderr)
    except TestbedError as e:
        sys.exit(f"scale bench: {e}")
    finally:
        tb.down()
        shutil.rmtree(bed_dir, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)   # the runs' folders and records
    med = report.medians(results)
    report.table(med, COLUMNS, label="nodes")
    slopes = {key: slope(sizes, [med[str(n)][key] for n in sizes]) for key, _, _ in COLUMNS}
    print("\nper-node slope (least squares over the sizes):")
    for key, head, _ in COLUMNS:
        print(f"  {head}: {slopes[key]:+.4f} per node")
    print(json.dumps({"sizes": sizes, "repeats": args.repeats, "medians": med, "slopes": slopes,
                      "all": results}, indent=1))


if __name__ == "__main__":
    main()
