"""Values that reach Enroot's bash (Pyxis mounts, workspace, image) and the containers'
sshd_config (Docker env), the workspace's one expansion, long run ids, and the checkpoint's
visibility inside the containers (issue 16 item 5, issue 20 item 5).

Where a value reaches a real parser, the test runs that parser: bash for the Enroot config line
Pyxis writes, OpenSSH's `sshd -T` for the sshd_config the Docker node script writes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ftcluster.errors import PlanError, SpecError
from ftcluster.engines.fastertransformer.plan import plan_for
from ftcluster.render.scripts import RenderOptions, RunPaths, pyxis_mounts, render
from ftcluster.spec.cluster import ClusterSpec, Mount
from ftcluster.spec.load import load_cluster, with_image
from ftcluster.run.store import RUN_NAME_MAX, new_run_id
from ftcluster.engines.fastertransformer.visibility import check_checkpoint_visible, server_checkpoint_path
from tests.helpers_specs import ckpt, cluster, facts, model



def pyxis(**container: object) -> ClusterSpec:
    return cluster(scheduler="slurm", container={"runtime": "pyxis", "image": "/img/t.sqsh", **container})


def _spec_error(tmp_path: Path, text: str) -> str:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as ei:
        load_cluster(p)
    msg = str(ei.value)
    assert "\n" not in msg, msg
    return msg


# --------------------------------------------------------------------------- Pyxis mounts

def test_pyxis_short_form_and_enroot_flags() -> None:
    c = pyxis(mounts=["/var/lib", "/a:/b:ro+unbindable", "/c:/d:runbindable+nosuid+nodev+noexec+rslave",
                      "/e:./f:x-create=dir+rprivate", "tmpfs:/scratch"])
    assert c.container.mounts[0] == Mount(src="/var/lib", dst="/var/lib")
    assert c.container.mounts[1].flags == ("ro", "unbindable")
    assert "/var/lib:/var/lib," in pyxis_mounts(c, Path("/runs/r1"))


@pytest.mark.parametrize("mount", [
    "/data/$USER:/data", "/data:/x`id`", '/data/a"b:/data', "/data/a\\b:/data", "/data/$(touch PWNED):/d",
])
def test_pyxis_mount_with_what_enroot_evaluates_is_refused(tmp_path: Path, mount: str) -> None:
    text = f"scheduler: slurm\ncontainer: {{runtime: pyxis, image: /i.sqsh, mounts: ['{mount}']}}\n"
    msg = _spec_error(tmp_path, text.replace("\\", "\\\\") if "\\" in mount else text)
    assert "container.mounts.0:" in msg and "Enroot" in msg


def test_mount_with_newline_is_refused(tmp_path: Path) -> None:
    msg = _spec_error(tmp_path, 'scheduler: slurm\ncontainer: {runtime: docker, image: i, mounts: ["/a\\nb:/c"]}\n')
    assert "container.mounts" in msg and "control character" in msg


@pytest.mark.parametrize("flag,runtime", [("bogus", "pyxis"), ("z", "pyxis"), ("nosuid", "docker")])
def test_mount_flags_per_runtime(tmp_path: Path, flag: str, runtime: str) -> None:
    msg = _spec_error(tmp_path, f"scheduler: slurm\ncontainer: {{runtime: {runtime}, image: /i.sqsh, "
                                f"mounts: ['/a:/b:{flag}']}}\n")
    assert f"'{flag}'" in msg


def _fstab_escape(s: str) -> str:
    # pyxis common.c fstab_escape: space, tab, newline and backslash as octal escapes.
    return "".join({" ": "\\040", "\t": "\\011", "\n": "\\012", "\\": "\\134"}.get(c, c) for c in s)


def _fstab_unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def test_accepted_mount_paths_survive_enroots_bash(tmp_path: Path) -> None:
    """What Pyxis writes for each mount (`echo "SRC DST FLAGS"` in a function Enroot runs with
    bash) gives back exactly the accepted paths; the hostile-looking ones run nothing."""
    odd = tmp_path / "a'c;d#e!f&g|h*i(j){k}~l"   # no blank: Pyxis before 0.24 splits there
    c = pyxis(mounts=[f"{odd}:/ckpt:ro", f"{odd}/x'y:{odd}/x'y"])
    config = "mounts() {\n" + "".join(
        f'\techo "{_fstab_escape(m.src)} {_fstab_escape(m.dst)} x-create=auto,rbind{"," if m.flags else ""}'
        f'{",".join(m.flags)}"\n' for m in c.container.mounts) + "}\nmounts\n"
    r = subprocess.run(["bash", "-c", config], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    got = [tuple(_fstab_unescape(f) for f in line.split()[:2]) for line in r.stdout.splitlines()]
    assert got == [(m.src, m.dst) for m in c.container.mounts]
    assert not list(tmp_path.glob("PWNED*"))


def test_what_the_spec_refuses_would_run_in_enroots_bash(tmp_path: Path) -> None:
    """Why the refusal: the same config line with `$(...)` in a path runs it."""
    src = "/data/$(>PWNED)"
    subprocess.run(["bash", "-c", f'echo "{_fstab_escape(src)} /d x-create=auto,rbind"'], check=True,
                   capture_output=True, cwd=tmp_path)
    assert (tmp_path / "PWNED").exists()
    with pytest.raises(ValueError, match="Enroot"):
        pyxis(mounts=[f"{src}:/d"])


# --------------------------------------------------------------------------- Pyxis image

@pytest.mark.parametrize("image", [
    "/lustre/images/triton_ft.sqsh", "./triton.sqsh", "../images/t.sqsh", "i", "team/triton_with_ft:22.12",
    "nvcr.io#nvidia/tritonserver:22.12-py3", "nvcr.io/nvidia/tritonserver:22.12-py3",
    "docker://nvcr.io#nvidia/tritonserver:22.12-py3", "dockerd://triton_with_ft:22.12",
    "registry.example.com:5000/team/triton:1", "ubuntu@sha256:" + "a" * 64,
])
def test_pyxis_images_accepted(image: str) -> None:
    assert pyxis(image=image).container.image == image


@pytest.mark.parametrize("image,fragment", [
    ("./", "names a folder"), (".", "names a folder"), ("/images/", "names a folder"), ("/a/..", "names a folder"),
    ("/img/$USER.sqsh", "Enroot would"), ("/img/a b.sqsh", "Enroot would"), ('/img/a"b.sqsh', "Enroot would"),
    ("Team/Triton", "neither a .sqsh path"), ("tri ton", "neither a .sqsh path"), ("img:", "neither a .sqsh path"),
    ("$(touch PWNED)", "neither a .sqsh path"), ("triton.sqsh/", "neither a .sqsh path"),
])
def test_pyxis_images_refused(tmp_path: Path, image: str, fragment: str) -> None:
    msg = _spec_error(tmp_path, f"scheduler: slurm\ncontainer: {{runtime: pyxis, image: '{image}'}}\n")
    assert "container.image:" in msg and fragment in msg


# --------------------------------------------------------------------------- workspace

def test_workspace_is_expanded_once_in_the_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTC_T_ROOT", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cluster(workspace="$FTC_T_ROOT/runs").workspace == f"{tmp_path}/runs"
    assert cluster(workspace="${FTC_T_ROOT}/a/../runs").workspace == f"{tmp_path}/runs"
    assert cluster(workspace="~/runs").workspace == f"{tmp_path}/home/runs"
    assert cluster(workspace="$HOME/runs").workspace == f"{tmp_path}/home/runs"
    # `$(` is no variable: it stays (and is quoted wherever it is used).
    assert cluster(workspace="/x/$(touch PWNED) $").workspace == "/x/$(touch PWNED) $"


def test_workspace_relative_to_the_spec_file(tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    p = tmp_path / "specs" / "c.yaml"
    p.write_text("scheduler: local\nworkspace: ../runs\n")
    assert load_cluster(p).workspace == str(tmp_path.resolve() / "runs")


def test_workspace_user_falls_back_to_the_account(monkeypatch: pytest.MonkeyPatch) -> None:
    import getpass

    monkeypatch.delenv("USER", raising=False)
    assert cluster(workspace="/lustre/$USER/runs").workspace == f"/lustre/{getpass.getuser()}/runs"


@pytest.mark.parametrize("text,fragment", [
    ("scheduler: local\nworkspace: $FTC_SURELY_UNSET_VAR/runs\n", "workspace: $FTC_SURELY_UNSET_VAR is not set"),
    ("scheduler: local\nworkspace: \"/runs\\nx\"\n", "workspace: '/runs\\nx' holds U+000A (newline), a control character"),
    ("scheduler: local\nworkspace: ~nosuchuser_ftc/runs\n", "workspace: '~nosuchuser_ftc' is not a known user"),
    ("scheduler: slurm\ncontainer: {runtime: pyxis, image: /i.sqsh}\nworkspace: '/r/$(touch PWNED)'\n",
     "workspace: '/r/$(touch PWNED)' holds $"),
    ("scheduler: slurm\ncontainer: {runtime: pyxis, image: /i.sqsh}\nworkspace: '/r,s'\n", "holds ,"),
    ("scheduler: slurm\ncontainer: {runtime: docker, image: i}\nworkspace: '/r:s'\n", "docker run -v"),
])
def test_workspace_refusals(tmp_path: Path, text: str, fragment: str) -> None:
    msg = _spec_error(tmp_path, text)
    assert fragment in msg and msg.startswith(f"{tmp_path / 'c.yaml'}: ")


def test_pyxis_workspace_with_blanks_is_refused() -> None:
    # Pyxis 0.24 escapes blanks for Enroot's fstab (\040); the Pyxis most sites run (before it)
    # writes them as they are and Enroot splits the path there (NVIDIA/pyxis#133).
    with pytest.raises(ValueError, match="workspace: '/lustre/my runs' holds a blank"):
        cluster(scheduler="slurm", container={"runtime": "pyxis", "image": "/i.sqsh"}, workspace="/lustre/my runs")
    c = cluster(scheduler="slurm", container={"runtime": "docker", "image": "i:1"}, workspace="/lustre/my runs")
    assert c.workspace == "/lustre/my runs"   # docker run -v takes it whole


# --------------------------------------------------------------------------- Docker env / sshd_config

DOCKER = {"scheduler": "slurm", "container": {"runtime": "docker", "image": "triton:1"}}


@pytest.mark.parametrize("value", ['a"b', "a\\b", "a\nSetEnv X=1", "a\rb", "a\tb"])
@pytest.mark.parametrize("spec", [DOCKER, {"scheduler": "ssh", "hosts": ["n1"], "container": DOCKER["container"]}],
                         ids=["slurm", "ssh"])
def test_docker_env_values_that_split_sshd_config_are_refused(value: str, spec: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"env\.NCCL_DEBUG: .*sshd_config"):
        cluster(**spec, env={"NCCL_DEBUG": value})


def test_other_runtimes_keep_any_env_value() -> None:
    assert cluster(env={"X": 'a"b\\c\nd'}).env["X"] == 'a"b\\c\nd'
    with pytest.raises(ValueError, match="NUL"):
        cluster(env={"X": "a\0b"})


# --------------------------------------------------------------------------- what no spec string holds

NOT_TEXT = {"\0": "U+0000 (NUL)", "\x1b": "U+001B (escape)", "\x7f": "U+007F (DEL)", "\x85": "U+0085 (NEL)",
            "\x9b": "U+009B,", "\u2028": "U+2028, a line separator", "\u2029": "U+2029, a paragraph separator",
            "\u202e": "U+202E (right-to-left override)", "\u200b": "U+200B (zero width space)",
            "\ufeff": "U+FEFF", "\ud800": "U+D800, a lone surrogate"}


@pytest.mark.parametrize("char", NOT_TEXT, ids=[f"U+{ord(c):04X}" for c in NOT_TEXT])
def test_no_spec_string_holds_what_is_not_text_and_an_env_value_is_never_shown(char: str, tmp_path: Path) -> None:
    """The README's rule (Specs: "no spec string holds ..."), for a path, a name and an env value:
    refused naming the field and the character; the env value's text is in no error."""
    import yaml

    for field, spec in (("workspace", {"workspace": f"/runs/a{char}b"}), ("python", {"python": f"/usr/bin/py{char}"}),
                        ("name", {"name": f"c{char}"}), ("env", {"env": {"HF_TOKEN": f"hf_SeCrEt{char}x"}})):
        msg = _spec_error(tmp_path, yaml.safe_dump({"scheduler": "local", **spec}))
        assert f"c.yaml: {field}: " in msg and NOT_TEXT[char] in msg, msg
        assert "hf_SeCrEt" not in msg


