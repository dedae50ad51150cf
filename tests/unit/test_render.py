"""Launch script rendering (issue 3): golden files, bash -n + shellcheck, hostile paths, Pyxis flags.

Golden files live in tests/golden/<style>/ and are the documentation a reviewer reads; after a
deliberate template change regenerate them with `FTC_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_render.py`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ftcluster.plan.parallel import Plan
from ftcluster.engines.fastertransformer.plan import plan_for
from ftcluster.render.scripts import RANK_FILE_SOURCES, STYLE_TEMPLATE, RenderedScripts, RenderOptions, RunPaths, render, templates_dir
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.engines.fastertransformer.spec import FTModelSpec as ModelSpec
from tests.helpers_specs import REPO_ROOT, ckpt, cluster, facts, model


GOLDEN = REPO_ROOT / "tests" / "golden"
UPDATE = os.environ.get("FTC_UPDATE_GOLDEN") == "1"
RUN_DIR = Path("/shared/runs/gpt-2n")
PYTHON = "/opt/ftcluster/venv/bin/python"

# Fixed small specs, one per launch style.
SPECS: dict[str, dict[str, object]] = {
    "local": {"name": "dev", "scheduler": "local", "gpus_per_node": 1, "max_nodes": 4,
              "ports": {"http": 18000, "grpc": 18001, "metrics": 18002},
              "server": {"binary": "/opt/tritonserver/bin/tritonserver", "ready_timeout": 120}},
    "none": {"name": "bare", "scheduler": "slurm", "partition": "gpu", "account": "proj", "qos": "normal",
             "time_limit": "01:30:00", "gpus_per_node": 4, "container": {"runtime": "none"},
             "env": {"NCCL_DEBUG": "WARN"}, "sbatch_args": ["--constraint=a100", "--mail-type=END"],
             "server": {"binary": "/opt/tritonserver/bin/tritonserver"}},
    "pyxis": {"name": "selene", "scheduler": "slurm", "partition": "batch", "account": "proj",
              "time_limit": "02:00:00", "gpus_per_node": 8, "mpi": "pmix",
              "container": {"runtime": "pyxis", "image": "/lustre/images/triton_ft.sqsh",
                            "mounts": ["/lustre/models:/models:ro", "/lustre/ckpt:/ckpt:ro+rprivate"],
                            "workdir": "/workspace"},
              "env": {"NCCL_DEBUG": "WARN", "NCCL_IB_HCA": "mlx5"},
              "server": {"binary": "/opt/tritonserver/bin/tritonserver", "ready_timeout": 1200}},
    "charliecloud": {"name": "lanl", "scheduler": "slurm", "partition": "gpu", "time_limit": "02:00:00",
                     "gpus_per_node": 4, "mpi": "pmix",
                     "container": {"runtime": "charliecloud", "image": "/shared/images/triton_ft",
                                   "mounts": ["/shared/models:/models"]},
                     "server": {"binary": "/opt/tritonserver/bin/tritonserver"}},
    "docker": {"name": "dock", "scheduler": "slurm", "partition": "gpu", "time_limit": "04:00:00",
               "gpus_per_node": 8, "ssh_port": 11068,
               "container": {"runtime": "docker", "image": "triton_with_ft:22.12",
                             "mounts": ["/shared/models:/models:ro"], "devices": ["/dev/infiniband"],
                             "shm_size": "32g"},
               "env": {"NCCL_SOCKET_IFNAME": "eth0"},
               "server": {"binary": "/opt/tritonserver/bin/tritonserver"}},
    "ssh_docker": {"name": "dgx-pool", "scheduler": "ssh", "hosts": ["dgx01", "dgx02", "dgx03", "dgx04"],
                   "node_ssh": {"user": "ubuntu", "port": 2222, "known_hosts": "/home/u/.ssh/known_hosts",
                                "parallel": 16},
                   "gpus_per_node": 8, "ssh_port": 11068,
                   "container": {"runtime": "docker", "image": "triton_with_ft:22.12",
                                 "mounts": ["/shared/models:/models:ro"], "shm_size": "32g",
                                 "mpi_if_include": "10.0.0.0/16"},
                   "server": {"binary": "/opt/tritonserver/bin/tritonserver"}},
}
STYLES = list(SPECS)


def _has_template(style: str) -> bool:
    return (templates_dir() / STYLE_TEMPLATE[style]).is_file()


def _model() -> ModelSpec:
    return model(name="ensemble", repository="/shared/models/gpt/all_models/gpt",
                 checkpoint_root="/shared/models/gpt/c-model", checkpoint_mount="/models/gpt/c-model")


def _plan(c: ClusterSpec, nodes: int = 2) -> Plan:
    g = c.gpus_per_node if isinstance(c.gpus_per_node, int) else 1
    return plan_for(c, _model(), facts(), ckpt(tp=g, heads=16, layers=24 * nodes, root="/shared/models/gpt/c-model"),
                    nodes, g)


def write_env_file(scripts: RenderedScripts, run_dir: Path) -> None:
    """The run's scripts/env.sh where the rendered scripts source it (they stop without it)."""
    (run_dir / "scripts").mkdir(parents=True, exist_ok=True)
    (run_dir / "scripts" / "env.sh").write_text(scripts.files["env.sh"])


