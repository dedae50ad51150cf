"""`preflight` and `convert` are job requests like `launch`'s: their step runs through the same
path and container as the servers (srun with the Pyxis flags, mpirun over ssh from rank 0's
container, mpirun here), their dry run executes nothing, their runs are recorded with their
launcher (status/logs/stop), and the preflight's rank side runs from the run folder with
Python's standard library alone."""

from __future__ import annotations

import ast
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftcluster.launch.convert import ConvertRequest, convert_launch
from ftcluster.errors import UserError
from ftcluster.job.config import JobConfig
from ftcluster.job.supervisor import Job
from ftcluster.run.layout import RunPaths
from ftcluster.engines import make_plan
from ftcluster.launch.preflight import PreflightOptions, preflight_launch, report_from_output
from ftcluster.rank.preflight import GpuInfo, RankReport, build_report
from ftcluster.render.scripts import RenderOptions
from ftcluster.render.request import JobRequest, build_request
from ftcluster.spec.defaults import embedded_model_path
from ftcluster.spec.load import load_model
from tests.helpers_specs import cluster
from tests.unit.test_render import KNOWN_TEMPLATE_ISSUES

REPO = Path(__file__).resolve().parents[2]
TEST_CONVERTER = REPO / "tests" / "data" / "ft_converter"
SLURM_TOOLS = ("scontrol", "sinfo", "squeue", "sbatch", "srun", "sacct", "scancel")
PYXIS = {"runtime": "pyxis", "image": "/images/ft.sqsh", "mounts": ["/data:/data:ro"]}
DOCKER = {"runtime": "docker", "image": "ft:1"}


def _spec(tmp_path: Path, **kw: Any) -> Any:
    base: dict[str, Any] = {"scheduler": "slurm", "partition": "gpu", "gpus_per_node": 2,
                            "workspace": str(tmp_path / "ws"), "python": "/opt/py/bin/python3",
                            "server": {"binary": "/opt/tritonserver/bin/tritonserver"}}
    return cluster(**{**base, **kw})


def _preflight(tmp_path: Path, nodes: int = 2, **kw: Any) -> JobRequest:
    c = _spec(tmp_path, **kw)
    return preflight_launch(c, nodes, PreflightOptions(sizes="1M,64M"), probe=False, run_id="r1").request()


def _script(req: JobRequest) -> str:
    return next(f.text for f in req.files if f.path == f"scripts/{req.paths.job_script(req.style).name}")


def _job(req: JobRequest) -> Job:
    """The supervisor the request's run folder starts (its job.json)."""
    return Job(JobConfig.from_json(next(f.text for f in req.files if f.path == "scripts/job.json")))


def _step_argv(req: JobRequest) -> list[str]:
    step = _job(req).cfg.step
    assert step is not None
    return list(step.argv)


def _step_command(req: JobRequest) -> list[str]:
    job = _job(req)
    assert job.cfg.step is not None
    return job.style.step_command(job.cfg.step)[0]


def _proven_first(req: JobRequest) -> list[str]:
    """Pyxis's first step in the image: each task records its / before the step's command."""
    job = _job(req)
    return ["bash", os.path.join(job.cfg.scripts, "prove_in_image.sh"), os.path.join(job.cfg.state, "pyxis")]


def _check_shell(req: JobRequest, tmp_path: Path) -> None:
    folder = tmp_path / "sh"
    folder.mkdir()
    paths = []
    for f in req.files:
        if f.path.endswith((".sh", ".sbatch")):
            p = folder / Path(f.path).name
            p.write_text(f.text)
            paths.append(p)
            r = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True, check=False)
            assert r.returncode == 0, f"bash -n {p.name}: {r.stderr}"
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed")
    r = subprocess.run(["shellcheck", "-s", "bash", "-f", "gcc", *map(str, paths)],
                       capture_output=True, text=True, check=False)
    codes = set(re.findall(r"\[(SC\d+)\]$", r.stdout, re.MULTILINE))
    assert codes <= set(KNOWN_TEMPLATE_ISSUES), r.stdout + r.stderr


