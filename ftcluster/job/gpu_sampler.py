"""A node's GPU sampler while its rank serves: `python3 scripts/ftcluster_job gpus ...`.

The rank wrapper (rank_server.sh) starts it beside its server, in the image, with the image's
python3: every --interval seconds the image's nvidia-smi answers gpu_samples.QUERY into --out
(one line per GPU), and NVML's XID and ECC events, waited on in a thread of their own through
the driver's libnvidia-ml.so.1 (nvml.py), go to --events as they come (gpu_samples.py has the
format). Without the library no event is watched and the samples go on; without nvidia-smi
only events are. It ends with the --while-pid process (the rank's server) or on TERM/INT.

nvidia-smi is run with a time limit: on a GPU that fell off the bus it can hang, and the samples
of the other GPUs and the events must not wait on it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, List, Optional, Sequence

from .gpu_samples import BASE_QUERY, QUERY, format_event
from .nvml import Nvml, NvmlError
from .text import Room, append_lines

EVENT_WAIT_MS = 1000   # one wait's limit: how soon the event thread sees the sampler stop
LIVENESS_S = 0.5       # how often the server's pid is looked at between samples
MAX_UNWRITTEN = 1000   # XID/ECC events kept while the filesystem has no room


def roll(path: str, max_bytes: int) -> None:
    """Past `max_bytes` the file moves to .1 (the one before is dropped): at most twice that."""
    try:
        if os.path.getsize(path) > max_bytes:
            os.replace(path, path + ".1")
    except OSError:
        pass


def alive(pid: int) -> bool:
    """The process runs: it exists and is no zombie (one its parent has not reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[:1] != ["Z"]
    except OSError:
        return True   # no /proc: kill's word stands


class NodeSampler:
    def __init__(self, out: str, events: str, interval: float, max_bytes: int, smi: Optional[str] = "nvidia-smi",
                 nvml: Callable[[], Any] = Nvml):
        self.out, self.events, self.interval, self.max_bytes = out, events, interval, max_bytes
        self.smi = shutil.which(smi) if smi else None
        self.fields: Sequence[str] = QUERY
        self.nvml = nvml
        self.stop = threading.Event()
        self.lock = threading.Lock()   # the events file: one writer at a time
        # The run folder's filesystem may fill while the node serves: a sample that finds no
        # room is skipped, an event waits for room (at most MAX_UNWRITTEN of them).
        self.room = Room()
        self.unwritten: List[str] = []

    def say(self, text: str) -> None:
        try:
            print(f"ftcluster gpu sampler: {text}", file=sys.stderr, flush=True)
        except OSError:   # its log on a full filesystem
            pass

    def sample(self) -> bool:
        """One nvidia-smi answer appended (a line per GPU); False when it gave none."""
        if self.smi is None:
            return False
        argv = [self.smi, f"--query-gpu={','.join(self.fields)}", "--format=csv,noheader,nounits"]
        try:
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=max(10.0, self.interval), check=False)
        except subprocess.TimeoutExpired:
            self.say(f"nvidia-smi gave no answer within {max(10.0, self.interval):g} s")
            return False
        except OSError as e:
            self.say(f"cannot run nvidia-smi: {e}")
            self.smi = None
            return False
        if r.returncode != 0:
            if self.fields is QUERY and b"is not a valid field" in r.stdout:
                self.say("this driver's nvidia-smi has no ECC error counts: sampling without them")
                self.fields = BASE_QUERY
                return self.sample()
            self.say(f"nvidia-smi exited {r.returncode}: {r.stdout.decode(errors='replace').strip()[:300]}")
            return False
        roll(self.out, self.max_bytes)
        # One write: a reader sees whole lines but for the last.
        wrote = self.room.attempt(self.out, lambda: append_lines(self.out, r.stdout))
        self.tell_room()
        if wrote:
            self.record("")   # events that waited for room
        return wrote

    def record(self, line: str) -> None:
        with self.lock:
            if line:
                self.unwritten = [*self.unwritten, line][-MAX_UNWRITTEN:]
            while self.unwritten:
                roll(self.events, self.max_bytes)
                if not self.room.attempt(self.events, lambda: append_lines(self.events, self.unwritten[0].encode())):
                    break
                del self.unwritten[0]

    def tell_room(self) -> None:
        if self.room.untold():
            self.say(f"writes refused ({self.room.why}): samples skipped, events kept until they are taken")
        if self.room.ended is not None:
            self.room.ended = None
            self.say("writes taken again: sampling on")

    def watch_events(self) -> None:
        """NVML's XID and ECC events until the sampler stops (a thread)."""
        try:
            nvml = self.nvml()
        except OSError as e:   # no libnvidia-ml.so.1: a CPU node, the driver's library not mounted
            self.say(f"no NVML ({e}): XID and ECC events are not recorded")
            return
        try:
            nvml.open()
            for note in nvml.notes:
                self.say(note)
            if not nvml.registered:
                return
            while not self.stop.is_set():
                ev = nvml.wait(EVENT_WAIT_MS)
                if ev is not None:
                    self.record(format_event(time.time(), ev.gpu, ev.uuid, ev.kind, ev.data, ev.gpu_instance,
                                             ev.compute_instance))
        except NvmlError as e:
            self.say(f"NVML events stopped: {e}")
        finally:
            nvml.close()

    def run(self, while_pid: Optional[int] = None) -> int:
        watcher = threading.Thread(target=self.watch_events, daemon=True)
        watcher.start()
        while not self.stop.is_set():
            until = time.monotonic() + self.interval
            while not self.stop.is_set() and time.monotonic() < until:
                if while_pid is not None and not alive(while_pid):
                    self.stop.set()
                    break
                self.stop.wait(min(LIVENESS_S, max(0.0, until - time.monotonic())))
            if not self.stop.is_set():
                self.sample()
        watcher.join(EVENT_WAIT_MS / 1000 + 1)
        return 0


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(prog="ftcluster_job gpus", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the samples file (state/gpu-rank<R>.csv)")
    ap.add_argument("--events", required=True, help="the events file (state/gpu-events-rank<R>)")
    ap.add_argument("--interval", type=float, required=True, help="seconds between samples")
    ap.add_argument("--max-bytes", type=int, required=True, help="a file moves to .1 past this")
    ap.add_argument("--while-pid", type=int, help="end with this process (the rank's server)")
    args = ap.parse_args(argv)
    sampler = NodeSampler(args.out, args.events, args.interval, args.max_bytes)

    def on_signal(signum: int, frame: Any) -> None:
        sampler.stop.set()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return sampler.run(args.while_pid)
