"""The urgent audit findings, each reproduced and now refused or harmless: env NAMES that ran
code, a Pyxis `render --out` path that ran code in Enroot's bash, `stop` signalling a recycled
pid, and a refused `--run-id` that deleted the earlier run. Canaries (PWNED*) are files any
executed payload would create."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftcluster.spec.envnames import env_name_problem, job_library_names
from ftcluster.run.layout import RunPaths
from ftcluster.run.procs import ProcessId
from ftcluster.render.scripts import RenderOptions, render
from ftcluster.run.store import RunRecord, RunStore
from tests.helpers_specs import (
    REPO_ROOT,
    assert_one_line_error,
    ckpt,
    cluster,
    facts,
    model,
    run_cli,
)
from tests.pyxis.enroot_config import source_mounts
from tests.unit.test_render import STYLES, render_style, write_env_file

PAYLOAD = "SECONDS[$(touch PWNED)]"
SHELL_SPECIAL = ["BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "PROMPT_COMMAND", "SECONDS",
                 "GLOBIGNORE", "CDPATH", "HOME", "BASH_XTRACEFD"]
RUNTIME = ["SLURM_NTASKS", "SRUN_CPUS_PER_TASK", "SBATCH_PARTITION", "PMIX_RANK", "OMPI_COMM_WORLD_RANK",
           "ENROOT_MOUNT_HOME", "PYXIS_CONTAINER_IMAGE", "DOCKER_HOST", "FTC_RANK", "SSH_AUTH_SOCK"]


def _no_pwned(root: Path) -> None:
    found = list(root.rglob("PWNED*"))
    assert not found, f"a payload ran: {found}"


# --------------------------------------------------------------------------- 1. env names

@pytest.mark.parametrize("name", ["RUN_ID", "EXIT_GRACE", "STATE", "TRITON", "NODES", "SERVER_MARK",
                                  "GPU_POOL", "GPUS_PER_NODE", "NAPPER", *SHELL_SPECIAL, *RUNTIME])
def test_env_names_of_the_job_shell_and_runtimes_are_refused(name: str) -> None:
    problem = env_name_problem(name)
    assert problem and name in problem and "choose another name" in problem


@pytest.mark.parametrize("name", ["MYVAR\n", "A B", "1X", "X-Y", "SECONDS[$(touch PWNED)]", "", "A\0"])
def test_malformed_env_names_are_refused(name: str) -> None:
    assert env_name_problem(name) and "not a valid environment variable name" in str(env_name_problem(name))


@pytest.mark.parametrize("name", ["NCCL_DEBUG", "OMPI_MCA_btl", "HF_TOKEN", "PATH", "LD_LIBRARY_PATH",
                                  "CUDA_VISIBLE_DEVICES", "TMPDIR", "PYTHONPATH", "my_setting", "SLURM_CONF",
                                  "FTC_LIBMPI", "FTCLUSTER_TEST_DIE_NODE"])
def test_ordinary_env_names_pass(name: str) -> None:
    assert env_name_problem(name) is None


def _defined_by_variable_block(text: str, tmp: Path) -> set[str]:
    """The names a rendered script's variable block defines, as bash itself lists them
    (`compgen -v` before and after evaluating the block in an empty environment)."""
    m = re.search(r"^set -uo pipefail\n(.*?^export RUN_ID .*?$)", text, re.DOTALL | re.MULTILINE)
    assert m, "no variable block"
    script = f"before=$(compgen -v)\n{m.group(1)}\ncomm -13 <(sort <<<\"$before\") <(compgen -v | sort)\n"
    r = subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", "bash", "-c", script], capture_output=True,
                       text=True, cwd=tmp, timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split()) - {"before", "BASH_REMATCH", "_"}


@pytest.mark.parametrize("style", STYLES)
def test_every_variable_a_rendered_script_defines_is_refused_as_an_env_name(style: str, tmp_path: Path) -> None:
    """Bash, not the project's scanner, says which names the scripts define: each is refused, so
    a variable added to the job library cannot reopen the hole."""
    scripts = render_style(style, run_dir=tmp_path / "run")
    write_env_file(scripts, tmp_path / "run")
    defined: set[str] = set()
    for name, text in scripts.files.items():
        if name.endswith((".sh", ".sbatch")) and "export RUN_ID " in text:
            defined |= _defined_by_variable_block(text, tmp_path)
    assert {"RUN_ID", "EXIT_GRACE", "NODES"} <= defined
    accepted = {n for n in defined if env_name_problem(n) is None}
    # The spec's own env (NCCL_*) is the user's: exported first, then the job's variables.
    assert {n for n in accepted if not n.startswith("NCCL_")} == set()


def test_the_scanner_sees_every_variable_of_the_job_library() -> None:
    names = job_library_names()
    for want in ("RUN_ID", "EXIT_GRACE", "NODES", "STATE", "SERVER_MARK", "GPU_POOL", "GPUS_PER_NODE",
                 "NAPPER", "IN_SSH", "SELF_STAT", "pid", "rc"):
        assert want in names


def test_the_scanner_reads_the_bash_in_jinja_expressions_and_the_jobs_bash_snippets() -> None:
    """A Jinja expression's string literals become bash in the script (`{{ ' $proxy_pids' if x }}`),
    and the job runs its node scripts (kill_marked.sh, session_guard.sh, ...) with the user's env: the
    names in both are refused like the scripts' own."""
    from ftcluster.spec.envnames import job_bash_snippets, names_in_script

    found = names_in_script("kill $pids{{ ' $only_in_jinja' if proxied }}\n{% set line = \"SET_IN_JINJA=1 run\" %}")
    assert {"pids", "only_in_jinja", "SET_IN_JINJA"} <= found and not {"proxied", "line", "set"} & found
    snippets = job_bash_snippets()
    assert len(snippets) >= 6 and all("$" in code for code in snippets)
    in_snippets = set().union(*map(names_in_script, snippets))
    # The teardown's and the guard's own variables (only there: kill_marked's, the guard's word).
    assert {"still", "last", "word", "gone", "run", "n"} <= in_snippets
    assert {n for n in in_snippets if env_name_problem(n) is None} == set()


