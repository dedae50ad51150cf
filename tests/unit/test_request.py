"""The job request: built by a pure function, printed by the dry run, run as printed by `launch`;
the run record names its launcher, so status/logs/stop find it."""

from __future__ import annotations

import ast
import shlex
from pathlib import Path

import pytest

from ftcluster.launch.run import Launch, LaunchOptions, write_run
from ftcluster.runtimes.base import Runtime, Submission
from ftcluster.runtimes.docker import DockerRuntime
from ftcluster.runtimes.none import NoRuntime
from ftcluster.runtimes.pyxis import PyxisRuntime
from ftcluster.schedulers import scheduler_class, scheduler_for_record, scheduler_named
from ftcluster.schedulers.base import Scheduler
from ftcluster.schedulers.local import LocalScheduler
from ftcluster.schedulers.slurm import SlurmScheduler
from ftcluster.schedulers.ssh import SshScheduler
from ftcluster.run.layout import RunPaths
from ftcluster.engines import make_plan
from ftcluster.render.scripts import RenderOptions
from ftcluster.render.request import JobRequest, build_request
from ftcluster.hosts.runner import LocalRunner
from ftcluster.run.job_info import JobInfo, JobState
from ftcluster.spec.defaults import embedded_model_path
from ftcluster.spec.load import load_model
from ftcluster.run.store import RunRecord, RunStore
from ftcluster.spec.launch_styles import LAUNCHERS, RUNTIMES, SCHEDULERS, STYLES
from tests.helpers_specs import cluster

SLURM = {"name": "s", "scheduler": "slurm", "partition": "gpu", "gpus_per_node": 1,
         "server": {"binary": "/opt/tritonserver/bin/tritonserver"}}


def _request(tmp_path: Path, **spec: object) -> JobRequest:
    c = cluster(**{**SLURM, "workspace": str(tmp_path / "ws"), **spec})
    m = load_model(embedded_model_path())
    paths = RunPaths("r1", tmp_path / "ws" / "r1")
    return build_request(c, m, make_plan(c, m, 1), paths, RenderOptions(tritonserver="/opt/t"))


def test_every_style_names_a_template_and_a_launcher() -> None:
    for style in STYLES.values():
        assert style.launcher in LAUNCHERS and LAUNCHERS[style.launcher] == (style.scheduler, style.runtime)
        assert style.scheduler in SCHEDULERS and style.runtime in RUNTIMES
        found = scheduler_named(style.launcher)
        assert isinstance(found, Scheduler) and isinstance(found.runtime, Runtime)
        assert (found.name, found.runtime.name) == (style.scheduler, style.runtime)


@pytest.mark.parametrize(("spec", "launcher", "argv0"), [
    ({}, "slurm", ("sbatch", "--parsable")),
    ({"container": {"runtime": "docker", "image": "i:1"}}, "docker_slurm", ("sbatch", "--parsable")),
    ({"scheduler": "local", "partition": None}, "local", ("bash",)),
])
def test_the_request_is_pure_and_names_what_runs(tmp_path: Path, spec: dict[str, object], launcher: str,
                                                 argv0: tuple[str, ...]) -> None:
    req = _request(tmp_path, **spec)
    assert req == _request(tmp_path, **spec)           # a function of its inputs
    assert not (tmp_path / "ws").exists()               # that writes nothing
    assert req.launcher == launcher and req.kind == "serve"
    script = req.paths.job_script(req.style)
    assert req.argv == (*argv0, str(script)) and req.cwd == req.paths.run_dir
    assert f"scripts/{script.name}" in {f.path for f in req.files}
    modes = {f.path: f.mode for f in req.files}
    assert modes[f"scripts/{script.name}"] == 0o755 and modes["scripts/rank_server.sh"] == 0o755
    # The dry run ends with the command, and a shell splits it back into cwd and argv.
    text = str(req)
    words = shlex.split(text.split("# ===== would run =====\n", 1)[1])
    assert words[:3] == ["cd", str(req.cwd), "&&"] and tuple(words[3:]) == req.argv


def test_writing_a_request_lays_out_the_run_folder(tmp_path: Path) -> None:
    req = _request(tmp_path, container={"runtime": "docker", "image": "i:1"})
    written = req.write_files()
    for folder in req.folders:
        assert folder.is_dir()
    # A private run's token is made at write time, beside the request's files (the docker style is private).
    assert req.private
    assert {p.relative_to(req.paths.run_dir).as_posix() for p in written} == {f.path for f in req.files} | {"scripts/token"}
    token = req.paths.scripts / "token"
    assert len(token.read_text().strip()) >= 40 and token.stat().st_mode & 0o777 == 0o600
    assert token.read_text().strip() not in str(req)
    for f in req.files:
        path = req.paths.run_dir / f.path
        assert path.read_text() == f.text and path.stat().st_mode & 0o777 == f.mode


