"""The planner (issue 2, item 4): every refusal, through the pure `plan_for` and the real CLI."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ftcluster.engines.fastertransformer.checkpoint import Split, read_checkpoint
from ftcluster.errors import PlanError
from ftcluster.engines import make_plan
from ftcluster.plan.parallel import JOB_LAYOUT, Plan, RankLayout
from ftcluster.engines.fastertransformer.engine import ENGINE
from ftcluster.engines.fastertransformer.plan import plan_for, read_model_facts
from ftcluster.spec.load import load_cluster, load_model
from tests.helpers_specs import MODELS, assert_one_line_error, ckpt, cluster, facts, model, run_cli



# --------------------------------------------------------------------------- pure: plan_for

def test_default_plan_tp_is_gpus_pp_is_nodes() -> None:
    p = plan_for(cluster(gpus_per_node=2), model(), facts(), ckpt(tp=2), nodes=3, gpus_per_node=2)
    assert (p.tensor_para_size, p.pipeline_para_size, p.world_size, p.mpi_ranks) == (2, 3, 6, 3)
    assert [(r.rank, r.node_index, r.node, r.gpus) for r in p.ranks] == [
        (0, 0, "local0", 2), (1, 1, "local1", 2), (2, 2, "local2", 2)]
    assert p.details == {"ft_model": "fastertransformer", "model_type": "GPT", "checkpoint_dir": "/ckpt/2-gpu",
                         "weight_data_type": "fp32", "input_hidden_size": None}
    assert p.engine_model == "fastertransformer" and p.layout == JOB_LAYOUT


def test_plan_round_trips_through_dict() -> None:
    p = plan_for(cluster(), model(), facts(), ckpt(), nodes=2, gpus_per_node=1)
    assert Plan.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_slurm_nodes_are_unknown_until_allocated_and_ssh_uses_hosts() -> None:
    p = plan_for(cluster(scheduler="slurm"), model(), facts(), ckpt(), nodes=2, gpus_per_node=1)
    assert [r.node for r in p.ranks] == [None, None]
    c = cluster(scheduler="ssh", hosts=["h1", "h2", "h3"], container={"runtime": "docker", "image": "i"})
    p = plan_for(c, model(), facts(), ckpt(), nodes=2, gpus_per_node=1)
    assert [r.node for r in p.ranks] == ["h1", "h2"]


def test_overrides_tp_pp_within_the_gpu_count() -> None:
    # 2 nodes x 2 GPUs as tp=4 x pp=1: allowed as long as tp*pp == nodes*gpus.
    p = plan_for(cluster(gpus_per_node=2), model(), facts(), ckpt(tp=4), nodes=2, gpus_per_node=2, tp=4, pp=1)
    assert (p.tensor_para_size, p.pipeline_para_size, p.world_size) == (4, 1, 4)


def test_single_node_allows_any_instance_group() -> None:
    p = plan_for(cluster(), model(), facts(groups=((2, "KIND_GPU"),)), ckpt(), nodes=1, gpus_per_node=1)
    assert p.nodes == 1


def test_sequence_batching_with_max_batch_size_1_is_fine() -> None:
    p = plan_for(cluster(), model(), facts(dynamic=False, sequence=True, mbs=1), ckpt(), nodes=1, gpus_per_node=1)
    assert p.world_size == 1


def _refuse(*fragments: str, **kw: object) -> PlanError:
    args = {"cluster": cluster(), "model": model(), "facts": facts(), "ckpt": ckpt(), "nodes": 1,
            "gpus_per_node": 1}
    args.update(kw)
    with pytest.raises(PlanError) as ei:
        plan_for(**args)  # type: ignore[arg-type]
    text = str(ei.value)
    assert "\n" not in text
    for f in fragments:
        assert f in text, f"{f!r} not in {text!r}"
    return ei.value


def test_refuses_tp_times_pp_not_nodes_times_gpus() -> None:
    _refuse("tensor_para_size 2 x pipeline_para_size 1 = 2 GPUs", "2 node(s) x 2 GPU(s) = 4",
            cluster=cluster(gpus_per_node=2), ckpt=ckpt(tp=2), nodes=2, gpus_per_node=2, tp=2, pp=1)


def test_refuses_zero_or_negative_sizes() -> None:
    _refuse("--nodes", nodes=0)
    _refuse("--tp/--pp", tp=0, pp=1)


def test_refuses_head_num_not_divisible_by_tp() -> None:
    _refuse("head_num 12 is not divisible by tensor_para_size 8",
            cluster=cluster(gpus_per_node=8), ckpt=ckpt(tp=8, heads=12), gpus_per_node=8)


def test_refuses_num_layer_not_divisible_by_pp() -> None:
    _refuse("num_layer 6 is not divisible by pipeline_para_size 4", ckpt=ckpt(layers=6), nodes=4)


def test_refuses_t5_decoder_split() -> None:
    splits = (Split("encoder", 8, 6), Split("decoder", 8, 3))
    _refuse("[decoder] num_layer 3", ckpt=ckpt(splits=splits), nodes=2)


def test_refuses_missing_gpu_folder_and_lists_found_ones() -> None:
    e = _refuse("no 4-gpu folder under /ckpt", "found: 1-gpu, 2-gpu",
                cluster=cluster(gpus_per_node=4), ckpt=ckpt(tp=4, gpu_dir=False, available=(1, 2)),
                gpus_per_node=4)
    assert e.field == "checkpoint_root"
    _refuse("found: none", ckpt=ckpt(gpu_dir=False, available=()))


def test_refuses_config_ini_tensor_para_size_disagreeing() -> None:
    _refuse("says tensor_para_size=2 but the plan uses 4",
            cluster=cluster(gpus_per_node=4), ckpt=ckpt(tp=4, ini_tp=2), gpus_per_node=4)


def test_refuses_missing_config_ini() -> None:
    _refuse("/ckpt/1-gpu/config.ini is missing", ckpt=ckpt(ini=False))


@pytest.mark.parametrize("groups", [((2, "KIND_CPU"),), ((1, "KIND_GPU"),), ((1, "KIND_AUTO"),),
                                    ((1, "KIND_CPU"), (1, "KIND_GPU"))])
def test_refuses_multi_node_instance_group(groups: tuple[tuple[int, str], ...]) -> None:
    _refuse("instance_group", "cannot run on several nodes", facts=facts(groups=groups), nodes=2)


def test_refuses_dynamic_and_sequence_batching() -> None:
    _refuse("dynamic_batching and sequence_batching are both set", facts=facts(dynamic=True, sequence=True, mbs=1))


def test_refuses_sequence_batching_with_max_batch_size_not_1() -> None:
    _refuse("sequence_batching needs max_batch_size 1 (it is 4)", facts=facts(dynamic=False, sequence=True, mbs=4))


def test_refuses_more_nodes_than_the_cluster_allows() -> None:
    _refuse("5 nodes requested but cluster 'c' allows 4", cluster=cluster(max_nodes=4), nodes=5)


# --------------------------------------------------------------------------- edge: make_plan

def test_make_plan_reads_facts_from_disk() -> None:
    c = load_cluster(MODELS / "cluster_local.yaml")
    m = load_model(MODELS / "tiny.yaml")
    f = read_model_facts(m)
    base = facts(groups=((1, "KIND_CPU"),), dynamic=True, sequence=False, mbs=8)
    assert (f.ft_model, f.instance_groups, f.dynamic_batching, f.sequence_batching, f.max_batch_size) == (
        base.ft_model, base.instance_groups, base.dynamic_batching, base.sequence_batching, base.max_batch_size)
    assert f.config_model_type == "GPT" and dict(f.input_ranks)["input_ids"] == 1
    assert f.served == m.name
    ck = read_checkpoint(m.checkpoint_root, "GPT", 2)
    assert ck.available_gpus == (1, 2, 3, 4, 8)
    assert ck.ini_tensor_para_size == 2 and ck.splits == (Split("gpt", 12, 6),)
    # The backend libraries the servers load (the ensemble is a platform, built in).
    assert f.backends == ("fastertransformer", "python")
    p = make_plan(c, m, 2)
    assert p.details["checkpoint_dir"] == str(m.checkpoint_root / "1-gpu")
    assert p.pipeline_para_size == 2
    assert p.backends == f.backends and Plan.from_dict(p.to_dict()) == p


def test_make_plan_gpus_auto_needs_an_override() -> None:
    m = load_model(MODELS / "tiny.yaml")
    with pytest.raises(PlanError, match="auto"):
        make_plan(cluster(gpus_per_node="auto"), m, 1)
    assert make_plan(cluster(gpus_per_node="auto"), m, 1, gpus_per_node=2).tensor_para_size == 2


# --------------------------------------------------------------------------- the real CLI

CL = str(MODELS / "cluster_local.yaml")

CLI_REFUSALS = [
    ("tp_pp", "tiny", ["--nodes", "2", "--tp", "1", "--pp", "1"], ["tensor_para_size 1 x pipeline_para_size 1"]),
    ("heads", "tiny", ["--gpus-per-node", "8"], ["head_num 12 is not divisible by tensor_para_size 8"]),
    ("layers", "tiny", ["--nodes", "4"], ["num_layer 6 is not divisible by pipeline_para_size 4"]),
    ("no_folder", "tiny", ["--gpus-per-node", "16"],
     ["no 16-gpu folder", "found: 1-gpu, 2-gpu, 3-gpu, 4-gpu, 8-gpu"]),
    ("ini_tp", "tiny", ["--gpus-per-node", "4"], ["says tensor_para_size=2 but the plan uses 4"]),
    ("no_ini", "tiny", ["--gpus-per-node", "3"], ["3-gpu/config.ini is missing"]),
    ("count2", "count2", ["--nodes", "2"], ["instance_group {count: 2, kind: KIND_CPU}"]),
    ("kind_gpu", "kind_gpu", ["--nodes", "2"], ["instance_group {count: 1, kind: KIND_GPU}"]),
    # Triton's schema makes the two a oneof, so the config parser already refuses them.
    ("dyn_seq", "dyn_seq", [], ["dynamic_batching", "sequence_batching", "config.pbtxt"]),
    ("seq_mbs", "seq_mbs", [], ["sequence_batching needs max_batch_size 1 (it is 4)"]),
    ("max_nodes", "tiny", ["--nodes", "5"], ["5 nodes requested but cluster 'testlocal' allows 4"]),
]


@pytest.mark.parametrize("case,spec,args,fragments", CLI_REFUSALS, ids=[c[0] for c in CLI_REFUSALS])
def test_cli_refusal(case: str, spec: str, args: list[str], fragments: list[str]) -> None:
    res = run_cli("plan", "--cluster", CL, "--model", str(MODELS / f"{spec}.yaml"), *args)
    assert_one_line_error(res, *fragments)
    assert res.stdout == ""


def test_cli_plan_json() -> None:
    res = run_cli("plan", "--cluster", CL, "--model", str(MODELS / "tiny.yaml"), "--nodes", "2", "--json")
    assert res.rc == 0, res.stderr
    data = json.loads(res.stdout)
    for key, value in {"tensor_para_size": 1, "pipeline_para_size": 2, "world_size": 2, "num_nodes": 2,
                       "gpus_per_node": 1}.items():
        assert data[key] == value


def test_cli_plan_table() -> None:
    res = run_cli("plan", "--cluster", CL, "--model", str(MODELS / "tiny.yaml"), "--nodes", "3")
    assert res.rc == 0, res.stderr
    for word in ("tensor_para_size", "pipeline_para_size", "world_size", "0->local0", "2->local2"):
        assert word in res.stdout


def test_cli_multi_node_ok_with_sequence_batching_mbs_1() -> None:
    res = run_cli("plan", "--cluster", CL, "--model", str(MODELS / "seq_ok.yaml"), "--nodes", "2", "--json")
    assert res.rc == 0, res.stderr


@pytest.mark.parametrize("cmd", ["plan", "prepare", "render"])
def test_cli_help_has_an_example(cmd: str) -> None:
    res = run_cli(cmd, "--help")
    assert res.rc == 0 and "Example:" in res.stdout and f"ftcluster {cmd}" in res.stdout


def test_refuses_multi_node_without_instance_group() -> None:
    _refuse("instance_group is not set", facts=facts(groups=()), nodes=2)
    assert plan_for(cluster(), model(), facts(groups=()), ckpt(), nodes=1, gpus_per_node=1).nodes == 1


def test_a_plan_saved_before_the_engine_seam_reads_back() -> None:
    """A run folder's launched.json from before the seam (FT's facts among the shared ones, no
    layout) reads back as the plan made now; `plan --json` keeps every key it had."""
    p = plan_for(cluster(), model(), facts(), ckpt(), nodes=2, gpus_per_node=1)
    old_keys = {"nodes", "gpus_per_node", "tensor_para_size", "pipeline_para_size", "world_size", "mpi_ranks", "ranks",
                "ft_model", "checkpoint_dir", "model_type", "weight_data_type", "input_hidden_size", "backends"}
    new = p.to_dict()
    assert old_keys <= set(new) and new["ft_model"] == "fastertransformer" and new["model_type"] == "GPT"
    old = {k: v for k, v in new.items() if k in old_keys}
    assert Plan.from_dict(json.loads(json.dumps(old))) == p


def test_engine_details_may_not_shadow_the_shared_keys() -> None:
    p = plan_for(cluster(), model(), facts(), ckpt(), nodes=2, gpus_per_node=1)
    with pytest.raises(ValueError, match="nodes"):
        dataclasses.replace(p, details={"nodes": 3})


def test_an_engine_whose_layout_the_job_cannot_run_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layout is the engine's word, checked before anything is written: a server per GPU is
    refused by name (the job starts one per node), not started wrong."""
    real = type(ENGINE).plan

    def per_gpu(self: object, *args: object, **kwargs: object) -> Plan:
        return dataclasses.replace(real(self, *args, **kwargs), layout=RankLayout(per_gpu=True))  # type: ignore[arg-type]

    monkeypatch.setattr(type(ENGINE), "plan", per_gpu)
    with pytest.raises(PlanError) as err:
        make_plan(load_cluster(MODELS / "cluster_local.yaml"), load_model(MODELS / "tiny.yaml"), 2)
    assert "asks for a server per GPU" in str(err.value) and "a server per node" in str(err.value)
