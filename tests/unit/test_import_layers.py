"""The package's imports point one way: the layers contract in pyproject.toml ([tool.importlinter])
holds, imports inside functions included, and it fails on a deliberately added upward import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))


def _lint(package_parent: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(package_parent), "HOME": str(package_parent)}
    return subprocess.run([LINT, "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=package_parent,
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def lint_available() -> None:
    if not Path(LINT).exists():
        pytest.fail("lint-imports is not installed: pip install -e '.[dev]' brings import-linter")


def test_the_layers_contract_holds(lint_available: None) -> None:
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_an_upward_import_breaks_it(lint_available: None, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "ftcluster", tmp_path / "ftcluster",
                    ignore=shutil.ignore_patterns("__pycache__", "demo", "job_templates", "configs"))
    # The spec layer asking the status of runs: a cycle through every stage in between.
    errors = tmp_path / "ftcluster" / "spec" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _upward() -> None:\n    from ftcluster.observe import status  # noqa\n")
    out = _lint(tmp_path)
    assert out.returncode != 0
    assert "BROKEN" in out.stdout and "ftcluster.spec.errors -> ftcluster.observe.status" in out.stdout


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_cycle_between_the_packages_parts_imports_inside_functions_included() -> None:
    import grimp

    graph = grimp.build_graph("ftcluster", include_external_packages=False, exclude_type_checking_imports=True)
    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = _top(module), _top(imported)
            if a != b and a and b:
                edges.setdefault(a, set()).add(b)
    # `python -m ftcluster.client` is the CLI's client group: an entry point, not a dependency.
    edges["client"].discard("cli")

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    knots = sorted(f"{a} <-> {b}" for a in edges for b in edges[a] if reaches(b, a))
    assert knots == []


def test_the_readme_maps_every_folder_of_the_package() -> None:
    import re

    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"`ftcluster/(\w+)/`", readme))
    folders = {p.name for p in (ROOT / "ftcluster").iterdir()
               if p.is_dir() and (p / "__init__.py").is_file() and p.name != "demo"}
    assert named == folders
    roots = sorted(p.stem for p in (ROOT / "ftcluster").glob("*.py"))
    assert len(roots) <= 8, roots
