"""Which launcher picks the ports of a spec that leaves them out: the local style's (its ranks
serve on this machine, where a free block can be found), not ssh + Docker's (its ranks serve on
the spec's hosts: a port free here says nothing of theirs)."""

from __future__ import annotations

from pathlib import Path

import yaml

from ftcluster.hosts.runner import LocalRunner
from ftcluster.schedulers.local import LocalScheduler
from ftcluster.schedulers.ssh import SshScheduler
from ftcluster.engines import make_plan
from ftcluster.spec.defaults import embedded_model_path
from ftcluster.spec.load import load_cluster, load_model


def _spec(tmp_path: Path, **values: object) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"name": "c", "gpus_per_node": 1, "workspace": str(tmp_path / "ws"), **values}))
    return path


def test_only_the_local_style_picks_free_ports(tmp_path: Path) -> None:
    model = load_model(embedded_model_path())
    local = load_cluster(_spec(tmp_path, scheduler="local"))
    ssh = load_cluster(_spec(tmp_path, scheduler="ssh", hosts=["n1", "n2"],
                             container={"runtime": "docker", "image": "triton:22.12"}))
    assert not local.ports_given and not ssh.ports_given
    picked = LocalScheduler(LocalRunner()).with_ports(local, make_plan(local, model, 2))
    assert picked.ports.http != local.ports.http
    kept = SshScheduler(LocalRunner()).with_ports(ssh, make_plan(ssh, model, 2))
    assert kept.ports == ssh.ports and kept.ports.http == 8000
