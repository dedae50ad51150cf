"""How fast does the `ftcluster` command start? Goals: the light commands within 10x a bare
interpreter start; `status` of a 16-node run within 0.2 s (issue #40).

    python bench/cli_startup.py [--repeats 15] [--goal 10] [--root CHECKOUT] [--compare CHECKOUT]
                                [--bytecode cached,uncached]

Runs each command N times, interleaved with a bare `python -c pass` (the same interpreter, so
site-packages .pth hooks count on both sides), and prints the median wall time of each and its
ratio to the bare start's median. The commands: `--help`, `--version`, `list`, `status RUN` and
`logs --tail 100 RUN` of a recorded run of a local style (run folder with two rank logs of 10,000
lines each), `status --json` of a recorded 16-node run, in a temporary run store; then the launch
path: `launch --keep-serving --dry-run` of the embedded default (2 nodes: spec check, plan,
rendering with the liveness probe; no job) and, alone, the import of the modules a launch loads
before its job starts. Exit 1 when a light command's ratio is above --goal (first --bytecode
mode). `--root` times the ftcluster of another checkout; `--compare` times a second one in the
same rounds (before/after), each command alternating between the two, with the after/before
ratio of the medians of wall time and of CPU time (user + system of the command and what it
waited for: steadier than wall time on a machine with other work running).

Two ways of starting, each its own column (--bytecode):
- cached: every module's bytecode cached (a PYTHONPYCACHEPREFIX of the run, filled by a warm-up
  round), as a pip install or an editable install's first run leaves it;
- uncached: PYTHONDONTWRITEBYTECODE=1 and no prefix, as some environments set it (this VM's):
  ftcluster's own modules are compiled from source at every start, unless the checkout already
  has __pycache__ folders (counted and printed).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report

from ftcluster.run.store import RunRecord, RunStore

# What `launch` imports before its job starts: the command, the rendering and the liveness probe
# (its request is made with the client's builder, numpy included, only the first time a model
# config is served: later launches read it from the cache).
LAUNCH_IMPORTS = "import ftcluster.cli.commands_launch, ftcluster.render.liveness_request, ftcluster.render.scripts"


def launch_imports(root: Path) -> str:
    """LAUNCH_IMPORTS of that checkout: --compare may time one from before the modules moved
    into their stages' folders (ftcluster/probe.py, ftcluster/render.py)."""
    if (root / "ftcluster" / "render" / "scripts.py").is_file():
        return LAUNCH_IMPORTS
    return "import ftcluster.cli.commands_launch, ftcluster.probe, ftcluster.render"
LAUNCH_LINES = ("ftcluster launch --keep-serving --dry-run", "import the launch path")
STATUS_16 = "ftcluster status --json RUN (16 nodes)"


