"""tests/run.sh's own machinery: the tests beside the bed's run from any checkout, and a run of
the whole suite that selected almost nothing fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FTC_SELECTED")}


@pytest.mark.skipif(subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0,
                    reason="no mount namespace here (not root)")
def test_the_side_run_enters_a_checkout_under_tmp() -> None:
    # The side's own /tmp hid a checkout under /tmp: its tests could not be found, and the pass
    # said it passed. The checkout is bound back at its path.
    co = Path(tempfile.mkdtemp(prefix="ftc-checkout-", dir="/tmp"))
    try:
        (co / "tests").mkdir()
        shutil.copy2(REPO / "tests" / "side.sh", co / "tests" / "side.sh")
        (co / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
        (co / "tests" / "test_three.py").write_text(
            "import os\n\ndef test_a(): pass\n\ndef test_b(): pass\n\n"
            "def test_own_tmp():\n    assert not any(n.startswith('ftc-checkout-') and n != os.path.basename(os.getcwd())\n"
            "                   for n in os.listdir('/tmp'))\n")
        sibling = Path(tempfile.mkdtemp(prefix="ftc-checkout-", dir="/tmp"))   # hidden from the side
        try:
            p = subprocess.run(["bash", "tests/side.sh", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                               cwd=co, env=_env(), capture_output=True, text=True, timeout=120, check=False)
        finally:
            sibling.rmdir()
        assert p.returncode == 0 and "3 passed" in p.stdout, p.stdout + p.stderr
    finally:
        shutil.rmtree(co)


def test_a_whole_run_that_selected_almost_nothing_fails(tmp_path: Path) -> None:
    # Each pass adds the tests it selected (tests/conftest.py) to run.sh's file; the sum of a
    # run of the whole suite is checked against the test functions defined (tests/selected.py).
    counts = tmp_path / "selected"
    counts.touch()
    fd = os.open(counts, os.O_WRONLY | os.O_APPEND)
    try:
        st = os.fstat(fd)
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "tests/unit/test_cli_numbers.py"], cwd=REPO, pass_fds=(fd,),
                           env={**_env(), "FTC_SELECTED": f"{fd}:{st.st_dev}:{st.st_ino}"},
                           capture_output=True, text=True, timeout=120, check=False)
    finally:
        os.close(fd)
    assert p.returncode == 0, p.stdout + p.stderr
    one_file = int(counts.read_text())
    assert 0 < one_file < 200, one_file
    check = [sys.executable, str(REPO / "tests" / "selected.py"), str(counts)]
    few = subprocess.run(check, capture_output=True, text=True, timeout=60, check=False)
    assert few.returncode == 1 and "almost nothing ran" in few.stderr, few.stderr
    counts.write_text(f"{one_file}\n5000\n0\n")
    assert subprocess.run(check, capture_output=True, text=True, timeout=60, check=False).returncode == 0