def _hostile_env_cluster(folder: Path, runtime: str, names: list[str]) -> Path:
    spec: dict[str, Any] = yaml.safe_load((REPO_ROOT / "configs" / "clusters" /
                                           {"pyxis": "pyxis.yaml", "docker": "slurm-docker.yaml",
                                            "local": "local.yaml"}[runtime]).read_text())
    spec["workspace"] = str(folder / "ws")
    spec["env"] = {n: PAYLOAD for n in names}
    path = folder / f"{runtime}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("runtime", ["local", "pyxis", "docker"])
def test_hostile_env_names_refused_by_every_command_at_once(runtime: str, tmp_path: Path) -> None:
    names = ["RUN_ID", "BASH_ENV", "EXIT_GRACE", "STATE", "NODES"]
    spec = _hostile_env_cluster(tmp_path, runtime, names)
    for cmd in (["launch", "--dry-run"], ["render", "--out", str(tmp_path / "out")]):
        res = run_cli(*cmd, "--cluster", str(spec), "--nodes", "2", "--gpus-per-node", "1", cwd=tmp_path)
        line = assert_one_line_error(res, "env")
        assert all(n in line for n in names), line   # every bad name in the one message
        assert res.rc == 3
    assert not (tmp_path / "out").exists() and not (tmp_path / "ws").exists()
    _no_pwned(tmp_path)


