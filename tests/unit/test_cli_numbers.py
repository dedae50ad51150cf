"""Every number a command takes is finite and bounded: inf, nan, 1e400, 10**30 and negatives
are refused in one line naming the option (click's usage error, or the planner's own check of
the plan's sizes), never by a traceback deep in a timer or an int(). Found by walking the real
command tree, so a new option is covered."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from ftcluster.cli import COMMANDS, HIDDEN_COMMANDS, cli, load, main
from ftcluster.cli.numbers import Finite


HOSTILE = ("inf", "-inf", "nan", "1e400", "-1", "0", "1" + "0" * 30)
# Sizes whose lower end the planner checks itself, naming --tp and --pp together.
PLANNED = {"nodes", "gpus_per_node", "tp", "pp"}


def _numeric_options() -> Iterator[tuple[tuple[str, ...], click.Option, click.Command]]:
    for name in sorted(COMMANDS) + sorted(HIDDEN_COMMANDS):
        load(name)
    todo: list[tuple[tuple[str, ...], click.Command]] = [((n,), c) for n, c in sorted(cli.commands.items())]
    while todo:
        path, cmd = todo.pop()
        if isinstance(cmd, click.Group):
            todo.extend((path + (n,), c) for n, c in sorted(cmd.commands.items()))
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.is_flag and \
                    isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType, Finite)):
                yield path, p, cmd


OPTIONS = list(_numeric_options())
IDS = [f"{' '.join(p)} {o.opts[0]}" for p, o, _ in OPTIONS]


def test_numbers_are_found() -> None:
    names = {(path, p.opts[0]) for path, p, _ in OPTIONS}
    assert (("preflight",), "--timeout") in names and (("client", "bench"), "--stability") in names
    assert (("plan",), "--tp") in names and len(OPTIONS) >= 30


@pytest.mark.parametrize("path,opt,cmd", OPTIONS, ids=IDS)
def test_every_number_is_bounded(path: tuple[str, ...], opt: click.Option, cmd: click.Command) -> None:
    # A bare int or float lets 10**30, inf or nan through; IntRange and Finite carry both ends.
    assert isinstance(opt.type, (click.IntRange, Finite)), f"{opt.opts[0]} is a bare {opt.type.name}"
    if isinstance(opt.type, click.IntRange):
        assert opt.type.max is not None and (opt.type.min is not None or opt.name in PLANNED)


@pytest.mark.parametrize("path,opt,cmd", OPTIONS, ids=IDS)
def test_hostile_numbers_are_refused_in_one_line_naming_the_option(path: tuple[str, ...], opt: click.Option,
                                                                   cmd: click.Command, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # The command's other required options, so that a check of the command's own (the planner's)
    # is reached; nothing is written: the number is refused first.
    required = [a for p in cmd.params if isinstance(p, click.Option) and p.required and p is not opt
                for a in (p.opts[0], str(tmp_path / "unused" / str(p.name)))]
    for value in HOSTILE:
        if value == "0" and (isinstance(opt.type, click.IntRange) and opt.type.min == 0 or
                             isinstance(opt.type, Finite) and not opt.type.low_open):
            continue   # 0 is a fine count of restarts, a rank, a warm-up
        with pytest.raises(SystemExit) as ended:
            main([*path, opt.opts[0], value, *required])
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert ended.value.code in (2, 3) and len(lines) == 1 and "Traceback" not in err, (value, err)
        assert opt.opts[0] in lines[0] and lines[0].startswith("error:"), (value, err)
    assert not (tmp_path / "unused").exists()
