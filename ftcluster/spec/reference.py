"""The spec reference: every field of the cluster and model specs -- its dotted path, type,
default and meaning -- read from the spec models themselves, so that it cannot drift from them.

The models are found from the two roots below through their fields' types, wherever they are
defined. A field's meaning is its `Field(description=...)` where it has one, else the comment
lines directly above it in its class (and a comment at the end of its own line); an object's is
its class docstring. docs/spec-reference.md is `markdown()`; `python3 docs/gen_reference.py`
writes it, and tests/unit/test_spec_reference.py checks that the committed file is current.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import re
import textwrap
import tokenize
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

# The roots: (the spec's name, the option that takes it, its model). Every other spec object is
# found through their fields.
# The model spec is each built-in engine's (its fields after the shared ones).
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.spec.engines import built_in, default_engine, model_spec_class

ROOTS: tuple[tuple[str, str, type[BaseModel]], ...] = (
    ("cluster", "--cluster", ClusterSpec),
    *(("model" if name == default_engine() else f"model ({name})", "--model", model_spec_class(name))
      for name in built_in()),
)


@dataclass(frozen=True)
class FieldDoc:
    """One field as the reference shows it."""

    spec: str           # "cluster" or "model"
    path: str           # dotted, from the spec's top: server.liveness.deadline; a list's items: mounts[].src
    owner: type[BaseModel]
    name: str           # the field's own name in its model
    type: str
    default: str
    description: str
    section: str | None  # the dotted path of the object it is, where its value is a spec object
    internal: bool      # set by the loader (excluded from dumps), not by a spec file


@dataclass(frozen=True)
class Section:
    """One spec object: its dotted path ("" for the spec itself), its model, its fields."""

    spec: str
    path: str
    model: type[BaseModel]
    fields: tuple[FieldDoc, ...]


def _models_in(annotation: Any) -> list[tuple[type[BaseModel], bool]]:
    """The spec objects an annotation holds: (model, as the items of a list)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, False)]
    origin = get_origin(annotation)
    found = [m for a in get_args(annotation) for m in _models_in(a)]
    if origin in (tuple, list, set, frozenset):
        return [(m, True) for m, _ in found]
    return found


def _number(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _bounds(metadata: list[Any]) -> list[str]:
    out = []
    for m in metadata:
        for attr, word in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if isinstance(m, getattr(annotated_types, attr.capitalize())):
                out.append(f"{word} {_number(getattr(m, attr))}")
        if isinstance(m, annotated_types.MinLen) and m.min_length:
            out.append(f"at least {m.min_length} character{'s' if m.min_length > 1 else ''}")
        if isinstance(m, annotated_types.MaxLen):
            out.append(f"at most {m.max_length} characters")
        # Field(...) inside Annotated[...] arrives as a FieldInfo with its own metadata.
        inner = getattr(m, "metadata", None)
        if isinstance(inner, list):
            out += _bounds(inner)
    return out


def _value(v: Any) -> str:
    """A value as YAML would write it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return _number(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, Path):
        return json.dumps(str(v))
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    return repr(v)


def _type(annotation: Any) -> str:
    """An annotation in words (None left out: the default says when unset is allowed)."""
    origin = get_origin(annotation)
    args = get_args(annotation)
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin is Annotated:
        bounds = _bounds(list(args[1:]))
        return _type(args[0]) + (f" ({', '.join(bounds)})" if bounds else "")
    if origin in (Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        return " or ".join(_type(a) for a in kept)
    if origin in (tuple, list):
        item = args[0] if args else Any
        return f"list of {_type(item)}"
    if origin is dict:
        return f"mapping of {_type(args[0])} to {_type(args[1])}"
    if annotation is Path:
        return "path"
    if isinstance(annotation, type):
        return f"`{annotation.__name__}`"
    return str(annotation)


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """Each field's comment in its class body, or in the base class that declares it (an engine's
    model spec inherits the shared fields): the comment lines directly above it, then a comment
    at the end of its own line(s)."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if isinstance(cls, type) and issubclass(cls, BaseModel) and cls is not BaseModel:
            found.update(_own_comments(cls))
    return found


def _own_comments(model: type[BaseModel]) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(model))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    at_end: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1][: tok.start[1]].strip():
            at_end[tok.start[0]] = tok.string
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    found: dict[str, str] = {}
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        row = node.lineno - 2
        while row >= 0 and lines[row].lstrip().startswith("#"):
            above.insert(0, lines[row].strip())
            row -= 1
        end = [at_end[r] for r in range(node.lineno, (node.end_lineno or node.lineno) + 1) if r in at_end]
        words = [c.lstrip("#").strip() for c in above + end]
        found[node.target.id] = " ".join(w for w in words if w)
    return found


def _doc(model: type[BaseModel]) -> str:
    own = model.__dict__.get("__doc__")
    return " ".join(inspect.cleandoc(own).split()) if own else ""


