"""Every node's GPU samples in the run folder: the format, and what the job reads back from it.

While a rank serves, its node's sampler (gpu_sampler.py, or the wrapper's plain nvidia-smi loop
where the image has no python3) appends to two files of state/:

- gpu-rank<R>.csv: nvidia-smi's `--format=csv,noheader,nounits` lines of QUERY, one per GPU a
  sample: timestamp, index, uuid, utilization.gpu [%], utilization.memory [%], memory.used
  [MiB], memory.total [MiB], power.draw [W], temperature.gpu [C], clocks.sm [MHz], then the
  volatile ECC error counts (corrected, uncorrected; since the driver loaded). A line of the
  first 10 fields alone is a sample without ECC counts (the wrapper's loop, a driver without
  those fields); "[N/A]" is a figure the GPU does not report (ECC off).
- gpu-events-rank<R>: NVML's XID and ECC events as they come, one line each:
  `EPOCH INDEX UUID KIND DATA [gi=N ci=N]`, KIND xid (DATA: the XID), ecc_dbe or ecc_sbe
  (DATA 0); gi/ci where the event is a MIG instance's. Index -1 and UUID "-": a GPU NVML did
  not name. Nothing is written where no event came (the normal case).

Both move to <file>.1 past server.metrics_max_mb. Standard library only: the job reads them
(failure messages, the GPU exporter) and `top`/`report` do (ftcluster/observe/samples.py, report.py).
"""

from __future__ import annotations

import csv
import io
import os
import time
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple

from .names import FILES

# nvidia-smi's --query-gpu fields, in the order of a line. BASE_QUERY is what every driver since
# the first serving runs answers; the ECC fields come after, so a reader takes either.
BASE_QUERY = ("timestamp", "index", "uuid", "utilization.gpu", "utilization.memory", "memory.used", "memory.total",
              "power.draw", "temperature.gpu", "clocks.sm")
ECC_QUERY = ("ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total")
QUERY = BASE_QUERY + ECC_QUERY
# The keys a parsed line has (and `top --json` shows), field for field.
FIELDS = ("timestamp", "index", "uuid", "util", "mem_util", "mem_used_mib", "mem_total_mib", "power_w", "temp_c",
          "sm_mhz", "ecc_corrected", "ecc_uncorrected")
TAIL_BYTES = 16384   # the end of a samples file read for its last sample: 64 GPUs' lines and more

# The XIDs a failure message explains (NVIDIA's "Xid Errors" catalogue); others by number only.
XID_WORDS = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup", 48: "double-bit ECC error", 61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt", 63: "ECC page retirement or row remapping",
    64: "ECC page retirement or row remapping failure", 74: "NVLink error", 79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate", 94: "contained ECC error", 95: "uncontained ECC error",
    119: "GSP RPC timeout", 120: "GSP error",
}


def samples_path(state: str, rank: int) -> str:
    return os.path.join(state, FILES.gpu_samples.format(r=rank))


def events_path(state: str, rank: int) -> str:
    return os.path.join(state, FILES.gpu_events.format(r=rank))


def parse_row(cells: List[str]) -> Optional[Dict[str, Any]]:
    """One GPU's sample from a CSV line's cells; None for a line of another shape (cut, a note)."""
    if len(cells) not in (len(BASE_QUERY), len(QUERY)):
        return None
    rec: Dict[str, Any] = dict(zip(FIELDS, (c.strip() for c in cells)))
    for key in FIELDS[3:]:
        try:
            rec[key] = float(rec[key]) if key in rec else None
        except ValueError:
            rec[key] = None   # "[N/A]": not reported by this GPU
    return rec


def parse_samples(lines: List[str]) -> List[Dict[str, Any]]:
    """Every sample line, in order (notes and cut lines left out)."""
    rows = csv.reader(io.StringIO("\n".join(ln for ln in lines if not ln.startswith("#"))), skipinitialspace=True)
    return [rec for rec in (parse_row(r) for r in rows) if rec is not None]


def latest(lines: List[str]) -> List[Dict[str, Any]]:
    """The last sample of each GPU, by index."""
    last: Dict[str, Dict[str, Any]] = {}
    for rec in parse_samples(lines):
        last[rec["index"]] = rec
    return [last[k] for k in sorted(last, key=lambda k: int(k) if k.isdigit() else 0)]


class GpuEvent(NamedTuple):
    t: float
    gpu: int            # the index; -1: a GPU NVML did not name
    uuid: str
    kind: str           # xid, ecc_dbe, ecc_sbe
    data: int           # the XID; 0 for ECC events
    instance: str = ""  # "gi=N ci=N" on a MIG instance

    def words(self) -> str:
        gpu = f"GPU {self.gpu}" if self.gpu >= 0 else "a GPU"
        if self.kind == "xid":
            what = f"XID {self.data}" + (f" ({XID_WORDS[self.data]})" if self.data in XID_WORDS else "")
        else:
            what = {"ecc_dbe": "a double-bit ECC error", "ecc_sbe": "a single-bit ECC error"}.get(self.kind, self.kind)
        at = time.strftime("%H:%M:%S", time.localtime(self.t))
        return f"{gpu} {what} at {at}" + (f" ({self.instance})" if self.instance else "")


