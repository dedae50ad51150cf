"""The `ftcluster` command line: thin click commands over the library.

Each command group lives in its own module and registers itself on `cli`.
`main` turns `UserError` into one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import sys

import click

from ftcluster.errors import UserError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="ftcluster")
def cli() -> None:
    """Serve a model with Triton Inference Server + FasterTransformer across Slurm nodes.

    \b
    Example:
      ftcluster launch --cluster configs/clusters/local.yaml --model configs/models/demo.yaml --nodes 2
    """


def _register() -> None:
    # Imported for their side effect of adding commands to `cli`.
    from ftcluster.cli import commands_plan  # noqa: F401
    import importlib

    for name in ("commands_launch", "commands_client", "commands_preflight", "commands_logs", "commands_check",
                 "commands_serve", "commands_gateway", "commands_image", "commands_convert"):
        try:
            importlib.import_module(f"ftcluster.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"ftcluster.cli.{name}":
                raise


# The arguments of this invocation, for commands that pass themselves on to a login node.
ARGV: list[str] = []


def main(argv: list[str] | None = None) -> None:
    ARGV[:] = list(sys.argv[1:] if argv is None else argv)
    _register()
    try:
        rv = cli.main(args=argv, prog_name="ftcluster", standalone_mode=False)
        if isinstance(rv, int) and rv:
            sys.exit(rv)
    except UserError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        # One line, like every other user error.
        cmd = exc.ctx.command_path if exc.ctx else "ftcluster"
        click.echo(f"error: {exc.format_message()} (see `{cmd} --help`)", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
