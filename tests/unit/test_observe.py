"""A serving run's samples: Triton's metrics page as the job keeps it (a page recorded from the
real tritonserver 2.51), rates between two samples, a node's GPUs from nvidia-smi's CSV (recorded
on a real H200), the Prometheus target a serving run publishes, and `top` reading them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ftcluster.job.metrics import Sampler, parse_metrics
from ftcluster.observe.samples import gpus, last_lines, rates, run_view
from ftcluster.run.store import RunRecord, RunStore
from tests.helpers_specs import DATA


def test_the_metrics_page_of_a_real_tritonserver() -> None:
    got = parse_metrics((DATA / "triton_metrics_2.51.txt").read_text())
    ft = got["models"]["fastertransformer"]
    # Three requests of one sequence each; the failure reasons summed; durations in us.
    assert ft["ok"] == 3 and ft["inf"] == 3 and ft["exec"] == 3 and ft["fail"] == 0 and ft["pending"] == 0
    assert ft["req_us"] == 33311 and ft["queue_us"] == 414 and ft["infer_us"] == 32194
    assert got["gpus"] == {}   # a CPU server has none
    gpu = parse_metrics('nv_gpu_utilization{gpu_uuid="GPU-1"} 0.75\nnv_gpu_memory_used_bytes{gpu_uuid="GPU-1"} 1e9\n'
                        'nv_inference_request_success{model="a",version="1"} NaN\n')
    assert gpu == {"models": {}, "gpus": {"GPU-1": {"util": 0.75, "mem": 1e9}}}


def test_the_latency_quantiles_of_a_real_tritonserver() -> None:
    # Recorded from tritonserver 2.51 started with --metrics-config=summary_latencies=true, as
    # rank 0 is where its tritonserver has the flag: three requests of the demo model.
    got = parse_metrics((DATA / "triton_metrics_2.51_summaries.txt").read_text())
    ft = got["models"]["fastertransformer"]
    assert (ft["p50_us"], ft["p90_us"], ft["p99_us"]) == (1768, 2018, 2018)
    assert ft["ok"] == 3 and ft["req_us"] == 37820   # the counters beside them, as before
    # The queue's and compute's summaries are not taken for the request's.
    assert set(ft) == {"ok", "fail", "inf", "exec", "req_us", "queue_us", "infer_us", "pending",
                       "p50_us", "p90_us", "p99_us"}
    # Two versions: the highest quantile (they do not add up).
    two = parse_metrics('nv_inference_request_summary_us{model="m",version="1",quantile="0.99"} 10\n'
                        'nv_inference_request_summary_us{model="m",version="2",quantile="0.99"} 30\n')
    assert two["models"]["m"] == {"p99_us": 30}


def test_rates_between_two_samples() -> None:
    a = {"t": 100.0, "i": 0, "models": {"m": {"ok": 10, "inf": 20, "fail": 0, "req_us": 10_000, "queue_us": 1000}}}
    b = {"t": 102.0, "i": 0, "models": {"m": {"ok": 30, "inf": 60, "fail": 2, "req_us": 50_000, "queue_us": 3000,
                                             "pending": 4}}}
    (r,) = rates(a, b)
    assert (r.requests_s, r.inferences_s, r.failures_s, r.latency_ms, r.queue_ms, r.pending) == (10, 20, 1, 2.0, 0.1, 4)
    assert (r.p50_ms, r.p99_ms) == (None, None)   # a server without summaries
    (q,) = rates(a, {**b, "models": {"m": {**b["models"]["m"], "p50_us": 1500, "p90_us": 2000, "p99_us": 9000}}})
    assert (q.p50_ms, q.p90_ms, q.p99_ms) == (1.5, 2.0, 9.0)
    assert rates(a, {**b, "i": 1}) == []   # a restart's counters start again
    assert rates(b, a) == []


def test_what_the_recorded_pages_give_per_second_and_what_they_cannot() -> None:
    # Each recorded page against an empty sample 10 s before: three requests, as three executions
    # of one sequence each, then of two sequences each (the client's batch of 2).
    for name, inf_s, batch in (("triton_metrics_2.51.txt", 0.3, 1.0), ("triton_metrics_2.51_summaries.txt", 0.6, 2.0)):
        page = (DATA / name).read_text()
        cur = {"t": 110.0, "i": 0, **parse_metrics(page)}
        (r,) = rates({"t": 100.0, "i": 0, "models": {}}, cur)
        assert (r.requests_s, r.inferences_s, r.batches_s, r.mean_batch) == (0.3, inf_s, 0.3, batch)
        # No token figure on Triton's page for an FT model: tokens/s is not derivable from it.
        assert not [ln for ln in page.splitlines() if "token" in ln.lower()]
    a = {"t": 0.0, "i": 0, "models": {"m": {"ok": 0, "inf": 0, "exec": 0}}}
    (full,) = rates(a, {"t": 2.0, "i": 0, "models": {"m": {"ok": 8, "inf": 32, "exec": 4}}})
    assert (full.batches_s, full.mean_batch) == (2.0, 8.0)
    (idle,) = rates(a, {"t": 2.0, "i": 0, "models": {"m": {}}})
    assert idle.mean_batch is None   # no execution between the samples


def test_gpus_from_nvidia_smi(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "gpu-rank1.csv").write_text((DATA / "nvidia_smi_h200.csv").read_text())
    (g,) = gpus(tmp_path, 1)
    assert g["uuid"] == "GPU-fe8f4655-7c50-fbcd-f714-03d7e2ba7b15" and g["timestamp"].endswith("18.311")
    assert g["util"] == 0 and g["mem_total_mib"] == 143771 and g["power_w"] == 77.60 and g["sm_mhz"] == 345
    assert gpus(tmp_path, 0) == []


def test_last_lines_reads_from_the_end(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_text("".join(f"line {i}\n" for i in range(100_000)))
    assert last_lines(p, 2, block=64) == ["line 99998", "line 99999"]
    assert last_lines(tmp_path / "none", 2) == []


def test_the_sampler_appends_and_rolls(tmp_path: Path) -> None:
    import http.server
    import threading

    page = (DATA / "triton_metrics_2.51.txt").read_bytes()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "state" / "metrics.jsonl"
        out.parent.mkdir()
        s = Sampler("127.0.0.1", srv.server_address[1], str(out), 1.0, max_bytes=150, incarnation=2)
        for _ in range(3):
            s.sample()
        lines = [json.loads(ln) for ln in out.read_text().splitlines()]
        kept = [json.loads(ln) for ln in (tmp_path / "state" / "metrics.jsonl.1").read_text().splitlines()]
        # Past 150 bytes (each line is more) the file moves aside: the newest line and the one
        # before are kept, the oldest dropped; at most twice the limit.
        assert len(lines) == 1 and len(kept) == 1 and kept[0]["t"] <= lines[0]["t"]
        assert lines[-1]["i"] == 2 and lines[-1]["models"]["fastertransformer"]["ok"] == 3
        view = run_view(tmp_path, 1)
        assert view["sampled"] == lines[-1]["t"]
    finally:
        srv.shutdown()


def test_top_once_and_json(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "state").mkdir(parents=True)
    now = time.time()
    samples = [{"t": now - 10, "i": 0, "models": {"fastertransformer": {"ok": 100, "req_us": 1_000_000,
                                                                        "inf": 100, "exec": 50}}},
               {"t": now, "i": 0, "models": {"fastertransformer": {"ok": 300, "req_us": 3_000_000, "inf": 700,
                                                                   "exec": 100}}}]
    (run_dir / "state" / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (run_dir / "state" / "events").write_text(f"{now} serving 127.0.0.1:8000\n")
    (run_dir / "state" / "gpu-rank0.csv").write_text((DATA / "nvidia_smi_h200.csv").read_text())
    (run_dir / "state" / "gpu-events-rank0").write_text(f"{now - 5:.3f} 0 GPU-fe8f xid 79\n")
    state = tmp_path / "store"
    RunStore(state / "runs.sqlite").add(RunRecord(run_id="r1", created=now, cluster_name="c", cluster_source="",
                                                  scheduler="local", style="local", run_dir=str(run_dir), nodes=1,
                                                  model="m", status="SERVING"))
    env = {**os.environ, "FTCLUSTER_STATE_DIR": str(state), "COLUMNS": "250"}
    got = subprocess.run([sys.executable, "-m", "ftcluster", "top", "r1", "--json"], capture_output=True, text=True,
                         env=env, check=False)
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    assert doc["kind"] == "top" and doc["runs"][0]["models"][0]["requests_s"] == 20.0
    assert doc["runs"][0]["models"][0]["latency_ms"] == 10.0 and doc["runs"][0]["gpus"]["0"][0]["util"] == 0
    assert doc["runs"][0]["models"][0]["mean_batch"] == 12.0
    (ev,) = doc["runs"][0]["gpu_events"]["0"]
    assert (ev["gpu"], ev["kind"], ev["data"]) == (0, "xid", 79) and "fallen off the bus" in ev["words"]
    shown = subprocess.run([sys.executable, "-m", "ftcluster", "top", "r1", "--once"], capture_output=True, text=True,
                           env=env, check=False)
    assert shown.returncode == 0, shown.stderr
    assert "fastertransformer" in shown.stdout and "20.0" in shown.stdout and "10.00" in shown.stdout
    assert "12.0" in shown.stdout and "XID 79" in shown.stdout


def test_report_plots_a_history(tmp_path: Path) -> None:
    import pytest

    pytest.importorskip("matplotlib", reason="the plot extra")   # tests/run.sh installs it
    from matplotlib.image import imread

    from ftcluster.observe.report import history, plot

    (tmp_path / "state").mkdir()
    t0 = 1795659016.0   # the recorded GPU samples' hour
    lines = [{"t": t0 + k, "i": 0 if k < 3 else 1, "models": {"m": {"ok": 10 * k * k, "req_us": 5000 * k * k,
                                                                     "queue_us": 100 * k, "p99_us": 900 * k}}}
             for k in range(6)]
    (tmp_path / "state" / "metrics.jsonl.1").write_text(json.dumps(lines[0]) + "\n")
    (tmp_path / "state" / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[1:]))
    (tmp_path / "state" / "events").write_text(f"{t0 + 3} restarting 1 rank 0 died\n")
    (tmp_path / "state" / "gpu-rank0.csv").write_text((DATA / "nvidia_smi_h200.csv").read_text())
    hist = history(tmp_path, 1)
    # 6 samples; rates between 0-1, 1-2, 3-4, 4-5 (not across the restart's new counters).
    assert hist["samples"] == 6 and len(hist["models"]["m"]["t"]) == 4
    assert hist["models"]["m"]["requests_s"][:2] == [10.0, 30.0] and hist["models"]["m"]["latency_ms"][0] == 0.5
    assert hist["models"]["m"]["p99_ms"] == [0.9, 1.8, 3.6, 4.5]   # the later sample's
    assert hist["gpus"]["rank0 gpu0"]["mem_used_mib"] == [0.0, 0.0, 0.0]
    assert [r["cause"] for r in hist["restarts"]] == ["rank 0 died"]
    assert hist["gpus"]["rank0 gpu0"]["ecc_uncorrected"] == [None, None, None]   # the H200's lines have none
    (tmp_path / "state" / "gpu-events-rank0").write_text(f"{t0 + 4} 0 GPU-fe8f xid 79\n")
    hist = history(tmp_path, 1)
    assert [(e["rank"], e["data"]) for e in hist["gpu_events"]] == [(0, 79)]
    out = tmp_path / "run.png"
    plot(hist, "run r", str(out))
    img = imread(str(out))
    assert img.shape[0] > 200 and img.shape[1] > 200 and float(img.std()) > 0.01   # an image, not blank


def test_a_hangs_message_names_the_gpus(tmp_path: Path) -> None:
    from ftcluster.job.gpu_samples import gpu_words

    (tmp_path / "gpu-rank1.csv").write_text((DATA / "nvidia_smi_h200.csv").read_text().split("\n", 1)[1])
    assert gpu_words(str(tmp_path), 2) == "rank 1: GPU 0 0% busy, 0 MiB"
    os.utime(tmp_path / "gpu-rank1.csv", (time.time() - 600, time.time() - 600))
    assert gpu_words(str(tmp_path), 2) == ""   # stale samples say nothing about now


def test_one_gpu_sample_is_enough(tmp_path: Path) -> None:
    from ftcluster.job.gpu_samples import gpu_words

    line = (DATA / "nvidia_smi_h200.csv").read_text().splitlines()[-1]
    (tmp_path / "gpu-rank0.csv").write_text(line + "\n")
    assert gpu_words(str(tmp_path), 1) == "rank 0: GPU 0 0% busy, 0 MiB"


def test_the_readmes_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    import re
    import shutil

    import pytest

    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (tests/cluster/install.sh installs it)")
    readme = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if "file_sd_configs" in b]
    # Its targets folder, made real, with a target file as a run publishes it.
    folder = tmp_path / "prometheus"
    folder.mkdir()
    (folder / "run-1.json").write_text(json.dumps([{"targets": ["node1:8002"], "labels": {"ftcluster_run": "run-1"}}]))
    glob = re.search(r'files: \["([^"]+)"\]', block)
    assert glob is not None, block
    config = tmp_path / "prometheus.yml"
    config.write_text(block.replace(glob.group(1), str(folder / "*.json")))
    r = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
