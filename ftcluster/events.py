"""The run's event file: one `EPOCH EVENT ARGS...` line per milestone, written by the job script.

The launcher follows it to show progress and to tell ready/failed/done apart without polling
the servers from the login node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ftcluster.runner import Runner


@dataclass(frozen=True)
class Kinds:
    """Every event kind a job script writes, defined once: the templates get this object as
    `ev` (`event "{{ ev.ready }} $URL"`), Python compares with EV.ready."""

    job_started: str = "job_started"            # HOST JOB_ID
    interrupted: str = "interrupted"            # INT/TERM acted on
    mpicheck_started: str = "mpicheck_started"
    mpicheck_ok: str = "mpicheck_ok"
    step_started: str = "step_started"          # WHAT (preflight, convert): a run's one job step
    step_done: str = "step_done"                # WHAT EXIT_CODE
    containers_starting: str = "containers_starting"   # HOSTS... (docker styles)
    node_ready: str = "node_ready"              # HOST DETAIL
    node_failed: str = "node_failed"            # HOST WHY
    containers_ready: str = "containers_ready"  # MPI_HOSTS
    servers_starting: str = "servers_starting"  # RANK0_HOST
    ready: str = "ready"                        # RANK0_HOST:PORT
    client_started: str = "client_started"
    client_done: str = "client_done"            # EXIT_CODE
    serving: str = "serving"                    # RANK0_HOST:PORT (--keep-serving)
    rank_failed: str = "rank_failed"            # RANK NODE EXIT_CODE|?
    failed: str = "failed"                      # WHY...
    servers_stopped: str = "servers_stopped"
    containers_stopping: str = "containers_stopping"
    teardown_failed: str = "teardown_failed"    # HOST WHY
    containers_stopped: str = "containers_stopped"
    done: str = "done"                          # EXIT_CODE of the job script


EV = Kinds()


@dataclass(frozen=True)
class Event:
    time: float
    kind: str
    args: tuple[str, ...]


def parse_events(text: str) -> list[Event]:
    events = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue  # a line being written
        try:
            t = float(parts[0])
        except ValueError:
            continue
        events.append(Event(t, parts[1], tuple(parts[2:])))
    return events


def last(events: list[Event], kind: str) -> Event | None:
    for ev in reversed(events):
        if ev.kind == kind:
            return ev
    return None


class EventFollower:
    """Incrementally reads an events file that another process appends to (a Follower of one file)."""

    def __init__(self, path: str, runner: Runner | None = None):
        from ftcluster.logs import Follower, LogSource

        self.path = path
        self._lines = Follower([LogSource("events", path)], runner)
        self.events: list[Event] = []

    def poll(self) -> list[Event]:
        new = parse_events("\n".join(line for _, line in self._lines.poll()))
        self.events.extend(new)
        return new
