"""A run folder keeps the specs it was launched with (files + command-line overrides +
defaults, scripts/specs.json), and its successors and a replica set's members are made from
them: an override given on the command line survives a hand-over, and a spec file moved or
edited after the launch changes nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ftcluster.launch.run import Launch, LaunchOptions, job_request, write_run
from ftcluster.render.launched import SPECS_FILE, LaunchedSpecs, read_specs
from ftcluster.engines import make_plan
from ftcluster.launch.replica_set import ReplicaSet, recorded_set, write_members
from ftcluster.plan.replicas import member_cluster
from ftcluster.spec.load import load_cluster, load_model, load_specs
from ftcluster.run.store import RunRecord, RunStore
from ftcluster.launch.successor import successor_launch
from tests.helpers_specs import run_cli
from tests.unit.test_cli_files import REPO

DEMO = REPO / "configs" / "models" / "demo.yaml"


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs" / "clusters").glob("*.yaml")))
def test_every_example_cluster_comes_back_as_it_was_launched(name: str) -> None:
    cluster, model = load_specs(REPO / "configs" / "clusters" / name, DEMO, {"time_limit": "7"})
    plan = make_plan(cluster, model, 2)
    back = LaunchedSpecs.from_json(LaunchedSpecs(cluster, model, plan).to_json())
    assert back == LaunchedSpecs(cluster, model, plan)
    assert back.cluster.source == cluster.source and back.cluster.time_limit == "7"


def test_a_workspace_comes_back_as_expanded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTC_TEST_WS", str(tmp_path / "a$b"))   # a '$' a variable gave: not expanded again
    spec = tmp_path / "c.yaml"
    spec.write_text("scheduler: slurm\nworkspace: $FTC_TEST_WS/ws\n")
    cluster, model = load_specs(spec, DEMO)
    back = LaunchedSpecs.from_json(LaunchedSpecs(cluster, model, make_plan(cluster, model, 1)).to_json())
    assert back.cluster.workspace == str(tmp_path / "a$b" / "ws") == cluster.workspace


def _render(tmp_path: Path, *options: str) -> tuple[Path, Path]:
    """A bare-Slurm run folder rendered with `options` on the command line; its cluster file."""
    spec = tmp_path / "specs" / "cluster.yaml"
    spec.parent.mkdir()
    text = (REPO / "configs" / "clusters" / "slurm-bare.yaml").read_text()
    spec.write_text(text.replace("/shared/$USER/ftcluster-runs", str(tmp_path / "ws"))
                    .replace("max_nodes: 8", "max_nodes: 8\nsbatch_args: [--exclude=n9]"))
    out = tmp_path / "run"
    r = run_cli("render", "--cluster", str(spec), "--model", str(DEMO), "--nodes", "2", "--keep-serving",
                "--no-client", *options, "--out", str(out))
    assert r.rc == 0, r.stderr
    return out, spec


def test_a_successor_keeps_the_command_lines_overrides_with_the_spec_file_moved(tmp_path: Path) -> None:
    out, spec = _render(tmp_path, "--time", "2:00:00", "--partition", "big", "--account", "proj")
    assert (out / "scripts" / SPECS_FILE).stat().st_mode & 0o777 == 0o600
    # The file moved away and another one in its place: neither reaches the successor.
    shutil.move(str(spec.parent), str(tmp_path / "elsewhere"))
    spec.parent.mkdir()
    spec.write_text("scheduler: slurm\npartition: other\n")
    succ = successor_launch(out, ["node1", "node2"])
    job = str(succ.dry_run())
    for line in ("#SBATCH --time=2:00:00\n", "#SBATCH --partition=big\n", "#SBATCH --account=proj\n",
                 "#SBATCH --exclude=n9,node1,node2\n"):
        assert line in job, line
    assert succ.predecessor == "run" and succ.opts.specs == read_specs(out)
    # Its own folder keeps the launch's specs, not its excluded nodes: its successor in turn
    # excludes only its own (a chain of hand-overs never runs out of nodes).
    assert succ.opts.specs is not None and succ.opts.specs.cluster.sbatch_args == ("--exclude=n9",)


def test_a_members_successor_gets_its_members_ports_once(tmp_path: Path) -> None:
    out, spec = _render(tmp_path, "--time", "3:00:00")
    specs = read_specs(out)
    assert specs is not None
    rs = ReplicaSet(specs.cluster, specs.model, specs.plan, successor_launch(out, []).opts, 2, run_id="set")
    member = rs.member(1)
    assert member.opts.specs == rs.specs and member.cluster == member_cluster(specs.cluster, 1)
    paths = member.paths
    paths.run_dir.mkdir(parents=True)
    write_run(job_request(member.cluster, member.model, member.plan, paths, member.opts, build=False),
              member.cluster, member.model, member.plan, replica={"set": "set", "index": 1},
              specs=member.opts.specs)
    spec.unlink()
    succ = successor_launch(paths.run_dir, ["node1"])
    assert succ.cluster.ports == member.cluster.ports and succ.opts.member == 1
    assert succ.cluster.time_limit == "3:00:00" and succ.opts.specs == rs.specs


def _written(launch: Launch) -> RunRecord:
    """`launch`'s run folder as Launch.prepare writes it, and its record (nothing submitted)."""
    paths = launch.paths
    paths.run_dir.mkdir(parents=True)
    write_run(job_request(launch.cluster, launch.model, launch.plan, paths, launch.opts, build=False),
              launch.cluster, launch.model, launch.plan, replica=launch._replica(), specs=launch.opts.specs)
    rec = RunRecord(run_id=paths.run_id, created=0.0, cluster_name="c", cluster_source="", scheduler="slurm",
                    style="front" if launch.opts.step else "none", run_dir=str(paths.run_dir), nodes=1, model="m",
                    job_id="7", replica_of=launch.opts.member_of, replica=launch.opts.member)
    RunStore().add(rec)
    return rec


