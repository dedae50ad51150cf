"""A generated corpus of hostile values for every string and number field of a cluster spec
(and the commands' own arguments): each runs the real CLI. A value is either refused in one
line naming its field (exit 3, no traceback) or accepted; an accepted one is rendered, every
script passes `bash -n`, and each node-side script's variable block (with the run's env.sh)
evaluates without running anything: a canary file that any executed payload would create
never appears."""

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
    "subst": f"$(touch {CANARY})", "backtick": f"`touch {CANARY}`", "quote": f"'; touch {CANARY}; '",
    "dquote": f'"; touch {CANARY}; "', "long": "a" * 5000, "empty": "",
    "inf": float("inf"), "nan": float("nan"), "bool": True, "int32": 2**31, "negative": -1, "huge": 10**30,
}
STRING = ("escape", "nul", "newline", "c1", "del", "subst", "backtick", "quote", "dquote", "long", "empty")
NUMBER = ("inf", "nan", "bool", "int32", "negative", "huge")
# Field path -> the payloads it gets (and its value in the base spec, when it needs one).
STRING_FIELDS = ("name", "partition", "account", "qos", "time_limit", "mpi", "workspace", "python", "login_host",
                 "server.binary", "server.extra_args.0", "env.MY_VAR", "container.image", "container.workdir",
                 "sbatch_args.0", "server.on_failure.0", "proxy.binary", "access")
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
    assert len(CASES) >= 150


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
    else:
        # Control characters never pass, nor non-finite numbers (an env value is text: "inf").
        assert payload not in ("escape", "nul", "c1", "del") and \
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
