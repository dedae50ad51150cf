"""What the per-node GPU sampler costs, on a GPU machine (ftcluster/job/gpu_sampler.py).

    python bench/gpu_sampler_cost.py [--samples 20] [--seconds 20] [--interval 1] [--out DIR]

  nvidia-smi  one query of the sampler's fields (gpu_samples.QUERY, and the 10 base fields
              alone) run --samples times: wall ms and CPU ms (user + system of the child) a
              sample, medians;
  NVML        libnvidia-ml.so.1 through ctypes (nvml.py): the time to open the event set over
              every GPU, and --samples waits of 100 ms with no event (the timeout path): wall
              ms and the waiting thread's CPU ms a wait;
  sampler     the real sampler process (`python -m ftcluster.job gpus`) every --interval s for
              --seconds, ended by the end of the pid it follows: its CPU (with nvidia-smi's)
              per sample and its resident memory; so the share of a core at the default 10 s;
  fixtures    with --out: the sampler's real CSV lines (tests/data/nvidia_smi_<gpu>_ecc.csv) and
              what NVML said (nvml_events_<gpu>.json: supported and registered event bits per
              GPU, the return codes and times of the waits).
The standard library alone (the sampler runs so in the image), Python >= 3.9.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ftcluster.job.gpu_samples import BASE_QUERY, QUERY, parse_samples  # noqa: E402
from ftcluster.job.nvml import ERROR_TIMEOUT, EventData, Nvml  # noqa: E402

DEFAULT_INTERVAL = 10.0


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def smi_costs(fields: tuple, n: int) -> Dict[str, Any]:
    argv = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    wall, cpu, out = [], [], b""
    for _ in range(n):
        c0, t0 = children_cpu(), time.perf_counter()
        out = subprocess.run(argv, stdout=subprocess.PIPE, check=True).stdout
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((children_cpu() - c0) * 1000)
    return {"wall_ms": round(statistics.median(wall), 2), "cpu_ms": round(statistics.median(cpu), 2),
            "wall_ms_all": [round(w, 2) for w in wall], "last": out.decode()}


def nvml_costs(n: int) -> Dict[str, Any]:
    try:
        nv = Nvml()
    except OSError as e:
        return {"error": str(e)}
    t0 = time.perf_counter()
    nv.open()
    opened_ms = (time.perf_counter() - t0) * 1000
    devices = []
    for handle, (index, uuid) in sorted(nv.devices.items(), key=lambda kv: kv[1][0]):
        supported = ctypes.c_ulonglong()
        nv.lib.nvmlDeviceGetSupportedEventTypes(ctypes.c_void_p(handle), ctypes.byref(supported))
        devices.append({"index": index, "uuid": uuid, "supported": hex(supported.value),
                        "registered": hex(nv.registered.get(index, 0))})
    waits = []
    for _ in range(n):
        raw = EventData()
        c0, t0 = time.thread_time(), time.perf_counter()
        rc = int(nv.lib.nvmlEventSetWait_v2(nv.set, ctypes.byref(raw), ctypes.c_uint(100)))
        waits.append({"rc": rc, "wall_ms": round((time.perf_counter() - t0) * 1000, 2),
                      "cpu_ms": round((time.thread_time() - c0) * 1000, 3)})
    nv.close()
    return {"open_ms": round(opened_ms, 2), "struct_size": ctypes.sizeof(EventData), "devices": devices,
            "notes": nv.notes, "timeout_rc": ERROR_TIMEOUT, "waits": waits,
            "wait_wall_ms": statistics.median(w["wall_ms"] for w in waits),
            "wait_cpu_ms": statistics.median(w["cpu_ms"] for w in waits)}


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def sampler_run(folder: Path, seconds: float, interval: float) -> Dict[str, Any]:
    """The real sampler following a `sleep`: it must end by itself when the sleep does."""
    out, events = folder / "gpu-rank0.csv", folder / "gpu-events-rank0"
    follow = subprocess.Popen(["sleep", str(seconds)])
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "ftcluster.job", "gpus", "--out", str(out), "--events",
                             str(events), "--interval", str(interval), "--max-bytes", str(64 << 20),
                             "--while-pid", str(follow.pid)], cwd=str(ROOT), stderr=subprocess.PIPE)
    time.sleep(min(seconds - 1, 3))
    rss = status_kb(proc.pid, "VmRSS")
    follow.wait()
    _, status, usage = os.wait4(proc.pid, 0)
    ended_s = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    lines = out.read_text().splitlines() if out.exists() else []
    rows = parse_samples(lines)
    gpus = len({r["index"] for r in rows}) or 1
    n = len(rows) // gpus
    cpu = usage.ru_utime + usage.ru_stime
    return {"rc": proc.returncode, "ended_after_s": round(ended_s, 2), "samples": n, "cpu_s": round(cpu, 3),
            "core_percent": round(cpu / ended_s * 100, 2),
            "cpu_ms_per_sample": round(cpu / max(n, 1) * 1000, 2), "rss_kb": rss, "maxrss_kb": usage.ru_maxrss,
            "events_file": events.exists(), "stderr": stderr.strip(), "lines": lines}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if shutil.which("nvidia-smi") is None:
        print("no nvidia-smi here: run this on a GPU machine", file=sys.stderr)
        return 2
    name = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,ecc.mode.current", "--format=csv,noheader"],
                          stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
    res: Dict[str, Any] = {"gpus": name.splitlines(), "python": sys.version.split()[0]}
    res["smi_query"] = smi_costs(QUERY, a.samples)
    res["smi_base"] = smi_costs(BASE_QUERY, a.samples)
    res["nvml"] = nvml_costs(a.samples)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=a.out) as d:
        res["sampler"] = sampler_run(Path(d), a.seconds, a.interval)
    s = res["sampler"]
    waits_per_s = 1000 / 1000   # the sampler's event thread waits 1 s at a time (EVENT_WAIT_MS)
    res["core_share_at_default"] = {
        "percent": round((s["cpu_ms_per_sample"] / (DEFAULT_INTERVAL * 1000)) * 100, 3),
        "event_thread_percent": round(res["nvml"].get("wait_cpu_ms", 0) * waits_per_s / 1000 * 100, 4)}
    short = {k: ({kk: vv for kk, vv in v.items() if kk not in ("lines", "wall_ms_all", "waits", "last")}
                 if isinstance(v, dict) else v) for k, v in res.items()}
    print(json.dumps(short, indent=1))
    if a.out:
        (a.out / "gpu_sampler_cost.json").write_text(json.dumps(res, indent=1) + "\n")
        words = name.split(",")[0].split()   # "NVIDIA H100 80GB HBM3": h100
        gpu = (words[1] if words[0] == "NVIDIA" and len(words) > 1 else words[0]).lower()
        (a.out / f"nvidia_smi_{gpu}_ecc.csv").write_text(
            f"# nvidia-smi on {name.splitlines()[0]}: the gpu sampler's lines (--query-gpu={','.join(QUERY)} "
            f"--format=csv,noheader,nounits), {s['samples']} samples {a.interval:g} s apart\n"
            + "".join(ln + "\n" for ln in s["lines"]))
        (a.out / f"nvml_events_{gpu}.json").write_text(json.dumps({"gpus": res["gpus"], **res["nvml"]}, indent=1) + "\n")
    return 0 if s["rc"] == 0 and s["samples"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
