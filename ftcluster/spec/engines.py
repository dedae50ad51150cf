"""The engines a model spec can name in `backend`, and where each one's code lives: the built-in
ones (their table is ftcluster.engines.built_in's), and those another installed package adds
through the `ftcluster.engines` entry-point group (a name and "module:attribute", as console
scripts are declared). An engine is loaded by its name when a spec names it: nothing here
imports an engine's code up front, and the spec layer never imports the engines' (ftcluster.engines,
above it) but by the names it is given."""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING, Any

from ftcluster.errors import UserError

if TYPE_CHECKING:
    from ftcluster.spec.model import ModelSpec

GROUP = "ftcluster.engines"
# The built-in engines' table, and the default engine's name, live with the engines (only
# ftcluster/engines/ names one): read by this name when first asked, after every module has
# loaded (the engines' package imports the plan's, which imports the specs).
_TABLE = "ftcluster.engines.built_in"


@cache
def _built_in() -> tuple[str, dict[str, str]]:
    table = importlib.import_module(_TABLE)
    return table.DEFAULT, dict(table.BUILT_IN)


def default_engine() -> str:
    """The engine a model spec without `backend` is served by."""
    return _built_in()[0]


def built_in() -> dict[str, str]:
    """The built-in engines: name -> "module:attribute"."""
    return _built_in()[1]


@cache
def _installed() -> dict[str, str]:
    """The engines other packages declare (read once: it scans every installed package)."""
    # startup: importlib.metadata reads every installed package: only when a spec names no built-in engine
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=GROUP) if ep.name not in built_in()}


def engine_names() -> tuple[str, ...]:
    return (*built_in(), *sorted(_installed()))


def engine_named(name: str) -> Any:
    """The engine object (ftcluster.engines.base.Engine) a spec's `backend` names."""
    where = built_in().get(name) or _installed().get(name)
    if where is None:
        raise UserError(f"no engine is named {name!r}", field="backend",
                        hint=f"use one of: {', '.join(engine_names())} (or install the package that adds it)")
    module, _, attribute = where.partition(":")
    return getattr(importlib.import_module(module), attribute)


def model_spec_class(name: str) -> type[ModelSpec]:
    """The model spec of the engine `name` (its own fields after the shared ones)."""
    spec: type[ModelSpec] = engine_named(name).spec
    return spec
