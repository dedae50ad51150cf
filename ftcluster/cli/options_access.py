"""The options that reach a recorded or private run, written once for every command that talks
to an endpoint (the clients, the gateway)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def token_options(url_option: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--run RUN (instead of `url_option`), --token-file and --token/$FTCLUSTER_TOKEN: a token
    on the command line shows in `ps`, so the file or the variable come first in the help."""
    opts = [
        click.option("--run", "run_ref", default=None, metavar="RUN",
                     help=f"A recorded run instead of {url_option}: its endpoint, and its token if it is private."),
        click.option("--token-file", type=click.Path(dir_okay=False), default=None,
                     help="A private run's token, read from this file (`ftcluster token RUN > FILE`)."),
        click.option("--token", envvar="FTCLUSTER_TOKEN", default=None, show_envvar=True,
                     help="A private run's token (visible in `ps`: prefer the variable or --token-file)."),
        click.option("--ca", type=click.Path(dir_okay=False), default=None,
                     help="TLS (as an https:// or grpcs:// endpoint asks): trust this certificate besides the "
                          "system's. --run trusts the run's own proxy.tls_cert."),
    ]

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for opt in reversed(opts):
            fn = opt(fn)
        return fn
    return decorate
