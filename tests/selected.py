"""Did a run of the whole suite select it? tests/run.sh's passes add how many tests each
selected (tests/conftest.py, to $FTC_SELECTED); a run without arguments that selected fewer
than half the test functions defined under tests/ ran almost nothing -- a checkout the tests
beside the bed could not enter, a collection that broke -- and fails, saying so.

    python3 tests/selected.py COUNTS_FILE
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
_TEST_DEF = re.compile(r"^(?:async )?def test_", re.M)


def defined(tests: Path = TESTS) -> int:
    """The module-level test functions under `tests` (a parametrized one counts once)."""
    return sum(len(_TEST_DEF.findall(p.read_text(errors="replace"))) for p in tests.rglob("test_*.py"))


def main(argv: list[str]) -> int:
    (counts,) = argv
    selected = sum(int(line) for line in Path(counts).read_text().split())
    want = defined()
    if selected * 2 < want:
        print(f"error: the test passes selected {selected} tests in all, of the {want} test functions "
              "under tests/: almost nothing ran (see each pass's collection above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
