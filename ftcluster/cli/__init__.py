"""The `ftcluster` command line: thin click commands over the library.

Commands live in their own modules and register themselves on `cli` when imported. The group
imports a command's module only when that command runs (or its own --help is asked for): the
listing in `ftcluster --help` and shell completion of command names come from the static table
below, so `--help`, `--version`, `list`, `status` and `logs` start without loading specs
(pydantic), templates (jinja2), the Triton client or numpy. tests/unit/test_cli_lazy.py checks
that the table matches the real commands.

`main` maps every outcome to one exit code (see EXIT_CODES) and prints user errors as one line.
"""

from __future__ import annotations

import atexit
import importlib
import os
import signal
import sys
import threading
from typing import Any, NoReturn

import click

from ftcluster import __version__
from ftcluster.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, EXIT_USER, UserError

# name -> (module under ftcluster.cli, one-line help as the command's docstring starts).
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("commands_plan", "Check and print the parallel plan for a cluster, a model and a node count."),
    "prepare": ("commands_plan", "Write the per-run model repository (config.pbtxt set for the plan) to --out."),
    "render": ("commands_plan", "Write launch scripts a person can read, edit and submit by hand."),
    "launch": ("commands_launch", "Plan, prepare, submit, wait for rank 0, run the client, report and clean up."),
    "status": ("commands_runs", "Queue state, per-rank state and endpoint of a run (default: the newest)."),
    "stop": ("commands_runs", "Cancel a run's job and stop its servers (RUN left out: the newest run, once confirmed)."),
    "scale": ("commands_replicas", "Change a replica set's number of members while it serves."),
    "restart": ("commands_replicas", "Restart a replica set one member at a time, optionally with a new model or image."),
    "top": ("commands_top", "A serving run's requests/s, latency (mean, p50, p99), queue, GPUs, health and restarts, refreshed (default: the newest run)."),
    "report": ("commands_report", "A service's history from its samples: throughput, latency, GPUs, restarts, outages (default: the newest run)."),
    "token": ("commands_runs", "Print a private run's token, which its clients send (default: the newest run)."),
    "tunnel": ("commands_tunnel", "Forward a local port through the login node to a run's endpoint (default: the newest run)."),
    "list": ("commands_runs", "Runs recorded in the local store, newest last, with the state now of those whose job may live."),
    "prune": ("commands_runs", "Remove ended runs older than N days: their run folders and records."),
    "logs": ("commands_logs", "Server logs (per rank) and the client log of a run (default: the newest run)."),
    "check": ("commands_check",
              "Run only the MPI world check (ranks, hosts, binaries, ring, allreduce) on N nodes."),
    "preflight": ("commands_preflight", "Check every node's GPUs and the NCCL all-reduce bandwidth between them."),
    "client": ("commands_client", "Test, benchmark and run prompts through a model served by Triton."),
    "compose": ("commands_serve",
                "Write docker-compose.yml + .env serving one node (pp = 1) as a restartable service."),
    "serve": ("commands_serve",
              "Start one node as a container through the Docker SDK and wait until the model is ready."),
    "down": ("commands_serve", "Stop and remove a service started by `ftcluster serve`."),
    "gateway": ("commands_gateway", "Serve a JSON generation API (OpenAPI docs at /docs) in front of Triton."),
    "image": ("commands_image", "Build an engine's serving image (Triton with its backend), push it, import it for Enroot/Pyxis."),
    "convert": ("commands_convert",
                "Convert weights with the engine's converter for the model, for tensor_para_size GPUs."),
    "check-checkpoint": ("commands_convert",
                         "Check <checkpoint_root>/<gpus>-gpu/: config.ini fields, every shard, every file size."),
    "config": ("commands_config", "Show or set the cluster and model spec used when --cluster/--model are left out."),
    "examples": ("commands_examples", "Write the example cluster and model specs into a folder (default: ./configs)."),
}

EXIT_CODES_HELP = f"""\b
Exit codes:
  0    ok
  {EXIT_FAILED}    a launch, job or client run failed
  {EXIT_USAGE}    usage error (unknown option, missing argument)
  {EXIT_USER}    user error: a bad spec or a refused plan (one line naming the field)
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C)"""


# Commands for ftcluster's own use, not listed: name -> module. `successor` is run by a serving
# job before its time limit.
HIDDEN_COMMANDS: dict[str, str] = {"successor": "commands_launch"}


