"""`status`'s text table: a replica set's members and its balancer's own node, whole values that
wrap at words, a reason row that holds a reason. Slurm's answers are the test bed's own
(squeue -o '%T|%R|%N' of running jobs), recorded and played back."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from ftcluster.observe import status as status_module
from ftcluster.cli.commands_runs import status_table
from ftcluster.schedulers.slurm import SlurmScheduler
from ftcluster.hosts.runner import CommandResult
from ftcluster.schedulers.slurm_cli import Slurm
from ftcluster.observe.status import run_status
from ftcluster.run.store import RunRecord, RunStore
from tests.unit.test_slurm import Scripted


class Squeue(Scripted):
    """squeue of each job by its id, as the bed's answered for running jobs."""

    def __init__(self, nodes: dict[str, str]):
        super().__init__()
        self.nodes = nodes

    def run(self, argv: list[str], *, cwd: str | None = None, timeout: float | None = 60.0) -> CommandResult:
        if argv[0] == "squeue":
            node = self.nodes[argv[argv.index("-j") + 1]]
            return CommandResult(tuple(argv), 0, f"RUNNING|{node}|{node}\n", "")
        return super().run(argv, cwd=cwd, timeout=timeout)


def _text(st: dict[str, object], width: int = 100_000) -> str:
    console = Console(width=width, force_terminal=False, highlight=False, record=True)
    console.print(status_table(st))
    return console.export_text()


def _record(run_id: str, run_dir: Path, job_id: str, style: str = "none", **kw: object) -> RunRecord:
    (run_dir / "state").mkdir(parents=True, exist_ok=True)
    rec = RunRecord(run_id=run_id, created=time.time(), cluster_name="c", cluster_source="", scheduler="slurm",
                    style=style, run_dir=str(run_dir), nodes=1, model="m", job_id=job_id, status="SERVING", **kw)
    RunStore().add(rec)
    return rec


def test_a_replica_sets_status_shows_its_members_and_its_balancers_own_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = Squeue({"10": "node3", "11": "node1", "12": "node2"})
    monkeypatch.setattr(status_module, "scheduler_for_record", lambda rec: SlurmScheduler(runner))
    front = _record("set", tmp_path / "set", "10", style="front")
    members = [_record(f"set-r{i}", tmp_path / f"r{i}", job, replica_of="set", replica=i)
               for i, job in enumerate(("11", "12"))]
    for i, m in enumerate(members):
        Path(m.run_dir, "state", "events").write_text(f"1.0 job_started node{i + 1} {m.job_id}\n"
                                                      f"2.0 ready node{i + 1}:8000\n3.0 serving node{i + 1}:8000\n")
    (tmp_path / "set" / "replicas.json").write_text(json.dumps(
        {"members": [{"replica": i, "run_id": m.run_id, "run_dir": m.run_dir} for i, m in enumerate(members)]}))
    (tmp_path / "set" / "state" / "rotation.json").write_text(json.dumps(
        {"members": [{"run_dir": members[0].run_dir, "in": True},
                     {"run_dir": members[1].run_dir, "in": False, "why": "probe missed"}]}))
    st = run_status(front)
    assert st["balancer_nodes"] == ["node3"] and st["nodes"] == ["node3", "node1", "node2"]
    text = _text(st)
    assert "balancer nodes │ node3 " in text and "│ nodes " not in text, text
    assert ("replica 0      │ run set-r0 (job 11): RUNNING, serving, in rotation; nodes node1; endpoint node1:8000"
            in text), text
    assert "replica 1      │ run set-r1 (job 12): RUNNING, serving, out of rotation: probe missed; nodes node2" in text


def test_a_running_jobs_node_list_is_no_reason() -> None:
    # squeue's %R is a pending job's reason but a running job's node list.
    running = Slurm(Squeue({"7": "node[1-2]"})).info("7")
    assert running.reason == "" and running.nodes == ("node1", "node2")
    pending = Slurm(Scripted(squeue=(0, "PENDING|(Resources)|\n", ""))).info("7")
    assert pending.reason == "(Resources)"


def test_a_long_restart_cause_is_whole_and_wraps_at_words(tmp_path: Path) -> None:
    cause = ("rank 1 on node2 died (exit 137): the server was killed by the kernel's OOM killer while it loaded "
             "the weights of layer 17 of 48; the world restarts on the same allocation, every node answered")
    st = {"run_id": "r", "job_id": "7", "state": "RUNNING", "phase_label": "serving", "failure": None,
          "endpoint": "node1:8000", "access": "cluster", "source": "squeue", "reason": None, "nodes": ["node1"],
          "run_dir": str(tmp_path), "health": None, "room": None, "predecessor": None, "successor": None,
          "restarts": [{"time": 1.0, "cause": cause}], "ranks": [], "replicas": None}
    assert cause in _text(st)                      # piped: one line, whole
    narrow = _text(st, width=80)
    words = [w for line in narrow.splitlines() for w in line.strip("│ ").split()]
    assert all(len(line) <= 80 for line in narrow.splitlines())
    assert " ".join(cause.split()) in " ".join(words), narrow     # every word whole, in order
