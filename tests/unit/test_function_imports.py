"""An import inside a function says why it is there: to keep `ftcluster --help` and the light
commands fast ("startup: ..."), to defer an optional extra ("optional extra: NAME"), or another
real reason (an import cycle, the job's own start-up on the nodes). Every other import belongs at
the top of its module.

The reason is a comment on the import's line or on the line directly above it; a comment above
a group of imports (one after another, blank lines between them at most) covers the group. A
pragma alone (`# noqa`, `# type: ignore`) says no reason. Imports under `if TYPE_CHECKING:` are
not run and are not looked at."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ftcluster"

# Imports inside functions that have no reason yet, by file: each one named, so that any other
# fails.
UNEXPLAINED: dict[str, set[str]] = {}

_PRAGMA = re.compile(r"^(noqa\b.*|type:\s*ignore\b.*|pragma\b.*|nosec\b.*)$")


def _reasons(source: str) -> dict[int, bool]:
    """Line number -> whether it holds a comment that says something (not a pragma alone);
    only lines with a comment are keys. `# noqa: X  (why)` says something."""
    out: dict[int, bool] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            parts = [p.strip() for p in text.split("#")]
            out[tok.start[0]] = out.get(tok.start[0], False) or any(p and not _PRAGMA.match(p) for p in parts)
    return out


def _function_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and in_function:
            found.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            children: list[ast.AST] = list(node.orelse)   # the body is for the type checker only
        else:
            children = list(ast.iter_child_nodes(node))
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in children:
            visit(child, inner)

    visit(tree, False)
    return sorted(found, key=lambda n: n.lineno)


def unexplained(source: str) -> list[tuple[int, str]]:
    """(line, statement) of each import inside a function that gives no reason."""
    lines = source.splitlines()
    reasons = _reasons(source)
    imports = _function_imports(ast.parse(source))
    ends = {n.end_lineno or n.lineno: n for n in imports}
    covered: set[int] = set()
    out = []
    for node in imports:
        end = node.end_lineno or node.lineno
        said = any(reasons.get(r) for r in range(node.lineno, end + 1)) or reasons.get(node.lineno - 1, False)
        if not said:
            # The group's reason: the nearest line above that is not blank ends another import
            # inside a function, itself with a reason (or covered by the one above it).
            above = node.lineno - 1
            while above >= 1 and not lines[above - 1].strip():
                above -= 1
            prev = ends.get(above)
            said = prev is not None and prev.lineno in covered
        if said:
            covered.add(node.lineno)
        else:
            out.append((node.lineno, " ".join(x.strip() for x in lines[node.lineno - 1:end])))
    return out


def test_every_import_inside_a_function_says_why() -> None:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        allowed = UNEXPLAINED.get(rel, set())
        for line, statement in unexplained(path.read_text()):
            if statement not in allowed:
                bad.append(f"ftcluster/{rel}:{line}: {statement}")
    assert bad == [], ("imports inside functions without a reason (a comment on the line or the one above: "
                       "'startup: ...', 'optional extra: NAME', or why else; or move them to the top):\n"
                       + "\n".join(bad))


def test_the_exemptions_are_still_needed() -> None:
    # A file's exemption goes once its imports say why (or move): none is kept that is not used.
    for rel, allowed in UNEXPLAINED.items():
        path = PACKAGE / rel
        if not path.exists():   # moved or split: its imports are checked where they went
            continue
        left = {statement for _, statement in unexplained(path.read_text())}
        assert allowed <= left, f"ftcluster/{rel}: {sorted(allowed - left)} give a reason now: drop them from UNEXPLAINED"


def test_the_check_itself() -> None:
    source = '''
from typing import TYPE_CHECKING

import os

if TYPE_CHECKING:
    import json


def a():
    import csv   # startup: only --csv

    # optional extra: plot
    import matplotlib

    import matplotlib.pyplot as plt
    x = 1
    import glob
    import shutil  # noqa: F401
    if x:
        import ssl
    from typing import (
        Any,  # used below
    )
    return csv, matplotlib, plt, glob, shutil, ssl, Any


def b():
    if TYPE_CHECKING:
        import decimal
    else:
        import fractions
'''
    assert unexplained(source) == [(18, "import glob"), (19, "import shutil  # noqa: F401"), (21, "import ssl"),
                                   (32, "import fractions")]
