"""What a launch keeps between launches so as not to ask again (each was on the way to the
servers' start): rank 0's `tritonserver --help` (rank_server.sh, on real files: the rendered
wrapper and a stand-in server that counts the questions) and the local style's
`mpirun --version` (a stand-in mpirun beside a stand-in interpreter)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftcluster.errors import UserError
from ftcluster.schedulers.local_mpi import find_local_mpi
from tests.unit.test_rank_leftovers import _wrapper_of
from tests.unit.test_request import _request

HELP = "Usage: tritonserver [options]\n  --model-repository <string>\n  --metrics-config <string>\n"


def _server(tmp: Path, help_text: str) -> str:
    """Answers --help (counted in ASKED, exit 1 as tritonserver does), else writes its arguments
    to ARGS and fails at once."""
    return ("#!/bin/bash\n"
            f"if [ \"$1\" = --help ]; then echo asked >>'{tmp}/ASKED'; printf %s '{help_text}'; exit 1; fi\n"
            f"printf '%s\\n' \"$*\" >>'{tmp}/ARGS'\n"
            "exit 3\n")


def _rank0(tmp: Path, server: str) -> tuple[Path, dict[str, str], Path]:
    run_dir, env = _wrapper_of(tmp, server)
    cache = tmp / "cache"
    return run_dir, {**env, "FTC_RANK": "0", "FTCLUSTER_CACHE": str(cache)}, cache


def _start(tmp: Path, run_dir: Path, env: dict[str, str]) -> None:
    r = subprocess.run(["bash", str(run_dir / "scripts" / "rank_server.sh")], cwd=tmp, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stdout + r.stderr


def _asked(tmp: Path) -> int:
    return len((tmp / "ASKED").read_text().splitlines()) if (tmp / "ASKED").exists() else 0


def test_rank0_asks_a_binary_its_help_once(tmp_path: Path) -> None:
    run_dir, env, cache = _rank0(tmp_path, _server(tmp_path, HELP))
    for _ in range(3):
        _start(tmp_path, run_dir, env)
    assert _asked(tmp_path) == 1
    # Every start used the answer: rank 0 keeps latency quantiles where the binary has the flag.
    starts = (tmp_path / "ARGS").read_text().splitlines()
    assert len(starts) == 3 and all("--metrics-config=summary_latencies=true" in s for s in starts)
    assert [p.read_text() for p in (cache / "triton-help").iterdir()] == [HELP]
    # The same path, rewritten (an upgrade): asked again.
    binary = tmp_path / "bin" / "tritonserver"
    binary.write_text(_server(tmp_path, HELP + "  --metrics-address <string>\n"))
    _start(tmp_path, run_dir, env)
    assert _asked(tmp_path) == 2


def test_an_answer_that_is_no_help_is_not_kept(tmp_path: Path) -> None:
    """A binary that failed to answer (a missing library, a timeout) is asked again next time."""
    run_dir, env, cache = _rank0(tmp_path, _server(tmp_path, "error while loading shared libraries\n"))
    for _ in range(2):
        _start(tmp_path, run_dir, env)
    assert _asked(tmp_path) == 2
    assert not (cache / "triton-help").exists() or not list((cache / "triton-help").iterdir())
    assert all("--metrics-config" not in s for s in (tmp_path / "ARGS").read_text().splitlines())


def test_an_unwritable_cache_only_costs_the_asking(tmp_path: Path) -> None:
    run_dir, env, _ = _rank0(tmp_path, _server(tmp_path, HELP))
    (tmp_path / "file").write_text("")
    env["FTCLUSTER_CACHE"] = str(tmp_path / "file" / "cache")   # under a file: cannot be made
    for _ in range(2):
        _start(tmp_path, run_dir, env)
    assert _asked(tmp_path) == 2
    assert all("--metrics-config=summary_latencies=true" in s for s in (tmp_path / "ARGS").read_text().splitlines())


def _mpirun(folder: Path, version: str) -> Path:
    """A stand-in interpreter's folder with an mpirun beside it that counts its questions."""
    folder.mkdir(parents=True, exist_ok=True)
    mpirun = folder / "mpirun"
    mpirun.write_text(f"#!/bin/sh\necho asked >>'{folder}/ASKED'\necho '{version}'\n")
    mpirun.chmod(0o755)
    return mpirun


def test_the_local_mpi_is_asked_its_version_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = tmp_path / "bin"
    monkeypatch.setattr(sys, "executable", str(here / "python3"))
    monkeypatch.setenv("FTCLUSTER_CACHE", str(tmp_path / "cache"))
    mpirun = _mpirun(here, "mpirun (Open MPI) 5.0.5")
    for _ in range(3):
        assert find_local_mpi().mpirun == str(mpirun)
    assert _asked(here) == 1
    # Rewritten in place (an upgrade; another size): asked again.
    _mpirun(here, "mpirun (Open MPI) 5.0.10")
    find_local_mpi()
    assert _asked(here) == 2


