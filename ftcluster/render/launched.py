"""What a run was launched from, kept in its folder (scripts/specs.json): the merged specs (the
files, the command-line overrides such as --time or --partition, the defaults) and the plan.

A successor, a replica set's new member and a rolling restart are made from it, never from the
user's files again: a file edited or moved since the launch changes nothing, and no option
given on the command line is lost at a hand-over. What a run derives from them for itself (a
member's ports, a successor's excluded nodes) is derived again from these, not saved over them.

Beside them the file keeps the run's own facts as its launch resolved them (`facts`:
ftcluster.plan.facts.RunFacts; version 2). A version-1 file (an earlier ftcluster's) has none:
its run's facts are resolved from its specs by the same resolver.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ftcluster.errors import UserError
from ftcluster.job.config import LivenessConfig
from ftcluster.plan.facts import FACTS_KEY, RunFacts, member_cluster, resolve
from ftcluster.plan.parallel import Plan
from ftcluster.run.layout import FILES
from ftcluster.spec.cluster import RESOLVED, ClusterSpec
from ftcluster.spec.engines import default_engine, model_spec_class
from ftcluster.spec.model import ModelSpec

SPECS_FILE = FILES.specs   # in scripts/ (0600: the cluster's env may hold secrets)
_VERSION = 2
_READ = (1, 2)              # version 1: no facts (resolved from the specs when read)


@dataclass(frozen=True)
class LaunchedSpecs:
    cluster: ClusterSpec
    model: ModelSpec
    plan: Plan

    def to_json(self, facts: RunFacts | None = None) -> str:
        """The file's text; `facts`: the run's own, saved beside the specs."""
        return json.dumps({
            "version": _VERSION, **({FACTS_KEY: facts.to_dict()} if facts is not None else {}),
            "cluster": self.cluster.model_dump(mode="json"), "cluster_source": self.cluster.source,
            "ports_given": self.cluster.ports_given,
            "model": self.model.model_dump(mode="json"), "model_source": self.model.source,
            "plan": self.plan.to_dict()}, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> LaunchedSpecs:
        """The specs back, checked as a spec file's are (ValueError: not such a file)."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") not in _READ:
            raise ValueError(f"not a version {' or '.join(map(str, _READ))} specs file")
        context = {RESOLVED: True}
        cluster = ClusterSpec.model_validate(data["cluster"], context=context)
        model = model_spec_class(str(data["model"].get("backend", default_engine()))).model_validate(data["model"], context=context)
        # What the loader sets beside the values (not dumped with them), as it was.
        return cls(cluster.model_copy(update={"source": _text(data.get("cluster_source")),
                                              "ports_given": data.get("ports_given") is not False}),
                   model.model_copy(update={"source": _text(data.get("model_source"))}),
                   Plan.from_dict(data["plan"]))


def write_specs(run_dir: Path, specs: LaunchedSpecs, facts: RunFacts | None = None) -> Path:
    """The specs (and the run's facts, where given) into the run folder."""
    from ftcluster.render.scripts import write_private   # here: render loads jinja, which reading needs not

    path = run_dir / "scripts" / SPECS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, specs.to_json(facts), 0o600)
    return path


def read_facts(run_dir: Path) -> RunFacts | None:
    """The facts of the run in `run_dir`, as its launch saved them; for a folder whose specs file
    saved none (version 1), resolved from its specs (a replica set's member's from its set's,
    with its index from run.json) by the same resolver; None for a folder that keeps no specs.
    Facts saved without the liveness request (an earlier ftcluster's) take the job's own
    (job.json), as the run probes with it."""
    specs = read_specs(run_dir)
    if specs is None:
        return None
    path = run_dir / "scripts" / SPECS_FILE
    job = _json(run_dir / "scripts" / FILES.job_config)
    try:
        liveness = LivenessConfig(**job["liveness"]) if isinstance(job.get("liveness"), dict) else None
        saved = json.loads(path.read_text()).get(FACTS_KEY)
        if saved is not None:
            return RunFacts.from_dict({"liveness": liveness._asdict() if liveness else None, **saved})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{path} is damaged: {str(exc).splitlines()[0] if str(exc) else exc!r}", field="RUN_DIR",
                        hint="the run cannot be continued from it; launch it again") from None
    replica = _json(run_dir / "run.json").get("replica")
    cluster = specs.cluster
    if isinstance(replica, dict) and isinstance(replica.get("index"), int):
        cluster = member_cluster(cluster, replica["index"])
    facts = resolve(cluster, member=isinstance(replica, dict), keep_serving=job.get("keep_serving") is True)
    return replace(facts, liveness=liveness)


def _json(path: Path) -> dict[str, Any]:
    """A JSON file's mapping; {} for none or another value."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


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
