"""docs/spec-reference.md is the spec models' own reference: regenerated, it is the committed file,
and it shows every field of every spec object (found from the two roots through their fields'
types), with its type, default and the words the models give it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, Field

from ftcluster.spec import reference
from ftcluster.spec.reference import ROOTS, markdown

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "spec-reference.md"
REGENERATE = "python3 docs/gen_reference.py"


def test_the_committed_reference_is_current() -> None:
    assert DOC.exists(), f"docs/spec-reference.md is missing: write it with `{REGENERATE}`"
    assert DOC.read_text() == markdown(), (
        f"docs/spec-reference.md differs from what the spec models say: regenerate it with `{REGENERATE}` "
        "(and commit it)")


def test_the_script_checks_and_writes_the_file() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_reference.py"), "--check"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr


def _every_field(model: type[BaseModel], path: str = "") -> list[str]:
    """Every field's dotted path under `model`, spec objects in fields (lists of them too) looked
    into: a walk of its own, not the generator's."""
    found = []

    def models(annotation: Any) -> list[type[BaseModel]]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for a in get_args(annotation) for m in models(a)]

    for name, info in model.model_fields.items():
        dotted = f"{path}.{name}" if path else name
        found.append(dotted)
        for sub in models(info.annotation):
            listed = "[]" if get_origin(info.annotation) in (tuple, list) else ""
            found += _every_field(sub, dotted + listed)
    return found


def test_every_field_of_both_specs_appears() -> None:
    text = markdown()
    for spec, _, root in ROOTS:
        paths = _every_field(root)
        assert len(paths) > 10
        missing = [p for p in paths if f"`{p}`" not in text]
        assert missing == [], f"{spec} spec fields not in the reference: {missing}"
        assert sorted(f.path for f in reference.fields() if f.spec == spec) == sorted(paths)
    # The nested objects are found through the fields' types: a list's items, two levels down.
    for path in ("server.liveness.deadline", "container.mounts[].flags", "client.hidden_size", "proxy.tls_cert"):
        assert f"| `{path}` |" in text


def test_every_field_a_spec_file_may_set_says_what_it_means() -> None:
    missing = reference.undocumented()
    assert missing == [], (
        f"fields without a description: {', '.join(missing)}; give each a comment above it in "
        "ftcluster/spec/cluster.py or model.py")


def test_a_row_says_type_default_and_the_models_words() -> None:
    rows = {f.path: f for f in reference.fields() if f.spec == "cluster"}
    deadline = rows["server.liveness.deadline"]
    assert deadline.type == "`float` (> 0, <= 86400)" and deadline.default == "10"
    assert rows["scheduler"].default == "required" and rows["scheduler"].type == "`slurm` or `ssh` or `local`"
    assert rows["partition"].default == "null"
    assert "successor" in rows["server.handover_lead"].description
    assert rows["server.restart_backoff"].description == "seconds before the first restart, doubling"
    assert rows["source"].internal and "set by the loader" in rows["source"].description


class _Inner(BaseModel):
    """An inner object."""

    # Said above, over
    # two lines.
    a: int = Field(1, ge=0)
    b: str = Field("x", description="Said by Field.")
    c: tuple[str, ...] = ()   # said at the end
    d: Literal["p", "q"] | None = None


class _Outer(BaseModel):
    inner: _Inner = _Inner()
    items: tuple[_Inner, ...] = ()
    e: dict[str, str] = Field(default_factory=dict)


def test_words_come_from_field_descriptions_and_comments(monkeypatch: Any) -> None:
    monkeypatch.setattr(reference, "ROOTS", (("t", "--t", _Outer),))
    rows = {f.path: f for f in reference.fields()}
    assert list(rows) == ["inner", "items", "e", "inner.a", "inner.b", "inner.c", "inner.d",
                          "items[].a", "items[].b", "items[].c", "items[].d"]
    assert rows["inner.a"].description == "Said above, over two lines."
    assert rows["inner.a"].type == "`int` (>= 0)" and rows["inner.a"].default == "1"
    assert rows["inner.b"].description == "Said by Field."
    assert rows["inner.c"].description == "said at the end" and rows["inner.c"].default == "[]"
    assert rows["inner.d"].description == "" and rows["inner.d"].type == "`p` or `q`"
    assert rows["e"].default == "{}" and rows["e"].type == "mapping of `str` to `str`"
    assert rows["inner"].section == "inner" and rows["items"].section == "items[]"
    assert reference.undocumented() == ["t: e", "t: inner.d", "t: items[].d"]
    text = reference.markdown()
    assert "## t: items[]\n\nAn inner object." in text and "| `e` |" in text