@pytest.mark.parametrize("style", STYLES)
def test_hostile_env_values_stay_data_in_every_style(style: str, tmp_path: Path) -> None:
    """Accepted names with payload values: every rendered script passes bash -n and its variable
    block evaluates, the payload arriving as the value, nothing run; the supervisor gets them as
    data for its children."""
    env = {"MY_SETTING": PAYLOAD, "OMPI_MCA_btl": "$(touch PWNED2)", "CUDA_VISIBLE_DEVICES": "`touch PWNED3`"}
    if style in ("docker", "ssh_docker"):
        env = {k: v.replace('"', "") for k, v in env.items()}
    scripts = render_style(style, run_dir=tmp_path / "run", env=env)
    write_env_file(scripts, tmp_path / "run")
    for name, text in scripts.files.items():
        if not name.endswith((".sh", ".sbatch")):
            continue
        path = tmp_path / name
        path.write_text(text)
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, name
        if "export RUN_ID " in text:
            m = re.search(r"^set -uo pipefail\n(.*?^export RUN_ID .*?$)", text, re.DOTALL | re.MULTILINE)
            assert m
            shell = f'{m.group(1)}\nprintf "%s\\0" "$MY_SETTING" "$OMPI_MCA_btl" "$CUDA_VISIBLE_DEVICES" "$NODES"'
            r = subprocess.run(["bash", "-c", shell], capture_output=True, cwd=tmp_path, timeout=30)
            assert r.returncode == 0, r.stderr
            assert r.stdout.decode().split("\0")[:4] == [*env.values(), "2"]
    assert {k: v for k, v in json.loads(scripts.files["job.json"])["env"].items() if k in env} == env
    _no_pwned(tmp_path)


def test_a_job_variable_in_env_cannot_replace_the_jobs_value_even_past_validation(tmp_path: Path) -> None:
    """Defence in depth: were a job variable's name ever let through, the spec's env is exported
    before the job's own assignments, so the job's value wins and the payload stays a string."""
    from ftcluster.engines.fastertransformer.plan import plan_for

    c = cluster()
    c = c.model_copy(update={"env": {"NODES": PAYLOAD, "EXIT_GRACE": PAYLOAD}})  # skips validation
    m = model(checkpoint_root="/ckpt")
    p = plan_for(c, m, facts(), ckpt(tp=1, layers=2), 1, 1)
    scripts = render(c, m, p, RunPaths("r1", tmp_path / "run"), RenderOptions())
    write_env_file(scripts, tmp_path / "run")
    text = scripts.files["rank_server.sh"]
    block = re.search(r"^set -uo pipefail\n(.*?^export RUN_ID .*?$)", text, re.DOTALL | re.MULTILINE)
    assert block
    shell = f"{block.group(1)}\nif (( NODES )); then :; fi\necho $((EXIT_GRACE + 0))"
    r = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, cwd=tmp_path, timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    _no_pwned(tmp_path)


# --------------------------------------------------------------------------- 2. Pyxis mount paths

def test_the_enroot_config_harness_would_run_a_payload(tmp_path: Path) -> None:
    """The rebuilt config is as dangerous as Pyxis's own: a '$(...)' path runs when sourced
    (so the tests below that find no canary can fail)."""
    source_mounts(f"{tmp_path}/x$(touch${{IFS}}PWNED):/x", tmp_path)
    assert (tmp_path / "PWNED").exists()


def _pyxis_cluster(tmp_path: Path) -> Path:
    """The example Pyxis cluster with the demo checkpoint mounted (render checks that the
    checkpoint is visible inside the containers)."""
    spec = yaml.safe_load((REPO_ROOT / "configs/clusters/pyxis.yaml").read_text())
    demo = REPO_ROOT / "ftcluster" / "demo" / "checkpoint"
    spec["container"]["mounts"].append(f"{demo}:{demo}:ro")
    (tmp_path / "pyxis.yaml").write_text(yaml.safe_dump(spec))
    return tmp_path / "pyxis.yaml"


