"""What runs inside a user's image needs only what a stock Triton + FT image has.

Such an image has python3 >= 3.8 with its standard library (plus numpy for Triton's python
backend), but neither ftcluster nor mpi4py nor pydantic. The files a run ships into the
container (scripts/mpicheck.py, scripts/ctmpi.py) and the test model that stands in for the FT
backend must parse as Python 3.8, import nothing else, and keep annotations unevaluated (a
`str | None` evaluated at import fails on 3.8 and 3.9).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]
# Beyond the standard library and the modules shipped beside each file (under the names render gives them): the FT stand-in runs in
# Triton's python backend stub (numpy, the backend's utils), in an image with torch (FT's
# Dockerfile installs it).
SHIPPED = {
    "ftcluster/rank/mpicheck.py": {"ctmpi", "rank_env"},   # rank_env.py: env.py, as render ships it
    "ftcluster/rank/ctmpi.py": set(),
    "ftcluster/rank/env.py": set(),
    "ftcluster/demo/model_repository/fastertransformer/1/model.py":
        {"numpy", "triton_python_backend_utils", "torch"},
}


def _imports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("rel", sorted(SHIPPED))
def test_parses_as_python_38_and_imports_only_the_stdlib(rel: str) -> None:
    src = (REPO / rel).read_text()
    tree = ast.parse(src, filename=rel, feature_version=(3, 8))
    # Imports guarded by try/except ImportError (ftcluster's own package when it is there).
    guarded = {
        name.split(".")[0]
        for node in ast.walk(tree) if isinstance(node, ast.Try)
        for sub in node.body
        for name in ([sub.module] if isinstance(sub, ast.ImportFrom) and sub.module else
                     [a.name for a in sub.names] if isinstance(sub, ast.Import) else [])
    }
    beside = {p.stem for p in (REPO / rel).parent.glob("*.py")}
    extra = (_imports(tree) - set(sys.stdlib_module_names) - SHIPPED[rel] - beside - guarded
             - {"__future__"})
    assert not extra, f"{rel} imports {sorted(extra)}, which a stock image lacks"


@pytest.mark.parametrize("rel", sorted(SHIPPED))
def test_annotations_are_not_evaluated(rel: str) -> None:
    tree = ast.parse((REPO / rel).read_text())
    annotated = any(
        (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and (n.returns or any(a.annotation for a in n.args.args)))
        or isinstance(n, ast.AnnAssign)
        for n in ast.walk(tree)
    )
    future = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                 and any(a.name == "annotations" for a in n.names) for n in tree.body)
    assert future or not annotated, f"{rel}: add `from __future__ import annotations` (Python 3.8/3.9)"