def render_style(style: str, run_dir: Path = RUN_DIR, nodes: int = 2, **spec: object) -> RenderedScripts:
    if not _has_template(style):
        pytest.skip(f"no {STYLE_TEMPLATE[style]} template yet")
    c = cluster(**{**SPECS[style], **spec})
    return render(c, _model(), _plan(c, nodes), RunPaths("gpt-2n", run_dir),
                  RenderOptions(python=PYTHON))


# --------------------------------------------------------------------------- golden files

# The supervisor and the rank side's files are copied verbatim from ftcluster/job/ and
# ftcluster/rank/: compared with their source, not kept twice under tests/golden.
@pytest.mark.parametrize("style", STYLES)
def test_golden(style: str) -> None:
    scripts = render_style(style)
    rendered = {n: t for n, t in scripts.files.items() if n not in scripts.sources}
    assert {n for n in scripts.sources if not n.startswith("ftcluster_job/")} <= (
        {"mpicheck.py", "ctmpi.py", "rank_env.py", "signal_rank.sh", "local_rank.sh"})
    for name, source in scripts.sources.items():
        assert scripts.files[name] == (REPO_ROOT / source).read_text()
        if not name.startswith("ftcluster_job/"):
            assert source == f"ftcluster/rank/{RANK_FILE_SOURCES.get(name, name)}"
    folder = GOLDEN / style
    if UPDATE:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for name, text in rendered.items():
            (folder / name).write_text(text)
    assert folder.is_dir(), f"no golden files for {style}; run with FTC_UPDATE_GOLDEN=1"
    assert sorted(p.name for p in folder.iterdir()) == sorted(rendered)
    for name, text in rendered.items():
        assert (folder / name).read_text() == text, (
            f"{style}/{name} differs from tests/golden; if intended, regenerate with FTC_UPDATE_GOLDEN=1")


def test_render_is_pure_and_deterministic() -> None:
    a, b = render_style("pyxis"), render_style("pyxis")
    assert a.files == b.files


# --------------------------------------------------------------------------- shell checks

def _write(scripts: RenderedScripts, d: Path) -> list[Path]:
    """The shell scripts among the rendered files (not nodes.json)."""
    return [p for p in scripts.materialize(d) if p.suffix in (".sh", ".sbatch")]


# Template findings reported to the templates' owner (job_templates/ is not edited by these
# tests): while one of these is all shellcheck finds, the test xfails and names it; any other
# finding fails.
KNOWN_TEMPLATE_ISSUES: dict[str, str] = {}


def shellcheck(paths: list[Path]) -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed")
    r = subprocess.run(["shellcheck", "-s", "bash", "-f", "gcc", *map(str, paths)], capture_output=True, text=True)
    if r.returncode == 0:
        return
    codes = set(re.findall(r"\[(SC\d+)\]$", r.stdout, re.M))
    if codes and codes <= set(KNOWN_TEMPLATE_ISSUES):
        pytest.xfail("known template issue(s): " + "; ".join(KNOWN_TEMPLATE_ISSUES[c] for c in sorted(codes)))
    raise AssertionError(r.stdout + r.stderr)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("nodes", [1, 3])
def test_bash_n_and_shellcheck(style: str, nodes: int, tmp_path: Path) -> None:
    paths = _write(render_style(style, nodes=nodes), tmp_path)
    for p in paths:
        r = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
        assert r.returncode == 0, f"bash -n {p.name}: {r.stderr}"
    shellcheck(paths)


