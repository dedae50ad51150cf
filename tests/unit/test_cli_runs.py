"""Exit codes, JSON objects and tables of the run commands, against real processes and a real
run store (the job is a real `bash scripts/job.sh` process group, as the local launcher starts)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from typing import Any
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftcluster.run.procs import ProcessId
from ftcluster.run.store import RunRecord, RunStore
from tests.launch_helpers import wait_for

LONG = "a-rather-long-folder-name-" * 6   # run folders longer than any 80-column table


def ftc(*args: str, state: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ftcluster", *args], capture_output=True, text=True,
                          env={**os.environ, "FTCLUSTER_STATE_DIR": str(state)}, timeout=timeout, check=False)


def record(state: Path, run_dir: Path, job_id: str | None, nodes: int = 2) -> RunRecord:
    rec = RunRecord(run_id=run_dir.name[:40].rstrip("-"), created=time.time(), cluster_name="local",
                    cluster_source="", scheduler="local", style="local", run_dir=str(run_dir), nodes=nodes,
                    model="m", job_id=job_id, status="RUNNING")
    RunStore(state / "runs.sqlite").add(rec)
    return rec


@pytest.fixture
def live_run(tmp_path: Path) -> Iterator[tuple[Path, RunRecord]]:
    """A running local job: job.sh in its own session, rank 0 ready on host0, rank 1 loaded on host1."""
    state = tmp_path / "state"
    run_dir = tmp_path / LONG / "run1"
    for sub in ("scripts", "logs", "state"):
        (run_dir / sub).mkdir(parents=True)
    (run_dir / "scripts" / "job.sh").write_text("sleep 120\n")
    (run_dir / "logs" / "server-rank0.log").write_text("first line\n")
    (run_dir / "state" / "events").write_text("1.0 submitted\n2.0 servers_starting\n3.0 ready host0:8000\n")
    for r in (0, 1):
        (run_dir / "state" / f"rank{r}.host").write_text(f"host{r}\n")
    (run_dir / "state" / "rank1.loaded").write_text("")
    job = subprocess.Popen(["bash", str(run_dir / "scripts" / "job.sh")], start_new_session=True)
    try:
        yield state, record(state, run_dir, f"local:{ProcessId.of(job.pid)}")
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def test_exit_0_2_3(tmp_path: Path) -> None:
    assert ftc("--version", state=tmp_path).returncode == 0
    usage = ftc("list", "--no-such-option", state=tmp_path)
    assert usage.returncode == 2 and usage.stderr.startswith("error: ") and usage.stderr.count("\n") == 1
    user = ftc("plan", "--nodes", "0", state=tmp_path)
    assert user.returncode == 3 and user.stderr == "error: --nodes: must be >= 1\n"
    assert ftc("status", "no-such-run", state=tmp_path).returncode == 3


@pytest.mark.parametrize("command", ["status", "stop", "token", "report"])
def test_a_run_key_too_long_for_a_path_is_no_run(tmp_path: Path, command: str) -> None:
    # A key that is no run id is tried as a run folder's path; one the filesystem refuses
    # (ENAMETOOLONG) is simply no run, with the store empty or not.
    key = "a" * 300
    empty = ftc(command, key, state=tmp_path / "empty")
    assert empty.returncode == 3 and empty.stderr == "error: no runs recorded yet (start one with `ftcluster launch`)\n"
    record(tmp_path / "state", tmp_path / "run1", None)
    some = ftc(command, key, state=tmp_path / "state")
    assert some.returncode == 3 and some.stderr.startswith(f"error: no run '{key}'") and some.stderr.count("\n") == 1


def test_examples_into_a_folder_name_too_long(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "ftcluster", "examples", "d" * 300], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60, check=False)
    assert p.returncode == 3 and p.stderr.startswith("error: DIR: cannot write ") and "File name too long" in p.stderr
    assert list(tmp_path.iterdir()) == []


def test_exit_1_when_the_followed_job_failed(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    run_dir = tmp_path / "run-dead"
    (run_dir / "state").mkdir(parents=True)
    rec = record(tmp_path, run_dir, f"local:{dead.pid}", nodes=1)
    p = ftc("logs", rec.run_id, "-f", state=tmp_path)
    assert p.returncode == 1 and "Traceback" not in p.stderr


def test_exit_130_on_ctrl_c(live_run: tuple[Path, RunRecord]) -> None:
    state, rec = live_run
    proc = subprocess.Popen([sys.executable, "-m", "ftcluster", "logs", rec.run_id, "-f", "--rank", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FTCLUSTER_STATE_DIR": str(state)})
    assert proc.stdout is not None and proc.stdout.readline() == "first line\n"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err


def test_status_json_shape(live_run: tuple[Path, RunRecord]) -> None:
    state, rec = live_run
    st = json.loads(ftc("status", "--json", state=state).stdout)
    assert st["schema_version"] == 2 and st["kind"] == "status" and st["run_id"] == rec.run_id
    assert st["phase"] == "ready" and st["phase_label"] == "rank 0 ready"
    assert st["state"] == "RUNNING" and st["endpoint"] == "host0:8000"
    assert st["num_nodes"] == 2 and isinstance(st["nodes"], list)
    assert [(r["node"], r["state"]) for r in st["ranks"]] == [("host0", "ready"), ("host1", "loaded")]


def test_a_run_whose_folder_is_gone(live_run: tuple[Path, RunRecord]) -> None:
    # A scratch filesystem purged the folder of a run whose job has ended: what is known is said
    # (its record, that the job is over), what is not is not guessed (no "killed", no ranks).
    state, rec = live_run
    job = ProcessId.of(int(rec.job_id.split(":")[1].split("@")[0]))   # type: ignore[union-attr]
    assert job is not None
    os.killpg(job.pid, signal.SIGKILL)
    # Not reaped until the fixture's end: a zombie, whose command line is empty, as the launcher sees it.
    assert wait_for(lambda: not job.alive(str(Path(rec.run_dir) / "scripts" / "job.sh")), 10)
    shutil.rmtree(rec.run_dir)
    st = json.loads(ftc("status", rec.run_id, "--json", state=state).stdout)
    gone = f"its run folder {rec.run_dir} is gone (removed, or purged from a scratch filesystem)"
    assert (st["state"], st["ranks"], st["reason"]) == ("UNKNOWN", [], f"{gone}: how its job ended is not known"), st
    assert st["phase_label"] == "not known (its events went with the folder)"
    logs = ftc("logs", rec.run_id, state=state)
    assert logs.returncode == 3 and logs.stderr == f"error: RUN: run {rec.run_id}: {gone}, and its logs with it\n"
    stop = ftc("stop", rec.run_id, state=state)
    assert stop.returncode == 0 and "has already ended" in stop.stdout and "nothing was stopped" in stop.stdout


def test_list_json_shape_matches_status_nodes(live_run: tuple[Path, RunRecord]) -> None:
    state, rec = live_run
    (run,) = json.loads(ftc("list", "--json", state=state).stdout)
    assert run["schema_version"] == 2 and run["kind"] == "run"
    assert run["num_nodes"] == 2 and run["nodes"] == ["host0", "host1"]   # same type as in status
    assert run["run_dir"] == rec.run_dir and run["job_id"] == rec.job_id


def test_piped_tables_keep_whole_values(live_run: tuple[Path, RunRecord]) -> None:
    state, rec = live_run
    for args in (["list"], ["status"]):
        out = ftc(*args, state=state).stdout
        assert rec.run_dir in out, out     # one line, not cut at 80 columns
    assert "loaded, waiting for rank 0 (FT)" in ftc("status", state=state).stdout


def test_stop_stops_the_job(live_run: tuple[Path, RunRecord]) -> None:
    state, rec = live_run
    # The newest run is not stopped on a guess: RUN or --yes (no terminal to ask on here).
    guessed = ftc("stop", state=state)
    assert guessed.returncode == 3 and "--yes" in guessed.stderr and rec.run_id in guessed.stderr
    assert json.loads(ftc("status", "--json", state=state).stdout)["state"] == "RUNNING"
    p = ftc("stop", "--yes", state=state)
    assert p.returncode == 0 and f"stopped run {rec.run_id}" in p.stdout
    assert json.loads(ftc("status", "--json", state=state).stdout)["state"] != "RUNNING"
    # An ended run: said so, its record left as it was (here: as if it had completed).
    store = RunStore(state / "runs.sqlite")
    store.update(store.get(rec.run_id), status="COMPLETED")
    again = ftc("stop", rec.run_id, state=state)
    assert again.returncode == 0 and "has already ended" in again.stdout and "nothing was stopped" in again.stdout
    assert json.loads(ftc("list", "--json", state=state).stdout)[-1]["status"] == "COMPLETED"


def test_status_and_logs_load_no_specs_or_templates(live_run: tuple[Path, RunRecord]) -> None:
    from tests.unit.test_cli_lazy import _modules_after

    state, rec = live_run
    for args in (["status", rec.run_id], ["logs", "--tail", "100", rec.run_id]):
        rc, mods, _ = _modules_after(args, env={"FTCLUSTER_STATE_DIR": str(state)})
        assert rc == 0
        assert not {"pydantic", "jinja2", "ftcluster.spec.base", "ftcluster.spec.cluster", "ftcluster.spec.model", "ftcluster.render.scripts", "numpy"} & mods, args


def test_replica_commands_refuse_a_run_that_is_no_set(tmp_path: Path) -> None:
    run_dir = tmp_path / "plain"
    (run_dir / "state").mkdir(parents=True)
    rec = record(tmp_path, run_dir, None)
    for args in (("stop", rec.run_id, "--replica", "0"), ("logs", rec.run_id, "--replica", "1"),
                 ("scale", rec.run_id, "--replicas", "2"), ("restart", rec.run_id)):
        out = ftc(*args, state=tmp_path)
        assert out.returncode == 3 and "is not a replica set" in out.stderr and "Traceback" not in out.stderr, args
    bad = ftc("scale", rec.run_id, "--replicas", "0", state=tmp_path)
    assert bad.returncode == 2 and "--replicas" in bad.stderr


def test_list_filters_and_prune(tmp_path: Path) -> None:
    state = tmp_path / "state"
    store = RunStore(state / "runs.sqlite")
    runs = []
    for i, status in enumerate(("COMPLETED", "FAILED", "SERVING", "COMPLETED")):
        d = tmp_path / f"run{i}"
        (d / "scripts").mkdir(parents=True)
        rec = RunRecord(run_id=f"r{i}", created=time.time() - (40 if i < 3 else 1) * 86400, cluster_name="c" if i else "d",
                        cluster_source="", scheduler="local", style="local", run_dir=str(d), nodes=1, model="m",
                        job_id=None, status=status)
        (d / "scripts" / "job.json").write_text(json.dumps({"run_id": rec.run_id}))
        store.add(rec)
        runs.append(rec)
    listed = json.loads(ftc("list", "--json", "--status", "completed", "--cluster", "c", state=state).stdout)
    assert [r["run_id"] for r in listed] == ["r3"]
    # r2 may still serve (SERVING, no job to ask: kept); r3 is too young; r0 and r1 go.
    dry = ftc("prune", "--older-than", "30", "--dry-run", state=state)
    assert dry.returncode == 0 and "r0" in dry.stdout and "r1" in dry.stdout and "r2" not in dry.stdout
    assert (tmp_path / "run0").is_dir()
    refused = ftc("prune", "--older-than", "30", state=state)
    assert refused.returncode == 3 and "--yes" in refused.stderr and (tmp_path / "run0").is_dir()
    # A record whose folder is another run's now: the record goes, the folder stays.
    (tmp_path / "run1" / "scripts" / "job.json").write_text(json.dumps({"run_id": "someone-else"}))
    done = ftc("prune", "--older-than", "30", "--yes", state=state)
    assert done.returncode == 0 and "removed 2 run(s)" in done.stdout
    assert not (tmp_path / "run0").exists() and (tmp_path / "run1").is_dir() and (tmp_path / "run2").is_dir()
    assert [r["run_id"] for r in json.loads(ftc("list", "--json", state=state).stdout)] == ["r2", "r3"]


def test_prune_keeps_what_a_live_service_needs(tmp_path: Path) -> None:
    """Days of hand-overs: the first runs of a service ended long ago, but their run id still
    names it (`status OLD`, `stop OLD` follow the chain) and a set's balancer follows each member
    from its first run's folder. A weekly `prune` must not take them while the service lives."""
    state = tmp_path / "state"
    store = RunStore(state / "runs.sqlite")
    month = time.time() - 40 * 86400

    def add(run_id: str, status: str, created: float = month, **kw: Any) -> None:
        d = tmp_path / run_id
        (d / "scripts").mkdir(parents=True)
        (d / "scripts" / "job.json").write_text(json.dumps({"run_id": run_id}))
        store.add(RunRecord(**{"run_id": run_id, "created": created, "cluster_name": "c", "cluster_source": "",
                               "scheduler": "local", "style": "local", "run_dir": str(d), "nodes": 1, "model": "m",
                               "job_id": None, "status": status, **kw}))

    # A lone run handed over twice, its latest serving (young); a chain that ended for good.
    add("a", "COMPLETED")
    add("a2", "COMPLETED", predecessor="a")
    add("a3", "SERVING", created=time.time(), predecessor="a2")
    add("b", "COMPLETED")
    add("b2", "FAILED", predecessor="b")
    # A set that serves: its member's first run handed over (ended), and a member stopped by
    # `scale`; another set stopped long ago.
    add("s", "SERVING", style="front")
    add("s-r0", "COMPLETED", replica_of="s", replica=0)
    add("s-r0.1", "SERVING", created=time.time(), predecessor="s-r0", replica_of="s", replica=0)
    add("t", "COMPLETED", style="front")
    add("t-r0", "COMPLETED", replica_of="t", replica=0)
    done = ftc("prune", "--older-than", "30", "--yes", state=state)
    assert done.returncode == 0 and "removed 4 run(s)" in done.stdout, done.stdout + done.stderr
    left = sorted(r["run_id"] for r in json.loads(ftc("list", "--json", state=state).stdout))
    assert left == ["a", "a2", "a3", "s", "s-r0", "s-r0.1"]
    assert all((tmp_path / r).is_dir() for r in left) and not (tmp_path / "b").exists()


