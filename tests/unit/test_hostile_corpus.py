"""A generated corpus of hostile values for every string and number field of a cluster spec
(and the commands' own arguments): each runs the real CLI. A value is either refused in one
line naming its field (exit 3, no traceback) or accepted; an accepted one is rendered, every
script passes `bash -n`, and each node-side script's variable block (with the run's env.sh)
evaluates without running anything: a canary file that any executed payload would create
never appears. An env value's text (it may be a secret) is in no error. Beside it, a NUL in
every path field of both specs, through every command that reads them: one line naming the
field, never Python's "embedded null byte"."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers_specs import CliResult, run_cli_many


CANARY = "FTC_CANARY"
PAYLOADS: dict[str, Any] = {
    "escape": "x\x1b[31mred", "nul": "a\x00b", "newline": "a\nb", "c1": "a\x9bb", "del": "a\x7fb",
    # What no spec string holds beyond ASCII's controls (ftcluster.spec.plaintext): NEL and U+2028
    # (str.splitlines breaks there), a bidirectional override, a lone surrogate (no path takes it).
    "nel": "a\x85b", "lsep": "a\u2028b", "psep": "a\u2029b", "bidi": "a\u202eb", "surrogate": "a\ud800b",
    "subst": f"$(touch {CANARY})", "backtick": f"`touch {CANARY}`", "quote": f"'; touch {CANARY}; '",
    "dquote": f'"; touch {CANARY}; "', "long": "a" * 5000, "empty": "",
    "inf": float("inf"), "nan": float("nan"), "bool": True, "int32": 2**31, "negative": -1, "huge": 10**30,
}
NOT_TEXT = ("escape", "nul", "c1", "del", "nel", "lsep", "psep", "bidi", "surrogate")
STRING = (*NOT_TEXT, "newline", "subst", "backtick", "quote", "dquote", "long", "empty")
NUMBER = ("inf", "nan", "bool", "int32", "negative", "huge")
# Every path field of the cluster spec (and the programs it names).
CLUSTER_PATHS = ("workspace", "python", "server.binary", "server.on_failure.0", "proxy.binary", "proxy.tls_cert",
                 "proxy.tls_key", "container.image", "container.workdir", "container.image_tar", "container.mounts.0",
                 "container.devices.0", "container.docker_host",
                 "node_ssh.identity_file", "node_ssh.known_hosts", "login_identity_file", "login_known_hosts",
                 "login_command", "image.sqsh")
# Field path -> the payloads it gets (and its value in the base spec, when it needs one).
STRING_FIELDS = ("name", "partition", "account", "qos", "time_limit", "mpi", "login_host", "server.extra_args.0",
                 "env.MY_VAR", "sbatch_args.0", "access", *CLUSTER_PATHS)
# An env value may be a secret: its text is never in an error (the field and the problem are).
SECRET = "hf_SeCrEtToKeN"
NUMBER_FIELDS = ("max_nodes", "gpus_per_node", "ssh_port", "ports.http", "server.ready_timeout", "server.exit_grace",
                 "server.log_verbose", "server.restarts", "server.restart_backoff", "server.restart_reset", "server.liveness.interval",
                 "server.liveness.deadline", "server.liveness.failures", "server.log_max_mb", "server.handover_lead",
                 "proxy.loopback_offset")


def _set(spec: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    node = spec
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    last = keys[-1]
    if last.isdigit():   # a list field: the payload as its one item
        raise AssertionError("lists are set by their parent")
    node[last] = value


def _case(path: str, payload: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "c", "scheduler": "slurm", "partition": "p", "gpus_per_node": 1,
                            "max_nodes": 4, "container": {"runtime": "pyxis", "image": "/i.sqsh"}}
    value = PAYLOADS[payload]
    if path.startswith("env.") and isinstance(value, str):
        value = SECRET + value
    if path.endswith(".0"):
        _set(spec, path[:-2], [value])
    else:
        _set(spec, path, value)
    return spec


CASES = [(f, p) for f in STRING_FIELDS for p in STRING] + [(f, p) for f in NUMBER_FIELDS for p in NUMBER]
CASES += [(f, p) for f in ("server.binary", "name", "env.MY_VAR") for p in ("bool", "inf")]


def _id(case: tuple[str, str]) -> str:
    return f"{case[0]}={case[1]}"


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[CliResult, CliResult | None, Path]]:
    """Every case's `plan`, and for those accepted a `render`, side by side."""
    root = tmp_path_factory.mktemp("corpus")

    model = Path(__file__).resolve().parents[1] / "data" / "bad_inputs" / "ok" / "model.yaml"
    folders = []
    for case in CASES:
        folder = root / re.sub(r"[^A-Za-z0-9]", "_", _id(case))
        folder.mkdir()
        # Written as YAML can hold them: a NUL or DEL only in a double-quoted escape.
        (folder / "cluster.yaml").write_text(yaml.safe_dump(_case(*case), allow_unicode=False))
        folders.append(folder)
    common = ["--model", str(model), "--nodes", "2"]
    plans = run_cli_many([(["plan", "--cluster", str(f / "cluster.yaml"), *common], f) for f in folders])
    accepted = [f for f, p in zip(folders, plans) if p.rc == 0]
    renders = dict(zip(accepted, run_cli_many(
        [(["render", "--cluster", str(f / "cluster.yaml"), *common, "--out", str(f / "run")], f) for f in accepted])))
    return {_id(c): (p, renders.get(f), f) for c, p, f in zip(CASES, plans, folders)}


