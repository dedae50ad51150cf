"""Polling back-off and the one file follower (events are lines of a followed file)."""

from __future__ import annotations

from pathlib import Path

from ftcluster.run.events import EventFollower
from ftcluster.job.poll import EVENTS_LOOKUP, Cadence
from tests.fake_clock import FakeClock


def test_backoff_slows_while_quiet_and_snaps_back_on_a_change() -> None:
    b = Cadence(0.02, 0.1, factor=2).backoff()
    assert [b.next(False) for _ in range(4)] == [0.04, 0.08, 0.1, 0.1]
    assert b.next(True) == 0.02
    assert b.next(False) == 0.04


def test_event_follower_reads_only_complete_lines_as_they_are_appended(tmp_path: Path) -> None:
    path = tmp_path / "events"
    clock = FakeClock()
    f = EventFollower(str(path), clock)
    assert f.poll() == []                                  # not there yet
    path.write_text("1.5 job_started\n2.0 ready node1:8000\n3.0 cli")
    assert f.poll() == []                                  # its path is looked up again ...
    clock.sleep(EVENTS_LOOKUP.fast)                                  # ... every second
    assert [(e.time, e.kind, e.args) for e in f.poll()] == [(1.5, "job_started", ()),
                                                            (2.0, "ready", ("node1:8000",))]
    with open(path, "a") as fh:
        fh.write("ent_started\n")
    assert [e.kind for e in f.poll()] == ["client_started"]
    assert [e.kind for e in f.events] == ["job_started", "ready", "client_started"]
