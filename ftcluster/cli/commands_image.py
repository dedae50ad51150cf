"""`image build` and `image import`: an engine's serving image (Triton with the engine's backend)
for a cluster. What is built is the engine's (Engine.image); its words in the help are too."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from ftcluster.service import image as img
from ftcluster.cli import cli
from ftcluster.cli.options import echo_json
from ftcluster.cli.words import DockerRef
from ftcluster.errors import UserError
from ftcluster.observe.documents import document
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.spec.defaults import default_cluster_path
from ftcluster.spec.engines import default_engine
from ftcluster.spec.load import load_cluster

# The default engine's recipe, for the help (another engine's is named by --engine).
_ENGINE, _RECIPE = img.engine_recipe()


def _cluster(path: str | None) -> ClusterSpec:
    return load_cluster(path or default_cluster_path())


@cli.group("image")
def image_group() -> None:
    """Build an engine's serving image (Triton with its backend), push it, import it for Enroot/Pyxis."""


@image_group.command("build")
@click.option("--cluster", "cluster_path", type=click.Path(dir_okay=False), help="Cluster spec YAML.")
@click.option("--engine", "engine_name", default=None, metavar="NAME",
              help=f"The engine whose image to build (a model spec's backend) [default: {default_engine()}].")
# --ft-backend: its first spelling, kept for the scripts that use it.
@click.option("--source", "--ft-backend", "source", required=True, type=click.Path(file_okay=False, exists=True),
              help=f"The source tree the engine's image is built from ({_ENGINE.name}: {_RECIPE.source}).")
@click.option("--triton-version", default=None, type=DockerRef(),
              help=f"The Triton release, build arg {_RECIPE.version_arg} (default: image.triton_version, 22.12).")
@click.option("--tag", default=None, type=DockerRef(), help="Image tag (default: image.tag or container.image of the spec).")
@click.option("--push", is_flag=True, help="Push to image.registry of the spec after the build.")
@click.option("--network", default=None, help="Network mode of RUN steps (e.g. host).")
@click.option("--json", "as_json", is_flag=True, help="Print the recorded metadata as JSON.")
def build_cmd(cluster_path: str | None, engine_name: str | None, source: str, triton_version: str | None,
              tag: str | None, push: bool, network: str | None, as_json: bool) -> None:
    """Build the engine's serving image from its source tree (--source) with the Docker SDK.

    Runs the engine's Dockerfile in the source tree, the Triton release as its build arg, on the
    daemon DOCKER_HOST names. Records the image id and the release in <workspace>/images/<tag>.json.

    \b
    Example:
      ftcluster image build --cluster configs/clusters/pyxis.yaml --source ~/src/backend \\
          --triton-version 22.12 --push
    """
    cluster = _cluster(cluster_path)
    _, recipe = img.engine_recipe(engine_name)
    version = triton_version or cluster.image.triton_version
    name = img.image_tag(cluster, tag, version, recipe)
    backend = Path(source).expanduser()
    img.check_source(recipe, backend)
    if push and not cluster.image.registry:
        raise UserError("--push needs image.registry in the cluster spec", field="image.registry",
                        hint="e.g. image: {registry: registry.example.com/team}")
    console = Console(stderr=True)
    client = img.docker_client()
    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task(f"building {name}", total=None)

        def on_event(ev: img.BuildEvent) -> None:
            if ev.kind == "step":
                progress.update(task, total=ev.steps, completed=ev.step - 1,
                                description=f"step {ev.step}/{ev.steps}: {ev.text[:60]}")
                progress.console.print(f"[cyan]Step {ev.step}/{ev.steps}[/] : {escape(ev.text)}")
            else:
                progress.console.print(f"  {escape(ev.text)}", highlight=False)

        image_id = img.build_image(client, recipe, backend, name, version, on_event, network_mode=network)
        progress.update(task, completed=progress.tasks[0].total or 1)
        pushed = None
        if push:
            assert cluster.image.registry
            progress.update(task, description=f"pushing to {cluster.image.registry}", total=None)
            pushed = img.push_image(client, name, cluster.image.registry,
                                    lambda line: progress.console.print(f"  {escape(line)}", highlight=False))
    meta_path = img.record_build(cluster, name, image_id, version, backend, pushed)
    if as_json:
        echo_json(img.image_metadata(cluster, name).to_dict())  # type: ignore[union-attr]
        return
    click.echo(f"built {name} ({image_id[:19]}) {recipe.version_arg}={version}"
               + (f"; pushed {pushed}" if pushed else "") + f"; recorded in {meta_path}")


@image_group.command("import")
@click.option("--cluster", "cluster_path", type=click.Path(dir_okay=False), help="Cluster spec YAML.")
@click.option("--engine", "engine_name", default=None, metavar="NAME",
              help=f"The engine whose image it is, for the default tag [default: {default_engine()}].")
@click.option("--tag", default=None, type=DockerRef(), help="Image to import (default: the spec's image tag).")
@click.option("--dry-run", is_flag=True, help="Write the import script and print the command; run nothing.")
@click.option("--force", is_flag=True, help="Replace an existing .sqsh file.")
@click.option("--json", "as_json", is_flag=True,
              help="Print {image, sqsh, script, command, imported} as JSON (imported: false for --dry-run).")
def import_cmd(cluster_path: str | None, engine_name: str | None, tag: str | None, dry_run: bool, force: bool,
               as_json: bool) -> None:
    """Import the built image from the local Docker daemon as an Enroot .sqsh for Pyxis.

    Writes <workspace>/images/import-<tag>.sh (enroot import -o <sqsh> dockerd://<tag>) and runs it.
    The .sqsh path is image.sqsh, else container.image when it ends in .sqsh.

    \b
    Example:
      ftcluster image import --cluster configs/clusters/pyxis.yaml --dry-run
    """
    cluster = _cluster(cluster_path)
    name = img.image_tag(cluster, tag, recipe=img.engine_recipe(engine_name)[1])
    sqsh = img.sqsh_path(cluster, name)
    script = img.write_import_script(cluster, name, sqsh)

    def said(imported: bool) -> None:
        echo_json(document("image_import", {"image": name, "sqsh": str(sqsh), "script": str(script),
                                            "command": img.enroot_argv(name, sqsh), "imported": imported}))

    if dry_run:
        if as_json:
            said(False)
            return
        click.echo(f"# {script}")
        click.echo(shlex.join(img.enroot_argv(name, sqsh)))
        return
    img.run_import(cluster, name, sqsh, script, force)
    if as_json:
        said(True)
    else:
        click.echo(f"imported {name} -> {sqsh} (use container.image: {sqsh})")
