"""The package's data files, found the one way (ftcluster.resources) a wheel install finds them too.

job_templates/ and configs/ are top-level folders of the checkout, found beside the package here
(an editable install); tests/integration/test_wheel.py checks the wheel carries them inside."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import ftcluster
from ftcluster.cli.commands_examples import example_files, examples_root
from ftcluster.spec.envnames import job_library_files
from ftcluster.render.scripts import templates_dir
from ftcluster.resources import TOP_LEVEL, package_path, tree_path, tree_root
from ftcluster.spec.defaults import embedded_cluster_path, embedded_model_path

REPO = Path(__file__).resolve().parents[2]


def test_package_data_is_found_inside_the_package() -> None:
    root = package_path()
    assert root == Path(ftcluster.__file__).resolve().parent
    assert embedded_cluster_path() == root / "demo" / "local-cluster.yaml" and embedded_cluster_path().is_file()
    assert embedded_model_path().is_file()


def test_top_level_folders_are_the_checkouts() -> None:
    assert tree_root() == REPO
    assert templates_dir() == REPO / "job_templates" and (templates_dir() / "job.sh.j2").is_file()
    assert examples_root() == REPO / "configs"
    assert {p.parent for p in job_library_files()} == {REPO / "job_templates", package_path("rank")}
    # Nothing left at the old places inside the package.
    assert not package_path("job_templates").exists() and not package_path("examples").exists()
    with pytest.raises(ValueError):
        tree_path("demo")


def test_examples_are_clusters_and_models_only() -> None:
    assert {p.parts[0] for p in example_files()} == {"clusters", "models"}
    assert len(example_files()) == len(list((REPO / "configs").glob("*/*.yaml")))


def test_every_help_example_names_a_file_examples_writes() -> None:
    # The `--help` examples use the files `ftcluster examples` writes (configs/...): every
    # command's, subcommands' included.
    import re

    import click

    from ftcluster.cli import COMMANDS, cli, load

    for name in COMMANDS:
        load(name)
    written = {f"configs/{p}" for p in example_files()}

    def helps(cmd: click.Command, path: str) -> list[tuple[str, str]]:
        text = cmd.get_help(click.Context(cmd, info_name=path))
        subs = cmd.commands.values() if isinstance(cmd, click.Group) else []
        return [(path, text)] + [h for sub in subs for h in helps(sub, f"{path} {sub.name}")]

    named = {(path, f) for path, text in helps(cli, "ftcluster") for f in re.findall(r"configs/[\w./-]+\.yaml", text)}
    assert len(named) > 10    # the help examples do name files
    assert {(path, f) for path, f in named if f not in written} == set()


def test_wheel_package_list_covers_every_package_folder() -> None:
    """pyproject lists the packages by hand (package-dir maps two): a new subpackage must be
    added there, or the wheel would lack it."""
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "ftcluster").rglob("__init__.py")
               if "demo" not in p.parts}
    mapped = {f"ftcluster.{name}" for name in TOP_LEVEL}
    # Folders of data only are named too (their files come by package-data), as setuptools
    # takes each such folder whose name could be a package's.
    pkg = REPO / "ftcluster"
    data = {"ftcluster." + ".".join(d.relative_to(pkg).parts) for d in [pkg / "demo", *(pkg / "demo").rglob("*")]
            if d.is_dir() and "__pycache__" not in d.parts and all(x.isidentifier() for x in d.relative_to(pkg).parts)}
    data |= {f"ftcluster.configs.{d.name}" for d in (REPO / "configs").iterdir() if d.is_dir() and d.name.isidentifier()}
    assert set(tool["packages"]) == on_disk | mapped | data
    assert tool["package-dir"] == {f"ftcluster.{name}": name for name in TOP_LEVEL}


def test_a_stale_folder_inside_the_package_does_not_shadow_the_checkouts(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    """A checkout that once held ftcluster/job_templates (or a copy of the tree that kept it)
    still renders from the top-level folder; a wheel-like tree (no pyproject.toml beside the
    package) reads inside the package even when site-packages has a folder of that name."""
    import ftcluster.resources as res

    src = tmp_path / "src"
    (src / "ftcluster" / "job_templates").mkdir(parents=True)      # stale, empty
    (src / "job_templates").mkdir()
    (src / "pyproject.toml").write_text("")
    monkeypatch.setattr(res, "package_path", lambda *parts: (src / "ftcluster").joinpath(*parts))
    assert res.tree_path("job_templates") == src / "job_templates"
    wheel = tmp_path / "site-packages"
    (wheel / "ftcluster" / "job_templates").mkdir(parents=True)
    (wheel / "job_templates").mkdir()                              # another distribution's
    monkeypatch.setattr(res, "package_path", lambda *parts: (wheel / "ftcluster").joinpath(*parts))
    assert res.tree_path("job_templates") == wheel / "ftcluster" / "job_templates"
