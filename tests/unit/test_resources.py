"""The package's data files, found the one way (ftcluster.resources) a wheel install finds them too."""

from __future__ import annotations

from pathlib import Path

import ftcluster
from ftcluster.cli.commands_examples import examples_root
from ftcluster.envnames import job_library_files
from ftcluster.resources import package_path
from ftcluster.spec import embedded_cluster_path, embedded_model_path


def test_package_data_is_found_inside_the_package() -> None:
    root = package_path()
    assert root == Path(ftcluster.__file__).resolve().parent
    assert embedded_cluster_path() == root / "demo" / "local-cluster.yaml" and embedded_cluster_path().is_file()
    assert embedded_model_path().is_file() and (root / "job_templates").is_dir()
    assert {p.parent.name for p in examples_root().glob("*/*.yaml")} == {"clusters", "models"}
    assert {p.parent for p in job_library_files()} == {root / "job_templates", root / "rank"}
