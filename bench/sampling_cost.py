"""What sampling a serving run costs: local serving runs of the demo model, one at a time on the
same ports, alternating: one sampling rank 0's Triton metrics every --interval seconds
(server.metrics_interval), one not (metrics_interval 0); the same liveness probes on both.

    python bench/sampling_cost.py [--interval 1] [--seconds 3] [--repeats 5] [--idle 10]

  throughput  c=8 closed loop against the run's endpoint, requests/s with and without sampling
              (medians; ratio, measured at a 10x faster --interval than the default 10 s);
  CPU         the job process's CPU seconds over --idle seconds of serving with nothing else
              asking: the extra per sample (CPU per sample x rate);
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


def launch(folder: Path, env: dict[str, str], base: int, interval: float) -> dict[str, Any]:
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
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of serving with nothing asking, for CPU")
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {}
    mem: dict[str, dict[str, int]] = {}
    lines: list[bytes] = []
    base = free_port_base(ranks=2)
    with tempfile.TemporaryDirectory(prefix="ftc-sampling-bench-") as tmp:
        env = {**os.environ, "FTCLUSTER_STATE_DIR": str(Path(tmp) / "state")}
        # One run at a time, on the same ports, the two kinds alternating: two servers side by
        # side differed by ~6 % with the same settings (an A/A run), more than what is measured.
        for i in range(args.repeats):
            for name in (("sampling", "off") if i % 2 == 0 else ("off", "sampling")):
                folder = Path(tmp) / f"{name}-{i}"
                folder.mkdir()
                st = launch(folder, env, base, args.interval if name == "sampling" else 0.0)
                try:
                    pid = job_pid(st["run_dir"])
                    rate = asyncio.run(measure({name: st["endpoint"]}, 8, args.seconds))[name].rate
                    # The job's CPU while the run serves with nothing asking (probes, samples).
                    cpu0 = cpu_seconds(pid)
                    time.sleep(args.idle)
                    runs.setdefault(name, []).append({"rate": rate, "cpu_s": cpu_seconds(pid) - cpu0})
                    mem[name] = memory_kib(pid)
                    if name == "sampling":
                        lines = (Path(st["run_dir"]) / "state" / "metrics.jsonl").read_bytes().splitlines()
                finally:
                    ftc(env, "stop", st["run_id"])
            print(f"repeat {i + 1}: " + " | ".join(f"{k} {v[-1]['rate']:.0f}/s" for k, v in runs.items()), flush=True)
    med = report.medians(runs)
    report.table(med, [("rate", "req/s", ".1f"), ("cpu_s", "job CPU s idle", ".3f")])
    ratio = med["sampling"]["rate"] / med["off"]["rate"]
    cpu = {name: med[name]["cpu_s"] for name in med}
    samples = args.idle / args.interval
    per_sample_ms = (cpu["sampling"] - cpu["off"]) * 1000 / samples
    line_bytes = statistics.mean(len(ln) + 1 for ln in lines) if lines else 0.0
    day_mb = line_bytes * 86400 / DEFAULT_INTERVAL / 1e6
    print(f"throughput with sampling every {args.interval:g} s: {ratio:.3f}x without (c=8, medians of {args.repeats})")
    print(f"job CPU over {args.idle:g} s idle (medians): {cpu['sampling']:.3f} s sampling, {cpu['off']:.3f} s not: "
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
