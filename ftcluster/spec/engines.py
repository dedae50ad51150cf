"""The engines a model spec can name in `backend`, and where each one's code lives: the built-in
ones, and those another installed package adds through the `ftcluster.engines` entry-point group
(a name and "module:attribute", as console scripts are declared). An engine is loaded by its
name when a spec names it: nothing here imports an engine's code up front, and the spec layer
never imports the engines' (ftcluster.engines, above it)."""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING, Any

from ftcluster.errors import UserError

if TYPE_CHECKING:
    from ftcluster.spec.model import ModelSpec

DEFAULT = "fastertransformer"
BUILT_IN: dict[str, str] = {
    DEFAULT: "ftcluster.engines.fastertransformer:ENGINE",
}
GROUP = "ftcluster.engines"


@cache
def _installed() -> dict[str, str]:
    """The engines other packages declare (read once: it scans every installed package)."""
    # startup: importlib.metadata reads every installed package: only when a spec names no built-in engine
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=GROUP) if ep.name not in BUILT_IN}


def engine_names() -> tuple[str, ...]:
    return (*BUILT_IN, *sorted(_installed()))


def engine_named(name: str) -> Any:
    """The engine object (ftcluster.engines.base.Engine) a spec's `backend` names."""
    where = BUILT_IN.get(name) or _installed().get(name)
    if where is None:
        raise UserError(f"no engine is named {name!r}", field="backend",
                        hint=f"use one of: {', '.join(engine_names())} (or install the package that adds it)")
    module, _, attribute = where.partition(":")
    return getattr(importlib.import_module(module), attribute)


def model_spec_class(name: str) -> type[ModelSpec]:
    """The model spec of the engine `name` (its own fields after the shared ones)."""
    spec: type[ModelSpec] = engine_named(name).spec
    return spec
