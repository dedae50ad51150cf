"""The liveness judge against a real HTTP server in this process: a slow world is not a hang, a
frozen one is. (The integration tests run the same through the test model on the bed; these
pin the timing that a loaded machine makes racy there.)"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from ftcluster.job.config import LivenessConfig
from ftcluster.job.liveness import Liveness


class _Rank0:
    """Triton's two doors the judge uses: /metrics and the infer endpoint. Each request takes
    `delay` s and then counts as a success; `frozen` requests never come back."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.frozen = False
        self.whole = False      # the whole process stopped (SIGSTOP of FT's rank): metrics too
        self.metrics_silent = False   # the metrics alone do not answer (a loaded machine's timeouts)
        self.successes = 0
        self.lock = threading.Lock()
        rank0 = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if rank0.whole or rank0.metrics_silent:
                    time.sleep(30)
                    return
                body = f'nv_inference_request_success{{model="m",version="1"}} {rank0.successes}\n'.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                if rank0.frozen:
                    time.sleep(30)
                    return
                time.sleep(rank0.delay)
                with rank0.lock:
                    rank0.successes += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def rank0() -> Iterator[_Rank0]:
    r = _Rank0()
    yield r
    r.server.shutdown()


def _judge(rank0: _Rank0, tmp_path: Path, probes: int) -> tuple[Liveness, str | None]:
    cfg = LivenessConfig(interval=1.0, deadline=0.5, failures=2, model="m", body="AA==", json_size=1,
                         what="1 token", metrics_port=rank0.port)
    live = Liveness(cfg, "127.0.0.1", rank0.port, str(tmp_path / "health.json"))
    fault = None
    while live.probes < probes and fault is None:
        fault = live.check()
        time.sleep(0.02)   # the job's loop ticks; the judgement comes the moment a probe ends
    return live, fault


def test_a_world_slower_than_the_deadline_is_not_a_hang(rank0: _Rank0, tmp_path: Path) -> None:
    # Every request takes 0.9 s against a 0.5 s deadline: every probe misses and is judged while
    # still in flight; it completes before the next one starts (1 s after it) and so before that
    # one is judged. Judged from each probe's own start, the world looked hung.
    rank0.delay = 0.9
    live, fault = _judge(rank0, tmp_path, 5)
    assert fault is None and live.probes == 5 and live.misses <= 1


def test_a_frozen_world_is_a_hang_after_failures_misses(rank0: _Rank0, tmp_path: Path) -> None:
    rank0.frozen = True
    live, fault = _judge(rank0, tmp_path, 10)
    assert fault is not None and fault.startswith("the MPI world is hung") and live.probes == 2
    # Its metrics answered: the verdict does not say they went silent.
    assert "did not answer either" not in fault


def test_a_world_that_freezes_after_answering_is_a_hang(rank0: _Rank0, tmp_path: Path) -> None:
    live, fault = _judge(rank0, tmp_path, 2)
    assert fault is None and live.last_ok is not None and live.misses == 0
    rank0.frozen = True
    live_probes = live.probes
    frozen_at = time.time()
    while fault is None:
        fault = live.check()
        time.sleep(0.02)
    assert live.probes == live_probes + 2 and "the last answer came" in fault
    # Unanswered since the first of the two missed probes was sent, not since the verdict.
    assert live.missed_since is not None and live.last_ok is not None
    assert live.last_ok < live.missed_since and frozen_at - 0.1 < live.missed_since < frozen_at + 1.2
    assert time.time() - live.missed_since > 1.0
    assert live.health()["unanswered_since"] == live.missed_since


def test_a_whole_process_freeze_is_found_within_the_formula(rank0: _Rank0, tmp_path: Path) -> None:
    # FT's rank is the tritonserver process: stopped whole, its metrics endpoint waits too. Each
    # read of it has its own short deadline (0.5 s), and probes go out every interval while others
    # are in flight, so the verdict comes (failures - 1) x interval + deadline (+ 0.5 s) after the
    # first missed probe was sent. Before, each probe's metrics reads waited 2 s each and the
    # probes went one after another: (2 + deadline + 2) x failures = 16.5 s here.
    cfg = LivenessConfig(interval=0.5, deadline=1.5, failures=3, model="m", body="AA==", json_size=1,
                         what="1 token", metrics_port=rank0.port)
    live = Liveness(cfg, "127.0.0.1", rank0.port, str(tmp_path / "health.json"))
    while live.probes < 1:
        assert live.check() is None
        time.sleep(0.02)
    rank0.frozen = rank0.whole = True
    fault = None
    while fault is None:
        fault = live.check()
        time.sleep(0.02)
    found = time.time()
    assert live.missed_since is not None and fault.startswith("the MPI world is hung")
    assert "(its metrics did not answer either)" in fault
    formula = (cfg.failures - 1) * cfg.interval + cfg.deadline
    assert formula - 0.1 < found - live.missed_since < formula + 1.0
    # The inference had its whole deadline, and no more.
    assert cfg.deadline * 1000 - 50 < live.last["latency_ms"] < cfg.deadline * 1000 + 100


def test_a_slow_world_whose_metrics_do_not_answer_is_not_a_hang(rank0: _Rank0, tmp_path: Path) -> None:
    # A loaded machine: the metrics reads time out while the world, slower than the deadline,
    # still answers every probe. Each late answer is the world crossing: no two misses in a row
    # go without one. Judged by the metrics alone, this world was hung after two probes.
    rank0.delay = 0.9
    rank0.metrics_silent = True
    live, fault = _judge(rank0, tmp_path, 5)
    assert fault is None and live.probes == 5 and live.misses <= 1
    assert live.last["answered"] is False and live.missed_since is not None
