"""Write docs/spec-reference.md from the spec models (ftcluster.spec.reference).

    python3 docs/gen_reference.py           # write it
    python3 docs/gen_reference.py --check   # exit 1 if the committed file is not current
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "spec-reference.md"


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))   # this checkout's ftcluster, whichever one is installed
    from ftcluster.spec.reference import markdown

    text = markdown()
    if argv == ["--check"]:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            print(f"{OUT.relative_to(ROOT)} is not current: run python3 docs/gen_reference.py", file=sys.stderr)
            return 1
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