@pytest.mark.parametrize("bad", ["$(touch PWNED)", "`touch PWNED`", 'a"b', "a\\b", "a,b", "a:b", "${IFS}x"])
def test_render_out_that_enroot_would_evaluate_is_refused(bad: str, tmp_path: Path) -> None:
    out = tmp_path / "new" / f"run {bad}"
    res = run_cli("render", "--cluster", str(_pyxis_cluster(tmp_path)),
                  "--nodes", "1", "--gpus-per-node", "1", "--out", str(out), cwd=tmp_path)
    line = assert_one_line_error(res, "--out", "Pyxis mounts it")
    assert res.rc == 3 and str(tmp_path) in line
    assert not (tmp_path / "new").exists()
    _no_pwned(tmp_path)


def test_a_workspace_and_spec_mounts_go_through_the_same_check(tmp_path: Path) -> None:
    from ftcluster.errors import UserError
    from ftcluster.render.scripts import pyxis_mount_problems

    c = cluster(scheduler="slurm", container={"runtime": "pyxis", "image": "/i.sqsh",
                                              "mounts": ["/data:/data"]})
    bad_mount = c.container.model_copy(update={"mounts": (c.container.mounts[0].model_copy(
        update={"src": "/d$(touch PWNED)"}),)})
    c2 = c.model_copy(update={"container": bad_mount})
    problems = pyxis_mount_problems(c2, RunPaths("r", Path("/runs/`x`/r")), None)
    assert [p.split(":", 1)[0] for p in problems] == ["container.mounts.0", "workspace"]
    with pytest.raises(UserError, match="container.mounts.0: .*; workspace: "):
        render(c2, model(checkpoint_root="/ckpt"), _plan(c2), RunPaths("r", Path("/runs/`x`/r")))


def _plan(c: Any) -> Any:
    from ftcluster.engines.fastertransformer.plan import plan_for

    return plan_for(c, model(checkpoint_root="/ckpt"), facts(), ckpt(tp=1, layers=2), 1, 1)


def test_accepted_render_out_survives_enroots_bash(tmp_path: Path) -> None:
    """What is accepted (quotes, ; # & | < > * ( )) reaches Enroot as the path itself:
    --container-mounts from the rendered script, the config rebuilt from Pyxis's source and
    sourced, mounts() called. (Blanks are refused: Pyxis before 0.24 does not escape them.)"""
    out = tmp_path / "runs" / "a';>PWNED;(>PWNED2)#&|<x>*"
    res = run_cli("render", "--cluster", str(_pyxis_cluster(tmp_path)),
                  "--nodes", "1", "--gpus-per-node", "1", "--out", str(out), cwd=tmp_path)
    assert res.rc == 0, res.stderr
    container = json.loads((out / "scripts" / "job.json").read_text())["container_flags"]
    flags = dict(a.split("=", 1) for a in container)
    mounts = source_mounts(flags["--container-mounts"], tmp_path)
    assert (str(out), str(out), "x-create=auto,rbind") in mounts
    _no_pwned(tmp_path)


# --------------------------------------------------------------------------- 3. stop and pids

@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process leading its own group, as a recycled pid would name."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _ftc(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ftcluster", *args], capture_output=True, text=True,
                          env={**os.environ, "FTCLUSTER_STATE_DIR": str(state)}, timeout=120, check=False)