def test_the_corpus_is_big() -> None:
    assert len(CASES) >= 450


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_refused_in_one_line_or_safe_when_accepted(case: tuple[str, str], outcomes: dict[str, Any]) -> None:
    field, payload = case
    plan, render, folder = outcomes[_id(case)]
    assert "Traceback" not in plan.stderr + plan.stdout, plan.stderr
    if plan.rc != 0:
        assert plan.rc == 3, plan.stderr
        lines = [ln for ln in plan.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), plan.stderr
        top = field.split(".")[0]
        assert top in lines[0], f"{lines[0]!r} does not name {field}"
        assert len(lines[0]) < 600
        assert SECRET not in plan.stderr, plan.stderr
    else:
        # Control characters never pass, nor non-finite numbers (an env value is text: "inf").
        assert payload not in NOT_TEXT and \
            not (payload in ("inf", "nan") and not field.startswith("env.")) and \
            not (payload == "newline" and not field.startswith("env.")), plan.stdout
        assert render is not None and "Traceback" not in render.stderr, render.stderr
        if render.rc == 0:
            scripts = folder / "run" / "scripts"
            for sh in sorted(scripts.glob("*.sh")) + sorted(scripts.glob("*.sbatch")):
                assert subprocess.run(["bash", "-n", str(sh)], capture_output=True).returncode == 0, sh
                text = sh.read_text()
                block = re.search(r"^set -uo pipefail\n(.*?^export RUN_ID .*?$)", text, re.S | re.M)
                if block:
                    r = subprocess.run(["bash", "-c", block.group(1)], cwd=folder, capture_output=True, timeout=30)
                    assert r.returncode == 0, (sh.name, r.stderr)
        else:
            assert render.rc == 3 and len([ln for ln in render.stderr.splitlines() if ln.strip()]) == 1, render.stderr
    assert not list(folder.rglob(CANARY)) and not Path(CANARY).exists()


# ---- A NUL in every path field of both specs, through every command that reads them: one line
# naming the field (the OS takes no NUL in a path: Python raises ValueError, not OSError, there).
MODEL_PATHS = ("repository", "checkpoint_root", "checkpoint_mount")
# command -> (its arguments, which specs it reads)
COMMANDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "plan": (("--nodes", "1"), ("cluster", "model")),
    "render": (("--nodes", "1", "--out", "{dir}/out"), ("cluster", "model")),
    "prepare": (("--nodes", "1", "--out", "{dir}/out"), ("cluster", "model")),
    "launch": (("--nodes", "1", "--dry-run"), ("cluster", "model")),
    "check": (("--nodes", "1"), ("cluster", "model")),
    "convert": (("--nodes", "1", "--dry-run", "--converter-root", "{dir}", "--input", "{dir}"), ("cluster", "model")),
    "compose": (("--out", "{dir}/out"), ("cluster", "model")),
    "preflight": (("--nodes", "1", "--dry-run"), ("cluster",)),
    "check-checkpoint": (("--gpus", "1"), ("model",)),
}
NUL_CASES = [(spec, f, cmd) for spec, fields in (("cluster", CLUSTER_PATHS), ("model", MODEL_PATHS)) for f in fields
             for cmd, (_, reads) in COMMANDS.items() if spec in reads]


def _nul_specs(folder: Path, spec: str, path: str) -> tuple[Path, Path]:
    """A good cluster (Docker, every path field set) and model, with a NUL in `path` of `spec`."""
    data = yaml.safe_load((Path(__file__).resolve().parents[1] / "data" / "bad_inputs" / "ok" / "model.yaml").read_text())
    base = Path(__file__).resolve().parents[1] / "data" / "bad_inputs" / "ok"
    model: dict[str, Any] = {**data, "repository": str(base / data["repository"]),
                             "checkpoint_root": str(base / data["checkpoint_root"]), "checkpoint_mount": "/ckpt"}
    cluster: dict[str, Any] = {"name": "c", "scheduler": "slurm", "partition": "p", "gpus_per_node": 1, "max_nodes": 4,
                               "container": {"runtime": "docker", "image": "img", "mounts": ["/a:/b"]}}
    target = cluster if spec == "cluster" else model
    value = "/x\x00y"
    if path.endswith(".0"):
        _set(target, path[:-2], [f"{value}:/b" if path.startswith("container.mounts") else value])
    else:
        _set(target, path, value)
    (folder / "cluster.yaml").write_text(yaml.safe_dump(cluster, allow_unicode=False))
    (folder / "model.yaml").write_text(yaml.safe_dump(model, allow_unicode=False))
    return folder / "cluster.yaml", folder / "model.yaml"


