"""Liveness while serving: a small real inference through rank 0, so through the whole MPI world.

A rank that freezes (alive, silent) leaves rank 0 waiting in a broadcast: every request hangs
while Triton's /v2/health/ready still answers 200 and every process is alive. Only a request
that has to cross the world finds it. A probe that misses its deadline counts only if rank 0
made no progress since the misses began (nv_inference_request_success of the served model did not
grow, and no probe's answer came back late), so a long batch ahead of the probe, or a slow probe,
is not taken for a hang; `failures` misses in a row are. Standard library only: this runs in the job (Python 3.8).

With FT the rank IS the tritonserver process: when it stops whole (SIGSTOP, a GPU driver hang),
its metrics endpoint waits too. So every request a probe makes of rank 0 has a deadline of its
own: the inference and the metrics read beside it the probe's (the read runs while the inference
waits, so a loaded rank 0 that answers it late still shows its progress), the read after a miss
METRICS_S (or half the deadline); a metrics read that cannot answer counts as no progress, and a probe is
sent every `interval` whether or not the last one has come back: a frozen world is called hung
within (failures - 1) x interval + deadline + METRICS_S of its first missed probe (plus the
loop's tick).
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from typing import Any

from .config import LivenessConfig
from .ranks import DIRECT, Via, http_get
from .text import Room, write_json

_METRIC = re.compile(r'^nv_inference_request_success\{([^}]*)\}\s+([0-9.eE+-]+)\s*$', re.MULTILINE)


# The most a read of rank 0's metrics may take (half the probe's deadline, when that is less).
METRICS_S = 0.5


def request_successes(host: str, port: int, model: str, timeout: float = 2.0, via: Via = DIRECT) -> float | None:
    """Rank 0's completed requests of `model` (every version), from its metrics; None when they
    could not be read."""
    body = http_get(host, port, "/metrics", timeout, via)
    if body is None:
        return None
    total = None
    for labels, value in _METRIC.findall(body.decode(errors="replace")):
        if f'model="{model}"' in labels:
            total = (total or 0.0) + float(value)
    return total


class Probe:
    """One probe in a thread of its own: the job's loop keeps watching the ranks meanwhile. It is
    over within deadline + METRICS_S, whatever rank 0 does."""

    def __init__(self, cfg: LivenessConfig, host: str, port: int, via: Via = DIRECT):
        self.cfg, self.host, self.port, self.via = cfg, host, port, via
        self.body = base64.b64decode(cfg.body)
        self.started = time.time()
        self.successes_before: float | None = None
        self.successes_after: float | None = None   # read when it missed, before it is done
        self.answered: bool | None = None   # None while it runs
        self.latency = 0.0
        self.detail = ""
        self.refused = ""
        self._replied = threading.Event()
        self._reply: tuple[int, bytes] | None = None
        self._error = ""
        # When a 200 came back, within the deadline or after it (a late answer).
        self.answered_at: float | None = None
        self.thread = threading.Thread(target=self._send, daemon=True)
        self.thread.start()

    def _send(self) -> None:
        # The metrics before are read beside the inference, each with the whole deadline (on a
        # loaded machine a 0.5 s read timed out while rank 0 progressed: a slow world called hung);
        # the read after a miss gets METRICS_S: the probe is over within deadline + METRICS_S.
        before = threading.Thread(target=self._read_before, daemon=True)
        before.start()
        asker = threading.Thread(target=self._ask, daemon=True)
        t0 = time.monotonic()
        asker.start()
        if not self._replied.wait(self.cfg.deadline) or self._reply is None:
            self.latency = time.monotonic() - t0
            self.detail = self._error or "no answer within the deadline"
            self.successes_after = self._successes(self._metrics_s)
            before.join()
            self.answered = False
            return
        self.latency = time.monotonic() - t0
        status, data = self._reply
        # An error reply proves nothing about the world: Triton's frontend refuses a request it
        # finds wrong before any rank sees it. It neither counts nor clears a miss.
        if status != 200:
            self.refused = f"HTTP {status}: {_error_text(data)}"
            self.detail = self.refused
        before.join()
        self.answered = True

    def _ask(self) -> None:
        """The inference, over a fresh connection (nothing of a hung one is reused). It may answer
        after the deadline: that late answer is the world crossing all the same, proof of progress
        that needs no metrics read (on a loaded machine those time out while a slow world works)."""
        import http.client   # here, not on the way to the servers' start (ranks.Via.connection)

        try:
            conn = self.via.connection(self.host, self.port, self.cfg.deadline + self.cfg.failures * self.cfg.interval)
            try:
                conn.request("POST", f"/v2/models/{self.cfg.model}/infer", body=self.body,
                             headers={"Content-Type": "application/octet-stream",
                                      "Inference-Header-Content-Length": str(self.cfg.json_size),
                                      **(self.via.headers() or {})})
                reply = conn.getresponse()
                self._reply = (reply.status, reply.read())
            finally:
                conn.close()
        except (OSError, http.client.HTTPException) as exc:
            self._error = str(exc)   # read only when it came within the deadline (a refused connection)
        if self._reply is not None and self._reply[0] == 200:
            self.answered_at = time.time()
        self._replied.set()

    @property
    def _metrics_s(self) -> float:
        return min(METRICS_S, self.cfg.deadline / 2)

    def _read_before(self) -> None:
        self.successes_before = self._successes(self.cfg.deadline)

    def _successes(self, timeout: float) -> float | None:
        return request_successes(self.host, self.cfg.metrics_port, self.cfg.model, timeout, self.via)

    @property
    def replied(self) -> bool:
        """Its inference is over: answered (in time or late), refused or failed."""
        return self._replied.is_set()

    @property
    def done(self) -> bool:
        return self.answered is not None


def _error_text(data: bytes) -> str:
    try:
        return str(json.loads(data[:4096]).get("error", ""))[:200]
    except ValueError:
        return data[:200].decode(errors="replace")


class Liveness:
    """The probes of one incarnation of the servers; `check` once per tick of the job's loop."""

    def __init__(self, cfg: LivenessConfig, host: str, port: int, health_path: str, via: Via = DIRECT,
                 room: Room | None = None):
        self.cfg, self.host, self.port, self.health_path, self.via = cfg, host, port, health_path, via
        self.room = room or Room()
        self.in_flight: list[Probe] = []   # oldest first; several while deadline > interval
        self.missed: list[Probe] = []      # judged as misses; their answers may yet come, late
        self.next_at = time.monotonic() + cfg.interval
        self.misses = 0
        self.probes = 0
        self.last_ok: float | None = None
        self.last: dict[str, Any] = {}
        self.streak_from: float | None = None   # rank 0's completed requests when the misses began
        # When the first probe of the run of misses was sent: the world has not answered since
        # (report's outage of a hung world starts there, not at the verdict).
        self.missed_since: float | None = None
        # Whether any metrics read of the run of misses answered: a world whose metrics went
        # silent too is stopped whole (or the host stalls it), which the verdict says.
        self.streak_read = False
        self.streak_started = 0.0   # when the first probe of the run of misses was sent

    def check(self) -> str | None:
        """None while the world answers (or may yet); the fault in words once `failures` probes in
        a row missed their deadline with no request completed meanwhile. Probes are judged in the
        order they were sent, each the moment it is over."""
        if time.monotonic() >= self.next_at:
            self.next_at = time.monotonic() + self.cfg.interval
            self.in_flight.append(Probe(self.cfg, self.host, self.port, self.via))
        fault = None
        while self.in_flight and self.in_flight[0].done and fault is None:
            fault = self._judge(self.in_flight.pop(0))
        return fault

    def _judge(self, probe: Probe) -> str | None:
        self.probes += 1
        progressed = False
        if probe.refused:
            pass
        elif probe.answered:
            self.misses = 0
            self.last_ok = time.time()
        else:
            # Progress is counted from the start of the first probe of the run of misses: a slow
            # probe that missed its deadline is still in flight when it is judged, and shows as
            # progress only once it completes, which the next probe's judgement sees. A metrics
            # read that got no answer is no progress.
            if self.misses == 0 or self.streak_from is None:
                self.streak_from = probe.successes_before
            if self.misses == 0:
                self.streak_started = probe.started
            # Later probes' reads before theirs count too: a loaded world shows its progress there.
            seen = [x for x in (probe.successes_after, *(p.successes_before for p in self.in_flight))
                    if x is not None]
            after = max(seen) if seen else None
            progressed = after is not None and self.streak_from is not None and after > self.streak_from
            # A late answer that came since the misses began (this probe's own included) is the
            # world crossing meanwhile, whatever its metrics said.
            self.missed = [p for p in (*self.missed, probe) if not p.replied or
                           (p.answered_at or 0.0) >= self.streak_started]
            progressed = progressed or any(p.answered_at is not None for p in self.missed)
            if progressed:
                self.missed = [p for p in self.missed if p.answered_at is None]
            self.streak_read = after is not None or (self.misses > 0 and self.streak_read)
            self.misses = 0 if progressed else self.misses + 1
            if self.misses == 1:
                self.missed_since = probe.started
        self.last = {"time": probe.started, "answered": bool(probe.answered), "latency_ms": round(probe.latency * 1000, 1),
                     "detail": probe.detail, "progress_meanwhile": progressed}
        self._write_health()
        if self.misses < self.cfg.failures:
            return None
        last_ok = (f"the last answer came {time.time() - self.last_ok:.0f} s ago" if self.last_ok
                   else "no probe was ever answered")
        return (f"the MPI world is hung: the liveness probe ({self.cfg.what}) got no answer within "
                f"{self.cfg.deadline:g} s {self.misses} times in a row, and rank 0 completed no request "
                f"meanwhile{'' if self.streak_read else ' (its metrics did not answer either)'}; {last_ok}")

    def health(self) -> dict[str, Any]:
        return {"probes": self.probes, "consecutive_misses": self.misses, "last_ok": self.last_ok,
                "unanswered_since": self.missed_since if self.misses else None,
                "last_probe": self.last, "interval": self.cfg.interval, "deadline": self.cfg.deadline,
                "failures": self.cfg.failures}

    def _write_health(self) -> None:
        # Skipped for want of room: the next probe's record says all there is to say.
        health = self.health()
        self.room.attempt("state/health.json", lambda: write_json(self.health_path, health))
