"""The event kinds and the run folder's file names are defined once, in Python (ftcluster/job/names.py):
the templates take them from the render context, the job supervisor writes events only through EV,
and what a run folder holds writes nothing else."""

from __future__ import annotations

import dataclasses
import re

import pytest

from ftcluster.run.events import EV
from ftcluster.run.layout import FILES
from ftcluster.render.scripts import templates_dir
from tests.unit.test_render import STYLES, render_style

KINDS = {v for k, v in vars(type(EV)).items() if not k.startswith("_") and isinstance(v, str)}


def test_no_template_spells_an_event_kind_or_a_run_file_itself() -> None:
    for t in templates_dir().glob("*.j2"):
        text = t.read_text()
        assert not re.search(r'\bevent "[a-z]', text), t.name
        assert not re.search(r"\$(STATE|LOGS|RESULTS)/(rank\$|rank\d|server-rank|events|client\.|mpicheck\.)",
                             text), t.name


@pytest.mark.parametrize("style", STYLES)
def test_rendered_scripts_write_only_known_event_kinds(style: str) -> None:
    scripts = render_style(style)
    texts = scripts.files.values()
    assert not any(re.search(r'\bevent\(\s*["\']|\bevent "', text) for text in texts)   # no kind spelt out
    written = {m.group(1) for text in texts for m in re.finditer(r"\bevent\(\s*EV\.([a-z_0-9]+)", text)}
    assert written and written <= KINDS
    assert {EV.ready, EV.done, EV.failed} <= written   # what every launch waits for


def test_per_rank_file_names() -> None:
    assert FILES.rank(3, "pid") == "rank3.pid" and FILES.rank("$RANK", "exit") == "rank$RANK.exit"
    assert FILES.server_log(0) == "server-rank0.log"
    with pytest.raises(ValueError):
        FILES.rank(0, "pidfile")


def test_every_template_needs_only_names_of_the_typed_context() -> None:
    from jinja2 import meta

    from ftcluster.render.scripts import RenderContext, _env

    names = {f.name for f in dataclasses.fields(RenderContext)}
    env = _env()
    for t in templates_dir().glob("*.j2"):
        needed = meta.find_undeclared_variables(env.parse(t.read_text()))
        assert needed <= names, (t.name, needed - names)
