"""What every spec model shares: the strict base class (unknown keys refused, numbers finite, a
boolean never taken for a number, every string visible text), the check it runs on every value,
the name rule that the cluster and the model spec both apply, and the switch that keeps pydantic
from looking for plugins while the spec models are built (ftcluster.spec.cluster and
ftcluster.spec.model turn the lookup off around their own models)."""

from __future__ import annotations

import os
import re
from typing import Any, ClassVar, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from ftcluster.spec.errors import cut
from ftcluster.spec.plaintext import MULTI_LINE, not_text

# A name in a spec (the cluster's, the model's, an MPI plugin's): it names jobs, folders and
# Triton models.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


# pydantic looks for third-party plugins (every installed distribution's entry points) as it
# builds each model: 5-25 ms of every command's start-up, growing with the environment, for
# validation hooks that the spec models never use. Off while they are built (each module of spec
# models calls plugin_lookup_off before its first and plugin_lookup_back after its last), then as
# it was, so that nothing this process starts (the job, the user's model code in the python
# backend) inherits the setting.
_PLUGINS_VAR = "PYDANTIC_DISABLE_PLUGINS"


def plugin_lookup_off() -> str | None:
    """pydantic's plugin lookup off, unless the user set the variable; what it was, for
    plugin_lookup_back."""
    was = os.environ.get(_PLUGINS_VAR)
    os.environ.setdefault(_PLUGINS_VAR, "__all__")
    return was


def plugin_lookup_back(was: str | None) -> None:
    """The variable as it was before plugin_lookup_off (`was`: what that returned)."""
    if was is None:
        os.environ.pop(_PLUGINS_VAR, None)


_PLUGINS_WERE = plugin_lookup_off()


class SpecModel(BaseModel):
    """Every spec object: unknown keys refused, numbers finite (no .inf or .nan), a boolean never
    taken for a number, and no string holding what is not visible text (ftcluster.spec.plaintext: a
    NUL, an escape sequence for the terminal, a newline or U+2028 that a script, a regex or
    str.splitlines would split on, a lone surrogate no path can hold)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    # Mappings whose values are text that scripts carry as quoted data (the env: a certificate
    # spans lines): a newline, tab or CR is kept there (the Docker sshd path refuses them itself).
    _TEXT_VALUES: ClassVar[frozenset[str]] = frozenset({"env"})

    @field_validator("*", mode="before")
    @classmethod
    def _plain_values(cls, v: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        kinds = annotation_kinds(field.annotation) if field is not None else set()
        if isinstance(v, bool) and bool not in kinds and kinds & {int, float}:
            raise ValueError(f"expected a number, got {v!r}")
        # A spec object checks its own fields, which then name themselves in the error.
        if any(isinstance(k, type) and issubclass(k, SpecModel) for k in kinds):
            return v
        bad = _control_in(v, text=info.field_name in cls._TEXT_VALUES)
        if bad is not None:
            raise ValueError(f"{bad} (no spec string may hold one): write the value without it")
        return v


plugin_lookup_back(_PLUGINS_WERE)


def annotation_kinds(annotation: Any) -> set[Any]:
    """The plain types an annotation admits (Optional, unions and containers looked into)."""
    args = get_args(annotation)
    if not args:
        return {annotation}
    return {k for a in args for k in annotation_kinds(a)} | ({get_origin(annotation)} if get_origin(annotation) else set())


def _control_in(v: Any, text: bool = False) -> str | None:
    """The first string in v (itself, or inside lists, tuples and mappings, keys too) that holds
    what is not visible text (ftcluster.spec.plaintext), in words, else None. A mapping's value is
    named by its key and never shown: an env value may be a secret. text: a mapping's values may
    span lines (newlines, tabs and CRs)."""
    if isinstance(v, str):
        bad = not_text(v)
        return None if bad is None else f"{cut(repr(v))} holds {bad}"
    if isinstance(v, dict):
        for key, val in v.items():
            found = _control_in(key)
            if found is not None:
                return f"the key {found}"
            if isinstance(val, str):
                bad = not_text(val, MULTI_LINE if text else frozenset())
                if bad is not None:
                    return f"the value of {key} holds {bad}"
            elif (found := _control_in(val, text)) is not None:
                return f"the value of {key}: {found}"
    if isinstance(v, (list, tuple)):
        for item in v:
            found = _control_in(item)
            if found is not None:
                return found
    return None
