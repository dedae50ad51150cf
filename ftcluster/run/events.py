"""The run's event file: one `EPOCH EVENT ARGS...` line per milestone, written by the job script.

The launcher follows it to show progress and to tell ready/failed/done apart without polling
the servers from the login node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ftcluster.job.names import EV, FILES, Kinds  # noqa: F401  (defined with the supervisor, which writes them)
from ftcluster.job.poll import CLOCK, EVENTS_LOOKUP, Clock


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


def events_in(run_dir: Path) -> list[Event]:
    """A run folder's events so far: none before the job wrote any, or where they cannot be read
    (its folder gone)."""
    try:
        return parse_events((run_dir / "state" / FILES.events).read_text(errors="replace"))
    except OSError:
        return []


def last(events: list[Event], kind: str) -> Event | None:
    for ev in reversed(events):
        if ev.kind == kind:
            return ev
    return None


class EventFollower:
    """Incrementally reads an events file that another process appends to (a Follower of one file)."""

    def __init__(self, path: str, clock: Clock = CLOCK):
        # startup: the log followers only when events are followed, not when they are read once (`status`)
        from ftcluster.run.logs import Follower, LogSource

        self.path = path
        self._lines = Follower([LogSource("events", path)], clock=clock, lookup=EVENTS_LOOKUP)
        self.events: list[Event] = []

    def poll(self) -> list[Event]:
        new = parse_events("\n".join(line for _, line in self._lines.poll()))
        self.events.extend(new)
        return new

    def close(self) -> None:
        self._lines.close()
