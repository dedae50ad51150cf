"""How fast does `ftcluster logs` follow, and what does `--tail 100` of a 1 GB log cost?

    python bench/logs_follow.py [--lines 200] [--size-gb 1] [--repeats 5]

- follow latency: a writer appends timestamped lines (one every 20 ms) to two rank logs of a
  recorded run while `ftcluster logs RUN -f` runs; latency = time the CLI printed the line -
  time it was written (median, p90). Baseline in the same run: `tail -F` of the same file.
- tail: `ftcluster logs RUN --server --rank 0 --tail 100` on a 1 GB log against
  `tail -n 100 FILE` (median wall time of the repeats, and the ratio), with the peak RSS of
  each process, which must not grow with the file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ftcluster.render.scripts import RunPaths  # noqa: E402
from ftcluster.run.store import RunRecord, RunStore  # noqa: E402


def make_run(tmp: Path) -> tuple[RunRecord, RunPaths, subprocess.Popen[bytes]]:
    """A recorded local run whose 'job' is a live script, so `logs -f` follows until it ends."""
    paths = RunPaths("bench-run", tmp / "bench-run")
    for d in (paths.logs, paths.state, paths.scripts):
        d.mkdir(parents=True, exist_ok=True)
    script = paths.job_script("local")
    script.write_text("#!/bin/bash\nsleep 600\n")
    job = subprocess.Popen(["bash", str(script)], start_new_session=True)
    for r in range(2):
        (paths.state / f"rank{r}.host").write_text(f"node{r + 1}\n")
    rec = RunRecord(run_id=paths.run_id, created=time.time(), cluster_name="bench", cluster_source="",
                    scheduler="local", style="local", run_dir=str(paths.run_dir), nodes=2, model="bench",
                    job_id=f"local:{job.pid}", status="RUNNING")
    RunStore().add(rec)
    return rec, paths, job


def follow_latency(cmd: list[str], log: Path, lines: int, env: dict[str, str]) -> list[float]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, bufsize=1)
    lat: list[float] = []
    time.sleep(1.0)  # let the follower start

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.time()
            if "BENCH " in line:
                lat.append(now - float(line.rsplit("BENCH ", 1)[1]))
            if len(lat) >= lines:
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    with open(log, "a") as fh:
        for _ in range(lines):
            fh.write(f"x BENCH {time.time():.6f}\n")
            fh.flush()
            time.sleep(0.02)
    t.join(timeout=10)
    proc.terminate()
    proc.wait()
    return [x * 1000 for x in lat]


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB, VmHWM read from /proc while it runs) of one command."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
    hwm = 0.0
    while proc.poll() is None:
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    hwm = max(hwm, int(line.split()[1]) / 1024)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass
        time.sleep(0.0005)
    return time.perf_counter() - t0, hwm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--lines", type=int, default=200)
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ftc-bench-logs-"))
    env = {**os.environ, "FTCLUSTER_STATE_DIR": str(tmp / "state"), "PYTHONPATH": str(ROOT)}
    os.environ["FTCLUSTER_STATE_DIR"] = env["FTCLUSTER_STATE_DIR"]
    rec, paths, job = make_run(tmp)
    log0 = paths.logs / "server-rank0.log"
    log0.touch()
    try:
        ftc = [sys.executable, "-m", "ftcluster", "logs", rec.run_id]
        ours = follow_latency([*ftc, "-f", "--server"], log0, args.lines, env)
        base = follow_latency(["tail", "-n", "0", "-F", str(log0)], log0, args.lines, env)
        print(f"follow latency ms  ftcluster logs -f: median {statistics.median(ours):.1f} "
              f"p90 {statistics.quantiles(ours, n=10)[-1]:.1f} ({len(ours)} lines); "
              f"tail -F: median {statistics.median(base):.1f} p90 {statistics.quantiles(base, n=10)[-1]:.1f}; "
              f"ratio {statistics.median(ours) / statistics.median(base):.2f}")

        # A real (not sparse) log of the asked size, written in 64 MB blocks.
        chunk = b"".join(b"I1122 01:02:03.456789 1234 server.cc:100] line %08d of a long log\n" % i
                         for i in range(1_000_000))[: 64 << 20]
        with open(log0, "wb") as fh:
            written = 0
            while written < args.size_gb * (1 << 30):
                fh.write(chunk)
                written += len(chunk)
        size_mb = log0.stat().st_size / (1 << 20)
        del chunk
        from ftcluster.run.logs import tail_lines

        lib = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            tail_lines(str(log0), 100)
            lib.append(time.perf_counter() - t0)
        print(f"tail_lines(100) in-process on the {size_mb:.0f} MB log: {statistics.median(lib) * 1000:.2f} ms")
        for label, small in (("1 KB log", True), (f"{size_mb:.0f} MB log", False)):
            target = log0 if not small else paths.logs / "server-rank1.log"
            if small:
                target.write_bytes(b"short line\n" * 93)
            rank = "0" if not small else "1"
            ours_t = [timed([*ftc, "--server", "--rank", rank, "--tail", "100"], env) for _ in range(args.repeats)]
            tail_t = [timed(["tail", "-n", "100", str(target)], env) for _ in range(args.repeats)]
            o, t = statistics.median(x[0] for x in ours_t), statistics.median(x[0] for x in tail_t)
            print(f"--tail 100 of a {label}: ftcluster {o * 1000:.0f} ms (peak RSS "
                  f"{max(x[1] for x in ours_t):.0f} MB), tail -n 100 {t * 1000:.1f} ms (peak RSS "
                  f"{max(x[1] for x in tail_t):.1f} MB); ratio {o / t:.1f}")
    finally:
        os.killpg(job.pid, 15)
        job.wait()
        log0.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
