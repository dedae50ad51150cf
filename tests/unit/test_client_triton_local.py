"""The cached tritonserver bundle: wrapper text, atomic build, racing builders, missing server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftcluster.service import triton_local
from ftcluster.errors import UserError


def test_wrapper_quotes_values(tmp_path: Path) -> None:
    bundle = tmp_path / "a b'c"
    text = triton_local._wrapper_text(bundle, bundle / "bin" / "tritonserver",
                                      {"LD_LIBRARY_PATH": "/x y:/z", "PATH": "/p'q"})
    script = tmp_path / "w.sh"
    # Replace exec with printing what would run, to check the shell sees the values intact.
    script.write_text(text.replace("exec ", "printf '%s\\n' \"$LD_LIBRARY_PATH\" \"$PATH\" ") )
    out = subprocess.run(["bash", str(script), "--x"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, check=True).stdout.splitlines()
    assert out[0] == "/x y:/z"
    assert out[1] == "/p'q:/usr/bin:/bin"
    assert out[2] == str(bundle / "bin" / "tritonserver")
    assert out[3] == f"--backend-directory={bundle / 'backends'}"
    assert out[4] == "--x"


def test_no_server_anywhere_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(triton_local, "_pytriton_dir", lambda: None)
    with pytest.raises(UserError, match="no tritonserver found") as exc:
        triton_local.find_tritonserver()
    assert "ftcluster[cpu-triton]" in str(exc.value)


def test_path_binary_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "tritonserver"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert triton_local.find_tritonserver() == fake


@pytest.mark.skipif(triton_local._pytriton_dir() is None, reason="nvidia-pytriton not installed")
def test_racing_builders_get_one_complete_bundle(tmp_path: Path) -> None:
    env = {**os.environ, "FTCLUSTER_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    code = "from ftcluster.service.triton_local import find_tritonserver as f; print(f())"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(outs) == 1
    wrapper = Path(outs.pop())
    assert wrapper.name == "tritonserver-wrapper" and os.access(wrapper, os.X_OK)
    bundle = wrapper.parent.parent
    assert (bundle / "backends" / "python" / "triton_python_backend_stub").is_file()
    assert (bundle / "backends" / "python" / "libtriton_python.so").is_file()
    # No temp folders left behind by the losers.
    assert [p.name for p in bundle.parent.iterdir()] == [bundle.name]
    # The wheel's files are hard-linked where the cache shares its filesystem: no 22 MB per venv.
    pytriton = triton_local._pytriton_dir()
    assert pytriton is not None
    real, linked = (pytriton / "tritonserver" / "bin" / "tritonserver").stat(), (bundle / "bin" / "tritonserver").stat()
    if real.st_dev == linked.st_dev:
        assert real.st_ino == linked.st_ino


def test_perf_analyzer_env_finds_its_libs() -> None:
    pa = triton_local.perf_analyzer_path()
    if pa is None:
        pytest.skip("no perf_analyzer (tritonclient 2.51 wheel) here")
    r = subprocess.run([str(pa), "--version"], env=triton_local.perf_analyzer_env(),
                       capture_output=True, text=True, timeout=30, check=False)
    assert "error while loading shared libraries" not in r.stderr
