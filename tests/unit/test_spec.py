"""Cluster and model specs (issue 2, items 2-3)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ftcluster.errors import SpecError
from ftcluster.spec.cluster import ClusterSpec, Mount
from ftcluster.spec.load import load_cluster, load_model
from ftcluster.engines.fastertransformer.spec import FTModelSpec as ModelSpec
from tests.helpers_specs import MODELS, REPO_ROOT, cluster

CLUSTERS = sorted((REPO_ROOT / "configs" / "clusters").glob("*.yaml"))
MODEL_SPECS = sorted((REPO_ROOT / "configs" / "models").glob("*.yaml"))


@pytest.mark.parametrize("path", CLUSTERS, ids=[p.stem for p in CLUSTERS])
def test_example_clusters_load(path: Path) -> None:
    c = load_cluster(path)
    assert c.source == str(path.resolve())


def test_example_cluster_styles() -> None:
    by_name = {p.stem: load_cluster(p) for p in CLUSTERS}
    assert by_name["pyxis"].container.runtime == "pyxis" and by_name["pyxis"].gpus_per_node == 8
    assert by_name["slurm-docker"].container.runtime == "docker"
    assert by_name["slurm-bare"].container.runtime == "none"
    assert by_name["local"].scheduler == "local"
    ssh = by_name["ssh-docker"]
    assert ssh.scheduler == "ssh" and ssh.container.runtime == "docker" and ssh.max_nodes == len(ssh.hosts)


@pytest.mark.parametrize("path", MODEL_SPECS, ids=[p.stem for p in MODEL_SPECS])
def test_example_models_validate(path: Path) -> None:
    # Their repositories live on a shared filesystem; validate the schema only.
    data = yaml.safe_load(path.read_text())
    m = ModelSpec.model_validate(data)
    assert m.backend == "fastertransformer"


def test_example_models_cover_the_issue() -> None:
    types = {yaml.safe_load(p.read_text())["model_type"] for p in MODEL_SPECS}
    assert {"GPT", "GPT-J", "T5", "GPT-NeoX"} <= types


def test_defaults() -> None:
    c = cluster()
    assert c.mpi == "pmix" and c.ssh_port == 11068 and c.container.runtime == "none"
    assert (c.ports.http, c.ports.grpc, c.ports.metrics) == (8000, 8001, 8002)


def test_mount_forms() -> None:
    c = cluster(scheduler="slurm", container={
        "runtime": "pyxis", "image": "/i.sqsh",
        "mounts": ["/a:/b", "/c:/d:ro+rprivate", {"src": "/e", "dst": "/f", "flags": ["ro"]}]})
    assert c.container.mounts == (Mount(src="/a", dst="/b"), Mount(src="/c", dst="/d", flags=("ro", "rprivate")),
                                  Mount(src="/e", dst="/f", flags=("ro",)))
    # Pyxis's short form: the same path inside.
    assert Mount.parse("/only") == Mount(src="/only", dst="/only")
    for bad in ("/a::ro", ":/b", "/a:/b:ro:x"):
        with pytest.raises(ValueError, match="SRC:DST"):
            Mount.parse(bad)


def test_env_values_become_strings() -> None:
    assert cluster(env={"NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": 1, "X": True}).env == {
        "NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": "1", "X": "True"}


def test_gpus_auto_and_time_forms() -> None:
    assert cluster(gpus_per_node="auto").gpus_per_node == "auto"
    for t in ("30", "01:00:00", "1-12:00:00", "1-12", "UNLIMITED", "30:00"):
        assert cluster(time_limit=t).time_limit == t


def test_ssh_max_nodes_is_the_host_count() -> None:
    assert cluster(scheduler="ssh", hosts=["a", "b"], max_nodes=64,
                   container={"runtime": "docker", "image": "i"}).max_nodes == 2


def test_specs_are_frozen() -> None:
    with pytest.raises(Exception):
        cluster().max_nodes = 3  # type: ignore[misc]


def test_model_paths_resolve_against_the_spec_folder(tmp_path: Path) -> None:
    m = load_model(MODELS / "tiny.yaml")
    assert m.repository == MODELS / "tiny" / "repo"
    assert m.checkpoint_root == MODELS / "tiny" / "ckpt"
    assert m.source == str((MODELS / "tiny.yaml").resolve())


def test_cluster_name_defaults_to_a_clean_file_stem(tmp_path: Path) -> None:
    p = tmp_path / "my cluster (copy).yaml"
    p.write_text("scheduler: local\n")
    assert load_cluster(p).name == "my-cluster--copy-"


@pytest.mark.parametrize("text,fragment", [
    ("scheduler: local\nfoo: 1\n", "foo: unknown key"),
    ("scheduler: local\nmax_nodes: x\n", "max_nodes: Input should be a valid integer"),
    ("scheduler: local\nports: {http: 0}\n", "ports.http:"),
    ("scheduler: slurm\ncontainer: {runtime: pyxis, image: i, mounts: ['rel:/x']}\n", "start with '/' or '.'"),
    ("scheduler: slurm\ncontainer: {runtime: pyxis, image: i, mounts: ['/x:rel']}\n", "start with '/' or '.'"),
    ("scheduler: ssh\nhosts: [a]\n", "set container.runtime: docker"),
    ("scheduler: ssh\ncontainer: {runtime: docker, image: i}\n", "needs hosts"),
    ("scheduler: ssh\nhosts: ['a b']\ncontainer: {runtime: docker, image: i}\n", "hosts: "),
    ("scheduler: ssh\nhosts: [a, a]\ncontainer: {runtime: docker, image: i}\n", "listed twice"),
    ("scheduler: ssh\nhosts: [a]\nnode_ssh: {parallel: 0}\ncontainer: {runtime: docker, image: i}\n",
     "node_ssh.parallel"),
])
def test_cluster_errors_name_file_and_field(tmp_path: Path, text: str, fragment: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as ei:
        load_cluster(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}: ") and fragment in msg and "\n" not in msg


def test_docker_mounts_may_use_named_volumes() -> None:
    c = cluster(scheduler="slurm", container={"runtime": "docker", "image": "i", "mounts": ["vol:/x"]})
    assert c.container.mounts[0].src == "vol"


def test_pyxis_tmpfs_mount() -> None:
    c = cluster(scheduler="slurm", container={"runtime": "pyxis", "image": "i", "mounts": ["tmpfs:/scratch"]})
    assert c.container.mounts[0].src == "tmpfs"


def test_cluster_spec_dump_excludes_source() -> None:
    c = load_cluster(CLUSTERS[0])
    assert "source" not in c.model_dump() and "ports_given" not in c.model_dump()
    # A dumped spec (a run's resolved values) has its ports fixed: they were picked already.
    assert ClusterSpec.model_validate(c.model_dump()) == c.model_copy(update={"source": None, "ports_given": True})
