"""Start-up cost (issue #40): what `status` and `launch` leave unimported, and that what they load
on demand still works -- the client package's lazy names, a loading rank's progress in `status`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ftcluster.run.procs import ProcessId
from ftcluster.observe.status import run_status
from ftcluster.run.store import RunRecord, RunStore
from tests.unit.test_cli_lazy import _modules_after


def _fresh_modules(code: str) -> set[str]:
    """The modules a fresh interpreter has after running `code`."""
    p = subprocess.run([sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                       capture_output=True, text=True, timeout=60, check=True)
    return set(json.loads(p.stdout.splitlines()[-1]))


def test_the_client_packages_names_load_on_first_use() -> None:
    import ftcluster.client as client

    # The liveness probe's modules alone: no process pool, tokenizer or test module.
    mods = _fresh_modules("import ftcluster.client.modelio, ftcluster.client.rawtriton")
    assert not {"multiprocessing", "ftcluster.client.bench", "ftcluster.client.identity",
                "ftcluster.client.text", "ftcluster.client.endpoint", "ftcluster.client.tokenizer"} & mods
    # Every public name resolves to its submodule's object, and the table names no other.
    for name in client.__all__:
        value = getattr(client, name)
        assert getattr(sys.modules[f"ftcluster.client.{client._WHERE[name]}"], name) is value
    assert sorted(client._WHERE) == sorted(client.__all__)
    try:
        client.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown name was found")


def _run(tmp_path: Path, nodes: int, job_id: str | None) -> tuple[Path, RunRecord]:
    state = tmp_path / "state"
    run_dir = tmp_path / "run"
    for sub in ("scripts", "logs", "state"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    rec = RunRecord(run_id="r1", created=time.time(), cluster_name="c", cluster_source="", scheduler="local",
                    style="local", run_dir=str(run_dir), nodes=nodes, model="m", job_id=job_id, status="SERVING")
    RunStore(state / "runs.sqlite").add(rec)
    return state, rec


def test_status_json_imports_no_http_client_or_rich(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    state, rec = _run(tmp_path, 16, f"local:{dead.pid}")
    rc, mods, out = _modules_after(["status", "--json", rec.run_id], env={"FTCLUSTER_STATE_DIR": str(state)})
    assert rc == 0 and json.loads(out)["num_nodes"] == 16
    assert not {"http.client", "ssl", "email", "rich", "hashlib", "ftcluster.job.ranks"} & mods


def test_launch_dry_run_imports_no_rich(tmp_path: Path) -> None:
    rc, mods, out = _modules_after(["launch", "--nodes", "2", "--dry-run"],
                                   env={"FTCLUSTER_STATE_DIR": str(tmp_path)})
    assert rc == 0 and out
    # Beyond what this interpreter's own start-up imports (a site .pth file may import some).
    assert not {"rich", "concurrent.futures", "importlib.resources", "argparse"} & (mods - _fresh_modules("pass"))


def test_spec_models_built_without_plugin_lookup_and_the_environment_left_as_it_was() -> None:
    """pydantic's plugin search (every installed distribution's entry points) is off while the spec
    models are built; nothing this process starts inherits the setting, and a user's own value
    stands."""
    code = ("import os, pydantic.plugin._loader as L; seen = []; get = L.get_plugins\n"
            "L.get_plugins = lambda: (seen.append(os.environ.get('PYDANTIC_DISABLE_PLUGINS')), get())[1]\n"
            "import ftcluster.spec.cluster, ftcluster.spec.model\n"
            "print(sorted(set(map(str, seen))), len(seen), os.environ.get('PYDANTIC_DISABLE_PLUGINS'))")
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                         check=True).stdout.split()
    assert out[0] == "['__all__']" and int(out[1]) >= 10 and out[2] == "None"
    env["PYDANTIC_DISABLE_PLUGINS"] = "logfire"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                         check=True).stdout.split()
    assert out[0] == "['logfire']" and out[2] == "logfire"


def test_rank_states_from_one_listing(tmp_path: Path) -> None:
    """Each rank's state as its files say, a loading rank's progress included (its reader is
    imported on demand)."""
    # The local launcher knows its job by the run's scripts folder in its command line.
    job_sh = tmp_path / "run" / "scripts" / "job.sh"
    job_sh.parent.mkdir(parents=True)
    job_sh.write_text("sleep 60\n")
    job = subprocess.Popen(["bash", str(job_sh)], start_new_session=True)
    try:
        _, rec = _run(tmp_path, 6, f"local:{ProcessId.of(job.pid)}")
        st_dir = Path(rec.run_dir) / "state"
        (st_dir / "events").write_text("1.0 submitted\n2.0 servers_starting\n3.0 ready host0:8000\n")
        for r in range(5):
            (st_dir / f"rank{r}.host").write_text(f"host{r}\n" if r != 4 else "")
        (st_dir / "rank1.loaded").write_text("")
        now = int(time.time())
        (st_dir / "rank2.progress").write_text(f"{now - 7} {now} 2500000 4000 0\n")
        (st_dir / "rank3.exit").write_text("137 1700000000 died\n")
        st = run_status(rec)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    ranks = {r["rank"]: r for r in st["ranks"]}
    assert st["state"] == "RUNNING", st
    assert [ranks[r]["state"] for r in range(6)] == ["ready", "loaded", "loading", "died", "not_started",
                                                    "not_started"]
    assert ranks[2]["progress"] == {"read_bytes": 2500000, "log_bytes": 4000, "gpu_mib": 0, "still_s": 7.0}
    assert "read 2.5 MB" in ranks[2]["state_label"] and "last moved 7 s ago" in ranks[2]["state_label"]
    assert ranks[3]["exit_code"] == 137 and ranks[4]["node"] == "" and ranks[5]["node"] is None
    assert st["nodes"] == ["host0", "host1", "host2", "host3"]
