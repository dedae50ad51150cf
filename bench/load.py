"""A closed-loop load generator for the HTTP benches: workers send back to back, latency and
CPU per request are accounted (this process's, and optionally another process's such as a gateway)."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NamedTuple


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

class Result(NamedTuple):
    rate: float              # requests/s
    p50_ms: float            # median latency
    client_ms: float         # this process's (the load generator's) CPU per request
    cpu_ms: float | None     # the gateway process's CPU per request

async def closed_loop(send: Callable[[], Awaitable[None]], concurrency: int, seconds: float,
                      pid: int | None = None) -> Result:
    """`concurrency` workers sending back to back for `seconds`; `pid`: a gateway to account."""
    stop = time.monotonic() + seconds
    latencies: list[float] = []
    cpu0 = cpu_seconds(pid) if pid is not None else 0.0
    own0 = time.process_time()

    async def worker() -> None:
        while (t := time.monotonic()) < stop:
            await send()
            latencies.append(time.monotonic() - t)

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - t0
    n = len(latencies)
    cpu = (cpu_seconds(pid) - cpu0) * 1000 / n if pid is not None else None
    return Result(n / elapsed, statistics.median(latencies) * 1000, (time.process_time() - own0) * 1000 / n, cpu)
