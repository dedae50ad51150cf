"""What sampling a serving run costs: two local serving runs of the demo model side by side, one
sampling rank 0's Triton metrics every --interval seconds (server.metrics_interval), one not
(metrics_interval 0); the same liveness probes on both.

    python bench/sampling_cost.py [--interval 1] [--seconds 3] [--repeats 5] [--idle 20]

  throughput  c=8 closed loop against each run's endpoint in turn, interleaved, --repeats times:
              requests/s with and without sampling (ratio; goal >= 0.99 at the default 10 s,
              measured here at a 10x faster --interval);
  CPU         the job process's CPU seconds over --idle seconds of serving with nothing else
              asking, both runs at once: the extra per sample (CPU per sample x rate);
  memory      the job process's resident memory (VmRSS, VmHWM) with and without the sampler;
  size        the mean bytes of a metrics.jsonl line, so a day's samples at the default 10 s.
The per-node GPU sampler (nvidia-smi in each rank's wrapper) needs a GPU: not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402
from load import cpu_seconds  # noqa: E402
from replicas import ftc, measure  # noqa: E402

from tests.launch_helpers import free_port_base  # noqa: E402

DEFAULT_INTERVAL = 10.0


def launch(folder: Path, env: dict[str, str], interval: float) -> dict[str, Any]:
    base = free_port_base(ranks=2)
    spec = {"name": "bench", "scheduler": "local", "gpus_per_node": 1, "workspace": str(folder / "ws"),
            "ports": {"http": base, "grpc": base + 1, "metrics": base + 2},
            "server": {"binary": "auto", "ready_timeout": 60, "exit_grace": 5, "metrics_interval": interval}}
    (folder / "cluster.yaml").write_text(yaml.safe_dump(spec))
    out = ftc(env, "launch", "--cluster", str(folder / "cluster.yaml"), "--nodes", "1", "--keep-serving",
              "--no-client", "--json")
    return ftc(env, "status", str(out["run_id"]), "--json")


def job_pid(run_dir: str) -> int:
    """The run's job (the supervisor's Python): its command line names the run's scripts folder."""
    scripts = os.path.join(run_dir, "scripts")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.startswith(scripts.encode()) for a in argv) and any(b"python" in a for a in argv[:1]):
            return int(proc.name)
    raise SystemExit(f"no job process of {run_dir}")


def memory_kib(pid: int) -> dict[str, int]:
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(rest.split()[0])
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=1.0, help="server.metrics_interval of the sampling run")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--idle", type=float, default=20.0, help="seconds of serving with nothing asking, for CPU")
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ftc-sampling-bench-") as tmp:
        env = {**os.environ, "FTCLUSTER_STATE_DIR": str(Path(tmp) / "state")}
        started: dict[str, dict[str, Any]] = {}
        try:
            for name, interval in (("sampling", args.interval), ("off", 0.0)):
                (Path(tmp) / name).mkdir()
                started[name] = launch(Path(tmp) / name, env, interval)
            pids = {name: job_pid(st["run_dir"]) for name, st in started.items()}
            # CPU with nothing asking: both runs serve, both jobs probe; one also samples.
            cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
            time.sleep(args.idle)
            cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
            for i in range(args.repeats):
                order = ("sampling", "off") if i % 2 == 0 else ("off", "sampling")
                for name in order:
                    got = asyncio.run(measure({name: started[name]["endpoint"]}, 8, args.seconds))
                    runs.setdefault(name, []).append({"rate": got[name].rate})
                print(f"repeat {i + 1}: " + " | ".join(f"{k} {v[-1]['rate']:.0f}/s" for k, v in runs.items()), flush=True)
            mem = {name: memory_kib(pid) for name, pid in pids.items()}
            lines = (Path(started["sampling"]["run_dir"]) / "state" / "metrics.jsonl").read_bytes().splitlines()
        finally:
            for st in started.values():
                ftc(env, "stop", st["run_id"])
    med = report.medians(runs)
    report.table(med, [("rate", "req/s", ".1f")])
    ratio = med["sampling"]["rate"] / med["off"]["rate"]
    samples = args.idle / args.interval
    per_sample_ms = (cpu["sampling"] - cpu["off"]) * 1000 / samples
    line_bytes = statistics.mean(len(ln) + 1 for ln in lines) if lines else 0.0
    day_mb = line_bytes * 86400 / DEFAULT_INTERVAL / 1e6
    print(f"throughput with sampling every {args.interval:g} s: {ratio:.3f}x without (c=8, medians of {args.repeats})")
    print(f"job CPU over {args.idle:g} s idle: {cpu['sampling']:.3f} s sampling, {cpu['off']:.3f} s not: "
          f"{per_sample_ms:.2f} ms a sample, {per_sample_ms / DEFAULT_INTERVAL / 10:.4f} % of a core at the "
          f"default {DEFAULT_INTERVAL:g} s")
    print(f"job memory: sampling {mem['sampling']}, off {mem['off']} (KiB)")
    print(f"metrics.jsonl: {len(lines)} lines, {line_bytes:.0f} bytes a line: {day_mb:.1f} MB a day at "
          f"{DEFAULT_INTERVAL:g} s")
    report.print_json(med, interval=args.interval, ratio=ratio, cpu_s=cpu, per_sample_ms=per_sample_ms,
                      memory_kib=mem, line_bytes=line_bytes, day_mb=day_mb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
