"""A run's facts are resolved in one place (ftcluster.plan.facts.resolve) and kept with the run
(scripts/specs.json): a rule changed there changes every reader, no reader works a fact out
again, and what one launch saved is what its successor and its set's members are made from."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import ftcluster.plan.facts as facts_module
import ftcluster.spec.launch_styles as launch_styles
from ftcluster.job.config import JobConfig, LivenessConfig
from ftcluster.launch.replica_set import ReplicaSet, front_step, recorded_set, write_members
from ftcluster.launch.run import Launch, LaunchOptions, job_request, write_run
from ftcluster.launch.successor import successor_launch
from ftcluster.schedulers.local import _ports_of
from ftcluster.observe.status import run_status
from ftcluster.plan.facts import RunFacts, member_ports, resolve
from ftcluster.engines import make_plan
from ftcluster.plan.replicas import ports_of
from ftcluster.render.launched import SPECS_FILE, LaunchedSpecs, read_facts, read_specs
from ftcluster.render.request import JobRequest, build_request
from ftcluster.render.scripts import RenderOptions, context
from ftcluster.run.folder import record_of_folder
from ftcluster.run.layout import FILES, RunPaths
from ftcluster.run.store import RunRecord, RunStore
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.spec.defaults import embedded_model_path
from ftcluster.spec.launch_styles import STYLES
from ftcluster.spec.load import load_model, with_values
from tests.helpers_specs import cluster

PACKAGE = Path(__file__).resolve().parents[2] / "ftcluster"
# Where the rules live: the resolver, and the proxy's own checks beside it.
RULE_MODULES = {PACKAGE / "plan" / "facts.py", PACKAGE / "plan" / "endpoint.py"}
SLURM = {"name": "s", "scheduler": "slurm", "partition": "gpu", "gpus_per_node": 1,
         "server": {"binary": "/opt/tritonserver/bin/tritonserver"}}


def _local(tmp_path: Path, **spec: object) -> ClusterSpec:
    return cluster(workspace=str(tmp_path / "ws"), ports={"http": 21000, "grpc": 21001, "metrics": 21002}, **spec)


def _request(c: ClusterSpec, tmp_path: Path, run_id: str = "r1", **opts: object) -> JobRequest:
    m = load_model(embedded_model_path())
    paths = RunPaths(run_id, tmp_path / "ws" / run_id)
    options = RenderOptions(tritonserver="/opt/t", **opts)   # type: ignore[arg-type]
    return build_request(c, m, make_plan(c, m, 2), paths, options)


def _written_status(c: ClusterSpec, tmp_path: Path, run_id: str) -> dict[str, object]:
    """`status` of a run of `c` whose folder a launch wrote (nothing submitted)."""
    m = load_model(embedded_model_path())
    plan = make_plan(c, m, 2)
    request = _request(c, tmp_path, run_id, keep_serving=True)
    request.paths.run_dir.mkdir(parents=True)
    write_run(request, c, m, plan)
    rec = RunRecord(run_id=run_id, created=0.0, cluster_name="c", cluster_source="", scheduler=c.scheduler,
                    style=request.style, run_dir=str(request.paths.run_dir), nodes=2, model=m.name)
    return run_status(rec)


def test_the_access_rule_changed_in_the_resolver_changes_every_reader(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    c = _local(tmp_path)
    m = load_model(embedded_model_path())
    plan = make_plan(c, m, 2)
    paths = RunPaths("r0", tmp_path / "ws" / "r0")
    # The local style's own rule: cluster (it binds the loopback already).
    assert not context(c, m, plan, paths, RenderOptions(tritonserver="/t")).private
    assert not _request(c, tmp_path).private
    assert all(whose != "the proxy" for _, _, whose, _ in _ports_of(c, plan))
    assert _written_status(c, tmp_path, "before")["access"] == "cluster"
    assert not front_step(c, paths, build=False).token

    monkeypatch.setattr(facts_module, "access_of", lambda spec: "private")
    ctx = context(c, m, plan, paths, RenderOptions(tritonserver="/t"))
    assert ctx.private and ctx.triton_ports == c.ports.shifted(c.proxy.loopback_offset)
    request = _request(c, tmp_path)
    assert request.private and request.facts is not None and request.facts.access == "private"
    assert [p for n, p, whose, _ in _ports_of(c, plan) if whose == "the proxy"] == [c.ports.http, c.ports.grpc]
    assert _written_status(c, tmp_path, "after")["access"] == "private"
    assert front_step(c, paths, build=False).token
    # A step of the same spec serves no Triton: no proxy of its own, whatever the access.
    assert not resolve(c, serves=False).private and resolve(c, serves=False).access == "private"


def test_the_loopback_rule_changed_in_the_resolver_changes_every_reader(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(facts_module, "loopback_shift", lambda proxy: 555)
    c = cluster(**SLURM, workspace=str(tmp_path / "ws"))   # Slurm: private by its style's rule
    m = load_model(embedded_model_path())
    plan = make_plan(c, m, 2)
    request = _request(c, tmp_path, keep_serving=True)
    files = {f.path: f.text for f in request.files}
    job = JobConfig.from_json(files[f"scripts/{FILES.job_config}"])
    assert job.proxy is not None and job.proxy.triton_http_port == c.ports.http + 555
    assert f"127.0.0.1:{c.ports.grpc + 555}" in files[f"scripts/{FILES.proxy_config}"]
    local = _local(tmp_path, access="private")
    assert [p for n, p, whose, _ in _ports_of(local, plan) if whose == "rank 1" and n == "http"] == [
        local.ports.http + 555 + facts_module.LOCAL_PORT_STRIDE]
    assert ("replica 0's http (loopback)", c.ports.http + c.balancer.port_step + 555) in ports_of(c, 1, 1, 0)
    request.paths.run_dir.mkdir(parents=True)
    write_run(request, c, m, plan)
    saved = read_facts(request.paths.run_dir)
    assert saved is not None and saved.triton.http == c.ports.http + 555 and saved == request.facts


def test_no_reader_derives_a_fact_again() -> None:
    """The rules' own names are called in the rule modules alone (imported elsewhere at most)."""
    derivations = re.compile(r"\b(access_of|loopback_ports|member_ports|loopback_shift|member_shift|port_stride"
                             r"|serving_restarts)\(|LOCAL_PORT_STRIDE\b|\.loopback_offset\s*[-+*]|\.port_step\s*\*"
                             r"|\(paths?\.scripts\s*/\s*FILES\.token\)\.is_file")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in RULE_MODULES:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if derivations.search(line) and not line.lstrip().startswith(("#", "def ")):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}")
    # status's guess from the token file, for a folder an earlier ftcluster wrote (no saved facts), alone.
    assert [f for f in found if "observe/status.py" not in f] == []
    assert len(found) <= 1


