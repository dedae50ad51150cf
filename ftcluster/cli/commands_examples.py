"""`examples`: write the example specs shipped inside the package into a folder."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import click

from ftcluster.cli import cli
from ftcluster.cli.folders import refuse_dangling_link
from ftcluster.cli.output import echo_json
from ftcluster.errors import UserError
from ftcluster.observe.documents import document
from ftcluster.resources import tree_path, tree_root

# Spec keys whose relative values are paths relative to the spec file.
_PATH_KEY = re.compile(r"^(?P<key>\s*(?:- )?(?:repository|checkpoint_root|checkpoint_mount_src|src|dst):\s*)"
                       r"(?P<path>\.{1,2}/\S+)\s*$")


def examples_root() -> Path:
    # The source tree's configs/, which a wheel carries inside the package; this command copies
    # them out (into ./configs by default).
    return tree_path("configs")


def example_files() -> list[Path]:
    """The example specs, relative to examples_root(): clusters/*.yaml and models/*.yaml."""
    root = examples_root()
    return sorted(p.relative_to(root) for kind in ("clusters", "models") for p in (root / kind).glob("*.yaml"))


def relocated(text: str, rel: Path) -> str:
    """The spec text with relative paths made absolute: the copy lives elsewhere, and
    `../../ftcluster/demo/...` must still find the test model inside the package (relative to
    the spec's place in the source tree, which is the same in a checkout and a wheel)."""
    base = tree_root() / "configs" / rel.parent
    out = []
    for line in text.splitlines(keepends=True):
        m = _PATH_KEY.match(line)
        if m:
            target = os.path.normpath(base / m["path"])
            line = f"{m['key']}{json.dumps(target)}\n"
        out.append(line)
    return "".join(out)


def write_examples(dest: Path, force: bool = False) -> list[Path]:
    """Write every example into dest; refuse (before writing anything) to overwrite a file."""
    files = example_files()
    targets = [dest / rel for rel in files]
    if not force:
        for target in targets:
            try:
                taken = target.exists() or target.is_symlink()
            except OSError as exc:   # a name too long for the filesystem, a folder not to be entered
                raise UserError(f"cannot write {target}: {exc.strerror or exc}", field="DIR",
                                hint="choose a folder you can write to") from None
            if taken:
                raise UserError(f"{target} already exists", field="DIR",
                                hint="choose another folder or pass --force to overwrite")
    written = []
    for rel, target in zip(files, targets):
        source = examples_root() / rel
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink():
                target.unlink()  # --force replaces a link, never writes through it
            target.write_text(relocated(source.read_text(), rel))
        except OSError as exc:
            raise UserError(f"cannot write {target}: {exc.strerror or exc}", field="DIR",
                            hint="choose a folder you can write to") from None
        written.append(target)
    return written


@cli.command("examples")
@click.argument("dest", metavar="[DIR]", default="configs", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Overwrite example files that already exist in DIR.")
@click.option("--json", "as_json", is_flag=True, help="Print {files: [paths written]} as JSON.")
def examples_cmd(dest: str, force: bool, as_json: bool) -> None:
    """Write the example cluster and model specs into a folder (default: ./configs).

    The `--help` examples of every command use these files (configs/clusters/*.yaml,
    configs/models/*.yaml). Edit them for your cluster and model.

    \b
    Example:
      ftcluster examples && ftcluster plan --cluster configs/clusters/pyxis.yaml \\
          --model configs/models/gpt.yaml --nodes 2
    """
    if not dest.strip():
        raise UserError("an empty path", field="DIR", hint="name a folder, or leave DIR out for ./configs")
    refuse_dangling_link(Path(dest), "DIR")
    written = write_examples(Path(dest), force)
    if as_json:
        echo_json(document("examples", {"files": [str(p) for p in written]}))
        return
    for path in written:
        click.echo(str(path))
