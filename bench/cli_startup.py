"""How fast does the `ftcluster` command start? Goal: within 10x a bare interpreter start.

    python bench/cli_startup.py [--repeats 15] [--goal 10] [--root CHECKOUT]

Runs each command N times, interleaved with a bare `python -c pass` (the same interpreter, so
site-packages .pth hooks count on both sides), and prints the median wall time of each and its
ratio to the bare start's median. The commands: `--help`, `--version`, `list`, `status RUN` and
`logs --tail 100 RUN` of a recorded run of a local style (run folder with two rank logs of 10,000
lines each), in a temporary run store. Exit 1 when a ratio is above --goal. `--root` times the
ftcluster of another checkout (before/after).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report

from ftcluster.store import RunRecord, RunStore


def make_run(tmp: Path) -> str:
    """A finished two-rank local run with real-sized logs, recorded in a store under tmp."""
    run_dir = tmp / "runs" / "bench-run"
    for sub in ("logs", "state", "scripts"):
        (run_dir / sub).mkdir(parents=True)
    for r in (0, 1):
        (run_dir / "logs" / f"server-rank{r}.log").write_text(
            "".join(f"I1123 07:00:{i % 60:02d} rank{r} line {i} of the server log\n" for i in range(10_000)))
        (run_dir / "state" / f"rank{r}.host").write_text(f"node{r}\n")
        (run_dir / "state" / f"rank{r}.exit").write_text("0 1700000000 stopped\n")
    (run_dir / "state" / "events").write_text("1 submitted\n2 job_started\n3 ready node0:8000\n9 done 0\n")
    dead = subprocess.Popen(["true"])
    dead.wait()
    RunStore(tmp / "state" / "runs.sqlite").add(RunRecord(
        run_id="bench-run", created=time.time(), cluster_name="local", cluster_source="", scheduler="local",
        style="local", run_dir=str(run_dir), nodes=2, model="bench", job_id=f"local:{dead.pid}", status="DONE"))
    return "bench-run"


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    # cwd: `python -m` puts it first on sys.path, before PYTHONPATH.
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True,
                   cwd=env["PYTHONPATH"])
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--goal", type=float, default=10.0)
    ap.add_argument("--root", type=Path, default=ROOT, help="The checkout whose ftcluster is timed.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftc-startup-") as d:
        tmp = Path(d)
        run = make_run(tmp)
        env = {**os.environ, "FTCLUSTER_STATE_DIR": str(tmp / "state"), "PYTHONPATH": str(args.root.resolve())}
        ftc = [sys.executable, "-m", "ftcluster"]
        commands = {
            "--help": [*ftc, "--help"],
            "--version": [*ftc, "--version"],
            "list": [*ftc, "list"],
            "status RUN": [*ftc, "status", run],
            "logs --tail 100 RUN": [*ftc, "logs", "--tail", "100", run],
        }
        bare_argv = [sys.executable, "-c", "pass"]
        for argv in commands.values():   # warm the file cache and the .pyc files
            timed(argv, env)
        bare: list[float] = []
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeats):
            for name, argv in commands.items():
                bare.append(timed(bare_argv, env))
                times[name].append(timed(argv, env))
    med = report.medians({"python -c pass": [{"s": t} for t in bare],
                          **{f"ftcluster {name}": [{"s": t} for t in ts] for name, ts in times.items()}})
    for m in med.values():
        m["ratio"] = m["s"] / med["python -c pass"]["s"]
    print(f"{args.root.resolve()}: python {sys.version.split()[0]}, {len(os.sched_getaffinity(0))} CPUs, "
          f"load {os.getloadavg()[0]:.1f}, median of {args.repeats}")
    report.table(med, [("s", "median s", ".3f"), ("ratio", "ratio", ".1f")], label="command")
    worst = max(m["ratio"] for m in med.values())
    print(f"worst ratio {worst:.1f} (goal <= {args.goal:g})")
    report.print_json(med, repeats=args.repeats, goal=args.goal)
    return 0 if worst <= args.goal else 1


if __name__ == "__main__":
    sys.exit(main())
