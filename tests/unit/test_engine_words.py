"""Only the engines name an engine: `grep -rliI fastertransformer ftcluster/ job_templates/` lists
files of ftcluster/engines/ (the FT engine's package, the built-in engines' table) and the demo
(a test model of FT's shape) alone (issue #74). Anything else asks the engine the model spec
names (ftcluster.engines.engine_for) or the registry (ftcluster.spec.engines), and takes its
words from the engine object."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORD = b"fastertransformer"
# Folders whose files may name it, and single files that may (none today: the CLI takes the
# demo model's name from its spec, the engines' words from the engine objects).
ALLOWED_UNDER = ("ftcluster/engines/", "ftcluster/demo/")
ALLOWED_FILES: frozenset[str] = frozenset()


def naming(roots: tuple[str, ...]) -> list[str]:
    """The text files under `roots` that name the word in any case (as grep -rliI: a file with a
    NUL byte is binary, and skipped)."""
    found = []
    for root in roots:
        for path in sorted((REPO / root).rglob("*")):
            if not path.is_file():
                continue
            data = path.read_bytes()
            if b"\0" not in data and WORD in data.lower():
                found.append(path.relative_to(REPO).as_posix())
    return found


def test_only_the_engines_and_the_demo_name_fastertransformer() -> None:
    named = naming(("ftcluster", "job_templates"))
    outside = [f for f in named if not f.startswith(ALLOWED_UNDER) and f not in ALLOWED_FILES]
    assert not outside, f"these name an engine outside ftcluster/engines/: {outside}"
    assert len(ALLOWED_FILES) <= 2


def test_the_check_finds_a_file_that_names_it() -> None:
    """The check is not vacuous: the FT engine's package is found by it."""
    assert "ftcluster/engines/fastertransformer/engine.py" in naming(("ftcluster",))