@pytest.mark.parametrize("text", ["caf\u00e9", "\u65e5\u672c", "a\u00a0b", "\U0001F642", "a b"])
def test_visible_text_beyond_ascii_is_kept(text: str) -> None:
    assert cluster(workspace=f"/runs/{text}", env={"X": text}).env["X"] == text


def test_an_env_value_may_span_lines_and_hold_tabs_but_no_other_control() -> None:
    assert cluster(env={"PEM": "-----BEGIN-----\r\nab\tc\n-----END-----\n"}).env["PEM"].count("\n") == 3
    with pytest.raises(ValueError, match="U\\+2028"):
        cluster(env={"PEM": "a\nb\u2028c"})


def test_a_nul_in_the_config_files_spec_path_is_one_line_naming_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from ftcluster.spec.defaults import default_path
    from ftcluster.errors import UserError

    (tmp_path / "ftcluster").mkdir()
    (tmp_path / "ftcluster" / "config.yaml").write_text('model: "/specs/m\\0.yaml"\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("FTCLUSTER_MODEL", raising=False)
    with pytest.raises(UserError) as ei:
        default_path("model")
    assert str(ei.value).startswith("config: ") and "model: " in str(ei.value) and "U+0000 (NUL)" in str(ei.value)


def _sshd_setenv(tmp_path: Path, env: dict[str, str]) -> list[str]:
    """The rendered docker_node.sh's own SetEnv lines, written with its values and read by sshd -T."""
    c = cluster(**DOCKER, env=env, gpus_per_node=1)
    m = model(checkpoint_root="/ckpt")
    plan = plan_for(c, m, facts(), ckpt(tp=1, layers=2), 2, 1)
    text = render(c, m, plan, RunPaths("r1", tmp_path / "run"), RenderOptions()).files["docker_node.sh"]
    keys = re.search(r"^ENV_KEYS=.*$", text, re.MULTILINE)
    body = re.search(r"^  for var in PATH .*?^EOF$", text, re.MULTILINE | re.DOTALL)
    assert keys and body, "docker_node.sh no longer writes SetEnv as this test expects"
    hk = tmp_path / "hk"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hk)], check=True)
    # The values come from the environment, as docker run -e gives them to the container.
    script = f"{keys.group(0)}\nIN_SSH={tmp_path}\nSSH_PORT=12345\nsetenv=()\n{body.group(0)}\n"
    r = subprocess.run(["bash", "-c", script], env={**env, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                       cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stderr
    cfg = (tmp_path / "sshd_config").read_text().replace(f"HostKey {tmp_path}/host_key", f"HostKey {hk}")
    (tmp_path / "sshd_config").write_text(cfg)
    # sshd -T, like sshd, needs its privilege separation folder (the test bed makes it too).
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    t = subprocess.run([shutil.which("sshd") or "/usr/sbin/sshd", "-T", "-f", str(tmp_path / "sshd_config")],
                       capture_output=True, text=True, check=False)
    assert t.returncode == 0, t.stderr
    return [ln.split(" ", 1)[1] for ln in t.stdout.splitlines() if ln.startswith("setenv ")]


@pytest.mark.skipif(not (shutil.which("sshd") or Path("/usr/sbin/sshd").exists()) or not shutil.which("ssh-keygen"),
                    reason="OpenSSH's sshd and ssh-keygen are needed to parse the sshd_config")
def test_accepted_docker_env_reaches_sshd_verbatim(tmp_path: Path) -> None:
    value = "x y'z $(touch PWNED) `touch PWNED1` '; touch PWNED2 # $HOME = %h"
    got = _sshd_setenv(tmp_path, {"NCCL_DEBUG": value, "B": "2"})
    assert got == ["PATH=/usr/bin:/bin", f"NCCL_DEBUG={value}", "B=2"]
    assert not list(tmp_path.glob("PWNED*"))


# --------------------------------------------------------------------------- run ids

def test_long_model_names_make_working_run_ids() -> None:
    long_a, long_b = "m" * 89 + "a", "m" * 89 + "b"
    ids = [new_run_id(n) for n in (long_a, long_b, f"convert-{long_a}")]
    for rid in ids:
        RunPaths(rid, Path("/runs") / rid)   # the run id rules (refused ids raise)
        assert len(rid.split("-2")[0]) <= RUN_NAME_MAX
    assert ids[0].rsplit("-", 3)[0] != ids[1].rsplit("-", 3)[0], "distinct names keep distinct run ids"
    assert new_run_id("ensemble").startswith("ensemble-")


# --------------------------------------------------------------------------- checkpoint visibility

def test_checkpoint_path_the_server_reads() -> None:
    assert server_checkpoint_path(model(checkpoint_root="/l/ckpt"), 2) == "/l/ckpt/2-gpu/"
    assert server_checkpoint_path(model(checkpoint_root="/l/ckpt", checkpoint_mount="/ckpt/"), 2) == "/ckpt/2-gpu/"
    assert server_checkpoint_path(model(parameters={"model_checkpoint_path": "/x/1-gpu"}), 2) == "/x/1-gpu"


@pytest.mark.parametrize("runtime", ["pyxis", "docker"])
def test_invisible_checkpoint_is_refused_naming_the_mount(runtime: str) -> None:
    image = "/i.sqsh" if runtime == "pyxis" else "triton:1"
    c = cluster(scheduler="slurm", container={"runtime": runtime, "image": image, "mounts": ["/lustre/models:/models"]})
    with pytest.raises(PlanError) as ei:
        check_checkpoint_visible(c, model(checkpoint_root="/lustre/ckpt/gpt"), 8, Path("/runs/r1"))
    msg = str(ei.value)
    assert msg.startswith("container.mounts: model_checkpoint_path /lustre/ckpt/gpt/8-gpu/ is not visible")
    assert "add the mount /lustre/ckpt/gpt:/lustre/ckpt/gpt:ro" in msg and "\n" not in msg
    with pytest.raises(PlanError, match="add the mount /lustre/ckpt/gpt:/ckpt:ro"):
        check_checkpoint_visible(c, model(checkpoint_root="/lustre/ckpt/gpt", checkpoint_mount="/ckpt"), 8)


def test_visible_checkpoints_pass() -> None:
    c = pyxis(mounts=["/lustre/ckpt:/ckpt:ro", "/data", "tmpfs:/scratch"])
    check_checkpoint_visible(c, model(checkpoint_root="/lustre/ckpt/gpt", checkpoint_mount="/ckpt/gpt"), 8)
    check_checkpoint_visible(c, model(checkpoint_root="/data/gpt"), 8)   # short form: same path inside
    check_checkpoint_visible(c, model(checkpoint_root="/runs/r1/ckpt"), 1, Path("/runs/r1"))
    # No containers, nothing to check.
    check_checkpoint_visible(cluster(), model(checkpoint_root="/anywhere"), 1)
    check_checkpoint_visible(cluster(scheduler="slurm"), model(checkpoint_root="/anywhere"), 1)


def test_tmpfs_and_sibling_paths_do_not_count() -> None:
    c = pyxis(mounts=["tmpfs:/ckpt", "/lustre/ck:/ck"])
    with pytest.raises(PlanError):
        check_checkpoint_visible(c, model(checkpoint_root="/lustre/ckpt", checkpoint_mount="/ckpt"), 1)
    with pytest.raises(PlanError):
        check_checkpoint_visible(c, model(checkpoint_root="/lustre/ckpt", checkpoint_mount="/ck2"), 1)


def test_mount_showing_another_folder_is_refused(tmp_path: Path) -> None:
    for d in ("real/1-gpu", "other/1-gpu"):
        (tmp_path / d).mkdir(parents=True)
    c = pyxis(mounts=[f"{tmp_path}/other:/ckpt"])
    with pytest.raises(PlanError, match=r"^checkpoint_mount: .* is .*/other/1-gpu on the host"):
        check_checkpoint_visible(c, model(checkpoint_root=str(tmp_path / "real"), checkpoint_mount="/ckpt"), 1)
    ok = pyxis(mounts=[f"{tmp_path}/real:/ckpt"])
    check_checkpoint_visible(ok, model(checkpoint_root=str(tmp_path / "real"), checkpoint_mount="/ckpt"), 1)


# --------------------------------------------------------------------------- through the CLI

def test_launch_dry_run_with_a_90_character_model_name(tmp_path: Path) -> None:
    """Was a traceback (run id over 100 characters); now the run gets a short id."""
    from tests.helpers_specs import MODELS, run_cli
    from tests.launch_helpers import free_port_base

    base, name = free_port_base(1), "g" * 90
    (tmp_path / "m.yaml").write_text(f"name: {name}\nmodel_type: GPT\nrepository: {MODELS}/tiny/repo\n"
                                     f"ft_model: fastertransformer\ncheckpoint_root: {MODELS}/tiny/ckpt\n")
    (tmp_path / "c.yaml").write_text(f"scheduler: local\nworkspace: runs\n"
                                     f"ports: {{http: {base}, grpc: {base + 1}, metrics: {base + 2}}}\n")
    res = run_cli("launch", "--cluster", str(tmp_path / "c.yaml"), "--model", str(tmp_path / "m.yaml"), "--dry-run",
                  cwd=tmp_path)
    assert res.rc == 0 and "Traceback" not in res.stderr, res.stderr
    run_id = re.search(r"^RUN_ID=(\S+)$", res.stdout, re.MULTILINE)
    assert run_id and run_id.group(1).startswith("g" * 31 + "-") and len(run_id.group(1)) < 70
    # The relative workspace is the spec folder's runs/, whatever the current folder.
    assert f"RUN_DIR={tmp_path}/runs/{run_id.group(1)}" in res.stdout


def test_images_folder_uses_the_expanded_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`$HOME/...` once made a literal `$HOME` folder (convert, image): the spec expands it."""
    from ftcluster.service.image import images_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    p = tmp_path / "c.yaml"
    p.write_text("scheduler: local\nworkspace: $HOME/ftc-runs\n")
    assert images_dir(load_cluster(p)) == tmp_path / "ftc-runs" / "images"


def test_pyxis_mount_path_problem_for_render_out() -> None:
    from ftcluster.spec.cluster import pyxis_mount_path_problem

    assert pyxis_mount_path_problem("/shared/runs/my-run_1") is None
    for path, shown in [("/shared/runs/my run 1", "a blank"), ("/r/$(x)", "$"), ("/r/a,b", ","), ("/r/a:b", ":"), ("/r/`x`", "`"), ('/r/"', '"'),
                        ("/r/\\x", "\\"), ("/r/a\nb", "control character")]:
        problem = pyxis_mount_path_problem(path)
        assert problem and shown in problem.split("; ")[0], (path, problem)


def test_default_workspace_is_expanded_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    p = tmp_path / "c.yaml"
    p.write_text("scheduler: local\n")
    assert load_cluster(p).workspace == f"{tmp_path}/ftcluster-runs"


def test_a_forwarding_spec_leaves_the_workspace_to_the_login_node(monkeypatch: pytest.MonkeyPatch) -> None:
    from ftcluster.hosts import login as remote
    from ftcluster.spec import cluster as spec

    assert spec.ON_LOGIN_NODE_ENV == remote.HOP_ENV
    monkeypatch.delenv(remote.HOP_ENV, raising=False)
    ws = "$FTC_SET_ONLY_ON_THE_LOGIN_NODE/runs"
    assert cluster(login_host="login1", workspace=ws).workspace == ws
    monkeypatch.setenv(remote.HOP_ENV, "1")
    with pytest.raises(ValueError, match="FTC_SET_ONLY_ON_THE_LOGIN_NODE is not set"):
        cluster(login_host="login1", workspace=ws)
    monkeypatch.setenv("FTC_SET_ONLY_ON_THE_LOGIN_NODE", "/scratch/u")
    assert cluster(login_host="login1", workspace=ws).workspace == "/scratch/u/runs"


def test_a_checks_problem_is_said_at_its_field_and_by_the_option_that_gave_it() -> None:
    """A model's own check names the field first ("image: ..."): it is said at container.image,
    and when `restart --image` gave the value, as --image (not under the cluster file)."""
    docker = cluster(scheduler="slurm", container={"runtime": "docker", "image": "ok:1"})
    with pytest.raises(SpecError) as exc:
        with_image(docker, "--privileged", "--image")
    assert str(exc.value).startswith("--image: '--privileged' is not a Docker image reference")
    with pytest.raises(SpecError) as exc:
        with_image(docker, "--privileged")
    assert "container.image: '--privileged' is not a Docker image reference" in str(exc.value)
