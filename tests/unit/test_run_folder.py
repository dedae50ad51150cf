"""A run folder given to status/logs/stop (one rendered and submitted by hand) whose files were
edited or damaged: a value of another kind than launch writes makes it no run folder, one line
and exit 3, never a traceback (nor a record that breaks every later command)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

Edit = Callable[[dict[str, Any]], Any]


def ftc(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ftcluster", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "FTCLUSTER_STATE_DIR": str(state)}, check=False)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rendered") / "run"
    r = ftc("render", "--nodes", "2", "--out", str(out), state=out.parent / "state")
    assert r.returncode == 0, r.stderr
    return out


def _set(key: str, value: Any) -> Edit:
    def edit(doc: dict[str, Any]) -> Any:
        doc[key] = value
        return doc
    return edit


DAMAGED: list[tuple[str, str, Edit]] = [
    ("job.json a list", "scripts/job.json", lambda doc: [doc]),
    ("run id not text", "scripts/job.json", _set("run_id", True)),
    ("run id no run id", "scripts/job.json", _set("run_id", "../x")),
    ("nodes as text", "scripts/job.json", _set("nodes", "2")),
    ("nodes zero", "scripts/job.json", _set("nodes", 0)),
    ("model not text", "scripts/job.json", _set("served_model", ["m"])),
    ("step not an object", "scripts/job.json", _set("step", 5)),
]


@pytest.mark.parametrize("what, file, edit", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_a_damaged_job_json_is_no_run_folder(rendered: Path, tmp_path: Path, what: str, file: str, edit: Edit) -> None:
    folder = tmp_path / "run"
    shutil.copytree(rendered, folder, symlinks=True)
    path = folder / file
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    for command in ("status", "logs", "stop"):
        r = ftc(command, str(folder), state=tmp_path / "state")
        assert r.returncode == 3 and r.stderr == (
            f"error: RUN: {folder} is no run folder (scripts/job.json missing, or not as launch writes it) "
            "(give a run id, or the folder `render --out` wrote)\n"), (command, r.stderr)


@pytest.mark.parametrize("edit", [lambda doc: [doc], _set("cluster", "local"), _set("plan", {"ranks": 7}),
                                  _set("plan", {"ranks": [{"rank": 0, "node": 5}, {"rank": [1], "node": "h"}]})],
                         ids=["a list", "cluster as text", "ranks a number", "ranks of other kinds"])
def test_a_damaged_run_json_still_reports(rendered: Path, tmp_path: Path, edit: Edit) -> None:
    # run.json only adds to the record (the cluster's name, the plan's hosts): what is not of
    # its kind is left out.
    folder = tmp_path / "run"
    shutil.copytree(rendered, folder, symlinks=True)
    path = folder / "run.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    r = ftc("status", str(folder), "--json", state=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["run_id"] == "run" and all(isinstance(n, str) for n in st["nodes"])
    assert ftc("status", str(folder), state=tmp_path / "state").returncode == 0