@pytest.fixture(scope="module")
def nul_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], CliResult]:
    root = tmp_path_factory.mktemp("nul")
    runs = []
    for spec, path, cmd in NUL_CASES:
        folder = root / re.sub(r"[^A-Za-z0-9]", "_", f"{spec}_{path}_{cmd}")
        folder.mkdir()
        cluster, model = _nul_specs(folder, spec, path)
        args, reads = COMMANDS[cmd]
        given = [a for s, f in (("cluster", cluster), ("model", model)) if s in reads for a in (f"--{s}", str(f))]
        runs.append(([cmd, *given, *(a.format(dir=folder) for a in args)], folder))
    return dict(zip(NUL_CASES, run_cli_many(runs)))


def _text_fields(model: Any, prefix: str = "") -> set[str]:
    """Every field of a spec model (nested ones dotted) that holds text or paths."""
    from ftcluster.spec.base import SpecModel as _Strict
    from ftcluster.spec.base import annotation_kinds as _kinds

    out = set()
    for name, f in model.model_fields.items():
        kinds = _kinds(f.annotation)
        sub = next((k for k in kinds if isinstance(k, type) and issubclass(k, _Strict)), None)
        if sub is not None:
            out |= _text_fields(sub, f"{prefix}{name}.")
        elif kinds & {str, Path} and name != "source":
            out.add(f"{prefix}{name}")
    return out


# The text fields that hold no path (names, Slurm values, options, image references, the env).
NOT_PATHS = {"account", "container.mounts.flags", "container.mpi_if_include", "container.shm_size", "env", "hosts",
             "image.registry", "image.tag", "image.triton_version", "login_host", "mpi", "name", "node_ssh.user",
             "partition", "qos", "sbatch_args", "server.extra_args", "setup", "srun_args", "time_limit",
             "ft_model", "parameters"}


def test_every_path_field_is_in_the_nul_corpus() -> None:
    """A text field added to a spec is either a path (and gets the NUL) or named here as none."""
    from ftcluster.spec.cluster import ClusterSpec
    from ftcluster.engines.fastertransformer.spec import FTModelSpec as ModelSpec

    paths = {p.removesuffix(".0").replace("mounts", "mounts.src") if p == "container.mounts.0" else p.removesuffix(".0")
             for p in CLUSTER_PATHS + MODEL_PATHS}
    fields = _text_fields(ClusterSpec) | _text_fields(ModelSpec)
    assert fields - NOT_PATHS - {"container.mounts.dst"} == paths, (fields - NOT_PATHS) ^ paths


@pytest.mark.parametrize("case", NUL_CASES, ids=["-".join(c) for c in NUL_CASES])
def test_a_nul_in_a_path_field_is_one_line_naming_it(case: tuple[str, str, str],
                                                      nul_outcomes: dict[tuple[str, str, str], CliResult]) -> None:
    spec, path, cmd = case
    res = nul_outcomes[case]
    assert "Traceback" not in res.stdout + res.stderr and "embedded null" not in res.stderr, res.stderr
    assert res.rc == 3, (res.rc, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    assert f"{path.removesuffix('.0')}" in lines[0] and "U+0000 (NUL)" in lines[0], lines[0]


@pytest.mark.parametrize("out", ["run\udcff", "run\x01"], ids=["byte-0xFF", "C0"])
def test_a_run_folder_path_no_script_can_carry_is_one_line(out: str, tmp_path: Path) -> None:
    """--out from argv: a byte that is no UTF-8 arrives as a lone surrogate, which no script of
    the run can be written with; a control character neither. Refused naming --out."""
    from tests.helpers_specs import BAD_INPUTS, run_cli

    res = run_cli("render", "--cluster", str(BAD_INPUTS / "ok" / "cluster.yaml"), "--model",
                  str(BAD_INPUTS / "ok" / "model.yaml"), "--nodes", "1", "--out", str(tmp_path / out))
    assert res.rc == 3 and res.stderr.startswith("error: --out: a run folder's path cannot hold ") \
        and res.stderr.count("\n") == 1, res.stderr
    assert list(tmp_path.iterdir()) == []
