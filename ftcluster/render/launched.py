"""What a run was launched from, kept in its folder (scripts/specs.json): the merged specs (the
files, the command-line overrides such as --time or --partition, the defaults) and the plan.

A successor, a replica set's new member and a rolling restart are made from it, never from the
user's files again: a file edited or moved since the launch changes nothing, and no option
given on the command line is lost at a hand-over. What a run derives from them for itself (a
member's ports, a successor's excluded nodes) is derived again from these, not saved over them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftcluster.errors import UserError
from ftcluster.plan.parallel import Plan
from ftcluster.spec.cluster import RESOLVED, ClusterSpec
from ftcluster.spec.model import ModelSpec

SPECS_FILE = "specs.json"   # in scripts/ (0600: the cluster's env may hold secrets)
_VERSION = 1


@dataclass(frozen=True)
class LaunchedSpecs:
    cluster: ClusterSpec
    model: ModelSpec
    plan: Plan

    def to_json(self) -> str:
        return json.dumps({
            "version": _VERSION,
            "cluster": self.cluster.model_dump(mode="json"), "cluster_source": self.cluster.source,
            "ports_given": self.cluster.ports_given,
            "model": self.model.model_dump(mode="json"), "model_source": self.model.source,
            "plan": self.plan.to_dict()}, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> LaunchedSpecs:
        """The specs back, checked as a spec file's are (ValueError: not such a file)."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != _VERSION:
            raise ValueError(f"not a version {_VERSION} specs file")
        context = {RESOLVED: True}
        cluster = ClusterSpec.model_validate(data["cluster"], context=context)
        model = ModelSpec.model_validate(data["model"], context=context)
        # What the loader sets beside the values (not dumped with them), as it was.
        return cls(cluster.model_copy(update={"source": _text(data.get("cluster_source")),
                                              "ports_given": data.get("ports_given") is not False}),
                   model.model_copy(update={"source": _text(data.get("model_source"))}),
                   Plan.from_dict(data["plan"]))


def write_specs(run_dir: Path, specs: LaunchedSpecs) -> Path:
    from ftcluster.render.scripts import write_private   # here: render loads jinja, which reading needs not

    path = run_dir / "scripts" / SPECS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, specs.to_json(), 0o600)
    return path


def read_specs(run_dir: Path) -> LaunchedSpecs | None:
    """The specs the run in `run_dir` was launched from; None for a folder that keeps none (one
    an earlier ftcluster wrote keeps none: its specs are its files')."""
    path = run_dir / "scripts" / SPECS_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}", field="RUN_DIR",
                        hint="only the user who launched the run may read it") from None
    try:
        return LaunchedSpecs.from_json(text)
    except (ValueError, KeyError, TypeError) as exc:   # pydantic's ValidationError is a ValueError
        raise UserError(f"{path} is damaged: {str(exc).splitlines()[0]}", field="RUN_DIR",
                        hint="the run cannot be continued from it; launch it again") from None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
