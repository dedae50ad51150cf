"""Printing for the CLI: JSON (shapes in ftcluster.observe.documents), tables that never cut values.

Light on purpose (no rich at import): `list`, `status` and `logs` import it at start-up.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


# Whether this process printed its JSON result: an error raised after it (the exit code of a
# launch that failed) adds no second object (ftcluster.cli.fail).
JSON_SAID: list[bool] = []


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
    JSON_SAID.append(True)


def console(stderr: bool = False) -> Console:
    """A rich Console; off a terminal (piped, redirected) lines are as long as their values."""
    # startup: rich (~30 ms) only when something is printed with it; `list --json`, `status --json` never load it
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr, highlight=False)
    return Console(stderr=stderr, highlight=False, width=100_000, soft_wrap=False)


def table(title: str | None = None, columns: tuple[str, ...] = (), show_header: bool = True) -> Table:
    """A table whose cells are never wrapped or cut where the console is wide enough."""
    # startup: rich only when a table is printed
    from rich.table import Table

    # NO_COLOR (no-color.org) asks for no styling at all: rich drops colours but keeps a title's italics.
    plain = bool(os.environ.get("NO_COLOR"))
    t = Table(title=title, show_header=show_header and bool(columns))
    if plain:
        t.title_style = t.header_style = "none"
    for col in columns or ("key", "value"):
        t.add_column(col, overflow="fold")
    return t


def cell(value: Any) -> Any:
    """A table cell shown as is (no rich markup: paths may hold '[')."""
    # startup: rich only when a table is printed
    from rich.text import Text

    return Text("" if value is None else str(value))


def complete_run(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Shell completion of a RUN argument: the recorded run ids, newest first (the store only;
    no scheduler is asked at a TAB)."""
    # startup: completion's code and the run store only at a TAB
    from click.shell_completion import CompletionItem

    from ftcluster.run.store import RunStore

    try:
        runs = list(RunStore().all())
    except Exception:  # noqa: BLE001  (a TAB never shows a traceback)
        return []
    return [CompletionItem(r.run_id, help=r.status) for r in reversed(runs) if r.run_id.startswith(incomplete)]