def test_pyxis_preflight_runs_in_the_servers_container(tmp_path: Path) -> None:
    req = _preflight(tmp_path, container=PYXIS)
    assert (req.kind, req.launcher, req.style) == ("preflight", "pyxis_slurm", "pyxis")
    modes = {f.path: f.mode for f in req.files if not f.path.startswith("scripts/ftcluster_job/")}
    # The rank side is plain files in the run folder; no server wrapper.
    assert modes == {"scripts/job.sbatch": 0o755, "scripts/job.json": 0o600, "scripts/env.sh": 0o600,
                     "scripts/pyxis_node.sh": 0o755, "scripts/prove_in_image.sh": 0o755,
                     "scripts/preflight.py": 0o644, "scripts/rank_env.py": 0o644}
    assert next(f.text for f in req.files if f.path == "scripts/preflight.py") == \
        (REPO / "ftcluster" / "rank" / "preflight.py").read_text()
    # The container flags are the servers' own: the same flags a launch of this run id renders.
    m = load_model(embedded_model_path())
    c = _spec(tmp_path, container=PYXIS, server={"binary": "/opt/t"})
    serve = build_request(c, m, make_plan(c, m, 2), RunPaths("r1", req.paths.run_dir), RenderOptions(tritonserver="/opt/t"))
    flags = _job(req).cfg.container_flags
    assert flags and flags == _job(serve).cfg.container_flags
    assert _step_command(req) == ["srun", "--mpi=pmix", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                                  "--kill-on-bad-exit=1", *flags, *_proven_first(req), *_step_argv(req)]
    assert _job(req).cfg.step.timeout == 720   # type: ignore[union-attr]  # its gather timeout + 120 s
    # Inside the image: its python3 and the copy in the run folder; the report in results/.
    assert _step_argv(req) == ["python3", f"{req.paths.scripts}/preflight.py", "--sizes", "1M,64M",
                                  "--timeout", "600.0", "--expect-gpus-per-node", "2",
                                  "--out", f"{req.paths.results}/preflight",
                                  "--tritonserver", "/opt/tritonserver/bin/tritonserver"]
    _check_shell(req, tmp_path)


def test_bare_slurm_preflight_uses_the_specs_python(tmp_path: Path) -> None:
    req = _preflight(tmp_path, nodes=3)
    script = _script(req)
    assert req.launcher == "slurm" and _job(req).cfg.container_flags == []
    assert _step_argv(req)[:2] == ["/opt/py/bin/python3", f"{req.paths.scripts}/preflight.py"]
    assert _step_command(req)[:6] == ["srun", "--mpi=pmix", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1",
                                      "--kill-on-bad-exit=1"]
    assert "#SBATCH --nodes=3" in script
    _check_shell(req, tmp_path)


def test_docker_preflight_runs_over_mpirun_from_rank0s_container(tmp_path: Path) -> None:
    req = _preflight(tmp_path, container=DOCKER)
    assert req.launcher == "docker_slurm"
    job = _job(req)
    job.style.runtime.hosts, job.style.runtime.rank0_node = ["n1", "n2"], "n1"   # type: ignore[attr-defined]  # up() finds them
    node = f"{req.paths.scripts}/docker_node.sh"
    assert job.style.step_command(job.cfg.step)[0] == [  # type: ignore[arg-type]
        "bash", node, "exec", "bash", node, "mpirun_brief", "n1:1,n2:1", *_step_argv(req), "--master-addr", "n1"]
    assert _step_argv(req)[0] == "python3"
    # The containers and their teardown are the servers' (the step runs where the servers start):
    # tests/integration/test_docker_preflight.py runs one.
    _check_shell(req, tmp_path)


def test_local_preflight_under_mpirun_with_gpu_slices(tmp_path: Path) -> None:
    req = _preflight(tmp_path, scheduler="local", partition=None, gpus_per_node=1, python=None)
    assert req.launcher == "local" and req.argv == ("bash", str(req.paths.scripts / "job.sh"))
    job = _job(req)
    assert job.cfg.step is not None
    argv, env = job.style.step_command(job.cfg.step)
    assert argv[:3] == [job.cfg.mpirun, "-np", "2"] and "GPU_POOL" in argv and "MASTER_PORT" in argv
    assert argv[argv.index("bash"):] == ["bash", f"{req.paths.scripts}/local_rank.sh", "-", *_step_argv(req)]
    assert env["GPUS_PER_NODE"] == "1" and env["MASTER_PORT"].isdigit()
    job.style.down()   # its Open MPI session folder
    assert _step_argv(req)[0] == sys.executable
    _check_shell(req, tmp_path)


