"""The package's own data files: job templates, rank-side files, the demo, the example specs.

Found beside this module: a checkout, an editable install and a wheel all import the package
from its folder (importlib.resources says the same for them, at 10 ms of every command's
start-up). job_templates/ and configs/ are top-level folders of the source tree; the wheel
carries them inside the package (pyproject's package-dir); tree_path() knows which of the two
it is.
"""

from __future__ import annotations

from pathlib import Path

# The source tree's top-level data folders, carried inside the package by the wheel.
TOP_LEVEL = ("job_templates", "configs")


def package_path(*parts: str) -> Path:
    """A file or folder shipped inside the ftcluster package, as a real path (Jinja's loader,
    globbing and copies into a run folder need one); no parts: the package folder."""
    root = Path(__file__).resolve().parent
    if root.is_dir():
        return root.joinpath(*parts)
    # A zipped install: its files have no path of their own.
    raise RuntimeError(f"ftcluster's data files are not on the file system ({root}); install the package unzipped")


def tree_root() -> Path:
    """The source tree's root as the example specs see it: the folder holding ftcluster/ (a
    checkout, or site-packages for a wheel). Their relative paths (../../ftcluster/demo/...) are
    relative to their place in it, configs/<kind>/."""
    return package_path().parent


def tree_path(name: str, *parts: str) -> Path:
    """A file in one of the top-level data folders (TOP_LEVEL): beside the package in a source
    tree (a checkout or an editable install: pyproject.toml beside it), else inside the package
    (a wheel). Decided by the tree, not by which folder exists: a stale folder of that name left
    inside a checkout's package, or another distribution's top-level folder of that name in
    site-packages, must not win."""
    if name not in TOP_LEVEL:
        raise ValueError(f"{name} is not one of {TOP_LEVEL}")
    root = tree_root()
    source_tree = (root / "pyproject.toml").is_file() and (root / name).is_dir()
    base = root / name if source_tree else package_path(name)
    return base.joinpath(*parts)