# --------------------------------------------------------------------------- hostile values

HOSTILE = "x y'z\"w $(touch PWNED) `touch PWNED1` '; touch PWNED2 # \\ $HOME"


def _no_pwned(*roots: Path) -> None:
    for root in roots:
        found = [p for p in root.rglob("PWNED*")] if root.is_dir() else []
        assert not found, f"something was executed: {found}"


# What the spec lets through where a value reaches sshd_config (Docker) or Enroot's bash (Pyxis):
# no '"' or '\\' in Docker env values, no $ ` " \\ in a Pyxis workspace (tests/unit/test_spec_values.py).
SPEC_SAFE_HOSTILE = HOSTILE.replace('"', "").replace("\\", "")


def _hostile_render(style: str, weird: Path) -> tuple[RenderedScripts, Path]:
    # Pyxis refuses a run folder with $ ` " \ (Enroot's bash evaluates mount lines) or a blank
    # (Pyxis before 0.24 splits there): its hostile folder has the rest
    # (tests/unit/test_urgent_hardening.py covers the refusal).
    run_dir = weird / "run dir $(touch PWNED) '; touch PWNED2 #"
    if style == "pyxis":
        run_dir = weird.parent / "run_dir'(>PWNED);>PWNED2#&|<x>*"
    workspace = str(weird.parent / "ws") if style == "pyxis" else str(weird / "ws $(touch PWNED)")
    env = SPEC_SAFE_HOSTILE if style in ("docker", "ssh_docker") else HOSTILE
    scripts = render_style(style, run_dir=run_dir, workspace=workspace,
                           env={"NCCL_DEBUG": env}, server={
                               "binary": str(weird / "bin" / "triton $(touch PWNED)"),
                               "extra_args": ["--model-control-mode=none", HOSTILE], "ready_timeout": 5})
    return scripts, run_dir


@pytest.mark.parametrize("style", STYLES)
def test_hostile_values_are_quoted_for_bash_and_shellcheck(style: str, weird_tmp_path: Path) -> None:
    scripts, _ = _hostile_render(style, weird_tmp_path)
    paths = _write(scripts, weird_tmp_path / "scripts")
    for p in paths:
        assert subprocess.run(["bash", "-n", str(p)]).returncode == 0
    shellcheck(paths)


def _var_block(text: str) -> str:
    """The assignment block every node-side script starts with (the spec's env exports, RUN_ID=...
    through the export line)."""
    m = re.search(r"^set -uo pipefail\n(.*?^export RUN_ID .*?$)", text, re.S | re.M)
    assert m, "no variable block"
    return m.group(1)


