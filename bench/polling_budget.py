"""What following a run costs slurmctld and the shared filesystem, and how soon users see what
they wait for: before and after, same run.

    flock /tmp/.ftc-testbed.lock python bench/polling_budget.py [--repeats 3] [--load 100] [--follow 120]
                                                                [--before REV] [--after REV]

On the real Slurm test cluster (bare Slurm style, 2 nodes, FT-shaped test model), alternating per
repeat between the code of git revision AFTER (default HEAD) and BEFORE (default: the commit
before the polling budget), every ftcluster command run as its own process under strace -f -y:
- launch (model load LOAD s): scheduler queries (squeue/sacct/scontrol started) and path calls
  naming the run folder (open, stat family, access) per minute from the second minute to ready;
  reads of run-folder files per minute; ready seen = "rank 0 ready" printed - the `ready` event;
- logs -f of a serving run for FOLLOW s: the same counts per minute, from its second minute to
  the stop; job end seen = logs -f exits - the job's `done` event;
- stop of that run: queries and path calls while it waits; job end seen = stop returns - `done`;
- failure seen: a launch where rank 1's model refuses to load: launch exits - the `failed` event.
Prints medians of the repeats and the ratios before / after.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report
import yaml  # noqa: E402

from ftcluster.run.events import parse_events  # noqa: E402
from ftcluster.service.triton_local import find_tritonserver  # noqa: E402

# The commit before the polling budget: what "before" means by default.
BEFORE = "f06c28a"
PATH_CALLS = re.compile(r"^\d+ +([\d.]+) (openat|open|newfstatat|statx|stat|lstat|access|faccessat2?)\(")
READS = re.compile(r"^\d+ +([\d.]+) (read|pread64)\(\d+<([^>]*)>")
# A query is the execve that succeeded (failed ones are PATH entries without the tool); with
# several processes traced, strace may split it: `execve(... <unfinished ...>`, then the pid's
# `<... execve resumed>) = 0`.
QUERY = re.compile(r'^(\d+) +([\d.]+) execve\("[^"]*/(squeue|sacct|scontrol)".*(= 0|<unfinished \.\.\.>)$')
RESUMED = re.compile(r'^(\d+) +[\d.]+ <\.\.\. execve resumed>.* = 0$')
TRACED = "trace=openat,open,newfstatat,statx,stat,lstat,access,faccessat,faccessat2,execve,read,pread64"


def code_of(rev: str, into: Path) -> Path:
    """The ftcluster package as of a git revision, extracted into a folder for PYTHONPATH."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "ftcluster"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


@dataclass
class Traced:
    """One ftcluster command under strace: its trace, and its stderr lines with the time each
    came (read as they come, by a thread), "<exit>" last."""

    proc: subprocess.Popen[str]
    trace: Path
    lines: list[tuple[float, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.time(), line))
        self.proc.wait()
        self.lines.append((time.time(), "<exit>"))

    def wait(self) -> int:
        self.reader.join()
        return self.proc.returncode

    def seen(self, text: str) -> float:
        return next(t for t, line in self.lines if text in line)

    def counts(self, run: Path, t_from: float, t_to: float) -> dict[str, float]:
        """Per minute between t_from and t_to: scheduler queries, path calls and reads naming the run."""
        queries = paths = reads = 0
        pending: dict[str, float] = {}    # pid -> time of its unfinished execve of a Slurm tool
        for line in self.trace.read_text(errors="replace").splitlines():
            q = QUERY.match(line)
            if q and t_from <= float(q.group(2)) <= t_to:
                if q.group(4) == "= 0":
                    queries += 1
                else:
                    pending[q.group(1)] = float(q.group(2))
                continue
            r = RESUMED.match(line)
            if r and pending.pop(r.group(1), None) is not None:
                queries += 1
                continue
            for pattern in (PATH_CALLS, READS):
                m = pattern.match(line)
                if not m or not t_from <= float(m.group(1)) <= t_to:
                    continue
                # fstat() is newfstatat(fd, "", AT_EMPTY_PATH): no path is looked up.
                if str(run) in line and "AT_EMPTY_PATH" not in line:
                    if pattern is PATH_CALLS:
                        paths += 1
                    else:
                        reads += 1
                break
        minutes = max(t_to - t_from, 1e-6) / 60
        return {"queries_min": queries / minutes, "paths_min": paths / minutes, "reads_min": reads / minutes}