def _convert_req(tmp_path: Path, input_dir: str, **kw: Any) -> ConvertRequest:
    c = _spec(tmp_path, **kw)
    m = load_model(embedded_model_path()).model_copy(update={"checkpoint_root": tmp_path / "ckpt"})
    return ConvertRequest(c, m, 2, TEST_CONVERTER, input_dir, "python3")


def test_pyxis_convert_mounts_what_the_converter_touches(tmp_path: Path) -> None:
    req = convert_launch(_convert_req(tmp_path, "/hf/gpt2", container=PYXIS)).request()
    assert (req.kind, req.launcher) == ("convert", "pyxis_slurm")
    script = _script(req)
    mounts = _job(req).cfg.container_flags[1].split("=", 1)[1].split(",")
    assert mounts[:2] == ["/data:/data:ro", f"{req.paths.run_dir}:{req.paths.run_dir}"]
    assert sorted(mounts[2:]) == sorted(["/hf/gpt2:/hf/gpt2", f"{TEST_CONVERTER}:{TEST_CONVERTER}",
                                         f"{tmp_path / 'ckpt'}:{tmp_path / 'ckpt'}"])
    assert _step_command(req) == ["srun", "--nodes=1", "--ntasks=1", *_job(req).cfg.container_flags,
                                  *_proven_first(req), *_step_argv(req)]
    assert _job(req).cfg.step.timeout is None   # type: ignore[union-attr]  # the job's time limit bounds a conversion
    assert "#SBATCH --nodes=1" in script and "#SBATCH --gpus-per-node=1" in script
    assert _step_argv(req)[:2] == ["python3", str(TEST_CONVERTER / "examples/pytorch/gpt/utils/huggingface_gpt_convert.py")]
    _check_shell(req, tmp_path)
    # Pyxis splits a mount on ',' and ':', Enroot's bash would run a $(...): refused, before
    # anything is written.
    for bad, why in (("/hf/a,b", ","), ("/hf/$(touch PWNED)", "$")):
        with pytest.raises(UserError, match=f"^convert: '/hf/.*' holds {re.escape(why)}"):
            convert_launch(_convert_req(tmp_path, bad, container=PYXIS)).request()
    assert not (tmp_path / "ws").exists() and not list(tmp_path.rglob("PWNED"))


def test_convert_on_slurm_docker_runs_in_the_runs_container_on_its_node(tmp_path: Path) -> None:
    # The gptj-slurm-docker walkthrough converts this way (it was refused outright).
    req = convert_launch(_convert_req(tmp_path, "/hf/gptj", container=DOCKER)).request()
    assert (req.kind, req.launcher, req.style) == ("convert", "docker_slurm", "docker")
    job = _job(req)
    job.style.runtime.hosts, job.style.runtime.rank0_node = ["n1"], "n1"   # type: ignore[attr-defined]  # up() finds them
    node = f"{req.paths.scripts}/docker_node.sh"
    assert job.style.step_command(job.cfg.step)[0] == ["bash", node, "exec", *_step_argv(req)]  # type: ignore[arg-type]
    # What the converter reads and writes is mounted at its own path in the container.
    run_args = next(f.text for f in req.files if f.path == "scripts/docker_node.sh").split("RUN_ARGS=(", 1)[1]
    for p in ("/hf/gptj", str(TEST_CONVERTER), str(tmp_path / "ckpt")):
        assert f"-v {p}:{p}" in run_args.split(")", 1)[0], p
    _check_shell(req, tmp_path)


def test_convert_refuses_ssh_docker(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="scheduler: convert runs through Slurm .* not scheduler 'ssh' "
                                        "with container runtime 'docker'"):
        convert_launch(_convert_req(tmp_path, "/hf", container=DOCKER, scheduler="ssh", partition=None,
                                    hosts=["h1"]))


# ---------------------------------------------------------------- dry runs submit nothing


def _shims(tmp_path: Path) -> tuple[dict[str, str], Path]:
    shims = tmp_path / "bin"
    shims.mkdir()
    calls = tmp_path / "calls"
    for tool in SLURM_TOOLS:
        (shims / tool).write_text(f"#!/bin/sh\necho {tool} \"$@\" >> {shlex.quote(str(calls))}\nexit 1\n")
        (shims / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "FTCLUSTER_STATE_DIR": str(tmp_path / "state"),
           "PYTHONPATH": str(REPO)}
    return env, calls


