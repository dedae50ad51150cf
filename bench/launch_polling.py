"""What does following a launch cost the shared filesystem and Slurm, and how late is readiness seen?

    flock /tmp/.ftc-testbed.lock python bench/launch_polling.py [--load 60] [--repeats 3] [--before REV]
                                                               [--after REV]

On the real Slurm test cluster (bare Slurm style, 2 nodes, FT-shaped test model), alternating
per repeat between the code of git revision AFTER (default HEAD) and of REV ("before"; default:
where this branch left main), each `ftcluster launch` run as its own process under strace:
- long load: FTCLUSTER_TEST_LOAD_DELAY=LOAD makes every rank's model load that slow. Counted
  from the launcher's process tree between the job's `servers_starting` and `ready` events:
  file-system calls naming the run folder (openat, stat family, access) per minute, and
  scheduler queries (squeue/sacct/scontrol started) per minute;
- both loads (long, and the model's normal one): readiness lag = when the launcher printed
  "rank 0 ready" minus an independent 10 ms poller's first "every rank up as ours and the model
  ready" (bench/launch_overhead.py's Poller).
Prints medians of the repeats and the ratios before / after from the same run.
"""

from __future__ import annotations

import argparse
import os
import re
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
from launch_overhead import Poller  # noqa: E402

from ftcluster.events import parse_events  # noqa: E402
from ftcluster.spec import default_model_path, load_model  # noqa: E402
from ftcluster.triton_local import find_tritonserver  # noqa: E402

FS_CALLS = re.compile(r"^\d+ +([\d.]+) (openat|open|newfstatat|statx|stat|lstat|access|faccessat2?)\(")
# A query is the execve that succeeded (failed ones are PATH entries without the tool).
QUERY = re.compile(r'^\d+ +([\d.]+) execve\("[^"]*/(squeue|sacct|scontrol)".* = 0$')


def code_of(rev: str, into: Path) -> Path:
    """The ftcluster package as of a git revision, extracted into a folder for PYTHONPATH."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "ftcluster"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def launch_once(code: Path, cluster: Path, ws: Path, tmp: Path, load: float, nodes: int) -> dict[str, float]:
    model = load_model(default_model_path())
    trace = Path(tempfile.mkstemp(dir=tmp, suffix=".strace")[1])
    env = {**os.environ, "PYTHONPATH": str(code)}
    env.pop("FTCLUSTER_TEST_LOAD_DELAY", None)
    if load:
        env["FTCLUSTER_TEST_LOAD_DELAY"] = str(load)
    poller = Poller(ws, model.name, nodes)
    poller.start()
    seen: dict[str, float] = {}
    proc = subprocess.Popen(
        ["strace", "-f", "--seccomp-bpf", "-qq", "-ttt", "-o", str(trace),
         "-e", "trace=openat,open,newfstatat,statx,stat,lstat,access,faccessat,faccessat2,execve",
         sys.executable, "-m", "ftcluster", "launch", "--cluster", str(cluster), "--nodes", str(nodes)],
        # Not from the checkout: `python -m` would import the package in the cwd, not PYTHONPATH's.
        cwd=str(tmp), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    tail: list[str] = []
    for line in proc.stderr:
        tail = (tail + [line])[-20:]
        if "rank 0 ready" in line:
            seen.setdefault("ready", time.time())
    rc = proc.wait()
    poller.stop.set()
    poller.join()
    assert rc == 0, "".join(tail)
    assert poller.first_ready is not None and "ready" in seen
    run = max(p.parent for p in ws.glob("*/state"))
    events = {e.kind: e.time for e in parse_events((run / "state" / "events").read_text())}
    t_from, t_to = events["servers_starting"], events["ready"]
    fs = queries = 0
    for line in trace.read_text(errors="replace").splitlines():
        m = FS_CALLS.match(line)
        if m and t_from <= float(m.group(1)) <= t_to and str(run) in line:
            fs += 1
        q = QUERY.match(line)
        if q and t_from <= float(q.group(1)) <= t_to:
            queries += 1
    minutes = max(t_to - t_from, 1e-6) / 60
    return {"lag_ms": (seen["ready"] - poller.first_ready) * 1000, "window_s": t_to - t_from,
            "fs_per_min": fs / minutes, "queries_per_min": queries / minutes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--load", type=float, default=60.0, help="seconds of simulated model load")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--before", default=None, help="git revision of the 'before' code (default: merge-base with main)")
    ap.add_argument("--after", default="HEAD", help="git revision of the 'after' code (default: HEAD)")
    args = ap.parse_args()
    before_rev = args.before or subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"],
                                               capture_output=True, text=True, check=True).stdout.strip()
    from tests.cluster.testbed import running_testbed

    tmp = Path(tempfile.mkdtemp(prefix="ftc-bench-poll-"))
    codes = {"before": code_of(before_rev, tmp / "before"), "after": code_of(args.after, tmp / "after")}
    os.environ["FTCLUSTER_STATE_DIR"] = str(tmp / "state")
    ws = tmp / "ws"
    spec = {"name": "bench", "scheduler": "slurm", "partition": "debug", "gpus_per_node": 1,
            "request_gpus": False, "exclusive": False, "workspace": str(ws),
            "server": {"binary": str(find_tritonserver()), "ready_timeout": int(args.load) + 120,
                       "exit_grace": 10}}
    cluster = tmp / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(spec))
    results: dict[str, list[dict[str, float]]] = {f"{c} {k}": [] for c in codes for k in ("long", "short")}
    with running_testbed():
        for i in range(args.repeats):
            for name, code in codes.items():
                results[f"{name} long"].append(launch_once(code, cluster, ws, tmp, args.load, args.nodes))
                results[f"{name} short"].append(launch_once(code, cluster, ws, tmp, 0, args.nodes))
            print(f"repeat {i + 1}/{args.repeats} done", file=sys.stderr)
    med = report.medians(results)
    print(f"traces and runs in {tmp}", file=sys.stderr)
    print(f"before = {before_rev[:10]}, after = {args.after}; {args.nodes} nodes, load {args.load:.0f} s, "
          f"median of {args.repeats}")
    print(f"{'':14} {'load window s':>13} {'run-folder fs calls/min':>24} {'Slurm queries/min':>18} {'lag ms':>8}")
    for k, m in med.items():
        load_cols = (f"{m['fs_per_min']:24.0f} {m['queries_per_min']:18.1f}" if k.endswith("long")
                     else f"{'-':>24} {'-':>18}")
        print(f"{k:14} {m['window_s']:13.1f} {load_cols} {m['lag_ms']:8.0f}")
    for metric in ("fs_per_min", "queries_per_min"):
        report.print_ratios(med, metric, [("before long", "after long")])
    report.print_json(med, repeats=args.repeats, load=args.load, before=before_rev)


if __name__ == "__main__":
    main()