def _local_run(state: Path, run_dir: Path, job_id: str, events: str = "1.0 job_started h 1\n") -> RunRecord:
    for sub in ("scripts", "logs", "state"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    (run_dir / "scripts" / "job.sh").write_text("sleep 600\n")
    (run_dir / "state" / "events").write_text(events)
    rec = RunRecord(run_id=run_dir.name, created=time.time(), cluster_name="local", cluster_source="",
                    scheduler="local", style="local", run_dir=str(run_dir), nodes=1, model="m",
                    job_id=job_id, status="RUNNING")
    RunStore(state / "runs.sqlite").add(rec)
    return rec


def test_stop_never_signals_a_recycled_job_pid(bystander: subprocess.Popen[bytes], tmp_path: Path) -> None:
    ident = ProcessId.of(bystander.pid)
    assert ident is not None
    # The record names the bystander's pid with another start time: the job it recorded is gone.
    rec = _local_run(tmp_path / "state", tmp_path / "run-a", f"local:{ident.pid}@{ident.start + 1}")
    status = json.loads(_ftc(tmp_path / "state", "status", rec.run_id, "--json").stdout)
    assert status["state"] != "RUNNING"
    _ftc(tmp_path / "state", "stop", rec.run_id)
    time.sleep(0.2)
    assert bystander.poll() is None, "stop killed an unrelated process"


def test_stop_of_an_unidentifiable_job_signals_nothing(bystander: subprocess.Popen[bytes], tmp_path: Path) -> None:
    """An older ftcluster's `local:PID` (no start time) cannot be identified: nothing signalled,
    one line saying so."""
    rec = _local_run(tmp_path / "state", tmp_path / "run-b", f"local:{bystander.pid}")
    res = _ftc(tmp_path / "state", "stop", rec.run_id)
    assert "cannot be identified" in res.stderr and "Traceback" not in res.stderr and res.returncode != 0
    assert bystander.poll() is None


def test_stop_never_signals_a_recycled_rank_pid(bystander: subprocess.Popen[bytes], tmp_path: Path) -> None:
    ident = ProcessId.of(bystander.pid)
    assert ident is not None
    dead = subprocess.Popen(["true"], start_new_session=True)
    dead.wait()
    rec = _local_run(tmp_path / "state", tmp_path / "run-c", f"local:{dead.pid}@1")
    (Path(rec.run_dir) / "state" / "rank0.pid").write_text(f"{ident.pid} {ident.start + 1}\n")
    (Path(rec.run_dir) / "state" / "rank1.pid").write_text(f"{ident.pid}\n")   # a bare pid
    _ftc(tmp_path / "state", "stop", rec.run_id)
    time.sleep(0.2)
    assert bystander.poll() is None


def _signal_rank(sig: str, pidfile: Path, group: bool = False) -> int:
    script = REPO_ROOT / "ftcluster" / "rank" / "signal_rank.sh"
    return subprocess.run(["bash", str(script), sig, str(pidfile), *(["group"] if group else [])],
                          timeout=30).returncode


@pytest.mark.parametrize("group", [False, True])
def test_the_jobs_signal_helper_checks_identity(group: bool, tmp_path: Path) -> None:
    victim = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        ident = ProcessId.of(victim.pid)
        assert ident is not None
        pidfile = tmp_path / "rank0.pid"
        for wrong in (f"{ident.pid} {ident.start + 1}", f"{ident.pid}", f"{ident.pid} x", "$(touch PWNED) 1"):
            pidfile.write_text(wrong + "\n")
            assert _signal_rank("KILL", pidfile, group) != 0
            assert victim.poll() is None, wrong
        pidfile.write_text(f"{ident.pid} {ident.start}\n")
        assert _signal_rank("KILL", pidfile, group) == 0
        assert victim.wait(timeout=10) == -signal.SIGKILL
    finally:
        victim.kill()
        victim.wait()
    _no_pwned(tmp_path)


def test_python_and_bash_read_the_same_pidfile(tmp_path: Path) -> None:
    """rank_server.sh's own lines write the pidfile; procs.ProcessId identifies that process."""
    text = (REPO_ROOT / "job_templates" / "rank_server.sh.j2").read_text()
    lines = re.search(r"^read -r SELF_STAT.*?\n.*?\nprintf .*?$", text, re.DOTALL | re.MULTILINE)
    assert lines
    script = lines.group(0).replace("\"$STATE/{{ files.rank('$RANK', 'pid') }}\"", shlex.quote(str(tmp_path / "p")))
    proc = subprocess.Popen(["bash", "-c", f"{script}\nsleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "p").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.05)
        ident = ProcessId.parse((tmp_path / "p").read_text())
        assert ident is not None and ident.pid == proc.pid and ident.alive("bash")
    finally:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- 4. a taken --run-id

def test_a_taken_run_id_is_refused_and_the_earlier_run_survives(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ws = tmp_path / "ws"
    spec = yaml.safe_load((REPO_ROOT / "ftcluster" / "demo" / "local-cluster.yaml").read_text())
    spec["workspace"] = str(ws)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(spec))
    dead = subprocess.Popen(["true"])
    dead.wait()
    rec = _local_run(state, ws / "earlier-run", f"local:{dead.pid}@1",
                     events="1.0 job_started h 1\n2.0 ready 127.0.0.1:1\n3.0 done 0\n")
    before = {p: p.read_bytes() for p in Path(rec.run_dir).rglob("*") if p.is_file()}
    assert json.loads(_ftc(state, "status", rec.run_id, "--json").stdout)["state"] == "COMPLETED"
    res = _ftc(state, "launch", "--cluster", str(tmp_path / "c.yaml"), "--nodes", "1", "--run-id", rec.run_id)
    assert res.returncode == 3 and "--run-id" in res.stderr and "exists already" in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert {p: p.read_bytes() for p in Path(rec.run_dir).rglob("*") if p.is_file()} == before
    assert json.loads(_ftc(state, "status", rec.run_id, "--json").stdout)["state"] == "COMPLETED"
    # A record without its folder is taken too; nothing is created for it.
    other = RunRecord(run_id="only-a-record", created=time.time(), cluster_name="local", cluster_source="",
                      scheduler="local", style="local", run_dir=str(tmp_path / "elsewhere"), nodes=1, model="m")
    RunStore(state / "runs.sqlite").add(other)
    res = _ftc(state, "launch", "--cluster", str(tmp_path / "c.yaml"), "--nodes", "1", "--run-id", other.run_id)
    assert res.returncode == 3 and "a run record" in res.stderr
    assert not (ws / other.run_id).exists()


def test_a_dry_run_refuses_the_run_id_the_launch_refuses_and_writes_nothing(tmp_path: Path) -> None:
    """launch --dry-run --run-id ID: the launch's own check (a run folder or a record holds ID),
    read only -- a dry run with no store yet makes none."""
    state, ws = tmp_path / "state", tmp_path / "ws"
    spec = yaml.safe_load((REPO_ROOT / "ftcluster" / "demo" / "local-cluster.yaml").read_text())
    spec["workspace"] = str(ws)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(spec))
    dry = ("launch", "--cluster", str(tmp_path / "c.yaml"), "--nodes", "1", "--dry-run", "--run-id")
    fresh = _ftc(state, *dry, "fresh-run")
    assert fresh.returncode == 0 and "# run fresh-run" in fresh.stdout, fresh.stderr
    assert not state.exists() and not ws.exists()           # nothing written, not even the store
    (ws / "folder-only").mkdir(parents=True)                # a folder without a record (render --out, a crash)
    res = _ftc(state, *dry, "folder-only")
    assert res.returncode == 3 and res.stderr.startswith("error: --run-id: run folder-only exists already (a run "
                                                         "folder at"), res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr and not state.exists()
    RunStore(state / "runs.sqlite").add(RunRecord(
        run_id="record-only", created=time.time(), cluster_name="local", cluster_source="", scheduler="local",
        style="local", run_dir=str(tmp_path / "elsewhere"), nodes=1, model="m"))
    before = (state / "runs.sqlite").read_bytes()
    res = _ftc(state, *dry, "record-only")
    assert res.returncode == 3 and "exists already (a run record" in res.stderr and not res.stdout, res.stderr
    assert not (ws / "record-only").exists() and (state / "runs.sqlite").read_bytes() == before
    # The same words as the launch itself.
    real = _ftc(state, *dry[:-2], "--run-id", "record-only")
    assert real.returncode == 3 and real.stderr == res.stderr
