"""The ssh fan-out of scheduler `ssh` (ftcluster.hosts.fanout): its config, exit status and output
handling; an unreachable host for real (a closed port). The happy path runs against the test
bed's sshd in tests/integration/test_ssh_docker_launch.py."""

from __future__ import annotations

import json

import io
import socket
import threading
from pathlib import Path

from ftcluster.hosts.fanout import UNREACHABLE, FanoutConfig, HostResult, _Lines, exit_code, main
from ftcluster.render.scripts import RenderOptions, RunPaths, fanout_config, render
from tests.helpers_specs import ckpt, cluster, facts, model


def test_config_round_trip() -> None:
    cfg = FanoutConfig(hosts=("a", "b"), user="u", port=2222, identity_file="/k", known_hosts="/kh",
                       parallel=4, connect_timeout=3.0)
    assert FanoutConfig.from_json(cfg.to_json()) == cfg


def test_exit_code_is_the_first_failure() -> None:
    assert exit_code([HostResult("a", 0), HostResult("b", 0)]) == 0
    assert exit_code([HostResult("a", 0), HostResult("b", 3), HostResult("c", UNREACHABLE)]) == 3


def test_pty_output_becomes_plain_lines() -> None:
    out = io.StringIO()
    sink = _Lines(out, threading.Lock(), prefix="n1: ")
    sink.write("one\r\ntwo\r\n")
    assert out.getvalue() == "n1: one\nn1: two\n"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_host_is_reported_in_its_log(tmp_path: Path) -> None:
    cfg = FanoutConfig(hosts=("127.0.0.1",), port=_closed_port(), known_hosts=str(tmp_path / "none"),
                       connect_timeout=5)
    (tmp_path / "nodes.json").write_text(cfg.to_json())
    rc = main(["--config", str(tmp_path / "nodes.json"), "--output", str(tmp_path / "up-%N.log"),
               "--", "true"])
    assert rc == UNREACHABLE
    log = (tmp_path / "up-127.0.0.1.log").read_text()
    assert "127.0.0.1" in log and "cannot reach" in log and "node_ssh" in log


def test_render_writes_the_plan_hosts_and_node_ssh() -> None:
    c = cluster(scheduler="ssh", hosts=["h1", "h2", "h3"], gpus_per_node=1,
                node_ssh={"user": "me", "port": 2200, "parallel": 2},
                container={"runtime": "docker", "image": "img"})
    from ftcluster.engines.fastertransformer.plan import plan_for

    m = model()
    plan = plan_for(c, m, facts(), ckpt(tp=1, heads=16, layers=24), 2, 1)
    cfg = fanout_config(c, plan)
    assert cfg.hosts == ("h1", "h2") and cfg.user == "me" and cfg.port == 2200 and cfg.parallel == 2
    files = render(c, m, plan, RunPaths("r1", Path("/shared/runs/r1")), RenderOptions()).files
    assert sorted(f for f in files if not f.startswith("ftcluster_job/")) == [
        "ctmpi.py", "docker_node.sh", "env.sh", "job.json", "job.sh", "mpicheck.py", "nodes.json", "proxy.json",
        "rank_env.py", "rank_server.sh", "session_guard.sh", "signal_rank.sh"]   # private by default: the proxy's config
    assert FanoutConfig.from_json(files["nodes.json"]) == cfg
    assert json.loads(files["job.json"])["run_hosts"] == ["h1", "h2"]
