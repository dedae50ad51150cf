"""The python backend's /tmp folders a run's SIGKILLed ranks leave: a folder goes once no other
run's claim is left in it (another run starting on the node meanwhile may have claimed it: its
live server would abort at its clean exit if its folder were gone)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ftcluster.job.leftovers import PYTHON_ENV_DIR
from tests.unit.test_render import render_style


def _free_python_envs(tmp_path: Path) -> str:
    """The rendered script, as the job runs it: `bash free_python_envs.sh RUN_ID FOLDER...`."""
    script = tmp_path / "free_python_envs.sh"
    script.write_text(render_style("local").files["free_python_envs.sh"])
    return str(script)


def test_a_folder_goes_once_no_other_run_claims_it(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    ours, shared, extracted = (tmp_path / n for n in ("python_env_aaaaaa", "python_env_bbbbbb", "python_env_cccccc"))
    for d in (ours, shared, extracted):
        d.mkdir()
        (d / ".ftc+run-1+r0+i0").touch()
    (ours / ".ftc+run-1+r1+i2").touch()                 # both ranks on one host claimed it
    (shared / ".ftc+run-10+r0+i0").touch()              # another run (a longer id sharing the prefix)
    (extracted / "env-hash").mkdir()                 # an extracted execution environment inside
    subprocess.run(["bash", _free_python_envs(tmp_path_factory.mktemp("scripts")), "run-1", str(ours), str(shared), str(extracted),
                    str(tmp_path / "python_env_gone00")], check=True)
    assert not ours.exists() and not extracted.exists()
    assert sorted(p.name for p in shared.iterdir()) == [".ftc+run-10+r0+i0"]


def test_only_the_backends_own_names_are_taken() -> None:
    assert PYTHON_ENV_DIR.fullmatch("/tmp/python_env_Ab12Cd")
    for bad in ("/tmp/python_env_../../etc", "/tmp/python_env_abc", "/home/x/python_env_abcdef", "/tmp/python_env_*"):
        assert not PYTHON_ENV_DIR.fullmatch(bad)


def test_every_rank_of_a_host_claimed_every_folder(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """16 ranks on one host each claim the 16 folders made there (the test bed; a node of the
    local style): every mark of the run goes, and every folder but the one another run claims."""
    folders = [tmp_path / f"python_env_{i:06d}" for i in range(16)]
    for d in folders:
        d.mkdir()
        for r in range(16):
            (d / f".ftc+run-1+r{r}+i0").touch()
    (folders[3] / ".ftc+run-2+r0+i0").touch()
    subprocess.run(["bash", _free_python_envs(tmp_path_factory.mktemp("scripts")), "run-1", *map(str, folders)],
                   check=True)
    assert [d.name for d in tmp_path.iterdir()] == [folders[3].name]
    assert [p.name for p in folders[3].iterdir()] == [".ftc+run-2+r0+i0"]
