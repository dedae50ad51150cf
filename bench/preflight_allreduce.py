"""Is the preflight's all-reduce number honest? Compare it with a plain torch.distributed loop.

    python bench/preflight_allreduce.py [--gpus 2] [--repeats 3] [--sizes 1M..1G] [--out DIR]

Alternates, `--repeats` times: the preflight (ftcluster.rank.preflight on N ranks started by
ftcluster's local launcher, one GPU each) and a plain all_reduce loop under torchrun (one
process per GPU, wall clock around synchronize, the slowest rank's time). Prints the median
busbw per size for both and the ratio at the largest size (goal >= 0.95); writes
DIR/bench_preflight_allreduce.json and the first preflight report.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ftcluster.rank.env import apply_nvls_off, child_env
from ftcluster.rank.preflight import busbw_factor, human_size, parse_sizes

# The preflight's busbw at the largest size against the plain loop's (issue: >= 0.95).
GOAL = 0.95

PLAIN_TAG = "PLAIN_ALLREDUCE"


def _pythonpath() -> str:
    """Our checkout first, then whatever the caller had (carried packages, say)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)


def plain_worker(sizes: list[int], dtype_name: str, warmup: int, iters: int) -> None:
    """One torchrun process: the textbook all_reduce timing loop."""
    import torch
    import torch.distributed as dist

    apply_nvls_off()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = getattr(torch, dtype_name)
    elem = torch.tensor([], dtype=dtype).element_size()
    buf = torch.zeros(max(sizes) // elem, dtype=dtype, device="cuda")
    out = {}
    for size in sizes:
        view = buf[: size // elem]
        for _ in range(warmup):
            dist.all_reduce(view)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(view)
        torch.cuda.synchronize()
        dt = torch.tensor([(time.perf_counter() - t0) / iters], device="cuda")
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        algbw = size / dt.item() / 1e9
        out[str(size)] = algbw * busbw_factor(world)
    if rank == 0:
        print(f"{PLAIN_TAG} {json.dumps(out)}", flush=True)
    dist.destroy_process_group()


def run_plain(gpus: int, sizes: str, args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={gpus}", str(Path(__file__).resolve()), "--worker",
           "--sizes", sizes, "--dtype", args.dtype, "--warmup", str(args.warmup),
           "--iters", str(args.iters)]
    proc = subprocess.run(cmd, check=False, env=child_env({"PYTHONPATH": _pythonpath()}),
                          capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith(PLAIN_TAG + " "):
            return {k: float(v) for k, v in json.loads(line[len(PLAIN_TAG) + 1:]).items()}
    raise RuntimeError(f"plain loop failed ({proc.returncode}): {proc.stderr[:3000]}")


def run_preflight(gpus: int, sizes: str, args: argparse.Namespace,
                  work: Path) -> tuple[dict[str, float], dict[str, Any]]:
    from ftcluster.schedulers.local_ranks import run_local_ranks

    out = work / "out"
    argv = [sys.executable, "-m", "ftcluster.rank.preflight", "--sizes", sizes, "--out", str(out),
            "--dtype", args.dtype, "--warmup", str(args.warmup), "--iters", str(args.iters)]
    results = run_local_ranks(argv, gpus, 1, env={"PYTHONPATH": _pythonpath()}, timeout=600,
                              log_dir=work / "logs")
    bad = [r for r in results if not r.ok]
    if bad:
        raise RuntimeError(f"preflight rank {bad[0].rank} exited {bad[0].returncode}: "
                           f"{bad[0].stderr()[-2000:]}")
    report = json.loads((out / "preflight.json").read_text())
    return {str(r["size"]): float(r["busbw_gbs"]) for r in report["bandwidth"]}, report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--gpus", type=int, default=0, help="ranks, one GPU each (default: all)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="1M..1G")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = parse_sizes(args.sizes)
    if args.worker:
        plain_worker(sizes, args.dtype, args.warmup, args.iters)
        return 0

    import torch

    gpus = args.gpus or torch.cuda.device_count()
    if gpus < 2:
        print(f"needs >= 2 GPUs, found {gpus}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="ftc-bench-"))
    pre: list[dict[str, float]] = []
    plain: list[dict[str, float]] = []
    first_report: dict[str, Any] | None = None
    for i in range(args.repeats):  # alternate so drift hits both alike
        bw, report = run_preflight(gpus, args.sizes, args, work / f"pre{i}")
        pre.append(bw)
        first_report = first_report or report
        plain.append(run_plain(gpus, args.sizes, args))
        print(f"repeat {i}: busbw at {human_size(sizes[-1])}: preflight "
              f"{bw[str(sizes[-1])]:.1f}, plain {plain[-1][str(sizes[-1])]:.1f} GB/s", flush=True)

    rows = []
    print(f"\n{gpus} ranks, {args.dtype}, median of {args.repeats}")
    print(f"{'size':>6} {'preflight busbw':>16} {'plain busbw':>12} {'ratio':>6}")
    for s in sizes:
        a = statistics.median(r[str(s)] for r in pre)
        b = statistics.median(r[str(s)] for r in plain)
        rows.append({"size": s, "preflight_busbw_gbs": a, "plain_busbw_gbs": b, "ratio": a / b})
        print(f"{human_size(s):>6} {a:>16.1f} {b:>12.1f} {a / b:>6.3f}")
    big = rows[-1]
    verdict = "ok" if big["ratio"] >= GOAL else "BELOW GOAL"
    print(f"\nbusbw at {human_size(int(big['size']))}: preflight {big['preflight_busbw_gbs']:.1f} GB/s, "
          f"plain {big['plain_busbw_gbs']:.1f} GB/s, ratio {big['ratio']:.3f} (goal >= {GOAL}: {verdict})")
    assert first_report is not None
    inv = [f"rank {r['rank']}: {r['host']} "
           + ", ".join(f"{g['name']} {g['memory_mib']} MiB" for g in r["gpus"])
           + f" driver {r['driver']} CVD={r['cuda_visible_devices']}" for r in first_report["ranks"]]
    print("inventory:\n  " + "\n  ".join(inv))
    print("NCCL transports: " + ", ".join(first_report["transports"]))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        result = {"gpus": gpus, "dtype": args.dtype, "repeats": args.repeats, "rows": rows,
                  "preflight_runs": pre, "plain_runs": plain}
        (args.out / "bench_preflight_allreduce.json").write_text(json.dumps(result, indent=2))
        (args.out / "preflight_report.json").write_text(json.dumps(first_report, indent=2))
    return 0 if big["ratio"] >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