def make_run(tmp: Path, run_id: str = "bench-run", nodes: int = 2, log_lines: int = 10_000) -> str:
    """A finished local run of `nodes` ranks with real-sized logs, recorded in a store under tmp."""
    run_dir = tmp / "runs" / run_id
    for sub in ("logs", "state", "scripts"):
        (run_dir / sub).mkdir(parents=True)
    for r in range(nodes):
        (run_dir / "logs" / f"server-rank{r}.log").write_text(
            "".join(f"I1123 07:00:{i % 60:02d} rank{r} line {i} of the server log\n" for i in range(log_lines)))
        (run_dir / "state" / f"rank{r}.host").write_text(f"node{r}\n")
        (run_dir / "state" / f"rank{r}.exit").write_text("0 1700000000 stopped\n")
    (run_dir / "state" / "events").write_text("1 submitted\n2 job_started\n3 ready node0:8000\n9 done 0\n")
    dead = subprocess.Popen(["true"])
    dead.wait()
    RunStore(tmp / "state" / "runs.sqlite").add(RunRecord(
        run_id=run_id, created=time.time(), cluster_name="local", cluster_source="", scheduler="local",
        style="local", run_dir=str(run_dir), nodes=nodes, model="bench", job_id=f"local:{dead.pid}", status="DONE"))
    return run_id


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall time and CPU time (user + system, the child's and its own children's)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # cwd: `python -m` puts it first on sys.path, before PYTHONPATH.
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True, cwd=cwd)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def mode_env(mode: str, base: dict[str, str], tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    if mode == "cached":
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    elif mode == "uncached":
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        raise SystemExit(f"--bytecode: unknown mode {mode!r} (cached, uncached)")
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--goal", type=float, default=10.0)
    ap.add_argument("--root", type=Path, default=ROOT, help="The checkout whose ftcluster is timed.")
    ap.add_argument("--compare", type=Path, default=None, help="A checkout timed in the same rounds (before).")
    ap.add_argument("--bytecode", default="cached,uncached", help="Modes, comma-separated: cached, uncached.")
    args = ap.parse_args()
    # side -> its checkout: "" is --root, "before" --compare.
    roots = {"": args.root.resolve(), **({"before": args.compare.resolve()} if args.compare else {})}
    modes = [m for m in args.bytecode.split(",") if m]
    with tempfile.TemporaryDirectory(prefix="ftc-startup-") as d:
        tmp = Path(d)
        run = make_run(tmp)
        run16 = make_run(tmp, "bench-run16", nodes=16, log_lines=10)
        ftc = [sys.executable, "-m", "ftcluster"]
        # column -> (argv maker, env, cwd); a column is a mode, with " before" for --compare's side.
        sides = {}
        for side, root in roots.items():
            base = {**os.environ, "FTCLUSTER_STATE_DIR": str(tmp / "state"), "PYTHONPATH": str(root)}
            for mode in modes:
                sides[f"{mode} {side}".strip()] = (root, mode_env(mode, base, tmp))

        def commands(root: Path) -> dict[str, list[str]]:
            demo = root / "ftcluster" / "demo"
            return {
                "python -c pass": [sys.executable, "-c", "pass"],
                "ftcluster --help": [*ftc, "--help"],
                "ftcluster --version": [*ftc, "--version"],
                "ftcluster list": [*ftc, "list"],
                "ftcluster status RUN": [*ftc, "status", run],
                STATUS_16: [*ftc, "status", "--json", run16],
                "ftcluster logs --tail 100 RUN": [*ftc, "logs", "--tail", "100", run],
                LAUNCH_LINES[0]: [*ftc, "launch", "--cluster", str(demo / "local-cluster.yaml"), "--model",
                                  str(demo / "model.yaml"), "--nodes", "2", "--keep-serving", "--dry-run"],
                LAUNCH_LINES[1]: [sys.executable, "-c", launch_imports(root)],
            }

        argvs = {col: commands(root) for col, (root, _) in sides.items()}
        names = list(commands(roots[""]))
        for _ in range(2):   # warm the file cache and fill the bytecode prefix
            for col, (root, env) in sides.items():
                for argv in argvs[col].values():
                    timed(argv, env, root)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for _ in range(args.repeats):
            for name in names:
                row = {}
                for col, (root, env) in sides.items():
                    row[col], row[f"{col} cpu"] = timed(argvs[col][name], env, root)
                runs[name].append(row)
    med = report.medians(runs)
    floor = med["python -c pass"]
    for m in med.values():
        m.update({f"{col} x": m[col] / floor[col] for col in sides})
        if args.compare:
            m.update({f"{mode} change": m[mode] / m[f"{mode} before"] for mode in modes})
            m.update({f"{mode} cpu change": m[f"{mode} cpu"] / m[f"{mode} before cpu"] for mode in modes})
    for side, root in roots.items():
        cached = sum(1 for _ in (root / "ftcluster").rglob("__pycache__"))
        print(f"{side or 'timed'}: {root}; __pycache__ folders in its ftcluster/: {cached}")
    print(f"python {sys.version.split()[0]}, {len(os.sched_getaffinity(0))} CPUs, load {os.getloadavg()[0]:.1f}, "
          f"median of {args.repeats}")
    cols = []
    for mode in modes:
        if args.compare:
            cols += [(f"{mode} before", f"{mode} before s", ".3f"), (f"{mode} before x", "ratio", ".1f")]
        cols += [(mode, f"{mode} s", ".3f"), (f"{mode} x", "ratio", ".1f")]
        if args.compare:
            cols += [(f"{mode} change", "after/before", ".2f"), (f"{mode} cpu change", "CPU after/before", ".3f")]
    report.table(med, cols, label="command")
    light = [k for k in med if k not in LAUNCH_LINES]
    worst = max(med[k][f"{modes[0]} x"] for k in light)
    print(f"{STATUS_16}: " + ", ".join(f"{med[STATUS_16][m]:.3f} s {m}" for m in modes) + " (goal <= 0.2 s)")
    print(f"worst ratio of the light commands ({modes[0]}) {worst:.1f} (goal <= {args.goal:g})")
    report.print_json(med, repeats=args.repeats, goal=args.goal, bytecode=modes,
                      roots={k or "timed": str(v) for k, v in roots.items()})
    return 0 if worst <= args.goal else 1


if __name__ == "__main__":
    sys.exit(main())