class GatheringCommand(click.Command):
    """A command that says every bad option at once: click stops at the first value it cannot
    convert; here each parameter's failure is kept and the rest are still read."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        bad: list[click.BadParameter] = []
        params = self.get_params(ctx)

        def keeping(handle: Any) -> Any:
            def handle_parse_result(ctx: click.Context, opts: Any, args: list[str]) -> Any:
                try:
                    return handle(ctx, opts, args)
                except click.BadParameter as exc:   # MissingParameter too
                    bad.append(exc)
                    return None, args
            return handle_parse_result

        for p in params:
            p.handle_parse_result = keeping(p.handle_parse_result)  # type: ignore[method-assign]
        try:
            rest = super().parse_args(ctx, args)
        finally:
            for p in params:
                del p.handle_parse_result   # the class's method again
        if len(bad) == 1:
            raise bad[0]
        if bad:
            raise click.UsageError("; ".join(e.format_message() for e in bad), ctx)
        return rest


class GatheringGroup(click.Group):
    command_class = GatheringCommand


GatheringGroup.group_class = GatheringGroup


class LazyGroup(click.Group):
    """A group whose commands are imported on first use, listed from COMMANDS until then."""

    command_class = GatheringCommand
    group_class = GatheringGroup

    def list_commands(self, ctx: click.Context) -> list[str]:
        # A hidden command already imported (its module holds listed ones too) stays unlisted.
        return sorted({n for n, c in self.commands.items() if not c.hidden} | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and (cmd_name in COMMANDS or cmd_name in HIDDEN_COMMANDS):
            load(cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, _shorten(self._short_help(n), limit)) for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[Any]:
        # Command names from the table: a TAB after `ftcluster ` imports no command module.
        from click.shell_completion import CompletionItem

        items = [CompletionItem(n, help=self._short_help(n)) for n in self.list_commands(ctx)
                 if n.startswith(incomplete)]
        return items + click.Command.shell_complete(self, ctx, incomplete)

    def _short_help(self, name: str) -> str:
        if name in COMMANDS:
            return COMMANDS[name][1]
        return self.commands[name].get_short_help_str(limit=200)


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: max(limit - 3, 1)].rsplit(" ", 1)[0].rstrip(",;:") + "..."


def load(name: str) -> None:
    """Import the module that registers command `name` on `cli`."""
    module = f"ftcluster.cli.{COMMANDS[name][0] if name in COMMANDS else HIDDEN_COMMANDS[name]}"
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:  # a command module left out of this build
            return
        raise


@click.group(cls=LazyGroup, epilog=EXIT_CODES_HELP,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ftcluster")
def cli() -> None:
    """Serve a model with Triton Inference Server and its engine across Slurm nodes.

    The examples use the specs that `ftcluster examples` writes into ./configs.

    \b
    Example:
      ftcluster examples && ftcluster launch --cluster configs/clusters/local.yaml \\
          --model configs/models/demo.yaml --nodes 2
    """


# The arguments of this invocation, for commands that pass themselves on to a login node.
ARGV: list[str] = []


def _terminated(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def entry(argv: list[str] | None = None) -> NoReturn:
    """The `ftcluster` command (and `python -m ftcluster`): main(), then the process ends.

    SIGTERM (kill, `timeout`, a CI runner's cancel) is taken as Ctrl-C is, as srun takes it: an
    attached launch cancels its job and cleans up instead of leaving it to run unwatched."""
    signal.signal(signal.SIGTERM, _terminated)
    try:
        main(argv)
        code: str | int | None = 0
    except SystemExit as exc:
        code = exc.code
    _exit(code)


def _exit(code: str | int | None) -> NoReturn:
    """End the process without the interpreter's teardown, which frees every module and object
    the process is about to drop anyway: 0.03 s of a `status`, 0.1 s of a `launch` on the test
    machine. What an exit must still do is done: the atexit functions (finalizers included),
    the standard streams flushed, a message code printed as sys.exit prints it. A command that
    left threads running ends as Python ends it (they are waited for)."""
    if threading.active_count() > 1:
        sys.exit(code)
    atexit._run_exitfuncs()
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed pipe, a closed stream: nothing more to say
            pass
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI and exit with one of the documented codes (EXIT_CODES_HELP): SystemExit, or
    a return for 0 (in-process callers, tests, keep their process)."""
    ARGV[:] = list(sys.argv[1:] if argv is None else argv)
    try:
        rv = cli.main(args=argv, prog_name="ftcluster", standalone_mode=False)
    except UserError as exc:
        fail(f"error: {exc}", exc.exit_code, exc.message, exc.field, exc.hint)
    except click.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `ftcluster`: the help, as click does
            click.echo(exc.format_message(), err=True)
            sys.exit(EXIT_USAGE)
        # One line, like every other user error.
        cmd = exc.ctx.command_path if exc.ctx else "ftcluster"
        fail(f"error: {exc.format_message()} (see `{cmd} --help`)", EXIT_USAGE, exc.format_message())
    except click.exceptions.Abort:
        fail("interrupted", EXIT_INTERRUPTED, "interrupted")
    except click.ClickException as exc:
        # click's own non-usage errors (an unreadable file given to an option) are user errors.
        fail(f"error: {exc.format_message()}", EXIT_USER, exc.format_message())
    except KeyboardInterrupt:
        fail("interrupted", EXIT_INTERRUPTED, "interrupted")
    if isinstance(rv, int) and rv:
        sys.exit(rv)


def json_asked() -> bool:
    """Whether this invocation asked for JSON (--json before any `--`)."""
    return "--json" in (ARGV[:ARGV.index("--")] if "--" in ARGV else ARGV)


def fail(line: str, code: int, message: str, field: str | None = None, hint: str | None = None) -> NoReturn:
    """End with an error: its line on stderr; under --json also an `error` object on stdout,
    where a program reading the JSON looks (docs/reference.md, "JSON output"), unless the command printed
    its own object already (a failed launch's). One line: JSON Lines readers (`logs --json`) too."""
    click.echo(line, err=True)
    # import cycle: ftcluster.cli.output imports this package
    from ftcluster.cli.output import JSON_SAID

    if json_asked() and not JSON_SAID:
        # startup: only an error under --json needs these
        import json

        from ftcluster.observe.documents import document

        click.echo(json.dumps(document("error", {"error": line.removeprefix("error: "), "message": message,
                                                 "field": field, "hint": hint, "exit_code": code}), sort_keys=True))
    sys.exit(code)
