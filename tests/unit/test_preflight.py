"""Preflight on CPU: report building, mismatch errors, auto detection, and "no GPU" end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftcluster.schedulers.local_ranks import run_local_ranks
from ftcluster.rank.env import NVLS_OFF, RankEnvError, child_env, detect_rank_env, first_host
from ftcluster.rank.preflight import (
    GpuInfo,
    InventoryError,
    RankReport,
    _visible,
    build_report,
    busbw_factor,
    check_inventory,
    detect_gpus_per_node,
    parse_nvidia_smi,
    parse_sizes,
    parse_tagged,
    summarize_bandwidth,
    transport_lines,
    transports,
)

REPO = Path(__file__).resolve().parents[2]


def rep(rank: int, n_gpus: int, model: str = "NVIDIA H200", host: str | None = None,
        world: int = 2, times: dict[str, float] | None = None) -> RankReport:
    gpus = [GpuInfo(i, model, 143771, f"GPU-{rank}{i}") for i in range(n_gpus)]
    return RankReport(rank=rank, world_size=world, local_rank=0, host=host or f"node{rank}",
                      cuda_visible_devices=None, gpus=gpus, gpus_on_host=n_gpus,
                      driver="580.1", source="nvml" if n_gpus else "none",
                      note=None if n_gpus else "nvidia-smi not found", times_s=times or {})


# ---------------------------------------------------------------- sizes and bandwidth math


def test_parse_sizes() -> None:
    assert parse_sizes("1M..8M") == [1 << 20, 2 << 20, 4 << 20, 8 << 20]
    assert len(parse_sizes("1M..1G")) == 11 and parse_sizes("1M..1G")[-1] == 1 << 30
    assert parse_sizes("256K,1G") == [256 << 10, 1 << 30]
    with pytest.raises(ValueError):
        parse_sizes("1X")


def test_busbw_is_nccl_tests_allreduce_factor() -> None:
    assert busbw_factor(1) == 1.0
    assert busbw_factor(2) == 1.0
    assert busbw_factor(4) == 1.5
    assert busbw_factor(8) == 1.75


def test_summarize_takes_the_slowest_rank() -> None:
    g = 1 << 30
    reports = [rep(r, 1, world=4, times={str(g): t}) for r, t in
               enumerate([0.004, 0.005, 0.0045, 0.004])]
    (row,) = summarize_bandwidth(reports)
    assert row["slowest_rank"] == 1 and row["slowest_host"] == "node1"
    assert row["algbw_gbs"] == pytest.approx(g / 0.005 / 1e9)
    assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * 1.5)
    report = build_report(reports, bandwidth=True)
    assert report["slowest_rank"] == 1 and report["largest"]["size"] == g
    assert report["gpus_per_node"] == 1 and report["errors"] == []


# ---------------------------------------------------------------- inventory checks


def test_matching_nodes_pass_and_auto_detects() -> None:
    reports = [rep(0, 8), rep(1, 8)]
    assert check_inventory(reports, 8) == []
    assert check_inventory(reports, "auto") == []
    assert detect_gpus_per_node(reports) == 8


def test_gpu_count_mismatch_names_the_nodes() -> None:
    reports = [rep(0, 8, world=3), rep(1, 8, world=3), rep(2, 7, world=3)]
    errors = check_inventory(reports, "auto")
    assert len(errors) == 1
    assert "different GPU counts" in errors[0] and "7 GPU(s) on rank 2 (node2)" in errors[0]
    with pytest.raises(InventoryError, match="rank 2"):
        detect_gpus_per_node(reports)


def test_model_mismatch() -> None:
    errors = check_inventory([rep(0, 2), rep(1, 2, model="NVIDIA A100-SXM4-80GB")], 2)
    assert len(errors) == 1 and "different GPU models" in errors[0]
    assert "A100" in errors[0] and "rank 1 (node1)" in errors[0]


def test_spec_count_mismatch() -> None:
    errors = check_inventory([rep(0, 4), rep(1, 4)], 8)
    assert errors == ["every node sees 4 GPU(s), the cluster spec says gpus_per_node: 8"]


def test_no_gpu_is_an_error_only_when_required() -> None:
    reports = [rep(0, 0), rep(1, 0)]
    errors = check_inventory(reports, "auto")
    assert errors == ["no GPU on rank 0 (node0), rank 1 (node1): nvidia-smi not found"]
    assert check_inventory(reports, 1, require_gpus=False) == []
    with pytest.raises(InventoryError, match="no GPU"):
        detect_gpus_per_node(reports)


def test_missing_rank_is_reported() -> None:
    assert check_inventory([rep(0, 1, world=3), rep(2, 1, world=3)], 1) == [
        "ranks [1] of 3 did not report"]


def test_visible_follows_cuda_visible_devices() -> None:
    gpus = [GpuInfo(i, "H200", 1, f"GPU-aa{i}") for i in range(4)]
    assert [g.index for g in _visible(gpus, None)] == [0, 1, 2, 3]
    assert [g.index for g in _visible(gpus, "2,0")] == [2, 0]
    assert [g.index for g in _visible(gpus, "GPU-aa3")] == [3]
    assert _visible(gpus, "") == []
    assert [g.index for g in _visible(gpus, "1,7,2")] == [1]  # CUDA stops at a bad entry


def test_parse_nvidia_smi() -> None:
    text = ("0, NVIDIA H200, 143771, 580.159.04, GPU-1234, 00000000:19:00.0\n"
            "1, NVIDIA H200, 143771, 580.159.04, GPU-5678, 00000000:3B:00.0\n")
    gpus, driver = parse_nvidia_smi(text)
    assert driver == "580.159.04"
    assert [(g.index, g.name, g.memory_mib, g.uuid) for g in gpus] == [
        (0, "NVIDIA H200", 143771, "GPU-1234"), (1, "NVIDIA H200", 143771, "GPU-5678")]


def test_transport_lines() -> None:
    log = "\n".join([
        "h:1:2 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>",
        "h:1:2 [0] NCCL INFO NET/IB : No device found.",
        "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "h:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "h:1:2 [0] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [send] via NET/Socket/0",
        "h:1:2 [0] NCCL INFO Using network Socket",
        "h:1:2 [0] NCCL INFO comm 0x1 rank 0 nranks 2 - Init COMPLETE",
    ])
    lines = transport_lines(log)
    assert lines[0] == "NET/Socket : Using [0]eth0:10.0.0.1<0>"
    assert lines.count("0[0] -> 1[1] via P2P/CUMEM/read") == 1  # channels folded
    assert not any("Init COMPLETE" in ln for ln in lines)
    assert transports(lines) == ["P2P/CUMEM", "NET/Socket", "network Socket"]


# ---------------------------------------------------------------- rank environment


def test_env_sources_in_order() -> None:
    ftc = {"FTC_RANK": "1", "FTC_WORLD_SIZE": "2", "FTC_LOCAL_RANK": "0",
           "FTC_MASTER_ADDR": "10.0.0.5", "FTC_MASTER_PORT": "1234", "SLURM_PROCID": "7"}
    e = detect_rank_env(ftc)
    assert (e.rank, e.world_size, e.master_addr, e.master_port, e.source) == (
        1, 2, "10.0.0.5", 1234, "ftc")
    slurm = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
             "SLURM_JOB_NODELIST": "gpu[07-09,12]", "SLURM_JOB_ID": "100",
             "OMPI_COMM_WORLD_RANK": "0"}
    e = detect_rank_env(slurm)
    assert (e.rank, e.world_size, e.local_rank, e.master_addr, e.source) == (
        3, 4, 1, "gpu07", "slurm")
    assert e.master_port == detect_rank_env({**slurm, "SLURM_PROCID": "0"}).master_port
    ompi = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    e = detect_rank_env(ompi)
    assert (e.rank, e.world_size, e.local_rank, e.master_addr, e.source) == (
        2, 4, 2, "127.0.0.1", "ompi")
    with pytest.raises(RankEnvError, match="MASTER_ADDR"):
        detect_rank_env({**ompi, "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    e = detect_rank_env({"PMIX_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h0"})
    assert (e.rank, e.world_size, e.master_addr, e.source) == (1, 2, "h0", "pmix")
    assert detect_rank_env({}).source == "single"
    with pytest.raises(RankEnvError, match="FTC_WORLD_SIZE"):
        detect_rank_env({"FTC_RANK": "0"})


def test_first_host_without_python_hostlist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hostlist", None)  # import fails
    assert first_host("gpu[003-005,9],cpu1") == "gpu003"
    assert first_host("node1,node2") == "node1"
    assert first_host("a[2-3]-ib") == "a2-ib"


def test_child_env_forces_nvls_off() -> None:
    env = child_env({"NCCL_NVLS_ENABLE": "1", "X": "y"}, base={"PATH": "/bin"})
    assert env == {"PATH": "/bin", "X": "y", **NVLS_OFF}


# ---------------------------------------------------------------- end to end on this CPU machine


def _preflight_ranks(tmp_path: Path, extra_env: dict[str, str]) -> tuple[dict, list]:
    out = tmp_path / "out"
    results = run_local_ranks(
        [sys.executable, "-m", "ftcluster.rank.preflight", "--no-bandwidth", "--out", str(out)],
        2, None, env={"PYTHONPATH": str(REPO), **extra_env}, timeout=120,
        log_dir=tmp_path / "logs")
    assert all(r.ok for r in results), [r.stderr() for r in results]
    return json.loads((out / "preflight.json").read_text()), results


def test_no_gpu_reported_by_two_local_ranks(tmp_path: Path) -> None:
    # An empty CUDA_VISIBLE_DEVICES hides every GPU, so this holds on GPU machines too.
    report, results = _preflight_ranks(tmp_path, {"CUDA_VISIBLE_DEVICES": ""})
    assert report["world_size"] == 2 and report["complete"]
    assert report["no_gpu_ranks"] == [0, 1]
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert report["bandwidth"] == [] and report["bandwidth_skipped"] == "--no-bandwidth"
    for r in results:
        assert f"rank {r.rank} on " in r.stdout() and ": no GPU (" in r.stdout()
    text, ranks = parse_tagged(results[0].stdout() + results[1].stdout())
    assert text is not None and [r.rank for r in ranks] == [0, 1]
    errors = check_inventory([RankReport.from_dict(d) for d in report["ranks"]], 1)
    assert errors and errors[0].startswith("no GPU on rank 0")


def test_one_node_skips_the_bandwidth_with_the_reason(tmp_path: Path) -> None:
    # An all-reduce over one rank moves nothing: it once reported 109 TB/s on an H200.
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "ftcluster.rank.preflight", "--out", str(out)],
                       capture_output=True, text=True, env=child_env({"PYTHONPATH": str(REPO)}),
                       timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    report = json.loads((out / "preflight.json").read_text())
    assert report["world_size"] == 1 and report["bandwidth"] == []
    assert report["bandwidth_skipped"].startswith("one node: ")


@pytest.mark.skipif(bool(os.environ.get("CUDA_VISIBLE_DEVICES")) or
                    any(Path(p, "nvidia-smi").exists() for p in os.environ.get("PATH", "").split(":")),
                    reason="a GPU machine")
def test_no_gpu_on_a_cpu_machine(tmp_path: Path) -> None:
    report, _ = _preflight_ranks(tmp_path, {})
    assert report["no_gpu_ranks"] == [0, 1]
    assert all(r["source"] == "none" and r["note"] for r in report["ranks"])


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    spec = tmp_path / "cpu.yaml"
    # Its own workspace and run store: the user's (~/ftcluster-runs) got a run folder per test.
    spec.write_text(f"name: cpu\nscheduler: local\ngpus_per_node: auto\nworkspace: {tmp_path / 'ws'}\n")
    env = child_env({"PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", "COLUMNS": "200",
                     "FTCLUSTER_STATE_DIR": str(tmp_path / "state")})
    return subprocess.run([sys.executable, "-m", "ftcluster", "preflight", "--cluster", str(spec),
                           "--nodes", "2", *args], capture_output=True, text=True, env=env,
                          timeout=180, check=False)


def test_cli_reports_no_gpu_and_fails(tmp_path: Path) -> None:
    proc = _cli(tmp_path, "--no-bandwidth")
    assert proc.returncode == 3
    assert "no GPU" in proc.stdout
    assert proc.stderr.startswith("error: preflight failed: no GPU on rank 0")


def test_cli_json_allow_no_gpu(tmp_path: Path) -> None:
    proc = _cli(tmp_path, "--json", "--allow-no-gpu", "--no-bandwidth")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["no_gpu_ranks"] == [0, 1] and report["errors"] == []