def test_json_of_stop_render_and_check_checkpoint(live_run: tuple[Path, RunRecord], tmp_path: Path) -> None:
    state, rec = live_run
    stopped = json.loads(ftc("stop", rec.run_id, "--json", state=state).stdout)
    assert stopped["kind"] == "stop" and [r["run_id"] for r in stopped["stopped"]] == [rec.run_id]
    again = json.loads(ftc("stop", rec.run_id, "--json", state=state).stdout)
    assert again["stopped"] == [] and again["already_ended"]
    out = tmp_path / "rendered"
    rendered = json.loads(ftc("render", "--nodes", "2", "--out", str(out), "--json", state=state).stdout)
    assert rendered["kind"] == "render" and rendered["run_dir"] == str(out) and rendered["submit"].startswith("cd ")
    assert str(out / "scripts" / "job.json") in rendered["files"]
    ck = ftc("check-checkpoint", "--gpus", "2", "--json", state=state)
    doc = json.loads(ck.stdout)
    assert doc["kind"] == "checkpoint" and doc["gpus"] == 2 and doc["folder"].endswith("2-gpu")
    assert ck.returncode == (0 if doc["ok"] else 1)


def test_run_ids_complete(tmp_path: Path) -> None:
    state = tmp_path / "state"
    for name in ("gpt-a", "gpt-b", "bert-c"):
        record(state, tmp_path / name, None)
    env = {**os.environ, "FTCLUSTER_STATE_DIR": str(state), "_FTCLUSTER_COMPLETE": "bash_complete",
           "COMP_WORDS": "ftcluster logs gpt", "COMP_CWORD": "2"}
    out = subprocess.run([sys.executable, "-m", "ftcluster"], capture_output=True, text=True, env=env, check=False)
    assert out.stdout.split() == ["plain,gpt-b", "plain,gpt-a"], out


