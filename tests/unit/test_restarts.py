"""Which faults count against server.restarts: a long healthy stretch starts the count (and so
the back-off) afresh; a restart's failed start-up never does; a requeued job rebuilds the count
from the run's events."""

from __future__ import annotations

from ftcluster.job.names import EV
from ftcluster.job.restarts import Faults, faults_of_events

HOUR = 3600.0


def test_faults_days_apart_each_count_as_the_first() -> None:
    faults = Faults(HOUR)
    day = 24 * HOUR
    for n in range(5):
        faults.serving(n * day)
        assert faults.fault(f"fault {n}", n * day + day / 2) == 1
    assert faults.counted == ["fault 4"]


def test_faults_within_the_reset_add_up_and_a_failed_start_up_never_resets() -> None:
    faults = Faults(HOUR)
    faults.serving(0.0)
    assert faults.fault("hang", 60.0) == 1
    assert faults.fault("start-up failed", None) == 2      # never served
    faults.serving(100.0)
    assert faults.fault("died", 100.0 + HOUR - 1) == 3    # one second short
    assert faults.counted == ["hang", "start-up failed", "died"]


def test_no_reset_counts_every_fault_of_the_run() -> None:
    faults = Faults(0.0)
    for n in range(3):
        faults.serving(n * 10 * HOUR)
        faults.fault(str(n), n * 10 * HOUR + 5 * HOUR)
    assert faults.counted == ["0", "1", "2"]


def _line(at: float, kind: str, *args: object) -> str:
    return " ".join([f"{at:.9f}", kind, *(str(a) for a in args)])


def test_a_requeued_job_counts_what_its_events_count() -> None:
    events = "\n".join([
        _line(1.0, EV.job_started, "h1", "42"),
        _line(5.0, EV.serving, "http://h1:8000"),
        _line(20.0, EV.restarting, 1, "rank 1 on h2 exited (code 137) while serving"),
        _line(40.0, EV.serving, "http://h1:8000"),
        _line(40.0 + 2 * HOUR, EV.restarting, 1, "the MPI world is hung: ..."),   # after 2 h: afresh
        _line(41.0 + 2 * HOUR, EV.restarting, 2, "rank 0 on h1 exited (code 1) during start-up"),
        _line(60.0 + 2 * HOUR, EV.serving, "http://h1:8000"),
        "not an event", "", "12.5", _line(70.0 + 2 * HOUR, EV.restarting, 3),   # damaged: skipped
    ])
    faults = faults_of_events(events, HOUR)
    assert faults.restarts == 3
    assert faults.counted == ["the MPI world is hung: ...", "rank 0 on h1 exited (code 1) during start-up"]
    # The earlier attempt last showed life within the hour of its serving: the requeue adds up...
    assert faults.fault("requeued", 60.0 + 2 * HOUR + 600) == 3
    # ...after an hour of it, it is the first again.
    later = faults_of_events(events, HOUR)
    assert later.fault("requeued", 60.0 + 3 * HOUR) == 1
    # Without a reset, every restart of the events counts.
    assert faults_of_events(events, 0.0).fault("requeued", 60.0 + 3 * HOUR) == 4


def test_a_successor_counts_on_from_what_its_predecessor_still_counted() -> None:
    # The predecessor: a hang, then a lost node within the hour; its successor (with the run's
    # own restarts) carries both, and its own first fault is the third in a row...
    before = Faults(HOUR)
    before.serving(0.0)
    before.fault("the MPI world is hung", 60.0)
    before.serving(100.0)
    before.fault("rank 1 on n2 exited (node n2 lost)", 200.0)
    successor = Faults(HOUR, before.still_counted(200.0))
    successor.serving(0.0)
    assert successor.fault("died", 30.0) == 3
    # ...while one that has served an hour since starts afresh: node losses days apart never
    # wear the run's restarts down.
    later = Faults(HOUR, ["the MPI world is hung", "rank 1 on n2 exited (node n2 lost)"])
    later.serving(0.0)
    assert later.fault("died", HOUR + 1) == 1


def test_a_time_limit_hand_over_carries_nothing_after_a_healthy_stretch() -> None:
    faults = Faults(HOUR)
    faults.serving(0.0)
    faults.fault("hang", 10.0)
    faults.serving(20.0)
    assert faults.still_counted(30.0) == ["hang"]
    assert faults.still_counted(20.0 + HOUR) == []
    assert Faults(0.0, ["a", "b"]).still_counted(10 * HOUR) == ["a", "b"]   # no reset: all of them


def test_a_requeued_successor_counts_its_carried_faults_first() -> None:
    events = "\n".join([_line(5.0, EV.serving, "http://h1:8000"),
                        _line(20.0, EV.restarting, 2, "rank 1 on h2 exited (code 137) while serving")])
    faults = faults_of_events(events, HOUR, ["node n3 lost"])
    assert faults.counted == ["node n3 lost", "rank 1 on h2 exited (code 137) while serving"]
