"""The package's own data files: job templates, rank-side files, the demo, the example specs.

Found through importlib.resources rather than `__file__`, so a checkout, an editable install
and a wheel find them the same way. job_templates/ and configs/ are top-level folders of the
source tree; the wheel carries them inside the package (pyproject's package-dir), so tree_path()
looks there first and beside the package second.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# The source tree's top-level data folders, carried inside the package by the wheel.
TOP_LEVEL = ("job_templates", "configs")


def package_path(*parts: str) -> Path:
    """A file or folder shipped inside the ftcluster package, as a real path (Jinja's loader,
    globbing and copies into a run folder need one); no parts: the package folder."""
    root = files("ftcluster")
    if isinstance(root, Path):
        return root.resolve().joinpath(*parts)
    # A zipped install: its files have no path of their own.
    raise RuntimeError(f"ftcluster's data files are not on the file system ({root}); install the package unzipped")


def tree_root() -> Path:
    """The source tree's root as the example specs see it: the folder holding ftcluster/ (a
    checkout, or site-packages for a wheel). Their relative paths (../../ftcluster/demo/...) are
    relative to their place in it, configs/<kind>/."""
    return package_path().parent


def tree_path(name: str, *parts: str) -> Path:
    """A file in one of the top-level data folders (TOP_LEVEL): inside the package for a wheel,
    beside it for a checkout or an editable install."""
    if name not in TOP_LEVEL:
        raise ValueError(f"{name} is not one of {TOP_LEVEL}")
    inside = package_path(name)
    base = inside if inside.is_dir() else tree_root() / name
    return base.joinpath(*parts)