def test_no_color_means_no_styling(live_run: tuple[Path, RunRecord]) -> None:
    """NO_COLOR (no-color.org): no escape sequence at all, italics included, even on a terminal."""
    state, rec = live_run
    cmd = f"{sys.executable} -m ftcluster status {rec.run_id}"
    env = {**os.environ, "FTCLUSTER_STATE_DIR": str(state), "NO_COLOR": "1", "TERM": "xterm"}
    out = subprocess.run(["script", "-qc", cmd, "/dev/null"], capture_output=True, text=True, env=env, check=False)
    assert f"run {rec.run_id}" in out.stdout and "\x1b[" not in out.stdout, repr(out.stdout[:300])


def test_logs_as_json_lines(live_run: tuple[Path, RunRecord]) -> None:
    state, rec = live_run
    out = ftc("logs", rec.run_id, "--server", "--json", state=state)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert {"source": "rank0 host0", "line": "first line"} in rows, rows


def test_a_damaged_record_is_left_out_and_named(tmp_path: Path) -> None:
    # One record damaged (truncated JSON, a wrong type): the other runs stay usable, the damaged
    # run is named with the fix, and giving its folder records it again.
    state = tmp_path / "state"
    good = record(state, tmp_path / "good", None)
    cut = record(state, tmp_path / "cut", None)
    typed = record(state, tmp_path / "typed", None)
    (tmp_path / "cut" / "scripts").mkdir(parents=True)
    db = sqlite3.connect(state / "runs.sqlite")
    data = dict(json.loads(db.execute("SELECT data FROM runs WHERE run_id = ?", (typed.run_id,)).fetchone()[0]))
    db.execute("UPDATE runs SET data = ? WHERE run_id = ?", (json.dumps({**data, "nodes": "2"}), typed.run_id))
    db.execute("UPDATE runs SET data = substr(data, 1, 30) WHERE run_id = ?", (cut.run_id,))
    db.commit()
    db.close()
    listed = ftc("list", "--json", state=state)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout)] == [good.run_id]
    assert f"record of {cut.run_id} is damaged (not JSON" in listed.stderr
    assert f"record of {typed.run_id} is damaged (nodes is str)" in listed.stderr
    asked = ftc("status", typed.run_id, state=state)
    assert asked.returncode == 3 and "Traceback" not in asked.stderr
    assert f"error: RUN: the record of run {typed.run_id} is damaged (nodes is str)" in asked.stderr
    # A record from a newer ftcluster (a key this one does not know) still reads.
    from ftcluster.run.store import decode_record
    assert decode_record(json.dumps({**data, "added_later": 1})).run_id == typed.run_id


