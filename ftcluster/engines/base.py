"""What an engine is: the one interface the pipeline asks of whatever serves a model.

An engine names itself (a model spec's `backend`), brings its model spec (the fields after the
shared ones), plans a run (its rank layout and every refusal it knows before anything is
submitted), writes the run's own model repository, says what its ranks must see inside their
containers, gives the served model's config as its server will see it (from which the
liveness probe's smallest valid request is made), and says how its serving image is built
(`ftcluster image build`). Everything else -- the scheduler, the
container runtime, the job, the endpoint -- is the same for every engine.

One package per engine under ftcluster/engines/ (fastertransformer/ is the first); another
installed package adds one through the `ftcluster.engines` entry-point group
(ftcluster.spec.engines).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from ftcluster.plan.parallel import Plan
    from ftcluster.spec.cluster import ClusterSpec
    from ftcluster.spec.model import ModelSpec


@dataclass(frozen=True)
class Prepared:
    """A run's own model repository, as the engine wrote it."""

    path: Path
    model: str                    # the engine's model in it (the one the plan's parameters were set on)
    parameters: dict[str, str]    # what was set on it


@dataclass(frozen=True)
class Conversion:
    """One run of an engine's weight converter (`ftcluster convert`), as the run's job step."""

    argv: tuple[str, ...]
    output: Path                  # the folder it writes (made before the job: a container mounts it)
    paths: tuple[str, ...]        # what it reads and writes, mounted at their own path
    record: dict[str, Any]        # what the run record keeps: enough to check the result (Converter.result_problems)


@dataclass(frozen=True)
class ImageRecipe:
    """How an engine's serving image is built (`ftcluster image build --source`): a Dockerfile of
    a source tree the user has, the tree as the build's context, the Triton release as a build arg."""

    source: str                   # what --source is, in words for help and errors ("a ... checkout")
    dockerfile: str               # the Dockerfile, relative to the source (the check: it is a file)
    version_arg: str              # the build arg that takes the Triton release (image.triton_version)
    repository: str               # the image's name where the cluster spec names none (tagged with the release)

    def build_args(self, triton_version: str) -> dict[str, str]:
        return {self.version_arg: triton_version}


class Converter(Protocol):
    """An engine's weight converter and the check of what it wrote."""

    @property
    def output_field(self) -> str:
        """The model spec's folder field the converter writes into (it need not exist before)."""

    @property
    def root(self) -> str:
        """What `--converter-root` is, in words for the help ("a ... checkout")."""

    def conversion(self, model: ModelSpec, tp: int, converter_root: Path, input_dir: str, python: str) -> Conversion:
        """The converter's run for `tp` GPUs (UserError where converter_root has no converter for the model)."""

    def problems(self, model: ModelSpec, tp: int) -> tuple[Path, list[str]]:
        """The converted weights' folder for `tp` GPUs, and what is wrong with it (none: complete)."""

    def result_problems(self, record: dict[str, Any]) -> list[str]:
        """What is wrong with a finished conversion's output, from its run record's `record`."""


class Engine(Protocol):
    @property
    def name(self) -> str:
        """The model spec's `backend` that names this engine."""

    @property
    def loaded_marker(self) -> str:
        """The line (a bash regular expression) a rank's server logs once its model is loaded:
        the rank is marked loaded the moment it passes (a rank that blocks in its load for good,
        as FT's ranks != 0 do, is known loaded by it alone)."""

    @property
    def spec(self) -> type[ModelSpec]:
        """Its model spec: the shared fields (ftcluster.spec.model.ModelSpec) and its own."""

    def plan(self, cluster: ClusterSpec, model: ModelSpec, nodes: int, gpus_per_node: int,
             tp: int | None, pp: int | None) -> Plan:
        """The run's plan -- its ranks over the nodes and GPUs, the parallel sizes -- after every
        check the engine can make before submission (PlanError, every problem at once)."""

    def prepare(self, model: ModelSpec, plan: Plan, out: Path) -> Prepared:
        """Write the run's own model repository to `out` (a new folder), the plan set on it."""

    def check_visible(self, cluster: ClusterSpec, model: ModelSpec, plan: Plan, run_dir: Path) -> None:
        """Refuse (PlanError) a run whose ranks would not see what the engine reads (weights
        outside the containers' mounts), before anything is written or submitted."""

    def served_config(self, model: ModelSpec, plan: Plan) -> dict[str, Any]:
        """The served model's Triton config (config.pbtxt as JSON) as its server will see it, with
        what the engine sets or completes at load time (OSError, ValueError or UserError where it
        cannot be read)."""

    @property
    def converter(self) -> Converter | None:
        """Its weight converter, where `ftcluster convert` can run one (None: it has none)."""

    @property
    def image(self) -> ImageRecipe | None:
        """How its serving image is built (None: it has no image build of its own; an engine
        written before this member is read as None too, ftcluster.service.image.recipe_of)."""

    def binds(self, model: ModelSpec, repository: Path, links: bool) -> list[tuple[str, str]]:
        """What one node's servers read beside the run's repository (at `repository`), as (host
        path, path in the container): the weights, and the user's repository where the run's
        copy links its large files (`links`)."""