def test_the_facts_come_back_as_saved_and_a_version_1_file_is_resolved(tmp_path: Path) -> None:
    c = cluster(**SLURM, workspace=str(tmp_path / "ws"))
    request = _request(c, tmp_path, keep_serving=True)
    assert request.facts is not None
    assert RunFacts.from_dict(json.loads(json.dumps(request.facts.to_dict()))) == request.facts
    m = load_model(embedded_model_path())
    plan = make_plan(c, m, 2)
    request.paths.run_dir.mkdir(parents=True)
    write_run(request, c, m, plan)
    path = request.paths.scripts / SPECS_FILE
    data = json.loads(path.read_text())
    assert data["version"] == 2 and data["facts"]["access"] == "private"
    # An earlier ftcluster's file: no facts, version 1; read the same, its facts resolved from it.
    del data["facts"]
    path.write_text(json.dumps({**data, "version": 1}))
    assert read_specs(request.paths.run_dir) == LaunchedSpecs(c, m, plan)
    assert read_facts(request.paths.run_dir) == request.facts


def _launched(launch: Launch) -> Path:
    """`launch`'s run folder as Launch.prepare writes it (nothing submitted)."""
    paths = launch.paths
    paths.run_dir.mkdir(parents=True)
    write_run(job_request(launch.cluster, launch.model, launch.plan, paths, launch.opts, build=False),
              launch.cluster, launch.model, launch.plan, replica=launch._replica(), specs=launch.opts.specs)
    return paths.run_dir


