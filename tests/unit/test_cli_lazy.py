"""The CLI's start-up: commands imported on demand, the static table, shell completion."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import click

from ftcluster.cli import COMMANDS, HIDDEN_COMMANDS, cli, load

HEAVY = ("pydantic", "jinja2", "tritonclient", "docker", "fabric", "numpy", "submitit", "rich",
         "ftcluster.spec.base", "ftcluster.spec.cluster", "ftcluster.spec.model", "ftcluster.spec.load",
         "ftcluster.render.scripts")


def _modules_after(args: list[str], env: dict[str, str] | None = None) -> tuple[int, set[str], str]:
    """Run `ftcluster ARGS` in a fresh interpreter; the exit code and the modules it imported."""
    code = ("import sys, json, atexit\n"
            "atexit.register(lambda: sys.__stderr__.write('MODS' + json.dumps(sorted(sys.modules))))\n"
            "from ftcluster.cli import main\n"
            f"main({args!r})\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **(env or {})}, check=False)
    mods = set(json.loads(p.stderr.rsplit("MODS", 1)[1]))
    return p.returncode, mods, p.stdout


def test_table_matches_the_real_commands() -> None:
    for name in COMMANDS:
        load(name)
    # Every module's commands are in the table (or the hidden one), with the help their
    # docstring starts with.
    assert set(cli.commands) == set(COMMANDS) | set(HIDDEN_COMMANDS)
    for name in HIDDEN_COMMANDS:
        assert cli.commands[name].hidden and HIDDEN_COMMANDS[name] == cli.commands[name].callback.__module__.rsplit(".", 1)[1]
    for name, cmd in cli.commands.items():
        if name in HIDDEN_COMMANDS:
            continue
        module, short = COMMANDS[name]
        assert cmd.get_short_help_str(limit=500) == short, name
        assert importlib.import_module(f"ftcluster.cli.{module}")  # the table names its module
        assert cmd.callback is not None
        owner = sys.modules[f"ftcluster.cli.{module}"]
        assert any(getattr(owner, attr) is cmd for attr in dir(owner)), f"{name} is not in {module}"


def test_a_hidden_command_stays_unlisted_once_its_module_is_imported() -> None:
    # Its module also holds listed commands (`launch`): importing it for them must not list it.
    for name in HIDDEN_COMMANDS:
        load(name)
        ctx = click.Context(cli)
        assert name not in cli.list_commands(ctx) and f"  {name} " not in cli.get_help(ctx)


def test_help_lists_every_command_without_importing_them() -> None:
    rc, mods, out = _modules_after(["--help"])
    assert rc == 0
    for name in COMMANDS:
        assert f"  {name} " in out
    assert not [m for m in mods if m.startswith("ftcluster.cli.commands_")]
    assert not [m for m in HEAVY if m in mods]


def test_version_and_list_import_nothing_heavy(tmp_path: Path) -> None:
    rc, mods, out = _modules_after(["--version"])
    assert rc == 0 and "0.1.0" in out and not [m for m in HEAVY if m in mods]
    rc, mods, _ = _modules_after(["list", "--json"], env={"FTCLUSTER_STATE_DIR": str(tmp_path)})
    assert rc == 0 and not [m for m in HEAVY if m in mods]


def test_a_command_imports_its_module_only() -> None:
    rc, mods, out = _modules_after(["examples", "--help"])
    assert rc == 0 and "--force" in out
    assert "ftcluster.cli.commands_examples" in mods and "ftcluster.cli.commands_launch" not in mods


def test_completion_script_and_command_names() -> None:
    env = {**os.environ, "_FTCLUSTER_COMPLETE": "bash_source"}
    p = subprocess.run([sys.executable, "-m", "ftcluster"], capture_output=True, text=True, env=env,
                       timeout=60, check=False)
    assert p.returncode == 0 and "_ftcluster_completion" in p.stdout and "complete -o" in p.stdout
    # What the script asks at a TAB: the names come from the table, no command module is imported.
    env = {"_FTCLUSTER_COMPLETE": "bash_complete", "COMP_WORDS": "ftcluster st", "COMP_CWORD": "1"}
    rc, mods, out = _modules_after([], env=env)
    assert rc == 0
    assert out.split() == ["plain,status", "plain,stop"]
    assert not [m for m in mods if m.startswith("ftcluster.cli.commands_")]
    # Options of a lazily loaded command complete too.
    env = {"_FTCLUSTER_COMPLETE": "bash_complete", "COMP_WORDS": "ftcluster examples --f", "COMP_CWORD": "2"}
    rc, mods, out = _modules_after([], env=env)
    assert rc == 0 and "plain,--force" in out.split()


def test_group_help_of_a_subgroup_still_works() -> None:
    load("image")
    group = cli.commands["image"]
    assert isinstance(group, click.Group) and {"build", "import"} <= set(group.commands)


def test_the_command_ends_without_teardown_yet_as_an_exit_does(tmp_path: Path) -> None:
    """`ftcluster` (entry) ends with os._exit, past the interpreter's teardown: the exit code, a
    whole output through a pipe and the atexit functions are as sys.exit leaves them."""
    env = {**os.environ, "FTCLUSTER_STATE_DIR": str(tmp_path / "state")}
    code = ("import atexit, sys\n"
            "atexit.register(lambda: sys.stderr.write('ATEXIT RAN\\n'))\n"
            "from ftcluster.cli import entry\n"
            "entry(sys.argv[1:])\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                              env=env, check=False)

    ok = run("list", "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout) == [] and "ATEXIT RAN" in ok.stderr
    missing = run("status", "no-such-run")
    assert missing.returncode == 3 and missing.stderr.startswith("error: no run") and "ATEXIT RAN" in missing.stderr
    usage = run("no-such-command")
    assert usage.returncode == 2 and "ATEXIT RAN" in usage.stderr
    big = run("--help")
    assert big.returncode == 0 and big.stdout.rstrip().endswith(cli.get_help(click.Context(cli)).rstrip().splitlines()[-1])
