"""The package's own data files: job templates, rank-side files, the demo, the example specs.

Found through importlib.resources rather than `__file__`, so a checkout, an editable install
and a wheel (pyproject's package-data) find them the same way.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def package_path(*parts: str) -> Path:
    """A file or folder shipped inside the ftcluster package, as a real path (Jinja's loader,
    globbing and copies into a run folder need one); no parts: the package folder."""
    root = files("ftcluster")
    if isinstance(root, Path):
        return root.resolve().joinpath(*parts)
    # A zipped install: its files have no path of their own.
    raise RuntimeError(f"ftcluster's data files are not on the file system ({root}); install the package unzipped")