def test_what_a_launch_saved_is_what_its_successor_and_its_sets_members_run_with(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A value given only at launch (as a command-line override is): server.restarts 7, a
    # loopback offset of 300; and a rule of that launch's (twice the offset) that no later
    # reader has: a successor gets the saved value, not a value worked out again.
    base = cluster(**SLURM, workspace=str(tmp_path / "ws"))
    c = base.model_copy(update={"server": base.server.model_copy(update={"restarts": 7}),
                                "proxy": base.proxy.model_copy(update={"loopback_offset": 300})})
    m = load_model(embedded_model_path())
    plan = make_plan(c, m, 2)
    with monkeypatch.context() as patch:
        patch.setattr(facts_module, "loopback_shift", lambda proxy: 2 * proxy.loopback_offset)
        run_dir = _launched(Launch(c, m, plan, LaunchOptions(keep_serving=True, client=False), run_id="run"))
    saved = read_facts(run_dir)
    assert saved is not None and saved.triton.http == c.ports.http + 600 and saved.restarts == 7
    job = JobConfig.from_json((run_dir / "scripts" / FILES.job_config).read_text())
    assert job.restarts == 7 and job.proxy is not None and job.proxy.triton_http_port == saved.triton.http

    succ = successor_launch(run_dir, ["node1"])
    request = succ.request()
    assert request.facts == saved
    succ_job = JobConfig.from_json({f.path: f.text for f in request.files}[f"scripts/{FILES.job_config}"])
    assert succ_job.restarts == 7 and succ_job.proxy is not None and succ_job.proxy.triton_http_port == c.ports.http + 600

    # A replica set's member (a scale, a rolling restart) is made from the specs its set saved.
    specs = read_specs(run_dir)
    assert specs is not None
    rs = ReplicaSet(specs.cluster, specs.model, specs.plan, LaunchOptions(keep_serving=True), 2, run_id="set")
    member = rs.member(1).request()
    assert member.facts is not None and member.facts.restarts == 7
    assert member.facts.public == member_ports(c, 1) and member.facts.proxied
    assert member.facts.triton == member_ports(c, 1).shifted(300)
    member_job = JobConfig.from_json({f.path: f.text for f in member.files}[f"scripts/{FILES.job_config}"])
    assert member_job.restarts == 7 and member_job.http_port == member_ports(c, 1).http


def test_the_member_port_rule_changed_in_the_resolver_changes_every_reader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(facts_module, "member_shift", lambda spec, k: 1000 * (k + 1))
    c = cluster(**SLURM, workspace=str(tmp_path / "ws"))
    m = load_model(embedded_model_path())
    plan = make_plan(c, m, 2)
    assert ("replica 1's http", c.ports.http + 2000) in ports_of(c, 2, 1, 0)
    rs = ReplicaSet(c, m, plan, LaunchOptions(keep_serving=True, client=False), 2, run_id="set")
    member = rs.member(1)
    assert member.cluster.ports.http == c.ports.http + 2000
    request = member.request()
    assert request.facts is not None and request.facts.public.http == c.ports.http + 2000
    job = JobConfig.from_json({f.path: f.text for f in request.files}[f"scripts/{FILES.job_config}"])
    assert job.http_port == c.ports.http + 2000 and job.rotation
    # The member's successor, and its facts read back from a folder that saved none (version 1).
    run_dir = _launched(member)
    assert successor_launch(run_dir, ["node1"]).cluster.ports.http == c.ports.http + 2000
    path = run_dir / "scripts" / SPECS_FILE
    data = json.loads(path.read_text())
    del data["facts"]
    path.write_text(json.dumps({**data, "version": 1}))
    facts = read_facts(run_dir)
    assert facts is not None and facts.public.http == c.ports.http + 2000 and facts.proxied


def test_the_style_rule_changed_in_the_resolver_changes_every_reader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = cluster(**SLURM, workspace=str(tmp_path / "ws"))   # runtime none: the bare Slurm style
    assert _request(c, tmp_path, "before").style == "none"
    # The rule is the styles' own (ftcluster.spec.launch_styles); the resolver applies it.
    monkeypatch.setattr(launch_styles, "style_name", lambda scheduler, runtime: "charliecloud")
    request = _request(c, tmp_path, "after", keep_serving=True)
    files = {f.path: f.text for f in request.files}
    assert request.style == "charliecloud" and request.facts is not None and request.facts.style == "charliecloud"
    assert "scripts/charliecloud_node.sh" in files
    assert JobConfig.from_json(files[f"scripts/{FILES.job_config}"]).style == STYLES["charliecloud"].job_style
    m = load_model(embedded_model_path())
    request.paths.run_dir.mkdir(parents=True)
    write_run(request, c, m, make_plan(c, m, 2))
    monkeypatch.undo()
    # A folder adopted by `status DIR` keeps the style it was launched with.
    record = record_of_folder(request.paths.run_dir)
    assert record is not None and record.style == "charliecloud"


def test_the_liveness_request_is_resolved_with_the_facts_and_kept_with_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = cluster(**SLURM, workspace=str(tmp_path / "ws"))
    m = load_model(embedded_model_path())
    plan = make_plan(c, m, 2)
    made = LivenessConfig(interval=5, deadline=2, failures=3, model=m.name, body="AAAA", json_size=4,
                          what="the launch's request", metrics_port=0)
    probe = facts_module.liveness_of
    monkeypatch.setattr(facts_module, "liveness_of", lambda *a: made if probe(*a) is not None else None)
    run_dir = _launched(Launch(c, m, plan, LaunchOptions(keep_serving=True, client=False), run_id="run"))
    assert JobConfig.from_json((run_dir / "scripts" / FILES.job_config).read_text()).liveness == made
    saved = read_facts(run_dir)
    assert saved is not None and saved.liveness == made
    # A run that ends by itself probes nothing.
    assert resolve(c, keep_serving=False, probe=lambda port: made).liveness is None
    # The rule changed after the launch: the successor probes with what the run was launched with.
    monkeypatch.setattr(facts_module, "liveness_of", lambda *a: None)
    succ = successor_launch(run_dir, ["node1"]).request()
    assert JobConfig.from_json({f.path: f.text for f in succ.files}[f"scripts/{FILES.job_config}"]).liveness == made
    # Facts an earlier ftcluster saved without the request: the job's own (job.json).
    path = run_dir / "scripts" / SPECS_FILE
    data = json.loads(path.read_text())
    del data["facts"]["liveness"]
    path.write_text(json.dumps(data))
    facts = read_facts(run_dir)
    assert facts is not None and facts.liveness == made


def test_a_new_launch_option_reaches_the_job_a_restart_a_successor_and_a_member(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An option no command line gives yet, given as the command line gives its overrides (the
    spec with a value replaced): it reaches the job (job.json, which the job reads again when it
    restarts its supervisor), the successor, and a replica set's member, and the member a
    rolling restart starts in its place, through what the launch saved alone. The launch,
    successor and replica-set modules name no option."""
    monkeypatch.setenv("FTCLUSTER_STATE_DIR", str(tmp_path / "state"))
    base = cluster(**SLURM, workspace=str(tmp_path / "ws"))
    c = with_values(base, {"server": {**base.server.model_dump(), "stall_timeout": 321.0}})
    m = load_model(embedded_model_path())
    plan = make_plan(c, m, 2)

    def job_of(request: JobRequest) -> JobConfig:
        return JobConfig.from_json({f.path: f.text for f in request.files}[f"scripts/{FILES.job_config}"])

    run_dir = _launched(Launch(c, m, plan, LaunchOptions(keep_serving=True, client=False), run_id="run"))
    assert JobConfig.from_json((run_dir / "scripts" / FILES.job_config).read_text()).stall_timeout == 321.0
    assert job_of(successor_launch(run_dir, ["node1"]).request()).stall_timeout == 321.0

    rs = ReplicaSet(c, m, plan, LaunchOptions(keep_serving=True), 1, run_id="set")
    front, member = _recorded(rs.front(build=False)), _recorded(rs.member(0))
    write_members(Path(front.run_dir), [{"replica": 0, "run_id": member.run_id, "run_dir": member.run_dir}])
    assert JobConfig.from_json((Path(member.run_dir) / "scripts" / FILES.job_config).read_text()).stall_timeout == 321.0
    # A rolling restart's new run of member 0, from the set as its folders keep it.
    again = recorded_set(front).member(0, generation=1)
    assert job_of(again.request()).stall_timeout == 321.0
    assert job_of(successor_launch(Path(member.run_dir), []).request()).stall_timeout == 321.0
    sources = "".join((PACKAGE / "launch" / name).read_text() for name in ("run.py", "successor.py", "replica_set.py"))
    assert "stall_timeout" not in sources


def _recorded(launch: Launch) -> RunRecord:
    """`launch`'s run folder as Launch.prepare writes it, and its record (nothing submitted)."""
    run_dir = _launched(launch)
    rec = RunRecord(run_id=launch.paths.run_id, created=0.0, cluster_name="c", cluster_source="", scheduler="slurm",
                    style="front" if launch.opts.step else "none", run_dir=str(run_dir), nodes=1, model="m",
                    job_id="7", replica_of=launch.opts.member_of, replica=launch.opts.member)
    RunStore().add(rec)
    return rec


def test_no_reader_works_the_style_or_a_port_out_again() -> None:
    """The style's rule and the ports' arithmetic are called in the resolver alone (and defined
    in the spec); the liveness request is made only by the probe the resolver is given."""
    derivations = re.compile(r"\bstyle_name\(|\.shifted\(|\bliveness_config\(")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "plan" / "facts.py" or path.is_relative_to(PACKAGE / "spec"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if derivations.search(line) and not line.lstrip().startswith(("#", "def ")):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}")
    # The probe render gives the resolver (run_facts) alone.
    assert len(found) == 1 and found[0].startswith("ftcluster/render/scripts.py"), found
    assert "return liveness_config(model, plan," in found[0]


def test_a_folder_whose_job_json_names_the_proxys_ports_as_before_is_read_as_it_is(tmp_path: Path) -> None:
    """job.json names Triton's loopback ports behind the proxy triton_http_port and
    triton_grpc_port; a folder an earlier ftcluster wrote (http_port, grpc_port) is still read:
    its job runs its own copied reader, and status, a successor and `status DIR` read it here."""
    c = cluster(**SLURM, workspace=str(tmp_path / "ws"))
    m = load_model(embedded_model_path())
    run_dir = _launched(Launch(c, m, make_plan(c, m, 2), LaunchOptions(keep_serving=True, client=False),
                               run_id="old"))
    path = run_dir / "scripts" / FILES.job_config
    data = json.loads(path.read_text())
    proxy = data["proxy"]
    data["proxy"] = {**{k: v for k, v in proxy.items() if not k.startswith("triton_")},
                     "http_port": proxy["triton_http_port"], "grpc_port": proxy["triton_grpc_port"]}
    path.write_text(json.dumps(data))
    job = JobConfig.from_json(path.read_text())
    assert job.proxy is not None and job.proxy.triton_http_port == proxy["triton_http_port"]
    assert job.proxy.triton_grpc_port == proxy["triton_grpc_port"]
    assert record_of_folder(run_dir) is not None
    assert successor_launch(run_dir, ["node1"]).opts.facts == read_facts(run_dir)
    rec = RunRecord(run_id="old", created=0.0, cluster_name="c", cluster_source="", scheduler=c.scheduler,
                    style="none", run_dir=str(run_dir), nodes=2, model=m.name)
    assert run_status(rec)["access"] == "private"


def test_the_rank_stride_and_restart_rules_changed_in_the_resolver_change_every_reader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(facts_module, "port_stride", lambda spec: 7)
    monkeypatch.setattr(facts_module, "serving_restarts", lambda server, keep_serving: 4 if keep_serving else 0)
    c = _local(tmp_path)
    m = load_model(embedded_model_path())
    plan = make_plan(c, m, 2)
    assert [p for n, p, whose, _ in _ports_of(c, plan) if whose == "rank 1" and n == "http"] == [c.ports.http + 7]
    request = _request(c, tmp_path, keep_serving=True)
    files = {f.path: f.text for f in request.files}
    assert "PORT_STRIDE=7\n" in files["scripts/rank_server.sh"]
    assert JobConfig.from_json(files[f"scripts/{FILES.job_config}"]).restarts == 4
    member = ReplicaSet(c, m, plan, LaunchOptions(keep_serving=True), 2, run_id="set").member(1).request()
    assert member.facts is not None and (member.facts.port_stride, member.facts.restarts) == (7, 4)
