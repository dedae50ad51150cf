"""Replica sets, the pure parts: member ids and ports, the plan's refusals, the front's Caddy
config and the member's proxy config, and what the front reads from the members' folders."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from ftcluster.job.front import Front, needs_load
from ftcluster.plan.parallel import Plan, RankSlot
from ftcluster.plan.endpoint import caddy_config, loopback_ports
from ftcluster.plan.replicas import GRPC_UNARY_RETRIED, front_config, member_cluster, member_id, replica_problems
from tests.helpers_specs import cluster


def _plan(nodes: int) -> Plan:
    return Plan(nodes=nodes, gpus_per_node=1, tensor_para_size=1, pipeline_para_size=nodes, world_size=nodes,
                ranks=tuple(RankSlot(r, r, None, 1) for r in range(nodes)), engine_model="gpt")


def test_member_ids_and_ports() -> None:
    c = cluster(ports={"http": 9000, "grpc": 9001, "metrics": 9002}, balancer={"port_step": 20})
    assert member_id("set", 0) == "set-r0" and member_id("set", 1, 2) == "set-r1.2"
    m1 = member_cluster(c, 1)
    assert (m1.ports.http, m1.ports.grpc, m1.ports.metrics) == (9040, 9041, 9042) and m1.replicas == 1
    assert c.ports.http == 9000   # the front keeps the spec's


def test_problems_name_every_field() -> None:
    slurm = cluster(scheduler="slurm", max_nodes=4, ports={"http": 65500, "grpc": 65501, "metrics": 65502})
    problems = replica_problems(slurm, _plan(2), 3, one_host=False, rank_stride=0, nodes_known=5)
    text = "; ".join(problems)
    assert "3 x 2 node(s) + 1 for the balancer = 7 nodes, but the cluster has 5" in text
    assert "above max_nodes (4)" in text
    assert "balancer.port_step" in text and "65535" in text
    # One world behind the balancer (balancer.always) is a set too: its nodes and the balancer's.
    assert "1 x 2 node(s) + 1 for the balancer = 3 nodes, but the cluster has 1" in \
        "; ".join(replica_problems(slurm, _plan(2), 1, False, 0, 1))
    assert replica_problems(cluster(scheduler="slurm", max_nodes=4), _plan(2), 1, False, 0, 3) == []
    shared = cluster(scheduler="slurm", exclusive=False)   # jobs may share nodes: no count to meet
    assert replica_problems(shared, _plan(2), 3, False, 0, 3) == []
    ok = cluster(scheduler="slurm", access="cluster")
    assert replica_problems(ok, _plan(2), 2, False, 0, 5) == []
    ssh = cluster(scheduler="ssh", hosts=["a", "b"], access="cluster", container={"runtime": "docker", "image": "i"})
    assert any("ssh + Docker" in p for p in replica_problems(ssh, _plan(1), 2, False, 0, None))


def test_ports_that_meet_are_refused() -> None:
    # port_step 1: member 0's HTTP port is the balancer's gRPC port.
    c = cluster(balancer={"port_step": 1})
    problems = replica_problems(c, _plan(1), 2, one_host=True, rank_stride=10, nodes_known=None)
    assert len(problems) == 1 and "replica 0's http port 8001 is the balancer's grpc's too" in problems[0]
    # Private members: Triton's loopback ports (proxy.loopback_offset above) count too.
    c = cluster(access="private", balancer={"port_step": 50}, proxy={"loopback_offset": 100})
    problems = replica_problems(c, _plan(1), 3, one_host=True, rank_stride=10, nodes_known=None)
    assert problems and "(loopback)" in problems[0]


def _servers(cfg: dict) -> dict:  # type: ignore[type-arg]
    return cfg["apps"]["http"]["servers"]  # type: ignore[no-any-return]


def test_front_config() -> None:
    private = front_config(cluster(access="private", balancer={"retry_for": 90, "buffer_mb": 4}), "")
    # Off until the controller gives its job's Caddy a socket of its own (no localhost:2019).
    assert private["admin"] == {"disabled": True, "config": {"persist": False}}
    http = _servers(private)["http"]
    assert http["listen"] == [":8000"]
    first = http["routes"][0]
    assert first["handle"][0]["status_code"] == 401   # the token first
    proxies = [h for r in http["routes"] for h in r["handle"] if h["handler"] == "reverse_proxy"]
    assert len(proxies) == 1
    p = proxies[0]
    assert p["upstreams"] == [] and p["request_buffers"] == 4 << 20
    assert p["load_balancing"]["selection_policy"] == {"policy": "least_conn"}
    assert p["load_balancing"]["try_duration"] == "90s"
    assert p["load_balancing"]["retry_match"] == [{"method": ["GET", "HEAD", "POST"]}]
    grpc = _servers(private)["grpc"]["routes"]
    unary = [r for r in grpc if r.get("match") == [{"path": [GRPC_UNARY_RETRIED]}]]
    assert len(unary) == 1 and "request_buffers" in unary[0]["handle"][0]
    streams = grpc[-1]["handle"][0]
    assert "request_buffers" not in streams and streams["flush_interval"] == -1   # a stream is never buffered
    assert "FTC_PROXY_TOKEN" in json.dumps(private) and "Bearer {env.FTC_PROXY_TOKEN}" in json.dumps(private)
    open_ = front_config(cluster(access="cluster"), "127.0.0.1")
    assert "FTC_PROXY_TOKEN" not in json.dumps(open_)
    assert _servers(open_)["http"]["listen"] == ["127.0.0.1:8000"]


def test_member_proxy_drops_a_failed_request_and_keeps_access() -> None:
    c = cluster(access="cluster")
    lo = loopback_ports(c.ports, c.proxy)
    member = caddy_config(c.ports, lo, c.proxy, token=False, member=True)
    for s in _servers(member).values():
        assert s["errors"] == {"routes": [{"handle": [{"handler": "static_response", "abort": True}]}]}
    text = json.dumps(member)
    assert "FTC_PROXY_TOKEN" not in text and "403" not in text   # access: cluster hides nothing
    assert "metrics" in _servers(member)
    alone = caddy_config(c.ports, lo, c.proxy)
    assert all("errors" not in s for s in _servers(alone).values())


def _member_dir(root: Path, name: str, rotation: dict | None, events: str = "") -> Path:  # type: ignore[type-arg]
    d = root / name
    (d / "state").mkdir(parents=True)
    (d / "state" / "events").write_text(events)
    if rotation is not None:
        (d / "state" / "rotation").write_text(json.dumps(rotation))
    return d


def test_the_front_follows_members_and_successors(tmp_path: Path) -> None:
    a = _member_dir(tmp_path, "s-r0", {"in": True, "host": "n1", "http": 8020, "grpc": 8021},
                    events=f"1.0 successor_submitted s2 77 {tmp_path / 's2'} n1\n")
    b = _member_dir(tmp_path, "s-r1", {"in": False, "why": "a probe missed", "host": "n3", "http": 8040, "grpc": 8041})
    _member_dir(tmp_path, "s2", {"in": True, "host": "n5", "http": 8020, "grpc": 8021})
    gone = _member_dir(tmp_path, "s-r2", {"in": True, "host": "n6", "http": 8060, "grpc": 8061}, events="1.0 done 0\n")
    _member_dir(tmp_path, "s-r3", None)   # not started yet
    members = tmp_path / "replicas.json"
    members.write_text(json.dumps({"members": [{"replica": k, "run_dir": str(d)} for k, d in
                                               enumerate([a, b, gone, tmp_path / "s-r3"])]}))
    state = tmp_path / "front"
    state.mkdir()
    (state / "cfg.json").write_text(json.dumps(front_config(cluster(), "")))
    front = Front({"members": str(members), "state": str(state), "config": str(state / "cfg.json"), "token_file": ""})
    ups, seen = front.wanted()
    # Every live member's address (one out of rotation refuses connections), a successor's too.
    assert ups == [("n1", 8020, 8021), ("n3", 8040, 8041), ("n5", 8020, 8021)]
    assert [(m["endpoint"], m["in"]) for m in seen] == [("n1:8020", True), ("n5:8020", True), ("n3:8040", False),
                                                       ("n6:8060", False)]
    assert front.chains.runs(str(a)) == [(str(a), False), (str(tmp_path / "s2"), False)]
    assert front.chains.runs(str(gone)) == [(str(gone), True)]
    # Preempted and requeued (PreemptMode=REQUEUE): the earlier attempt's `done`, then the job
    # starts again in the same run folder and serves: a member again, not a gone one.
    (gone / "state" / "events").write_text("1.0 job_started n6 70\n2.0 done 143\n3.0 job_started n7 70\n")
    assert front.chains.runs(str(gone)) == [(str(gone), False)]
    assert ("n6", 8060, 8061) in front.wanted()[0]
    cfg = front.config(ups)
    dials = [u["dial"] for r in _servers(cfg)["grpc"]["routes"] for h in r["handle"] if h["handler"] == "reverse_proxy"
             for u in h["upstreams"]]
    assert dials == ["n1:8021", "n3:8041", "n5:8021"] * 2
    # The job's own admin socket, 0600, in the state folder: never a TCP port.
    assert cfg["admin"] == {"listen": f"unix/{front.admin_name}|0600", "config": {"persist": False}}
    assert front.admin_name == f"admin-{os.environ.get('SLURM_JOB_ID') or os.getpid()}.sock"


def test_a_look_reads_a_members_live_runs_only_however_long_its_chain(tmp_path: Path, monkeypatch: Any) -> None:
    """Days of hourly hand-overs give a member hundreds of runs, each naming the next: the
    front's look (every 0.5 s) reads an ended run once, then only the live runs and the set's
    own files -- a constant load on the shared filesystem, not one that grows with the days."""
    import builtins

    links = 200
    dirs = [tmp_path / f"s-r0.{k}" for k in range(links)]
    for k, d in enumerate(dirs):
        last = k == links - 1
        nxt = "" if last else f"1.0 successor_submitted s{k + 1} {100 + k} {dirs[k + 1]} n1\n"
        _member_dir(tmp_path, d.name, {"in": True, "host": f"n{k}", "http": 8020, "grpc": 8021},
                    events=f"0.5 job_started n{k} {100 + k}\n" + nxt + ("" if last else "2.0 done 0\n"))
    members = tmp_path / "replicas.json"
    members.write_text(json.dumps({"members": [{"replica": 0, "run_dir": str(dirs[0])}]}))
    state = tmp_path / "front"
    state.mkdir()
    (state / "cfg.json").write_text(json.dumps(front_config(cluster(), "")))
    front = Front({"members": str(members), "state": str(state), "config": str(state / "cfg.json"), "token_file": ""})
    opened: list[str] = []
    real_open = builtins.open

    def spy(path: Any, *args: Any, **kw: Any) -> Any:
        opened.append(str(path))
        return real_open(path, *args, **kw)

    monkeypatch.setattr(builtins, "open", spy)
    ups, seen = front.wanted()
    first = len(opened)
    opened.clear()
    assert front.wanted() == (ups, seen)
    monkeypatch.setattr(builtins, "open", real_open)
    # The live run alone is a member now: those before it handed over and ended.
    assert ups == [(f"n{links - 1}", 8020, 8021)] and [m["run_dir"] for m in seen] == [str(dirs[-1])]
    assert first >= links   # every run read once
    assert sorted(opened) == sorted([str(members), str(dirs[-1] / "state" / "events"),
                                     str(dirs[-1] / "state" / "rotation")]), opened


def test_only_an_added_address_loads_a_config() -> None:
    a, b, c = ("n1", 8020, 8021), ("n2", 8040, 8041), ("n3", 8020, 8021)
    assert needs_load([a], [a, b])              # a member started
    assert needs_load([a, b], [a, c])           # one moved: c is new
    assert not needs_load([a, b], [a])          # one went: passed over until the next load
    assert not needs_load([a, b], [b, a])


def test_the_front_takes_its_time_limit_notice_itself_on_slurm() -> None:
    """On Slurm the front's job asks for the time-limit notice on its steps (the front, not the
    batch shell), and its settings say how to submit its own script again and record the new job."""
    from ftcluster.launch.run import LaunchOptions
    from ftcluster.engines import make_plan
    from ftcluster.launch.replica_set import ReplicaSet
    from ftcluster.spec.defaults import embedded_model_path
    from ftcluster.spec.load import load_model

    demo = load_model(embedded_model_path())

    def model() -> Any:
        return demo

    spec = cluster(scheduler="slurm", time_limit="02:00:00", server={"handover_lead": 300})
    rs = ReplicaSet(spec, model(), make_plan(spec, model(), 1), LaunchOptions(keep_serving=True), 2, run_id="s1")
    text = rs.dry_run()
    front = text.split("# run s1-r0")[0]
    assert re.search(r"^#SBATCH --signal=USR1@300$", front, re.M), front[:1500]
    # Its node lost, Slurm starts the balancer's job again elsewhere, whatever the site's JobRequeue.
    assert re.search(r"^#SBATCH --requeue$", front, re.M) and re.search(r"^#SBATCH --open-mode=append$", front, re.M)
    members = text[len(front):]
    assert re.search(r"^#SBATCH --signal=B:USR1@300$", members, re.M)   # a member's supervisor hands over
    settings = json.loads(front.split("scripts/front.json (0644) =====\n")[1].split("\n# =====")[0])
    run_dir = str(rs.paths.run_dir)
    assert settings["handover_lead"] == 300 and settings["script"] == f"{run_dir}/scripts/job.sbatch"
    assert settings["run_dir"] == run_dir
    assert settings["record"][1:] == ["-m", "ftcluster", "successor", run_dir, "--took-over"]
    # Its Caddy's log is cut as the servers' logs are (server.log_max_mb).
    assert settings["log_max_bytes"] == 256 << 20
    # Without Slurm, no notice comes: nothing to hand over.
    local = cluster(time_limit="02:00:00")
    text = ReplicaSet(local, model(), make_plan(local, model(), 1), LaunchOptions(keep_serving=True), 2,
                      run_id="s2").dry_run()
    assert "--signal" not in text and '"handover_lead": 0' in text


def test_a_stopped_front_keeps_its_successor_only_at_its_time_limit() -> None:
    from ftcluster.job.front import successor_decision

    # Slurm's TERM at the limit comes `lead` seconds after the notice: the successor starts when
    # this job's node frees. A stop before that is the run's stop: the successor goes too.
    assert successor_decision(1000.0 + 300, 1000.0, 300) == "keep"
    assert successor_decision(1000.0 + 250, 1000.0, 300) == "keep"
    assert successor_decision(1000.0 + 100, 1000.0, 300) == "cancel"
    assert successor_decision(1000.0, None, 300) == "cancel"


def test_a_successor_that_no_record_can_name_is_cancelled(tmp_path: Path, monkeypatch: Any,
                                                          capsys: Any) -> None:
    """The run's record cannot be given the new job (here: no run is recorded for the folder, as
    when the store cannot be reached from the node): the new job is cancelled (a job that no
    record names would outlive `stop`) and the old front serves on, its events not set apart."""
    import sys

    from ftcluster.job.front import Front

    state = tmp_path / "state"
    state.mkdir()
    (state / "cfg.json").write_text(json.dumps(front_config(cluster(), "")))
    # scancel stands in for Slurm's (not on a unit test's machine): it notes what it was asked.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/scancel.args\n")
    (bin_dir / "scancel").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FTCLUSTER_STATE_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    front = Front({"members": str(tmp_path / "replicas.json"), "state": str(state), "config": str(state / "cfg.json"),
                   "token_file": "", "handover_lead": 300,
                   "record": [sys.executable, "-m", "ftcluster", "successor", str(tmp_path), "--took-over"]})
    front.successor, front.notice_at, front.serving = "42", 1.0, True
    (state / "front-job.json").write_text(json.dumps({"job_id": "42"}))
    front.hand_over_step()
    assert not front.stopping and not front.handing_over
    assert (tmp_path / "scancel.args").read_text().split() == ["42"]
    assert not (state / "taken-over-41").exists()
    assert "could not be given job 42" in capsys.readouterr().out


@pytest.mark.parametrize(("answer", "said"), [
    ((0, "", ""), False),
    ((1, "", "scancel: error: Kill job error on job id 42: Job/step already completing or completed"), False),
    ((1, "", "scancel: error: Kill job error on job id 42: Invalid job id specified"), False),
    ((1, "", "scancel: error: Socket timed out on send/recv operation"), True)])
def test_a_successor_already_ended_needs_no_cancel_and_no_word(tmp_path: Path, capsys: Any,
                                                               answer: tuple[int, str, str], said: bool) -> None:
    """The balancer cancels its successor: a job that has already ended (or that Slurm has
    forgotten) is no failure to report, as `Slurm.cancel` reads scancel; a Slurm that did not
    answer is."""
    front = Front({"members": str(tmp_path / "replicas.json"), "state": str(tmp_path), "config": "", "token_file": ""})
    asked: list[list[str]] = []
    front.run = lambda argv, cwd, timeout: (asked.append(argv), answer)[1]  # type: ignore[method-assign]
    front.successor, front.handing_over = "42", True
    front.cancel_successor()
    assert asked == [["scancel", "42"]] and not front.handing_over
    assert ("could not be cancelled: scancel: error: Socket timed out" in capsys.readouterr().out) == said


def test_a_front_keeps_the_last_look_of_the_front_before_it(tmp_path: Path) -> None:
    """rotation.json holds the time of a front's last look; a front that starts (after a requeue:
    its node was lost, no last word) appends it to last-alive before its first look replaces
    it, where `report` finds when the lost front last served. None there: nothing written."""
    from ftcluster.job.front import Front

    state = tmp_path / "front"
    state.mkdir()
    (state / "cfg.json").write_text(json.dumps(front_config(cluster(), "")))
    front = Front({"members": str(tmp_path / "replicas.json"), "state": str(state), "config": str(state / "cfg.json"),
                   "token_file": ""})
    front.keep_last_look()
    assert not (state / "last-alive").exists()
    (state / "rotation.json").write_text(json.dumps({"time": 1795825127.25, "upstreams": [], "in_rotation": []}))
    front.keep_last_look()
    assert (state / "last-alive").read_text().split()[0] == "1795825127.250"