class Bench:
    def __init__(self, tmp: Path, cluster: Path, ws: Path):
        self.tmp, self.cluster, self.ws = tmp, cluster, ws

    def start(self, code: Path, args: list[str], env: dict[str, str] | None = None) -> Traced:
        trace = Path(tempfile.mkstemp(dir=self.tmp, suffix=".strace")[1])
        full_env = {**os.environ, "PYTHONPATH": str(code), **(env or {})}
        proc = subprocess.Popen(
            ["strace", "-f", "-y", "--seccomp-bpf", "-qq", "-ttt", "-o", str(trace), "-e", TRACED,
             sys.executable, "-m", "ftcluster", *args],
            # Not from the checkout: `python -m` would import the package in the cwd, not PYTHONPATH's.
            cwd=str(self.tmp), env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        return Traced(proc, trace)

    def newest_run(self) -> Path:
        return max((p.parent for p in self.ws.glob("*/state")), key=lambda p: p.stat().st_mtime)

    @staticmethod
    def events(run: Path) -> dict[str, float]:
        return {e.kind: e.time for e in parse_events((run / "state" / "events").read_text())}

    def launch(self, code: Path, load: float) -> dict[str, float]:
        t = self.start(code, ["launch", "--cluster", str(self.cluster), "--nodes", "2"],
                       {"FTCLUSTER_TEST_LOAD_DELAY": str(load)})
        assert t.wait() == 0, "".join(line for _, line in t.lines[-20:])
        run = self.newest_run()
        ev = self.events(run)
        submitted = t.seen("queued")
        out = t.counts(run, submitted + 60, ev["ready"])
        out["ready_seen_ms"] = (t.seen("rank 0 ready") - ev["ready"]) * 1000
        return out

    def failure(self, code: Path) -> dict[str, float]:
        t = self.start(code, ["launch", "--cluster", str(self.cluster), "--nodes", "2"],
                       {"FTCLUSTER_TEST_BREAK_NODE": "rank1"})
        assert t.wait() != 0
        ev = self.events(self.newest_run())
        return {"failure_seen_ms": (t.seen("<exit>") - ev["failed"]) * 1000}

    def serve_follow_stop(self, code: Path, follow: float) -> dict[str, float]:
        env = {**os.environ, "PYTHONPATH": str(code)}
        subprocess.run([sys.executable, "-m", "ftcluster", "launch", "--cluster", str(self.cluster), "--nodes", "2",
                        "--keep-serving", "--no-client"], cwd=str(self.tmp), env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run = self.newest_run()
        logs = self.start(code, ["logs", run.name, "-f"])
        started = time.time()
        time.sleep(follow)
        stop = self.start(code, ["stop", run.name])
        asked = time.time()
        assert stop.wait() == 0, "".join(line for _, line in stop.lines[-20:])
        logs.wait()
        done = self.events(run)["done"]
        out = {f"follow_{k}": v for k, v in logs.counts(run, started + 60, asked).items()}
        out.update({f"stop_{k}": v for k, v in stop.counts(run, asked, stop.seen("<exit>")).items()})
        out["stop_s"] = stop.seen("<exit>") - asked
        out["logs_end_seen_ms"] = (logs.seen("<exit>") - done) * 1000
        out["stop_end_seen_ms"] = (stop.seen("<exit>") - done) * 1000
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--load", type=float, default=100.0, help="seconds of simulated model load (> 60)")
    ap.add_argument("--follow", type=float, default=120.0, help="seconds logs -f follows a serving run (> 60)")
    ap.add_argument("--before", default=BEFORE)
    ap.add_argument("--after", default="HEAD")
    args = ap.parse_args()
    from tests.cluster.testbed import running_testbed

    tmp = Path(tempfile.mkdtemp(prefix="ftc-bench-budget-"))
    codes = {"before": code_of(args.before, tmp / "before"), "after": code_of(args.after, tmp / "after")}
    os.environ["FTCLUSTER_STATE_DIR"] = str(tmp / "state")
    ws = tmp / "ws"
    spec = {"name": "bench", "scheduler": "slurm", "partition": "debug", "gpus_per_node": 1,
            "request_gpus": False, "exclusive": False, "workspace": str(ws),
            "server": {"binary": str(find_tritonserver()), "ready_timeout": int(args.load) + 120,
                       "exit_grace": 10}}
    cluster = tmp / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(spec))
    bench = Bench(tmp, cluster, ws)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in codes}
    with running_testbed():
        for i in range(args.repeats):
            for name, code in codes.items():
                row = {f"launch_{k}": v for k, v in bench.launch(code, args.load).items()}
                row.update(bench.serve_follow_stop(code, args.follow))
                row.update(bench.failure(code))
                results[name].append(row)
                print(f"repeat {i + 1}/{args.repeats} {name}: {row}", file=sys.stderr)
    med = report.medians(results)
    print(f"traces and runs in {tmp}", file=sys.stderr)
    print(f"before = {args.before}, after = {args.after}; 2 nodes, load {args.load:.0f} s, "
          f"logs -f for {args.follow:.0f} s; median of {args.repeats}")
    print("per minute, from each command's second minute (stop: over its whole wait)")
    report.table(med, [("launch_queries_min", "launch Slurm/min", ".1f"), ("launch_paths_min", "paths/min", ".0f"),
                       ("launch_reads_min", "reads/min", ".0f"),
                       ("follow_queries_min", "logs -f Slurm/min", ".1f"), ("follow_paths_min", "paths/min", ".0f"),
                       ("follow_reads_min", "reads/min", ".0f"),
                       ("stop_queries_min", "stop Slurm/min", ".1f"), ("stop_paths_min", "paths/min", ".0f"),
                       ("stop_s", "stop s", ".1f")])
    print("reaction, ms after the job's own event")
    report.table(med, [("launch_ready_seen_ms", "ready seen", ".0f"), ("failure_seen_ms", "failure seen", ".0f"),
                       ("logs_end_seen_ms", "end seen (logs -f)", ".0f"),
                       ("stop_end_seen_ms", "end seen (stop)", ".0f")])
    for metric in ("launch_queries_min", "launch_paths_min", "follow_queries_min", "follow_paths_min",
                   "stop_queries_min", "launch_ready_seen_ms", "failure_seen_ms", "logs_end_seen_ms",
                   "stop_end_seen_ms"):
        if med["after"].get(metric):
            report.print_ratios(med, metric, [("before", "after")])
    report.print_json(med, repeats=args.repeats, load=args.load, follow=args.follow, before=args.before)


if __name__ == "__main__":
    main()