def format_event(t: float, gpu: int, uuid: str, kind: str, data: int,
                 gpu_instance: Optional[int] = None, compute_instance: Optional[int] = None) -> str:
    """An events line (with its newline)."""
    mig = f" gi={gpu_instance} ci={compute_instance}" if gpu_instance is not None else ""
    return f"{t:.3f} {gpu} {uuid} {kind} {data}{mig}\n"


def parse_events(text: str) -> List[GpuEvent]:
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) < 5 or line.startswith("#"):
            continue
        try:
            out.append(GpuEvent(float(words[0]), int(words[1]), words[2], words[3], int(words[4]),
                                " ".join(words[5:])))
        except ValueError:
            continue
    return out


def read_tail(path: str, size: int = TAIL_BYTES) -> List[str]:
    """The whole lines in the file's last `size` bytes; [] without the file."""
    try:
        with open(path, "rb") as f:
            start = max(0, os.path.getsize(path) - size)
            f.seek(start)
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    return lines[1:] if start else lines   # the first may be cut


def read_events(path: str, since: float = 0.0) -> List[GpuEvent]:
    """A rank's node's events at or after `since` (the rolled .1 part first)."""
    out: List[GpuEvent] = []
    for p in (path + ".1", path):
        try:
            with open(p, errors="replace") as f:
                out += [e for e in parse_events(f.read()) if e.t >= since]
        except OSError:
            continue
    return out


# After these a GPU takes no work until it is reset (NVIDIA's Xid catalogue: a double-bit ECC
# error, a row remapping failure, fallen off the bus, an uncontained ECC error, GSP errors),
# which needs root on the node: a restart of the world there would fail again.
RESET_XIDS = frozenset({48, 64, 79, 95, 119, 120})


def events_by_rank(state: str, nodes: int, hosts: List[str],
                   since: float) -> Iterator[Tuple[int, str, List[GpuEvent]]]:
    """(rank, its node's name, the events it recorded at or after `since`) of each rank that
    recorded any."""
    for rank in range(nodes):
        events = read_events(events_path(state, rank), since)
        if events:
            yield rank, hosts[rank] if rank < len(hosts) and hosts[rank] else f"rank {rank}'s node", events


def needing_reset(state: str, nodes: int, hosts: List[str], since: float) -> Dict[str, str]:
    """The nodes whose GPU recorded, at or after `since`, an event after which it needs a reset:
    node -> the events in words."""
    found: Dict[str, List[str]] = {}
    for _, node, events in events_by_rank(state, nodes, hosts, since):
        bad = [e for e in events if e.kind == "ecc_dbe" or (e.kind == "xid" and e.data in RESET_XIDS)]
        if bad:
            found.setdefault(node, []).extend(e.words() for e in bad[-3:])
    return {node: ", ".join(words) for node, words in found.items()}


def gpu_words(state: str, nodes: int, max_age: float = 120.0) -> str:
    """Each rank's node's GPUs as last sampled, for a failure message: a hung world whose GPUs
    stay busy is spinning in a collective, one whose GPUs idle waits on a rank; uncorrected ECC
    errors are named. "" where nothing was sampled lately (no nvidia-smi, metrics_interval 0)."""
    said = []
    for rank in range(nodes):
        path = samples_path(state, rank)
        try:
            if time.time() - os.path.getmtime(path) > max_age:
                continue
        except OSError:
            continue
        gpus = []
        for g in latest(read_tail(path)):
            ecc = f", {g['ecc_uncorrected']:.0f} uncorrected ECC errors" if g.get("ecc_uncorrected") else ""
            util = "?" if g["util"] is None else f"{g['util']:.0f}"
            mem = "?" if g["mem_used_mib"] is None else f"{g['mem_used_mib']:.0f}"
            gpus.append(f"GPU {g['index']} {util}% busy, {mem} MiB{ecc}")
        if gpus:
            said.append(f"rank {rank}: " + ", ".join(gpus))
    return "; ".join(said)


def event_words(state: str, nodes: int, hosts: List[str], since: float) -> str:
    """The XID and ECC events each rank's node recorded since `since`, for a failure message
    ("" without any): the last three of a node, newest last."""
    said = []
    for rank, node, events in events_by_rank(state, nodes, hosts, since):
        more = f" (and {len(events) - 3} earlier)" if len(events) > 3 else ""
        said.append(f"{node} (rank {rank}): " + ", ".join(e.words() for e in events[-3:]) + more)
    return "; ".join(said)