def test_the_docker_launchers_make_and_remove_the_runs_keys(tmp_path: Path) -> None:
    for style in STYLES.values():
        assert isinstance(scheduler_named(style.launcher).runtime, DockerRuntime) == style.run_keys, style.name
    for spec, keys in (({"container": {"runtime": "docker", "image": "i:1"}}, True), ({}, False)):
        req = _request(tmp_path / str(keys), **spec)
        c = cluster(**{**SLURM, **spec})
        write_run(req, c, None, make_plan(c, load_model(embedded_model_path()), 1))   # as `render --out` does
        ssh = req.paths.state / "ssh"
        assert (ssh / "id_ed25519").is_file() == (ssh / "host_ed25519").is_file() == keys
        scheduler_named(req.launcher).release_resources(req.paths)
        assert not ssh.exists()


class Recording(Scheduler):
    """Records the request it is given; the job ends at once."""

    submitted: list[Submission] = []

    def submit(self, request: Submission) -> str:
        self.submitted.append(request)
        return "42"

    def info(self, job_id: str, paths: RunPaths) -> JobInfo:
        return JobInfo(job_id, JobState.COMPLETED, "COMPLETED", source="squeue")

    def cancel(self, job_id: str, paths: RunPaths, grace: float = 10.0) -> None:
        pass


def test_launch_submits_the_request_the_dry_run_printed(tmp_path: Path) -> None:
    c = cluster(**{**SLURM, "workspace": str(tmp_path / "ws")})
    m = load_model(embedded_model_path())
    plan = make_plan(c, m, 1)
    store = RunStore(tmp_path / "runs.sqlite")
    launch = Launch(c, m, plan, LaunchOptions(), store=store, launcher=Recording(LocalRunner()), run_id="r1")
    dry = launch.dry_run()
    outcome = launch.run()
    assert Recording.submitted == [dry]
    assert str(Recording.submitted[0]) == str(dry)
    rec = store.get("r1")
    assert (rec.launcher, rec.job_id) == ("slurm", "42") and not outcome.ok  # no `done` event


@pytest.mark.parametrize(("scheduler", "style", "launcher", "cls", "runtime"), [
    ("slurm", "none", "", SlurmScheduler, NoRuntime),
    ("slurm", "docker", "", SlurmScheduler, DockerRuntime),
    ("slurm", "convert", "", SlurmScheduler, NoRuntime),       # `convert` runs: their scheduler's jobs
    ("local", "convert", "", LocalScheduler, NoRuntime),
    ("slurm", "none", "docker_slurm", SlurmScheduler, DockerRuntime),  # the recorded launcher wins
    # Launcher names that run folders recorded before the scheduler and runtime were split
    ("slurm", "pyxis", "pyxis_slurm", SlurmScheduler, PyxisRuntime),
    ("ssh", "ssh_docker", "ssh_docker", SshScheduler, DockerRuntime),
    ("ssh", "convert", "", SshScheduler, DockerRuntime),
])
def test_status_logs_and_stop_find_the_runs_launcher(scheduler: str, style: str, launcher: str,
                                                     cls: type[Scheduler], runtime: type[Runtime]) -> None:
    rec = RunRecord(run_id="r", created=0.0, cluster_name="c", cluster_source="", scheduler=scheduler,
                    style=style, run_dir="/x", nodes=1, model="m", launcher=launcher)
    found = scheduler_for_record(rec)
    assert type(found) is cls and type(found.runtime) is runtime


def test_the_schedulers_and_runtimes_never_import_the_request() -> None:
    """One way only: the request imports the schedulers (each builds its argv); a scheduler or a
    runtime reads a request through runtimes.base.Submission, not even under TYPE_CHECKING."""
    package = Path(scheduler_class.__code__.co_filename).parent
    for source in [*package.glob("*.py"), *(package.parent / "runtimes").glob("*.py")]:
        for node in ast.walk(ast.parse(source.read_text())):
            names = ([node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            assert not any(n == "ftcluster.render.request" or n.startswith("ftcluster.render.request.") for n in names), source