def test_state_files_that_are_not_utf8(live_run: tuple[Path, RunRecord]) -> None:
    # The run folder's state files are read as text with undecodable bytes replaced, not raised.
    state, rec = live_run
    st = Path(rec.run_dir) / "state"
    for name in ("events", "rank0.host", "rank1.loaded"):
        with open(st / name, "ab") as f:
            f.write(b"\xff\xfe\n")
    (st / "rank1.exit").write_bytes(b"\xfe")
    for args in (("status", rec.run_id), ("status", "--json", rec.run_id), ("logs", rec.run_id)):
        done = ftc(*args, state=state)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (args, done.stderr)


def test_out_and_examples_refuse_a_dangling_link(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere" / "dir")
    for args in (("examples", str(link)), ("render", "--nodes", "2", "--out", str(link))):
        done = ftc(*args, state=tmp_path)
        assert done.returncode == 3 and "which does not exist; nothing was written" in done.stderr, done.stderr
    assert not (tmp_path / "nowhere").exists()
    empty = ftc("examples", "", state=tmp_path)
    assert empty.returncode == 3 and empty.stderr == (
        "error: DIR: an empty path (name a folder, or leave DIR out for ./configs)\n")


def test_every_bad_option_at_once(tmp_path: Path) -> None:
    # click stops at the first value it cannot convert; every one is said, in one line.
    bad = ftc("plan", "--nodes", "abc", "--tp", "x", state=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "'--nodes'" in bad.stderr and "'abc'" in bad.stderr and "'--tp'" in bad.stderr and "'x'" in bad.stderr
    words = ftc("convert", "--dry-run", "--converter-root", str(tmp_path), "--input", "", "--python", "",
                state=tmp_path)
    assert words.returncode == 2 and "'--input'" in words.stderr and "'--python'" in words.stderr, words.stderr
    sizes = ftc("preflight", "--dry-run", "--sizes", "1G..1M", state=tmp_path)
    assert sizes.returncode == 2 and "'--sizes': '1G..1M': need 0 < first <= last" in sizes.stderr, sizes.stderr
    image = ftc("image", "import", "--dry-run", "--tag", "BAD TAG;rm", state=tmp_path)
    assert image.returncode == 2 and "'--tag'" in image.stderr and "Docker reference" in image.stderr


def test_conflicting_or_unknown_choices_are_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    rec = record(state, tmp_path / "run1", None)
    both = ftc("logs", "--server", "--client", "--rank", "0", "--all", rec.run_id, state=state)
    assert both.returncode == 3 and both.stderr == (
        "error: --rank: give --rank or --all, not both; --server: give --server or --client, not both\n")
    status = ftc("list", "--status", "BOGUS", state=state)
    assert status.returncode == 2 and "'BOGUS' is not one of" in status.stderr
    none = ftc("list", "--status", "failed", state=state)
    assert none.returncode == 0 and none.stderr == "no run matches\n"
    dry = ftc("launch", "--nodes", "2", "--dry-run", "--json", state=state)
    assert dry.returncode == 3 and dry.stderr.startswith("error: --json: --dry-run prints the job request as text")
    missing = ftc("config", "--cluster", str(tmp_path / "no.yaml"), state=state)
    assert missing.returncode == 3 and "does not exist" in missing.stderr


def test_clients_of_a_run_ask_for_the_runs_model(live_run: tuple[Path, RunRecord]) -> None:
    # `client ... --run RUN` asks for the model the run serves (its record's, here "m"), not
    # `fastertransformer`. The run's endpoint is a real HTTP server that notes each path asked.
    import http.server
    import threading

    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            if self.path.startswith("/v2/health/"):
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self.send_error(404)

        do_POST = do_GET

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state, rec = live_run
    with open(Path(rec.run_dir) / "state" / "events", "a") as events:
        events.write(f"4.0 ready 127.0.0.1:{server.server_address[1]}\n")
    prompts = Path(rec.run_dir) / "prompts.txt"
    prompts.write_text("hello\n")
    try:
        for command in (["identity"], ["bench", "--concurrency", "1", "--duration", "0.1", "--warmup", "0"],
                        ["text", "--prompts", str(prompts), "--tokenizer", "bytes"]):
            asked.clear()
            p = ftc("client", *command, "--run", rec.run_id, "--timeout", "5", state=state)
            models = {path.split("/")[3] for path in asked if path.startswith("/v2/models/")}
            assert models == {"m"}, (command, asked, p.stderr)
    finally:
        server.shutdown()
        server.server_close()


MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
DOCKER = {"runtime": "docker", "image": "triton:22.12", "mounts": [f"{MODELS}:{MODELS}:ro"]}


@pytest.mark.parametrize("spec,who", [
    ({"scheduler": "slurm", "partition": "p", "exclusive": False}, "other jobs on that node (exclusive: false)"),
    ({"scheduler": "slurm", "partition": "p"}, None),                          # exclusive: true, the default
    ({"scheduler": "slurm", "partition": "p", "exclusive": False, "access": "cluster"}, None),   # no token to skip
    ({"scheduler": "local", "access": "private"}, "this machine's other users"),
    ({"scheduler": "local"}, None),                                            # access: cluster there
    ({"scheduler": "ssh", "hosts": ["n1"], "container": DOCKER}, "the hosts' other users"),
    ({"scheduler": "slurm", "partition": "p", "container": DOCKER}, None),
], ids=["slurm-shared", "slurm-exclusive", "slurm-shared-cluster", "local-private", "local-cluster", "ssh", "docker"])
def test_launch_and_status_say_when_same_host_users_can_reach_a_private_runs_triton(
        tmp_path: Path, spec: dict[str, Any], who: str | None) -> None:
    """A private run's Triton listens on rank 0's loopback without the token: where the job does
    not have that node to itself, `launch` and `status` say so in one line; elsewhere nothing."""
    import yaml

    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"name": "c", "gpus_per_node": 1, "max_nodes": 2,
                                                     "workspace": str(tmp_path / "ws"), **spec}))
    model = str(Path(__file__).resolve().parents[1] / "data" / "bad_inputs" / "ok" / "model.yaml")
    state = tmp_path / "state"
    args = ("--cluster", str(tmp_path / "c.yaml"), "--model", model, "--nodes", "1")
    dry = ftc("launch", *args, "--dry-run", state=state)
    assert dry.returncode == 0, dry.stderr
    rendered = ftc("render", *args, "--out", str(tmp_path / "run"), state=state)
    assert rendered.returncode == 0, rendered.stderr
    status = ftc("status", str(tmp_path / "run"), state=state)
    st = json.loads(ftc("status", str(tmp_path / "run"), "--json", state=state).stdout)
    notes = [[ln for ln in text.splitlines() if "same-host" in ln] for text in (dry.stderr, status.stdout)]
    if who is None:
        assert notes == [[], []] and st["same_host"] is None and "same-host" not in dry.stdout + status.stderr
        return
    # The local style's rendered block (a launch picks a free one) is 18000's, the others 8000's.
    base = 18000 if spec["scheduler"] == "local" else 8000
    for lines in notes:
        assert len(lines) == 1 and lines[0].startswith("note: same-host users can reach Triton directly, without "
                                                       f"the token: it listens on rank 0's loopback (ports {base + 100} "
                                                       f"and {base + 101}), which {who} share"), lines
    assert st["access"] == "private" and notes[1][0] == f"note: {st['same_host']}"
    assert dry.stderr.strip().splitlines()[-1] == notes[0][0]     # after the request, on stderr


def test_a_rank_that_ended_before_its_server_said_anything_is_not_given_an_empty_log(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ftcluster.cli.commands_launch import _report
    from ftcluster.launch.run import LaunchOutcome

    rec = record(tmp_path, tmp_path / "run1", "7", nodes=2)
    _report(LaunchOutcome(rec, ok=False, failure="ports.http: 18600 + proxy.loopback_offset 100 = port 18700 ...",
                          failed_rank={"rank": "0", "node": "node1", "exit_code": "98"}))
    err = capsys.readouterr().err
    assert "rank 0 on node1 exited with 98 before its server wrote a line" in err and "last lines" not in err, err
