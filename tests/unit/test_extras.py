"""A command that needs an optional part names the extra to install, in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ftcluster.errors import UserError
from ftcluster.extras import need


@pytest.mark.parametrize("module, extra", [("docker", "docker"), ("fabric", "ssh"), ("tritonclient.http", "client")])
def test_a_missing_part_names_its_extra(module: str, extra: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)   # as if it were not installed: import raises
    with pytest.raises(UserError) as exc:
        need(module, "something")
    assert exc.value.hint == f"pip install 'ftcluster[{extra}]'" and "something needs" in str(exc.value)


def test_the_cli_says_it_in_one_line() -> None:
    """`ftcluster image build` without the Docker SDK (blocked in that process): one line, exit 3."""
    code = ("import sys; sys.modules['docker'] = None; from ftcluster.cli import main; "
            "sys.argv = ['ftcluster', 'down', '--name', 'x']; main()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 3 and out.stderr.count("\n") == 1 and "ftcluster[docker]" in out.stderr, out.stderr