def test_a_replica_sets_later_members_come_from_the_sets_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTCLUSTER_STATE_DIR", str(tmp_path / "state"))
    out, spec = _render(tmp_path, "--time", "5:00:00")
    specs = read_specs(out)
    assert specs is not None
    rs = ReplicaSet(specs.cluster, specs.model, specs.plan, LaunchOptions(keep_serving=True), 1, run_id="set")
    front = _written(rs.front(build=False))
    member = _written(rs.member(0))
    write_members(Path(front.run_dir), [{"replica": 0, "run_id": member.run_id, "run_dir": member.run_dir}])
    spec.unlink()   # a scale or a rolling restart reads none of the user's files
    again = recorded_set(front)
    assert again.specs == rs.specs and again.cluster.time_limit == "5:00:00"
    assert again.member(1).cluster == member_cluster(specs.cluster, 1)


def test_a_damaged_specs_file_is_named(tmp_path: Path) -> None:
    out, _ = _render(tmp_path)
    (out / "scripts" / SPECS_FILE).write_text('{"version": 1, "cluster": {"scheduler": "pbs"}}')
    with pytest.raises(Exception, match=f"{SPECS_FILE} is damaged") as info:
        successor_launch(out, [])
    assert info.type.__name__ == "UserError"


def test_a_folder_from_before_takes_its_specs_from_its_files(tmp_path: Path) -> None:
    out, spec = _render(tmp_path, "--time", "4:00:00")
    (out / "scripts" / SPECS_FILE).unlink()
    assert read_specs(out) is None
    succ = successor_launch(out, [])
    # The file's values (the override was never kept), and it must still be there.
    assert succ.cluster.time_limit == load_cluster(spec).time_limit == "01:00:00" and succ.model == load_model(DEMO)
    spec.unlink()
    with pytest.raises(Exception, match="does not exist"):
        successor_launch(out, [])