def entry_argv(text: str, cwd: Path) -> list[str]:
    """What a rendered entry script (job.sh, job.sbatch) would exec, as bash parses it."""
    shell = f"exec() {{ printf '%s\\0' \"$@\"; }}\n{text}"
    r = subprocess.run(["bash", "-c", shell], cwd=cwd, capture_output=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().split("\0")[:-1]


def test_hostile_variable_block_arrives_verbatim(weird_tmp_path: Path) -> None:
    scripts, run_dir = _hostile_render("local", weird_tmp_path)
    write_env_file(scripts, run_dir)
    block = _var_block(scripts.files["rank_server.sh"])
    shell = f"{block}\nprintf '%s\\0' \"$RUN_DIR\" \"$STATE\" \"$LOGS\" \"$TRITON\" \"$NCCL_DEBUG\"\n"
    r = subprocess.run(["bash", "-c", shell], cwd=weird_tmp_path, capture_output=True)
    assert r.returncode == 0, r.stderr
    values = r.stdout.decode().split("\0")[:-1]
    assert values == [str(run_dir), str(run_dir / "state"), str(run_dir / "logs"),
                      str(weird_tmp_path / "bin" / "triton $(touch PWNED)"), HOSTILE]
    # The entry script execs the supervisor on the run's values, the paths arriving as data.
    scripts_dir = run_dir / "scripts"
    assert entry_argv(scripts.files["job.sh"], weird_tmp_path) == [
        PYTHON, "-S", f"{scripts_dir}/ftcluster_job", f"{scripts_dir}/job.json"]
    job = json.loads(scripts.files["job.json"])
    assert (job["run_dir"], job["logs"], job["python"], job["env"]) == (
        str(run_dir), str(run_dir / "logs"), PYTHON, {"NCCL_DEBUG": HOSTILE})
    _no_pwned(weird_tmp_path.parent)


def shlex_quote(s: str) -> str:
    import shlex
    return shlex.quote(s)


# --------------------------------------------------------------------------- Pyxis flags
# Pyxis's documented srun options (NVIDIA/pyxis README "Usage", and args.c spank_opts):
#   --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH
#   --container-mounts=SRC:DST[:FLAGS][,SRC:DST...]   "Mount flags are separated with "+", e.g. "ro+rprivate""
#   --container-workdir=PATH
#   --container-name=NAME   (args.c splits NAME[:FLAGS] on ':'; the name is an enroot container
#                            name, so no '/' and no ':' in it)
# args.c add_mount also needs SRC to start with '/' or '.' (or be tmpfs/umount) and DST with '/' or '.'.
PYXIS_FLAGS = {"--container-image", "--container-mounts", "--container-name", "--container-workdir"}
MOUNT_RE = re.compile(r"^[./][^,:]*:[./][^,:]*(:[a-z]+(\+[a-z]+)*)?$")


def _container_flags(scripts: RenderedScripts) -> list[str]:
    return list(json.loads(scripts.files["job.json"])["container_flags"])


def test_pyxis_flags_match_pyxis_syntax() -> None:
    scripts = render_style("pyxis")
    arr = _container_flags(scripts)
    flags = dict(a.split("=", 1) for a in arr)
    assert len(flags) == len(arr) and set(flags) == PYXIS_FLAGS, arr
    assert flags["--container-image"] == "/lustre/images/triton_ft.sqsh"
    assert flags["--container-workdir"] == "/workspace"
    name = flags["--container-name"]
    assert name and "/" not in name and ":" not in name and "," not in name
    mounts = flags["--container-mounts"].split(",")
    assert all(MOUNT_RE.match(m) for m in mounts), mounts
    assert mounts[:2] == ["/lustre/models:/models:ro", "/lustre/ckpt:/ckpt:ro+rprivate"]
    assert f"{RUN_DIR}:{RUN_DIR}" in mounts          # the run folder at the same path inside
    assert json.loads(scripts.files["job.json"])["mpi"] == "pmix"
    # How the supervisor uses them: tests/unit/test_job_supervisor.py.


def test_sbatch_header() -> None:
    text = render_style("pyxis", nodes=3).files["job.sbatch"]
    header = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    for want in ("--nodes=3", "--ntasks-per-node=1", "--partition=batch", "--account=proj", "--time=02:00:00",
                 f"--chdir={RUN_DIR}", f"--output={RUN_DIR}/logs/slurm-%j.out", "--gpus-per-node=8", "--exclusive"):
        assert f"#SBATCH {want}" in header
    assert any(h.startswith("#SBATCH --job-name=ftc-ensemble-gpt-2n") for h in header)
    assert all(" " not in h[len("#SBATCH "):] for h in header), "sbatch does not parse quoting"


def test_bare_slurm_has_no_container_flags() -> None:
    scripts = render_style("none")
    assert _container_flags(scripts) == [] and "--container-" not in scripts.files["job.json"]
    assert "#SBATCH --constraint=a100" in scripts.files["job.sbatch"]


def test_pyxis_refuses_run_dir_that_mounts_cannot_express() -> None:
    from ftcluster.errors import UserError

    with pytest.raises(UserError, match="workspace: .* holds , :; Pyxis mounts it"):
        render_style("pyxis", run_dir=Path("/shared/runs/a,b:c"))


def test_hostile_pyxis_container_flags_arrive_verbatim(weird_tmp_path: Path) -> None:
    scripts, run_dir = _hostile_render("pyxis", weird_tmp_path)
    arr = _container_flags(scripts)
    mounts = dict(a.split("=", 1) for a in arr)["--container-mounts"].split(",")
    assert mounts[-1] == f"{run_dir}:{run_dir}"
    _no_pwned(weird_tmp_path.parent)




# --------------------------------------------------------------------------- one job library

def test_no_shared_template_piece_names_a_style() -> None:
    """Shared pieces (the base entry template, the `_` includes, the rank wrapper) serve every
    style alike: what differs is a Style row's field or a style's own template."""
    from ftcluster.spec.launch_styles import STYLES as ROWS

    own = {ROWS[s].template for s in ROWS} | {ROWS[s].node_script for s in ROWS if ROWS[s].node_script}
    shared = [t for t in templates_dir().glob("*.j2") if t.name not in own - {"job.sh.j2"}]
    assert {t.name for t in shared} >= {"job.sh.j2", "_vars.sh.j2", "_node_guard.sh.j2", "rank_server.sh.j2"}
    for t in shared:
        # The code, not the comments (which may say why a line exists: "Enroot (Pyxis) starts ...").
        text = re.sub(r"\{#.*?#\}", "", t.read_text(), flags=re.S)
        code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
        assert not re.search(r"\bstyle\s*(==|!=|in)\b", code), t.name
        assert not re.search(r"\b(pyxis|docker|ssh_docker)\b", code, re.I), t.name


def test_no_block_of_eight_lines_repeats_across_the_job_library() -> None:
    files = [*templates_dir().glob("*.j2"), *(REPO_ROOT / "ftcluster" / "rank").glob("*.sh")]
    seen: dict[tuple[str, ...], str] = {}
    for f in files:
        lines = [ln.strip() for ln in f.read_text().splitlines()]
        for i in range(len(lines) - 7):
            window = tuple(lines[i:i + 8])
            if sum(1 for ln in window if ln and not ln.startswith("#")) < 5:
                continue   # blank lines and comments
            where = f"{f.name}:{i + 1}"
            assert window not in seen, f"{where} repeats {seen[window]}"
            seen[window] = where


_RENDER_IN_A_FRESH_PROCESS = """
import hashlib, json, jinja2
compiled = []
real = jinja2.Environment.compile
def counting(self, source, name=None, filename=None, raw=False, defer_init=False):
    compiled.append(name)
    return real(self, source, name, filename, raw, defer_init)
jinja2.Environment.compile = counting
from tests.unit.test_render import render_style
files = render_style("ssh_docker").files
print(json.dumps([compiled, hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()]))
"""


def test_templates_are_compiled_once_and_kept(tmp_path: Path) -> None:
    """A launch compiles no template a launch before it compiled (jinja2 keys the kept code by
    the template's source): the same scripts, nothing compiled; an unwritable cache is no error."""
    import json
    import os
    import subprocess
    import sys

    def rendered(cache: Path) -> list[object]:
        env = {**os.environ, "FTCLUSTER_CACHE": str(cache)}
        r = subprocess.run([sys.executable, "-c", _RENDER_IN_A_FRESH_PROCESS], env=env, capture_output=True,
                           text=True, timeout=120, cwd=REPO_ROOT, check=True)
        return json.loads(r.stdout)  # type: ignore[no-any-return]

    first = rendered(tmp_path / "cache")
    assert "rank_server.sh.j2" in first[0] and "docker_node.sh.j2" in first[0]
    kept = list((tmp_path / "cache" / "templates").iterdir())
    assert len(kept) >= len(first[0]) and oct((tmp_path / "cache" / "templates").stat().st_mode & 0o777) == "0o700"
    assert rendered(tmp_path / "cache") == [[], first[1]]
    (tmp_path / "a-file").write_text("")   # no folder can be made under it (root or not)
    assert rendered(tmp_path / "a-file" / "cache")[1] == first[1]


def test_a_fractional_sampling_interval_reaches_bash_as_whole_seconds() -> None:
    # nap_while_server's arithmetic takes integers: 1e-05 (Jinja's rendering of 0.00001) broke it.
    c = cluster(**{**SPECS["none"], "server": {"metrics_interval": 0.00001, "liveness": {"interval": 0}}})
    scripts = render(c, _model(), _plan(c, 2), RunPaths("gpt-2n", RUN_DIR), RenderOptions(python=PYTHON, keep_serving=True))
    assert "    nap_while_server 1 || break\n" in scripts.files["rank_server.sh"]
    assert "e-05" not in scripts.files["rank_server.sh"].split("--interval")[0]


def test_the_jobs_own_scripts_are_the_ones_scanned_for_env_names() -> None:
    """Each bash file the job runs as `bash SCRIPT` (a style's pick) is one envnames renders and
    reads: a script added to one list and not the other fails here."""
    from ftcluster.render.scripts import job_node_scripts
    from ftcluster.spec.envnames import JOB_SCRIPTS
    from ftcluster.spec.launch_styles import STYLES

    picked = {name for style in STYLES.values() for name in job_node_scripts(style)}
    assert picked == set(JOB_SCRIPTS)