def _walk(spec: str, root: type[BaseModel]) -> list[tuple[str, type[BaseModel]]]:
    """Every spec object under `root` (itself first) with its dotted path, depth first."""
    out: list[tuple[str, type[BaseModel]]] = []

    def visit(path: str, model: type[BaseModel], seen: tuple[type[BaseModel], ...]) -> None:
        out.append((path, model))
        for name, info in model.model_fields.items():
            for sub, listed in _models_in(info.annotation):
                if sub not in seen:
                    dotted = (f"{path}.{name}" if path else name) + ("[]" if listed else "")
                    visit(dotted, sub, (*seen, sub))

    visit("", root, (root,))
    return out


def anchor(spec: str, path: str) -> str:
    """The Markdown heading's anchor of a section (GitHub's: lowercase, punctuation dropped)."""
    text = f"{spec}: {path}" if path else f"{spec} spec"
    return "".join(c for c in text.lower() if c.isalnum() or c in " -_").replace(" ", "-")


def _heading(spec: str, path: str) -> str:
    return f"{spec}: {path}" if path else f"{spec} spec"


def sections() -> list[Section]:
    """Every spec object of both specs, with its fields, in the order the reference shows them."""
    out = []
    for spec, _, root in ROOTS:
        for path, model in _walk(spec, root):
            notes = _comments(model)
            fields = []
            for name, info in model.model_fields.items():
                dotted = f"{path}.{name}" if path else name
                subs = _models_in(info.annotation)
                if info.default_factory is not None:
                    default = _value(info.default_factory())   # type: ignore[call-arg]
                elif info.default is PydanticUndefined:
                    default = "required"
                elif isinstance(info.default, BaseModel):
                    default = ""
                else:
                    default = _value(info.default)
                bounds = _bounds(list(info.metadata))
                kind = _type(info.annotation) + (f" ({', '.join(bounds)})" if bounds else "")
                section = None
                if subs:
                    section = f"{dotted}[]" if subs[0][1] else dotted
                fields.append(FieldDoc(spec=spec, path=dotted, owner=model, name=name, type=kind, default=default,
                                       description=info.description or notes.get(name, ""), section=section,
                                       internal=bool(info.exclude)))
            out.append(Section(spec=spec, path=path, model=model, fields=tuple(fields)))
    return out


def fields() -> list[FieldDoc]:
    """Every field of both specs, nested objects' included."""
    return [f for s in sections() for f in s.fields]


def _cell(text: str, code: bool = False) -> str:
    """Text for a Markdown table cell: '|' escaped, and outside a code span a '<' that would start
    an HTML tag (state/gpu-rank<R>.csv)."""
    text = text.replace("|", "\\|")
    return text if code else re.sub(r"<(?=[A-Za-z/!?])", r"\\<", text)


def markdown() -> str:
    """The reference as Markdown (docs/spec-reference.md)."""
    out = [
        "# Spec reference",
        "",
        "<!-- Generated from the spec models by `python3 docs/gen_reference.py`; edit the models, not this file. -->",
        "",
        "Every field of the cluster spec (`--cluster`) and the model spec (`--model`): its dotted path, its",
        "type, its default and what it means, as the spec models define them (`ftcluster/spec/`). A default",
        "`null` is unset; `required` has none. [reference.md](reference.md#specs) shows an example of each",
        "spec and says more about `env:` and the values a spec may hold; `ftcluster examples` writes example",
        "specs.",
        "",
    ]
    every = sections()
    for spec, option, _ in ROOTS:
        out.append(f"- [{spec} spec](#{anchor(spec, '')}) (`{option}`): "
                   + ", ".join(f"[{s.path}](#{anchor(spec, s.path)})" for s in every if s.spec == spec and s.path))
    for s in every:
        out += ["", f"## {_heading(s.spec, s.path)}", ""]
        doc = _doc(s.model)
        if doc:
            out += [_cell(doc), ""]
        out += ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
        internal = []
        for f in s.fields:
            if f.internal:
                internal.append(f)
                continue
            default = f"`{_cell(f.default, code=True)}`" if f.default and f.default != "required" else f.default
            meaning = _cell(f.description)
            if f.section:
                meaning = " ".join(filter(None, (f"see [{_heading(s.spec, f.section)}](#{anchor(s.spec, f.section)})",
                                                 meaning)))
            out.append(f"| `{f.path}` | {_cell(f.type)} | {default} | {meaning} |")
        if internal:
            out += ["", "Set by the loader, not read from a spec file: "
                    + "; ".join(f"`{f.path}`" + (f" ({_cell(f.description)})" if f.description else "")
                                for f in internal) + "."]
    return "\n".join(out) + "\n"


def undocumented() -> list[str]:
    """The fields a spec file may set that say nothing of what they mean (the reference's gaps)."""
    return [f"{f.spec}: {f.path}" for f in fields() if not f.internal and not f.description and not f.section]