def test_an_mpirun_that_is_not_open_mpi_is_asked_every_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = tmp_path / "bin"
    monkeypatch.setattr(sys, "executable", str(here / "python3"))
    monkeypatch.setenv("FTCLUSTER_CACHE", str(tmp_path / "cache"))
    _mpirun(here, "HYDRA build details: MPICH 4.1")
    for _ in range(2):
        with pytest.raises(UserError, match="not Open MPI"):
            find_local_mpi()
    assert _asked(here) == 2
    assert not (tmp_path / "cache" / "mpi").exists() or not os.listdir(tmp_path / "cache" / "mpi")


# The supervisor's copies in a run folder come with their bytecode: the job's Python imports
# them without compiling (checked against each copy's source), as another Python would not.
_IMPORT = """
import importlib._bootstrap_external as ext, sys
compiled = []
to_code = ext.SourceLoader.source_to_code
def counting(self, data, path, *a, **k):
    compiled.append(path)
    return to_code(self, data, path, *a, **k)
ext.SourceLoader.source_to_code = counting
sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])
import ftcluster_job.supervisor, ftcluster_job.text
print(sorted(p.rsplit('/', 1)[-1] for p in compiled if '/ftcluster_job/' in p))
print(ftcluster_job.text.last_line.__code__.co_filename)
print(ftcluster_job.text.last_line('a\\nb\\n'))
"""


def _job_import(scripts: Path) -> list[str]:
    r = subprocess.run([sys.executable, "-S", "-c", _IMPORT, str(scripts)], capture_output=True, text=True,
                       timeout=60, env={k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"})
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_the_supervisors_copies_come_with_their_bytecode(tmp_path: Path) -> None:
    from ftcluster.render import bytecode
    from ftcluster.render.scripts import SUPERVISOR_MODULES
    from ftcluster.resources import package_path

    # The package's own cache, current, as an install leaves it.
    r = subprocess.run([sys.executable, "-m", "compileall", "-q", str(package_path("job"))],
                       capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")})
    assert r.returncode == 0, r.stderr
    req = _request(tmp_path, scheduler="local", partition=None)
    req.write_files()
    scripts = req.paths.scripts
    job = scripts / "ftcluster_job"   # its subpackages' modules too, each in its own folder's cache
    shipped = sorted((p.parent.parent / (p.name.split(".")[0] + ".py")).relative_to(job).as_posix()
                     for p in job.rglob("__pycache__/*"))
    assert shipped == sorted(SUPERVISOR_MODULES)
    compiled, filename, last = _job_import(scripts)
    assert compiled == "[]"
    assert filename == str(scripts / "ftcluster_job" / "text.py")   # tracebacks name the copy
    assert last == "b"
    # A copy changed after its bytecode was written (a hand edit): its own source wins.
    text = scripts / "ftcluster_job" / "text.py"
    text.write_text(text.read_text() + "\n\ndef last_line(text: str) -> str:\n    return 'edited'\n")
    compiled, _, last = _job_import(scripts)
    assert compiled == "['text.py']" and last == "edited"
    # Nothing is shipped for a copy that is not the package's text.
    assert not bytecode.ship_bytecode(text, package_path("job", "text.py"))


def test_a_module_without_bytecode_yet_gets_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An editable install has bytecode only for what was imported: the first ship makes it where
    an import would have, unless Python is told to write none."""
    from ftcluster.render.bytecode import ship_bytecode

    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    source = tmp_path / "pkg" / "mod.py"
    copy = tmp_path / "run" / "mod.py"
    for path in (source, copy):
        path.parent.mkdir()
        path.write_text("def f() -> int:\n    return 7\n")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert not ship_bytecode(copy, source)
    assert not (source.parent / "__pycache__").exists() and not (copy.parent / "__pycache__").exists()
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert ship_bytecode(copy, source)
    assert [p.name for p in (source.parent / "__pycache__").iterdir()] == [f"mod.{sys.implementation.cache_tag}.pyc"]
    r = subprocess.run([sys.executable, "-S", "-B", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import mod; "
                        "print(mod.f(), mod.__cached__)", str(copy.parent)], capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["7", str(copy.parent / "__pycache__" / f"mod.{sys.implementation.cache_tag}.pyc")]


def test_a_cache_entry_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    from ftcluster.run.store import keep_in_cache

    entry = tmp_path / "cache" / "mpi" / "k.txt"
    keep_in_cache(entry, "mpirun (Open MPI) 5.0.5\n")
    keep_in_cache(entry, "mpirun (Open MPI) 5.0.6\n")
    assert entry.read_text() == "mpirun (Open MPI) 5.0.6\n"
    assert [p.name for p in entry.parent.iterdir()] == ["k.txt"]   # no part left beside it
    (tmp_path / "file").write_text("")
    keep_in_cache(tmp_path / "file" / "mpi" / "k.txt", "x")       # under a file: cannot be made
    assert not (tmp_path / "file").is_dir()
