"""The job request: everything a run hands to a launcher, built by a pure function.

`--dry-run` prints the request; the command hands the same object to the launcher, which
writes its files and runs its argv from its cwd. What the dry run shows is what runs. Every
way onto the nodes is one: `launch` and `check` (the servers, or the MPI check alone),
`preflight` and `convert` (a job step in place of the servers: render.JobStep).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ftcluster.render.bytecode import ship_bytecode
from ftcluster.run.layout import FILES, LOGS, RESULTS, SCRIPTS, STATE, RunPaths
from ftcluster.plan.parallel import Plan, RankSlot, node_names
from ftcluster.plan.endpoint import new_token
from ftcluster.plan.facts import RunFacts
from ftcluster.render.scripts import PRIVATE_FILES, RenderOptions, render, write_private
from ftcluster.resources import package_path
from ftcluster.schedulers import scheduler_class
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.spec.model import ModelSpec
from ftcluster.spec.launch_styles import STYLES

# What a request runs: the servers (and the client), only the MPI world check (`check`), or a
# job step: the GPU preflight on every node, FT's checkpoint converter on one, or a replica set's
# balancer (its front) on one.
KINDS = ("serve", "check", "preflight", "convert", "front")


@dataclass(frozen=True)
class JobFile:
    path: str        # relative to the run folder
    text: str
    mode: int
    source: str = ""  # a copy of this package file (shown by name in a dry run, not in full)
    shown: str | None = None   # what a dry run shows instead of text (the env's values hidden)

    def __str__(self) -> str:
        if self.source:
            return f"# ===== {self.path} ({self.mode:04o}): a copy of {self.source} ====="
        return f"# ===== {self.path} ({self.mode:04o}) =====\n{self.text if self.shown is None else self.shown}"


@dataclass(frozen=True)
class JobRequest:
    kind: str
    launcher: str                  # a key of ftcluster.spec.launch_styles.LAUNCHERS; the run record keeps it
    scheduler: str
    style: str
    paths: RunPaths
    files: tuple[JobFile, ...]
    argv: tuple[str, ...]          # run from cwd by the launcher, exactly
    cwd: Path
    # access: private -- the run's token is made when the run folder is written (write_files):
    # a secret is no input of the request. A successor's is its predecessor's (given here; never
    # compared, printed or shown).
    private: bool = False
    token: str | None = field(default=None, compare=False, repr=False)
    # The run's facts (ftcluster.plan.facts), saved with its specs (scripts/specs.json).
    facts: RunFacts | None = None

    @property
    def folders(self) -> tuple[Path, ...]:
        """The run folder's subfolders that exist before the job starts."""
        return tuple(self.paths.run_dir / d for d in (SCRIPTS, LOGS, STATE, RESULTS))

    def command(self) -> str:
        """The argv with its cwd, quoted for pasting into a shell."""
        return f"cd {shlex.quote(str(self.cwd))} && {shlex.join(self.argv)}"

    def write_files(self) -> list[Path]:
        # The run folder is yours alone (0700): its logs, keys, model files and the spec's env
        # often sit on a filesystem every user of the cluster can read.
        self.paths.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.paths.run_dir, 0o700)
        for folder in self.folders:
            folder.mkdir(parents=True, exist_ok=True)
        # There from the start, so whoever follows the run holds it open from the start
        # (logs.Follower) instead of looking its path up until the job writes it.
        self.paths.events.touch()
        written = []
        for f in self.files:
            path = self.paths.run_dir / f.path
            path.parent.mkdir(parents=True, exist_ok=True)
            write_private(path, f.text, f.mode)
            written.append(path)
            if f.path.startswith(f"{SCRIPTS}/{FILES.supervisor}/") and f.source.endswith(".py"):
                ship_bytecode(path, package_path(*f.source.split("/")[1:]))
        if self.private:
            token = self.paths.scripts / FILES.token
            write_private(token, (self.token or new_token()) + "\n", 0o600)
            written.append(token)
        return written

    def __str__(self) -> str:
        head = (f"# run {self.paths.run_id} ({self.kind}): style {self.style}, launcher {self.launcher}, "
                f"run folder {self.paths.run_dir}\n")
        files = "\n".join(str(f) for f in self.files)
        if self.private:
            files += (f"\n# ===== {SCRIPTS}/{FILES.token} (0600) =====\n# the run's token, made when the run "
                      "folder is written (`ftcluster token RUN` shows it)")
        return f"{head}{files}\n# ===== would run =====\n{self.command()}\n"


def _mode(name: str) -> int:
    # The env's values (job.json, env.sh) for the owner alone; job scripts are run as `bash FILE`
    # or by sbatch; the rest are data or `python3 FILE`.
    if name in PRIVATE_FILES:
        return 0o600
    return 0o755 if name.endswith((".sh", ".sbatch")) else 0o644


def job_shape(cluster: ClusterSpec, nodes: int, gpus_per_node: int) -> Plan:
    """The plan of a run that serves no model (a preflight, a conversion): nodes and GPUs
    only, one task per node. gpus_per_node 0: not known yet (`auto` before a preflight)."""
    names = node_names(cluster, nodes)
    return Plan(nodes=nodes, gpus_per_node=gpus_per_node, tensor_para_size=gpus_per_node,
                pipeline_para_size=nodes, world_size=nodes * gpus_per_node,
                ranks=tuple(RankSlot(r, r, names[r], gpus_per_node) for r in range(nodes)))


def submit_argv(scheduler: str, script: str) -> tuple[str, ...]:
    """The argv that starts a job script from the run folder, as its scheduler says: sbatch for
    Slurm's styles, bash where the job runs as a process of the launching command (local, ssh)."""
    return scheduler_class(scheduler).submit_command(script)


def request_kind(opts: RenderOptions) -> str:
    if opts.step is not None:
        return opts.step.what
    return "serve" if opts.servers else "check"


def build_request(cluster: ClusterSpec, model: ModelSpec | None, plan: Plan, paths: RunPaths,
                  opts: RenderOptions) -> JobRequest:
    """The request for one run; pure (renders templates, touches nothing). `model` is None
    for a run that serves none (preflight)."""
    kind = request_kind(opts)
    if kind not in KINDS:
        raise ValueError(f"unknown job kind {kind!r}")
    scripts = render(cluster, model, plan, paths, opts)
    style = STYLES[scripts.style]
    script = paths.job_script(style.name)
    return JobRequest(
        kind=kind, launcher=style.launcher, scheduler=cluster.scheduler, style=style.name, paths=paths,
        files=tuple(JobFile(f"{SCRIPTS}/{name}", text, _mode(name), scripts.sources.get(name, ""),
                            scripts.shown.get(name)) for name, text in scripts.files.items()),
        argv=submit_argv(cluster.scheduler, str(script)), cwd=paths.run_dir,
        # The run's own (a serving run's access), or its step's (a private replica set's front).
        private=bool(scripts.facts and scripts.facts.private) or bool(opts.step and opts.step.token),
        facts=scripts.facts,
    )