@pytest.mark.parametrize("command", ["preflight", "convert"])
def test_dry_run_prints_the_request_and_runs_nothing(tmp_path: Path, command: str) -> None:
    env, calls = _shims(tmp_path)
    (tmp_path / "ft.sqsh").write_bytes(b"")   # a launch checks that the image is there, and so does its dry run
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump({
        "scheduler": "slurm", "partition": "gpu", "gpus_per_node": 2, "workspace": str(tmp_path / "ws"),
        "container": {**PYXIS, "image": str(tmp_path / "ft.sqsh")}}))
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({
        "name": "tinygpt", "model_type": "GPT", "repository": str(REPO / "tests/data/models/tiny/repo"),
        "checkpoint_root": str(tmp_path / "ckpt")}))
    (tmp_path / "ckpt").mkdir()   # the model spec wants it
    args = {"preflight": ["--nodes", "2"],
            "convert": ["--model", str(tmp_path / "model.yaml"), "--converter-root", str(TEST_CONVERTER),
                        "--input", "/hf/gpt2"]}[command]
    p = subprocess.run([sys.executable, "-m", "ftcluster", command, "--cluster", str(tmp_path / "cluster.yaml"),
                        *args, "--dry-run"], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    # Slurm is asked what a launch checks first (the partition: this one did not say), nothing more.
    assert calls.read_text() == "scontrol show partition -o gpu\n"
    for nothing in ("state", "ws", "ckpt/2-gpu"):
        assert not (tmp_path / nothing).exists(), nothing
    assert p.stdout.startswith(f"# run {command}-") and f"({command}): style pyxis, launcher pyxis_slurm" in p.stdout
    words = shlex.split(p.stdout.split("# ===== would run =====\n", 1)[1].replace(" && ", " ; "))
    assert words[0] == "cd" and words[3:5] == ["sbatch", "--parsable"]
    assert words[5] == f"{words[1]}/scripts/job.sbatch"


# ---------------------------------------------------------------- the rank side, as shipped


def test_the_rank_files_are_python_38_and_stdlib_only(tmp_path: Path) -> None:
    for name in ("preflight.py", "env.py"):
        ast.parse((REPO / "ftcluster" / "rank" / name).read_text(), feature_version=(3, 8))
    # Copied as a run ships them, run with no site-packages at all (-I -S: no ftcluster, no
    # torch, no nvidia-ml-py): two ranks gather through files, the bandwidth test says why not.
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(REPO / "ftcluster" / "rank" / "preflight.py", scripts / "preflight.py")
    shutil.copy(REPO / "ftcluster" / "rank" / "env.py", scripts / "rank_env.py")
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "FTC_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": ""}
    procs = [subprocess.Popen([sys.executable, "-I", "-S", str(scripts / "preflight.py"), "--out", str(out),
                               "--timeout", "60"], env={**env, "FTC_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (1, 0)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    report = json.loads((out / "preflight.json").read_text())
    assert report["world_size"] == 2 and report["complete"] and report["no_gpu_ranks"] == [0, 1]
    assert report["bandwidth_skipped"] == "torch is not importable on this rank"
    assert "bandwidth test skipped: torch is not importable on this rank" in results[1][0]
    assert all(r["python"] == platform.python_version() for r in report["ranks"])
    assert all(r["os_release"] for r in report["ranks"])


def test_report_from_rank_lines_when_rank0_could_not_gather() -> None:
    reps = [RankReport(rank=r, world_size=2, local_rank=0, host=f"node{r}", cuda_visible_devices=None,
                       gpus=[GpuInfo(i, "H200", 143771) for i in range(2)]) for r in (0, 1)]
    lines = "".join(f"FTC_PREFLIGHT_RANK {json.dumps(d)}\n" for d in build_report(reps, bandwidth=False)["ranks"])
    report = report_from_output("noise\n" + lines, 2)
    assert report["world_size"] == 2 and report["gpus_per_node"] == 2
    assert report["bandwidth_skipped"] == "ranks did not gather"


# ---------------------------------------------------------------- a recorded run


def test_status_logs_stop_of_a_local_preflight(tmp_path: Path) -> None:
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump({"name": "cpu", "scheduler": "local", "gpus_per_node": "auto",
                                                       "workspace": str(tmp_path / "ws")}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "FTCLUSTER_STATE_DIR": str(tmp_path / "state"),
           "CUDA_VISIBLE_DEVICES": ""}

    def ftc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ftcluster", *args], capture_output=True, text=True,
                              env=env, timeout=180, check=False)

    p = ftc("preflight", "--cluster", str(tmp_path / "cpu.yaml"), "--nodes", "2", "--allow-no-gpu", "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    run_id = report["run_id"]
    assert report["no_gpu_ranks"] == [0, 1] and Path(report["logs"]).parent.name == run_id
    st = json.loads(ftc("status", run_id, "--json").stdout)
    assert (st["state"], st["style"], st["phase"], st["ranks"]) == ("COMPLETED", "preflight", "done", [])
    logs = ftc("logs", run_id, "-f")
    assert logs.returncode == 0 and "rank 1 on " in logs.stdout and "FTC_PREFLIGHT_REPORT" in logs.stdout
    lst = json.loads(ftc("list", "--json").stdout)
    assert [(r["run_id"], r["style"], r["scheduler"]) for r in lst] == [(run_id, "preflight", "local")]
    stopped = ftc("stop", run_id)
    assert stopped.returncode == 0 and "Traceback" not in stopped.stderr


def test_local_preflight_ranks_see_their_own_gpu_slice(tmp_path: Path) -> None:
    """As on a real cluster each "node" sees only its gpus_per_node GPUs: rank r gets slice r of
    CUDA_VISIBLE_DEVICES (the same GPU_SLICE the local servers start with)."""
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"name": "cpu", "scheduler": "local", "gpus_per_node": 1,
                                                     "workspace": str(tmp_path / "ws")}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "FTCLUSTER_STATE_DIR": str(tmp_path / "state"),
           "CUDA_VISIBLE_DEVICES": "3,5"}
    p = subprocess.run([sys.executable, "-m", "ftcluster", "preflight", "--cluster", str(tmp_path / "c.yaml"),
                        "--nodes", "2", "--allow-no-gpu", "--no-bandwidth", "--json"],
                       capture_output=True, text=True, env=env, timeout=180, check=False)
    assert p.returncode == 0, p.stderr
    assert [(r["rank"], r["cuda_visible_devices"]) for r in json.loads(p.stdout)["ranks"]] == [(0, "3"), (1, "5")]


def test_a_step_past_its_time_fails_naming_it(tmp_path: Path) -> None:
    # A step that would outlive its limit is stopped, and the run fails saying so.
    from ftcluster.launch.run import Launch, LaunchOptions
    from ftcluster.render.scripts import JobStep
    from ftcluster.render.request import job_shape
    from ftcluster.run.store import RunStore

    c = cluster(scheduler="local", workspace=str(tmp_path / "ws"))
    step = JobStep("preflight", "the preflight", ("sleep", "60"), per_node=False, timeout=1)
    launch = Launch(c, None, job_shape(c, 1, 0), LaunchOptions(step=step), store=RunStore(tmp_path / "runs.sqlite"))
    outcome = launch.run()
    assert not outcome.ok and outcome.failure == "the preflight did not finish in 1s", outcome.failure
    assert outcome.phases["done"] < 15
    assert outcome.record.style == "preflight" and outcome.record.launcher == "local"


def test_hostile_paths_reach_the_step_as_data(tmp_path: Path) -> None:
    # A local conversion whose input path would run commands if it were ever evaluated: the
    # converter gets it as one argument, fails on it, and nothing ran.
    from ftcluster.launch.convert import run

    weird = tmp_path / "in $(touch PWNED) `touch PWNED1` '; touch PWNED2 #"
    req = _convert_req(tmp_path, str(weird), scheduler="local", partition=None, python=None)
    req = ConvertRequest(req.cluster, req.model, 2, TEST_CONVERTER, str(weird), sys.executable)
    from ftcluster.run.store import RunStore

    launch = convert_launch(req, store=RunStore(tmp_path / "runs.sqlite"))
    outcome = run(launch, req)
    assert not outcome.ok and outcome.failure and outcome.failure.startswith("the converter exited 1: ")
    assert str(weird) in (launch.paths.logs / "step.log").read_text()
    assert not list(tmp_path.rglob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))
