"""A spec's every problem, said on one line: pydantic's errors, then the checks across fields
that pydantic skipped because a field failed.

pydantic runs a model's after-validators only when all of its fields are valid, so a bad
`time_limit` hid `scheduler 'ssh' needs hosts`, and the user met the second problem only after
fixing the first. The spec is validated once more without the fields that failed; what the
models' own checks then say is added, unless it names a field left out (its default stood in
for the user's value, so a complaint about it would be about a value nobody gave).
"""

from __future__ import annotations

import copy
import re
import types
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from ftcluster.errors import every_problem

_S = TypeVar("_S", bound=BaseModel)

# An error names a 5,000-character value, it does not echo it: a longer run of characters
# without a space shows its two ends.
WORD_MAX_CHARS = 120

# Parts of an error's location that name a member of a union (pydantic's tags: 'constrained-int',
# "literal['auto']", 'int'), not a field: one error per field is said instead of one per member.
_UNION_TAG = re.compile(r"[\[\]'-]|^(int|str|float|bool|bytes|none)$")

# A spec's fields whose values may be secrets (an HF token in env): an error names the field and
# the problem, never the value.
SECRET_VALUES = frozenset({"env"})

# What a validator's ValueError or assert becomes: the only kinds a model's own check raises.
_CHECK_TYPES = ("value_error", "assertion_error")


class Problems(ValueError):
    """A model's own check that found several problems: each said apart, so that each can be
    kept or left out."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = list(problems)


def cut(text: str) -> str:
    half = WORD_MAX_CHARS // 2
    return re.sub(r"\S{%d,}" % (WORD_MAX_CHARS + 1), lambda m: f"{m.group()[:half]}...{m.group()[-half:]}", text)


def checked(cls: type[_S], data: dict[str, Any], context: dict[str, Any]) -> tuple[_S | None, list[ErrorDetails]]:
    """The validated model, or None and every error: pydantic's, then the checks across fields
    that it skipped."""
    try:
        return cls.model_validate(data, context=context), []
    except ValidationError as exc:
        errors = exc.errors()
    said = _by_field(cls, errors)
    return None, said + _skipped_checks(cls, data, errors, said, context)


def format_errors(path: Path | None, errors: list[ErrorDetails], names: dict[str, str] | None = None) -> str:
    """Every problem of the spec at once, each naming its field, on one line: the file's
    (after its path), then those of values given by options (`names`: field -> option, such as
    time_limit -> --time), named by the option."""
    # field -> its messages (a union: one per member); a check's problems are each said apart
    problems: dict[tuple[str, int], list[str]] = {}
    given: dict[str, str] = {}            # field -> the value it was given, said once
    for i, err in enumerate(errors):
        loc = _field(err)
        for field, option in (names or {}).items():
            if loc == field or loc.startswith(field + "."):
                loc = option + loc[len(field):]
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see configs/ for the accepted keys)"
        elif err["type"] == "missing":
            msg = "required field is missing"
        problems.setdefault((loc, i if err["type"] in _CHECK_TYPES else -1), []).append(msg)
        if "input" in err and err["type"] not in ("value_error", "extra_forbidden", "missing") \
                and _field(err).split(".")[0] not in SECRET_VALUES:
            given.setdefault(loc, f" (got {err['input']!r})")
    said: list[str] = []
    by_option: list[str] = []
    options = set((names or {}).values())
    for (loc, _), msgs in problems.items():
        if len(msgs) > 1 and all(m.startswith("Input should be ") for m in msgs):   # a union's members
            msg = "Input should be " + " or ".join(re.sub(r", unable to .*", "", m.removeprefix("Input should be "))
                                                   for m in msgs)
        else:
            msg = "; or ".join(msgs)
        got = given.get(loc, "")
        (by_option if loc.split(".")[0] in options else said).append(cut(f"{loc}: {msg}{got}" if loc else msg + got))
    if said and path is not None:   # the file's problems under its name, then the options'
        said[0] = f"{path}: {said[0]}"
    return every_problem(said + by_option)


# A model's own check names the field of each problem first ("image: ...", "mounts.0: ...").
_LEADING_FIELD = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*): (.+)", re.S)


def _by_field(cls: type[BaseModel], errors: list[ErrorDetails]) -> list[ErrorDetails]:
    """Each problem of a model's own check said at the field it names (container.image, not
    container: image), so that an option that gave the field names it too."""
    said: list[ErrorDetails] = []
    for err in errors:
        if not _is_check(cls, err):
            said.append(err)
            continue
        loc = _field_loc(err)
        raised = err.get("ctx", {}).get("error")
        parts = raised.problems if isinstance(raised, Problems) else [err["msg"].removeprefix("Value error, ")]
        for part in parts:
            named = _LEADING_FIELD.fullmatch(part)
            where = (*loc, *named[1].split(".")) if named else tuple(loc)
            said.append({**err, "loc": where, "msg": named[2] if named else part})
    return said


def _field_loc(err: ErrorDetails) -> list[int | str]:
    return [p for p in err["loc"] if not (isinstance(p, str) and _UNION_TAG.search(p))]


def _field(err: ErrorDetails) -> str:
    """The field an error is about, dotted (container.mounts.1)."""
    return ".".join(str(p) for p in _field_loc(err))


def _is_check(cls: type[BaseModel], err: ErrorDetails) -> bool:
    """Whether `err` is what a model's own check (an after-validator) raised: it is at the model."""
    return err["type"] in _CHECK_TYPES and _names_model(cls, _field_loc(err))


def _skipped_checks(cls: type[BaseModel], data: dict[str, Any], errors: list[ErrorDetails],
                    said: list[ErrorDetails], context: dict[str, Any]) -> list[ErrorDetails]:
    """What the models' own checks say once the fields that failed are left out, but for what
    names a field left out, or was `said` already (`errors`, each at its field)."""
    pruned = copy.deepcopy(data)
    left_out = set()
    for err in errors:
        if _is_check(cls, err):
            continue   # a model's own check failed: its fields were valid and stay
        key = _leave_out(pruned, _field_loc(err))
        if key is not None:
            left_out.add(key)
    if not left_out:
        return []      # the same data: the same errors
    try:
        cls.model_validate(pruned, context=context)
        return []
    except ValidationError as exc:
        again = exc.errors()
    before = {_where(e) for e in said}
    naming = re.compile(r"\b(?:%s)\b" % "|".join(re.escape(k) for k in sorted(left_out)))
    checks = [e for e in again if _is_check(cls, e)]
    return [e for e in _by_field(cls, checks) if _where(e) not in before and not naming.search(": ".join(_where(e)))]


def _where(err: ErrorDetails) -> tuple[str, str]:
    """A problem as said: its field and its words."""
    return _field(err), err["msg"]


def _leave_out(data: dict[str, Any], loc: list[int | str]) -> str | None:
    """Remove the value at `loc` (or the whole list holding it: items cannot be left out without
    renumbering the rest); the key removed, or None when there was none."""
    node: Any = data
    for i, part in enumerate(loc):
        if not (isinstance(node, dict) and isinstance(part, str) and part in node):
            return None
        if i == len(loc) - 1 or not isinstance(node[part], dict):
            del node[part]
            return part
        node = node[part]
    return None


def _names_model(cls: type[BaseModel], loc: list[int | str]) -> bool:
    """Whether `loc` is where a model (not one of its fields) is: its own checks' errors are there."""
    model: type[BaseModel] | None = cls
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return False
        model = _model_in(model.model_fields[part].annotation)
    return model is not None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds, alone or optional; None for any other type (a list of models
    is a field)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        for arg in get_args(annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
    return None
