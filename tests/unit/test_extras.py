"""A command that needs an optional part names the extra to install, in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ftcluster.errors import UserError
from ftcluster.extras import need


@pytest.mark.parametrize("module, extra", [("docker", "docker"), ("fabric", "ssh"), ("tritonclient.http", "client")])
def test_a_missing_part_names_its_extra(module: str, extra: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)   # as if it were not installed: import raises
    with pytest.raises(UserError) as exc:
        need(module, "something")
    assert exc.value.hint == f"pip install 'ftcluster[{extra}]'" and "something needs" in str(exc.value)


def test_tritonclient_without_its_http_dependencies_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """The base install's plain tritonclient: its http package raises RuntimeError (not
    ImportError) when gevent is missing; tritonclient's own import, gevent blocked."""
    for name in [m for m in sys.modules if m.startswith(("tritonclient.http", "gevent", "geventhttpclient"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "gevent", None)
    with pytest.raises(UserError) as exc:
        need("tritonclient.http", "the Triton client over HTTP")
    assert exc.value.hint == "pip install 'ftcluster[client]'"
    assert "http support" in str(exc.value) or "gevent" in str(exc.value), str(exc.value)


def test_other_runtime_errors_of_an_import_are_not_taken_for_a_missing_extra(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ftc_broken_mod.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError, match="broken at import"):
        need("ftc_broken_mod", "something")


def test_the_cli_says_it_in_one_line() -> None:
    """`ftcluster image build` without the Docker SDK (blocked in that process): one line, exit 3."""
    code = ("import sys; sys.modules['docker'] = None; from ftcluster.cli import main; "
            "sys.argv = ['ftcluster', 'down', '--name', 'x']; main()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 3 and out.stderr.count("\n") == 1 and "ftcluster[docker]" in out.stderr, out.stderr
