"""GPU preflight, run on every rank through the same launch path as the servers.

    python -m ftcluster.rank.preflight [--sizes 1M..1G] [--out DIR] [--no-bandwidth]
    python3 scripts/preflight.py ...      (as `ftcluster preflight` runs it, inside the image)

It runs inside the user's image, which has no ftcluster: the run copies this file and env.py
(as rank_env.py) into its scripts/ folder; both need only Python >= 3.8's standard library.
The GPUs come from the image's NVML (nvidia-ml-py) or nvidia-smi, the all-reduce from its torch
and NCCL; without torch the bandwidth test is skipped and says so.

Every rank reports its host and visible GPUs (NVML through nvidia-ml-py, else nvidia-smi):
model, memory, driver, CUDA_VISIBLE_DEVICES; a CPU-only rank says "no GPU". Unless
--no-bandwidth, the ranks then time an all-reduce over NCCL (torch.distributed) from 1 MB to
1 GB and rank 0 reports it like nccl-tests (algbw, busbw = algbw * 2(n-1)/n, time = slowest
rank), naming the slowest rank and the NCCL transports seen (NET/IB, NET/Socket, P2P, SHM...).

Each rank prints one `FTC_PREFLIGHT_RANK <json>` line; rank 0 prints `FTC_PREFLIGHT_REPORT
<json>` with everything it gathered (torch.distributed, or the files of --out DIR when torch
is not used) and writes DIR/preflight.json. Imports nothing from the CLI.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

try:
    from ftcluster.rank.env import RankEnv, apply_nvls_off, detect_rank_env, which_in_image
except ImportError:  # inside the user's image: rank_env.py lies beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # also under python -I
    from rank_env import RankEnv, apply_nvls_off, detect_rank_env, which_in_image  # type: ignore[no-redef]

RANK_TAG = "FTC_PREFLIGHT_RANK"
REPORT_TAG = "FTC_PREFLIGHT_REPORT"
REPORT_FILE = "preflight.json"
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class InventoryError(ValueError):
    """Nodes disagree about their GPUs, or a node has none where GPUs are needed."""


@dataclass
class GpuInfo:
    index: int
    name: str
    memory_mib: int
    uuid: str = ""
    bus_id: str = ""


@dataclass
class RankReport:
    rank: int
    world_size: int
    local_rank: int
    host: str
    cuda_visible_devices: str | None
    gpus: list[GpuInfo] = field(default_factory=list)  # the ones this rank may use
    gpus_on_host: int = 0  # all the host has, whatever CUDA_VISIBLE_DEVICES says
    driver: str | None = None
    cuda_driver: str | None = None
    source: str = "none"  # "nvml", "nvidia-smi" or "none"
    note: str | None = None  # why no GPU was found
    transport: list[str] = field(default_factory=list)
    times_s: dict[str, float] = field(default_factory=dict)  # all-reduce size (bytes) -> seconds
    # Where the rank ran: the OS (/etc/os-release's PRETTY_NAME) and Python of the image or host,
    # and the server binary the run would start there (None: not there, or not asked).
    os_release: str = ""
    python: str = ""
    tritonserver: str | None = None

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    def summary(self) -> str:
        head = f"rank {self.rank} on {self.host}"
        if not self.gpus:
            return f"{head}: no GPU ({self.note or 'none visible'})"
        models = ", ".join(sorted({g.name for g in self.gpus}))
        return (f"{head}: {len(self.gpus)} GPU(s) {models}, {self.gpus[0].memory_mib} MiB, "
                f"driver {self.driver}, CUDA_VISIBLE_DEVICES={self.cuda_visible_devices}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankReport:
        d = dict(data)
        d["gpus"] = [GpuInfo(**g) for g in d.get("gpus", [])]
        d.pop("has_gpu", None)
        return cls(**d)


# ---------------------------------------------------------------- sizes


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text.upper())
    if not m:
        raise ValueError(f"{text!r} is not a size like 1M or 256K")
    return int(m.group(1)) * _UNITS[m.group(2)]


def parse_sizes(text: str) -> list[int]:
    """"1M..1G" doubles from 1 MiB to 1 GiB (nccl-tests -b 1M -e 1G -f 2); "1M,1G" is a list."""
    if ".." in text:
        lo_s, hi_s = text.split("..", 1)
        lo, hi = parse_size(lo_s), parse_size(hi_s)
        if lo < 1 or hi < lo:
            raise ValueError(f"{text!r}: need 0 < first <= last")
        out = [lo]
        while out[-1] * 2 <= hi:
            out.append(out[-1] * 2)
        return out
    return [parse_size(s) for s in text.split(",") if s.strip()]


def human_size(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


# ---------------------------------------------------------------- inventory


def _visible(gpus: list[GpuInfo], cvd: str | None) -> list[GpuInfo]:
    """The GPUs CUDA would expose for this CUDA_VISIBLE_DEVICES (NVML/nvidia-smi ignore it)."""
    if cvd is None:
        return gpus
    out: list[GpuInfo] = []
    for tok in (t.strip() for t in cvd.split(",")):
        if tok.isdigit():
            match = [g for g in gpus if g.index == int(tok)]
        elif tok.startswith(("GPU-", "MIG-")):
            match = [g for g in gpus if g.uuid and g.uuid.startswith(tok)]
        else:
            match = []
        if not match or match[0] in out:
            break  # CUDA stops at the first invalid entry
        out.append(match[0])
    return out


def _nvml() -> tuple[list[GpuInfo], str | None, str | None]:
    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    try:
        def text(v: Any) -> str:
            return v.decode() if isinstance(v, bytes) else str(v)

        driver = text(pynvml.nvmlSystemGetDriverVersion())
        try:
            cv = int(pynvml.nvmlSystemGetCudaDriverVersion())
            cuda: str | None = f"{cv // 1000}.{cv % 1000 // 10}"
        except Exception:
            cuda = None
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append(GpuInfo(
                index=i, name=text(pynvml.nvmlDeviceGetName(h)),
                memory_mib=int(pynvml.nvmlDeviceGetMemoryInfo(h).total) // (1 << 20),
                uuid=text(pynvml.nvmlDeviceGetUUID(h)),
                bus_id=text(pynvml.nvmlDeviceGetPciInfo(h).busId),
            ))
        return gpus, driver, cuda
    finally:
        pynvml.nvmlShutdown()


def parse_nvidia_smi(csv_text: str) -> tuple[list[GpuInfo], str | None]:
    """Rows of `--query-gpu=index,name,memory.total,driver_version,uuid,pci.bus_id
    --format=csv,noheader,nounits`."""
    gpus, driver = [], None
    for line in csv_text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 4 or not cols[0].isdigit():
            continue
        mem = re.sub(r"[^0-9]", "", cols[2])
        gpus.append(GpuInfo(index=int(cols[0]), name=cols[1], memory_mib=int(mem or 0),
                            uuid=cols[4] if len(cols) > 4 else "",
                            bus_id=cols[5] if len(cols) > 5 else ""))
        driver = cols[3]
    return gpus, driver


def _nvidia_smi() -> tuple[list[GpuInfo], str | None]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi not found")
    proc = subprocess.run(
        [exe, "--query-gpu=index,name,memory.total,driver_version,uuid,pci.bus_id",
         "--format=csv,noheader,nounits"], check=False, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError((proc.stderr or proc.stdout).strip() or f"exit {proc.returncode}")
    return parse_nvidia_smi(proc.stdout)


def os_release(path: str = "/etc/os-release") -> str:
    """PRETTY_NAME of the system this runs on (in a container: the image's)."""
    try:
        with open(path) as fh:
            for line in fh:
                key, _, value = line.strip().partition("=")
                if key == "PRETTY_NAME":
                    return value.strip().strip('"')
    except OSError:
        pass
    return ""


def collect_inventory(rank_env: RankEnv | None = None) -> RankReport:
    """This rank's host and GPUs; never raises for a missing GPU or driver."""
    re_ = rank_env or RankEnv(0, 1, 0, "127.0.0.1", 0, "single")
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    rep = RankReport(rank=re_.rank, world_size=re_.world_size, local_rank=re_.local_rank,
                     host=socket.gethostname(), cuda_visible_devices=cvd, os_release=os_release(),
                     python=platform.python_version())
    notes: list[str] = []
    gpus: list[GpuInfo] = []
    try:
        gpus, rep.driver, rep.cuda_driver = _nvml()
        rep.source = "nvml"
    except ImportError:
        notes.append("nvidia-ml-py not installed")
    except Exception as exc:  # no libnvidia-ml or no driver
        notes.append(f"NVML: {exc}")
    if rep.source == "none":
        try:
            gpus, rep.driver = _nvidia_smi()
            rep.source = "nvidia-smi"
        except Exception as exc2:
            notes.append(f"nvidia-smi: {exc2}")
            gpus = []
    rep.gpus_on_host = len(gpus)
    rep.gpus = _visible(gpus, cvd)
    if not rep.gpus:
        if rep.source == "none":
            rep.note = "; ".join(notes)
        elif gpus:
            rep.note = f"{len(gpus)} on the host, none in CUDA_VISIBLE_DEVICES={cvd!r}"
        else:
            rep.note = f"{rep.source} lists no GPU"
    return rep


# ---------------------------------------------------------------- checks (pure)


def _who(r: RankReport) -> str:
    return f"rank {r.rank} ({r.host})"


def check_inventory(reports: Sequence[RankReport], expected_gpus_per_node: int | str | None,
                    require_gpus: bool = True) -> list[str]:
    """Problems with the nodes' GPUs, one message each (empty: all good).

    One report is one node (preflight runs one rank per node). Nodes must agree on the GPU
    count and models; an int `expected_gpus_per_node` must match; "auto"/None only compares.
    """
    errors: list[str] = []
    if not reports:
        return ["no rank reported"]
    ranks = sorted(r.rank for r in reports)
    world = max(r.world_size for r in reports)
    if ranks != list(range(world)):
        missing = sorted(set(range(world)) - set(ranks))
        errors.append(f"ranks {missing} of {world} did not report" if missing
                      else f"duplicate or unexpected ranks {ranks}")
    if require_gpus:
        by_note: dict[str, list[RankReport]] = {}
        for r in reports:
            if not r.has_gpu:
                by_note.setdefault(r.note or "none visible", []).append(r)
        for note, rs in by_note.items():
            errors.append(f"no GPU on {', '.join(_who(r) for r in rs)}: {note}")
    by_count: dict[int, list[RankReport]] = {}
    for r in reports:
        by_count.setdefault(len(r.gpus), []).append(r)
    if len(by_count) > 1:
        parts = [f"{n} GPU(s) on " + ", ".join(_who(r) for r in rs)
                 for n, rs in sorted(by_count.items())]
        errors.append("nodes see different GPU counts: " + "; ".join(parts))
    elif isinstance(expected_gpus_per_node, int) and reports[0].has_gpu:
        n = len(reports[0].gpus)
        if n != expected_gpus_per_node:
            errors.append(f"every node sees {n} GPU(s), the cluster spec says gpus_per_node: "
                          f"{expected_gpus_per_node}")
    by_model: dict[tuple[str, ...], list[RankReport]] = {}
    for r in reports:
        if r.has_gpu:
            by_model.setdefault(tuple(sorted({g.name for g in r.gpus})), []).append(r)
    if len(by_model) > 1:
        parts = [f"{', '.join(m)} on " + ", ".join(_who(r) for r in rs)
                 for m, rs in sorted(by_model.items())]
        errors.append("nodes have different GPU models: " + "; ".join(parts))
    return errors


def detect_gpus_per_node(reports: Sequence[RankReport]) -> int:
    """The GPU count every node shares (for `gpus_per_node: auto`); InventoryError if none."""
    counts = {len(r.gpus) for r in reports}
    if not reports or counts == {0}:
        raise InventoryError("gpus_per_node: auto found no GPU on any node")
    if len(counts) > 1:
        raise InventoryError("; ".join(check_inventory(reports, None, require_gpus=False)))
    return counts.pop()


# ---------------------------------------------------------------- bandwidth (pure parts)


def busbw_factor(world_size: int) -> float:
    """nccl-tests' all-reduce correction: each byte crosses 2(n-1)/n links."""
    return 2.0 * (world_size - 1) / world_size if world_size > 1 else 1.0


def summarize_bandwidth(reports: Sequence[RankReport]) -> list[dict[str, Any]]:
    """One nccl-tests row per size: the time is the slowest rank's, as bandwidth is set by it."""
    world = len(reports)
    sizes = sorted({int(s) for r in reports for s in r.times_s}, key=int)
    rows = []
    for size in sizes:
        times = {r.rank: r.times_s[str(size)] for r in reports if str(size) in r.times_s}
        if len(times) != world:
            continue
        slowest = max(times, key=lambda k: times[k])
        t = times[slowest]
        algbw = size / t / 1e9 if t > 0 else 0.0
        rows.append({"size": size, "time_us": t * 1e6, "algbw_gbs": algbw,
                     "busbw_gbs": algbw * busbw_factor(world), "slowest_rank": slowest,
                     "slowest_host": next(r.host for r in reports if r.rank == slowest)})
    return rows


_TRANSPORT_RE = re.compile(
    r"NET/(IB|Socket|OFI|AWS|\w+)|via (P2P|SHM|NET|CollNet|NVLS)\S*|NVLS|Using network|"
    r"P2P/(CUMEM|IPC|direct)|GPU Direct RDMA")


def transport_lines(text: str, limit: int = 40) -> list[str]:
    """The NCCL INFO lines that say how ranks talk, prefixes and channel numbers folded."""
    seen: dict[str, None] = {}
    for line in text.splitlines():
        if "NCCL INFO" not in line or not _TRANSPORT_RE.search(line):
            continue
        msg = line.split("NCCL INFO", 1)[1].strip()
        msg = re.sub(r"^Channel \d+/\d+ : ", "", msg)
        msg = re.sub(r"^Channel \d+/\d+/\d+ : ", "", msg)
        seen.setdefault(msg, None)
        if len(seen) >= limit:
            break
    return list(seen)


def transports(lines: Sequence[str]) -> list[str]:
    """What ranks actually connect through ("via P2P/CUMEM", "via NET/IB"), then the network
    NCCL picked for inter-node traffic ("network Socket"); "NET/IB : No device found" is not one."""
    found: dict[str, None] = {}
    for line in lines:
        for m in re.finditer(r"via ((?:P2P|SHM|NET|CollNet|NVLS)(?:/\w+)?)", line):
            found.setdefault(m.group(1), None)
    for line in lines:
        net = re.search(r"Using network (\w+)", line)
        if net:
            found.setdefault(f"network {net.group(1)}", None)
    return list(found)


def build_report(reports: Sequence[RankReport], bandwidth: bool, skipped: str | None = None,
                 expected_gpus_per_node: int | str | None = None) -> dict[str, Any]:
    reps = sorted(reports, key=lambda r: r.rank)
    rows = summarize_bandwidth(reps) if bandwidth else []
    lines = [ln for r in reps for ln in r.transport]
    report: dict[str, Any] = {
        "world_size": len(reps),
        "ranks": [{**asdict(r), "has_gpu": r.has_gpu} for r in reps],
        "no_gpu_ranks": [r.rank for r in reps if not r.has_gpu],
        "errors": check_inventory(reps, expected_gpus_per_node, require_gpus=False),
        "bandwidth": rows,
        "bandwidth_skipped": skipped,
        "busbw_factor": busbw_factor(len(reps)),
        "transports": transports(lines),
        "transport_lines": list(dict.fromkeys(lines)),
    }
    try:
        report["gpus_per_node"] = detect_gpus_per_node(reps)
    except InventoryError:
        report["gpus_per_node"] = None
    if rows:
        last = rows[-1]
        report["largest"] = last
        report["slowest_rank"] = last["slowest_rank"]
    return report


def format_bandwidth(rows: Sequence[dict[str, Any]]) -> str:
    out = [f"{'size':>8} {'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}  slowest"]
    for r in rows:
        out.append(f"{human_size(r['size']):>8} {r['time_us']:>10.1f} {r['algbw_gbs']:>12.2f} "
                   f"{r['busbw_gbs']:>12.2f}  rank {r['slowest_rank']} ({r['slowest_host']})")
    return "\n".join(out)


def parse_tagged(text: str) -> tuple[dict[str, Any] | None, list[RankReport]]:
    """The report and rank lines a run printed (stdout of srun or of local ranks)."""
    report, ranks = None, {}
    for line in text.splitlines():
        if line.startswith(REPORT_TAG + " "):
            report = json.loads(line[len(REPORT_TAG) + 1:])
        elif line.startswith(RANK_TAG + " "):
            r = RankReport.from_dict(json.loads(line[len(RANK_TAG) + 1:]))
            ranks[r.rank] = r
    return report, [ranks[k] for k in sorted(ranks)]


# ---------------------------------------------------------------- the rank's run


def _nccl_debug_to_file() -> str:
    """Send NCCL's INFO log to a file of ours, so stdout stays clean and we can read it."""
    d = tempfile.mkdtemp(prefix="ftc-nccl-")
    os.environ.setdefault("NCCL_DEBUG", "INFO")
    os.environ.setdefault("NCCL_DEBUG_FILE", os.path.join(d, "nccl.%h.%p.log"))
    return d


def _read_nccl_log(d: str) -> list[str]:
    text = ""
    for path in glob.glob(os.path.join(d, "*.log")):
        text += Path(path).read_text(errors="replace")
    shutil.rmtree(d, ignore_errors=True)
    return transport_lines(text)


def run_allreduce(sizes: Sequence[int], rank_env: RankEnv, group: Any, dtype_name: str,
                  warmup: int, iters: int) -> dict[str, float]:
    """Seconds per all-reduce at each size on this rank (CUDA events around `iters` calls)."""
    # the NCCL test's torch is the image's, on the nodes only
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", rank_env.local_rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dtype = getattr(torch, dtype_name)
    elem = torch.tensor([], dtype=dtype).element_size()
    # Correctness first: a sum of ones must be the world size.
    ones = torch.ones(1024, dtype=torch.float32, device=dev)
    dist.all_reduce(ones, group=group)
    if not bool((ones == rank_env.world_size).all()):
        raise RuntimeError(f"all-reduce gave {ones[0].item()}, expected {rank_env.world_size}")
    buf = torch.zeros(max(sizes) // elem, dtype=dtype, device=dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times: dict[str, float] = {}
    for size in sizes:
        view = buf[: max(1, size // elem)]
        for _ in range(warmup):
            dist.all_reduce(view, group=group)
        torch.cuda.synchronize(dev)
        dist.barrier(group=group, device_ids=[dev.index])
        start.record()
        for _ in range(iters):
            dist.all_reduce(view, group=group)
        end.record()
        end.synchronize()
        times[str(size)] = start.elapsed_time(end) / 1e3 / iters
    del buf
    return times


def _file_gather(out: Path, rep: RankReport, world: int, timeout: float) -> list[RankReport]:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".rank-{rep.rank:05d}.json.tmp"
    tmp.write_text(json.dumps(asdict(rep)))
    tmp.rename(out / f"rank-{rep.rank:05d}.json")  # atomic: rank 0 never reads half a file
    if rep.rank != 0:
        return []
    deadline = time.monotonic() + timeout
    while True:
        files = sorted(out.glob("rank-*.json"))
        if len(files) >= world or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    reps = [RankReport.from_dict(json.loads(f.read_text())) for f in files]
    return [r for r in reps if r.rank < world]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ftcluster.rank.preflight",
                                 description="GPU inventory and NCCL all-reduce check per rank.")
    ap.add_argument("--sizes", default="1M..1G", help="1M..1G (doubling) or a list 1M,64M,1G")
    ap.add_argument("--out", type=Path, help="folder for rank files and preflight.json")
    ap.add_argument("--no-bandwidth", action="store_true", help="inventory only (no torch)")
    ap.add_argument("--dtype", default="bfloat16", help="torch dtype of the all-reduce")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--expect-gpus-per-node", default=None,
                    help="an int or 'auto'; mismatches go to the report's errors")
    ap.add_argument("--timeout", type=float, default=300.0, help="rendezvous/gather timeout (s)")
    ap.add_argument("--tritonserver", default=None,
                    help="the server binary the run would start: reported when it is there")
    ap.add_argument("--master-addr", default=None,
                    help="rendezvous host when the launcher names none (mpirun across hosts)")
    args = ap.parse_args(argv)
    if args.master_addr:
        os.environ.setdefault("MASTER_ADDR", args.master_addr)
    sizes = parse_sizes(args.sizes)
    expect: int | str | None = args.expect_gpus_per_node
    if isinstance(expect, str) and expect.isdigit():
        expect = int(expect)

    apply_nvls_off()
    rank_env = detect_rank_env()
    rep = collect_inventory(rank_env)
    rep.tritonserver = which_in_image(args.tritonserver) if args.tritonserver else None
    print(rep.summary(), flush=True)
    print(f"{RANK_TAG} {json.dumps(asdict(rep))}", flush=True)

    skipped: str | None = "--no-bandwidth" if args.no_bandwidth else None
    if skipped is None and rank_env.world_size == 1:
        # One task per node: with one node nothing crosses a link, and an all-reduce over one
        # rank copies nothing (measured: "109 TB/s" at 1 GiB on an H200).
        skipped = "one node: the all-reduce measures the links between nodes (one rank per node)"
    torch_ok = False
    if skipped is None:
        try:
            # the NCCL test's torch is the image's, on the nodes only
            import torch
            import torch.distributed as dist
            torch_ok = True
        except ImportError:
            skipped = "torch is not importable on this rank"
    reports: list[RankReport] = [rep]
    if torch_ok:
        nccl_dir = _nccl_debug_to_file()
        # Gloo first: it works on every rank, so ranks agree whether NCCL can run at all.
        dist.init_process_group("gloo", init_method=rank_env.init_method, rank=rank_env.rank,
                                world_size=rank_env.world_size,
                                timeout=timedelta(seconds=args.timeout))
        try:
            world_reps: list[Any] = [None] * rank_env.world_size
            dist.all_gather_object(world_reps, asdict(rep))
            all_reps = [RankReport.from_dict(d) for d in world_reps]
            cuda_ok = torch.cuda.is_available() and torch.cuda.device_count() > 0
            flags: list[Any] = [None] * rank_env.world_size
            dist.all_gather_object(flags, cuda_ok)
            if all(flags):
                group = dist.new_group(backend="nccl")
                rep.times_s = run_allreduce(sizes, rank_env, group, args.dtype, args.warmup,
                                            args.iters)
                dist.destroy_process_group(group)
                rep.transport = _read_nccl_log(nccl_dir)
            else:
                skipped = "no GPU (CUDA) on " + ", ".join(
                    _who(r) for r, ok in zip(all_reps, flags) if not ok)
            gathered: list[Any] = [None] * rank_env.world_size
            dist.all_gather_object(gathered, asdict(rep))
            reports = [RankReport.from_dict(d) for d in gathered]
        finally:
            dist.destroy_process_group()
    elif args.out is not None and rank_env.world_size > 1:
        reports = _file_gather(args.out, rep, rank_env.world_size, args.timeout)

    if rank_env.rank != 0:
        return 0
    report = build_report(reports, bandwidth=skipped is None, skipped=skipped,
                          expected_gpus_per_node=expect)
    report["complete"] = len(reports) == rank_env.world_size
    if report["bandwidth"]:
        print(format_bandwidth(report["bandwidth"]), flush=True)
    elif skipped:
        print(f"bandwidth test skipped: {skipped}", flush=True)
    for line in report["transport_lines"][:12]:
        print(f"nccl: {line}", flush=True)
    print(f"{REPORT_TAG} {json.dumps(report)}", flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
