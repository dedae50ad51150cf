"""The run's event file: one `EPOCH EVENT ARGS...` line per milestone, written by the job script.

The launcher follows it to show progress and to tell ready/failed/done apart without polling
the servers from the login node.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftcluster.runner import LocalRunner, Runner


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
    """Incrementally reads an events file that another process appends to."""

    def __init__(self, path: str, runner: Runner | None = None):
        self.path = path
        self.runner = runner or LocalRunner()
        self._offset = 0
        self._partial = b""
        self.events: list[Event] = []

    def poll(self) -> list[Event]:
        data = self.runner.read_from(self.path, self._offset)
        if not data:
            return []
        self._offset += len(data)
        data = self._partial + data
        complete, _, self._partial = data.rpartition(b"\n")
        new = parse_events(complete.decode(errors="replace")) if complete else []
        self.events.extend(new)
        return new
