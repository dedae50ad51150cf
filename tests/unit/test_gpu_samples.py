"""Every node's GPU samples (issue 35): NVML's XID/ECC events through ctypes (the struct laid out
as nvml.h has it, replayed from what a real H100 answered), the node sampler writing the
samples and events (a stand-in nvidia-smi that prints the lines a real H100 gave), the parser,
the failure message that names the GPU and its XID, and the job's GPU exporter on a real socket."""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from ftcluster.job import nvml
from ftcluster.job.exporter import Exporter, page
from ftcluster.job.gpu_sampler import NodeSampler
from ftcluster.job.gpu_samples import (
    QUERY,
    event_words,
    format_event,
    gpu_words,
    latest,
    parse_events,
    parse_samples,
    read_events,
)
from tests.helpers_specs import DATA
from tests.launch_helpers import fill, small_filesystem

H100_CSV = DATA / "nvidia_smi_h100_ecc.csv"
H100_NVML = json.loads((DATA / "nvml_events_h100.json").read_text())
HANDLE = 0x5555_0000_1000


def raw_event(handle: int, kind: int, data: int, gi: int = nvml.NO_INSTANCE, ci: int = nvml.NO_INSTANCE) -> bytes:
    """nvmlEventData_t's bytes on x86-64: a pointer, two unsigned long long, two unsigned int."""
    return struct.pack("<QQQII", handle, kind, data, gi, ci)


# --------------------------------------------------------------------------- NVML through ctypes

def test_the_event_struct_is_nvml_hs() -> None:
    assert ctypes.sizeof(nvml.EventData) == 32 == H100_NVML["struct_size"]   # as the real library's caller built it
    devices = {HANDLE: (3, "GPU-abc")}
    xid = nvml.decode(nvml.EventData.from_buffer_copy(raw_event(HANDLE, nvml.XID_CRITICAL, 79)), devices)
    assert xid == nvml.Event(3, "GPU-abc", "xid", 79, None, None)
    dbe = nvml.decode(nvml.EventData.from_buffer_copy(raw_event(HANDLE, nvml.DOUBLE_BIT_ECC, 0)), devices)
    assert (dbe.kind, dbe.data) == ("ecc_dbe", 0)
    mig = nvml.decode(nvml.EventData.from_buffer_copy(raw_event(0, nvml.XID_CRITICAL, 999, 1, 0)), devices)
    assert mig == nvml.Event(-1, "-", "xid", 999, 1, 0)   # a device NVML did not name; a MIG instance's


class ReplayNvml:
    """libnvidia-ml.so.1 as the H100 answered (tests/data/nvml_events_h100.json), with events to
    hand out before the recorded timeouts. Arguments arrive as ctypes objects or byref()s."""

    def __init__(self, recorded: dict[str, Any], events: list[bytes], register_rc: int = 0):
        self.devices = recorded["devices"]
        self.waits = [w["rc"] for w in recorded["waits"]]
        self.events = list(events)
        self.register_rc = register_rc
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Callable[..., int]:
        if not name.startswith("nvml"):
            raise AttributeError(name)

        def call(*args: Any) -> int:
            self.calls.append(name)
            return getattr(self, "_" + name, lambda *a: 0)(*args)
        return call

    def _nvmlErrorString(self, rc: int) -> bytes:
        return b"Insufficient Permissions" if rc == 4 else b"Unknown Error"

    def _nvmlDeviceGetCount_v2(self, count: Any) -> int:
        count._obj.value = len(self.devices)
        return 0

    def _nvmlEventSetCreate(self, out: Any) -> int:
        out._obj.value = 0xE5E7
        return 0

    def _nvmlDeviceGetHandleByIndex_v2(self, i: ctypes.c_uint, out: Any) -> int:
        out._obj.value = HANDLE + i.value
        return 0

    def _nvmlDeviceGetUUID(self, handle: ctypes.c_void_p, buf: Any, size: ctypes.c_uint) -> int:
        buf.value = self.devices[(handle.value or 0) - HANDLE]["uuid"].encode()
        return 0

    def _nvmlDeviceGetSupportedEventTypes(self, handle: ctypes.c_void_p, out: Any) -> int:
        out._obj.value = int(self.devices[(handle.value or 0) - HANDLE]["supported"], 16)
        return 0

    def _nvmlDeviceRegisterEvents(self, handle: ctypes.c_void_p, bits: ctypes.c_ulonglong, eset: Any) -> int:
        self.registered = bits.value
        return self.register_rc

    def _nvmlEventSetWait_v2(self, eset: Any, data: Any, timeout: ctypes.c_uint) -> int:
        if self.events:
            raw = self.events.pop(0)
            ctypes.memmove(ctypes.addressof(data._obj), raw, len(raw))
            return 0
        return self.waits.pop(0) if self.waits else nvml.ERROR_TIMEOUT


def test_nvml_registers_xid_and_ecc_and_a_wait_without_events_times_out() -> None:
    lib = ReplayNvml(H100_NVML, [raw_event(HANDLE, nvml.XID_CRITICAL, 48)])
    n = nvml.Nvml(lib)
    n.open()
    (dev,) = H100_NVML["devices"]
    # The H100 supported 0xff9f; the watched bits of it are what was registered there.
    assert n.registered == {0: int(dev["registered"], 16)} == {0: nvml.WATCHED & int(dev["supported"], 16)}
    assert n.devices == {HANDLE: (0, dev["uuid"])}
    assert n.wait(1000) == nvml.Event(0, dev["uuid"], "xid", 48, None, None)
    # Then the recorded waits: rc 10 (NVML_ERROR_TIMEOUT) every time, no event.
    assert {w["rc"] for w in H100_NVML["waits"]} == {nvml.ERROR_TIMEOUT}
    assert [n.wait(100) for _ in H100_NVML["waits"]] == [None] * len(H100_NVML["waits"])
    n.close()
    assert lib.calls[-2:] == ["nvmlEventSetFree", "nvmlShutdown"]


def test_a_gpu_that_refuses_its_events_is_noted_not_fatal() -> None:
    n = nvml.Nvml(ReplayNvml(H100_NVML, [], register_rc=4))
    n.open()
    assert n.registered == {} and n.notes == ["GPU 0: nvmlDeviceRegisterEvents: Insufficient Permissions (4)"]
    quiet = nvml.Nvml(ReplayNvml({**H100_NVML, "devices": [{**H100_NVML["devices"][0], "supported": "0x4"}]}, []))
    quiet.open()
    assert quiet.registered == {} and "no XID/ECC events" in quiet.notes[0]


# --------------------------------------------------------------------------- the format

def test_the_recorded_h100_lines_parse_with_their_ecc_counts() -> None:
    lines = H100_CSV.read_text().splitlines()
    rows = parse_samples(lines)
    assert len(rows) == len([ln for ln in lines if not ln.startswith("#")]) > 2
    assert len(lines[1].split(",")) == len(QUERY)
    (g,) = latest(lines)
    assert g["uuid"] == "GPU-195afd21-f8a0-bb6f-870e-95567053fab5" and g["mem_total_mib"] == 81559
    assert g["ecc_corrected"] == 0 and g["ecc_uncorrected"] == 0 and g["sm_mhz"] == 345
    # The wrapper's older 10-field lines (an H200's) have no ECC counts; "[N/A]" is no figure.
    (old,) = latest((DATA / "nvidia_smi_h200.csv").read_text().splitlines())
    assert old["ecc_uncorrected"] is None and old["power_w"] == 77.60
    (na,) = parse_samples(["2026/11/26 02:10:16.247, 1, GPU-x, 5, 1, 10, 100, [N/A], 30, 1410, [N/A], [N/A]"])
    assert na["power_w"] is None and na["ecc_corrected"] is None and na["util"] == 5
    assert parse_samples(["2026/11/26 02:10:16.247, 1, GPU-x, 5"]) == []   # a cut line


def test_events_lines_round_trip() -> None:
    text = format_event(1795659016.5, 1, "GPU-b", "xid", 79) + format_event(1795659017, 0, "GPU-a", "ecc_dbe", 0, 2, 0)
    a, b = parse_events("# a note\n" + text + "1795659018.0 0 GPU-a\n")   # a cut line is left out
    assert (a.t, a.gpu, a.uuid, a.kind, a.data, a.instance) == (1795659016.5, 1, "GPU-b", "xid", 79, "")
    assert b.instance == "gi=2 ci=0"
    assert a.words().startswith("GPU 1 XID 79 (GPU has fallen off the bus) at ")
    assert b.words().startswith("GPU 0 a double-bit ECC error at ") and b.words().endswith("(gi=2 ci=0)")


# --------------------------------------------------------------------------- the sampler

@pytest.fixture
def fake_smi(tmp_path: Path) -> Path:
    """A stand-in nvidia-smi printing the H100's recorded lines for the sampler's query, and
    refusing the ECC fields where FAKE_SMI_OLD is set, as a driver without them does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    line = [ln for ln in H100_CSV.read_text().splitlines() if not ln.startswith("#")][-1]
    base = ", ".join(line.split(", ")[:10])
    (bin_dir / "nvidia-smi").write_text(
        "#!/bin/bash\n"
        'if [ -n "${FAKE_SMI_OLD:-}" ]; then\n'
        '  case "$1" in *ecc.errors*) echo \'Field "ecc.errors.corrected.volatile.total" is not a valid field to query.\'; exit 2;; esac\n'
        f"  echo '{base}'; exit 0\nfi\n"
        f"echo '{line}'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return bin_dir


class OneEvent:
    """The sampler's NVML: one XID, then waits that time out."""

    def __init__(self) -> None:
        self.registered = {0: nvml.WATCHED}
        self.notes: list[str] = []
        self.sent = False

    def open(self) -> None:
        pass

    def wait(self, timeout_ms: int) -> Optional[nvml.Event]:
        if not self.sent:
            self.sent = True
            return nvml.Event(0, "GPU-195afd21-f8a0-bb6f-870e-95567053fab5", "xid", 79)
        time.sleep(timeout_ms / 1000 / 50)
        return None

    def close(self) -> None:
        pass


def test_the_sampler_writes_samples_and_events(tmp_path: Path, fake_smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{fake_smi}:{os.environ['PATH']}")
    out, events = tmp_path / "gpu-rank1.csv", tmp_path / "gpu-events-rank1"
    s = NodeSampler(str(out), str(events), 0.05, 1 << 20, nvml=OneEvent)
    follow = subprocess.Popen(["sleep", "0.6"])
    s.run(follow.pid)   # ends with the process it follows
    follow.wait()
    rows = parse_samples(out.read_text().splitlines())
    assert len(rows) >= 3 and rows[-1]["ecc_uncorrected"] == 0
    (ev,) = read_events(str(events))
    assert (ev.gpu, ev.kind, ev.data) == (0, "xid", 79) and abs(ev.t - time.time()) < 30


def test_without_nvml_or_ecc_fields_the_samples_go_on(tmp_path: Path, fake_smi: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{fake_smi}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SMI_OLD", "1")

    def missing() -> Any:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")
    out, events = tmp_path / "g.csv", tmp_path / "e"
    s = NodeSampler(str(out), str(events), 0.05, 1 << 20, nvml=missing)
    assert s.sample() and s.sample()
    s.stop.set()
    s.watch_events()
    (row,) = latest(out.read_text().splitlines())
    assert row["ecc_uncorrected"] is None and row["mem_total_mib"] == 81559 and not events.exists()


def test_the_shipped_sampler_runs_as_a_command_and_ends_with_its_server(tmp_path: Path, fake_smi: Path) -> None:
    follow = subprocess.Popen(["sleep", "1.5"])
    env = {**os.environ, "PATH": f"{fake_smi}:{os.environ['PATH']}"}
    r = subprocess.run([sys.executable, "-m", "ftcluster.job", "gpus", "--out", str(tmp_path / "g.csv"), "--events",
                        str(tmp_path / "e"), "--interval", "0.2", "--max-bytes", "1000000", "--while-pid",
                        str(follow.pid)], env=env, capture_output=True, text=True, timeout=30, check=False)
    follow.wait()
    assert r.returncode == 0, r.stderr
    assert len(parse_samples((tmp_path / "g.csv").read_text().splitlines())) >= 3


def test_the_run_folders_copy_runs_it_with_the_standard_library_alone(tmp_path: Path, fake_smi: Path) -> None:
    """What the rank wrapper runs in the image: `python3 scripts/ftcluster_job gpus ...`."""
    from tests.unit.test_render import render_style

    scripts = tmp_path / "scripts"
    render_style("pyxis").materialize(scripts)
    follow = subprocess.Popen(["sleep", "1"])
    env = {"PATH": f"{fake_smi}:/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-I", "-S", str(scripts / "ftcluster_job"), "gpus", "--out", str(tmp_path / "g.csv"),
                        "--events", str(tmp_path / "e"), "--interval", "0.2", "--max-bytes", "1000000", "--while-pid",
                        str(follow.pid)], env=env, capture_output=True, text=True, timeout=30, check=False)
    follow.wait()
    assert r.returncode == 0, r.stderr
    assert parse_samples((tmp_path / "g.csv").read_text().splitlines())


def test_the_samples_roll_past_their_cap(tmp_path: Path, fake_smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{fake_smi}:{os.environ['PATH']}")
    out = tmp_path / "g.csv"
    s = NodeSampler(str(out), str(tmp_path / "e"), 1, 150)
    for _ in range(3):
        s.sample()
    # Each line is about 110 bytes: the file moved aside once it passed 150.
    assert len(out.read_text().splitlines()) == 1 and len((tmp_path / "g.csv.1").read_text().splitlines()) == 2


def test_a_full_filesystem_skips_samples_and_keeps_events_until_there_is_room(
        tmp_path: Path, fake_smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{fake_smi}:{os.environ['PATH']}")
    with small_filesystem(tmp_path / "small", "1m") as small:
        out, events = small / "gpu-rank0.csv", small / "gpu-events-rank0"
        s = NodeSampler(str(out), str(events), 1, 1 << 20)
        filler = fill(small)
        assert not s.sample() and not s.sample()   # skipped, not raised
        s.record(format_event(time.time(), 0, "GPU-195afd21-f8a0-bb6f-870e-95567053fab5", "xid", 79))
        assert s.room.skipped == 3 and len(s.unwritten) == 1 and not events.read_text()
        os.unlink(filler)
        assert s.sample()   # room again: the sample, then the event that waited
        assert len(parse_samples(out.read_text().splitlines())) == 1
        (ev,) = read_events(str(events))
        assert (ev.kind, ev.data) == ("xid", 79) and s.unwritten == [] and s.room.since is None


# --------------------------------------------------------------------------- failure messages

def test_a_failure_names_the_gpu_and_its_xid(tmp_path: Path) -> None:
    from ftcluster.job.supervisor import Job
    from tests.unit.test_job_supervisor import job_of
    from tests.unit.test_render import render_style

    state = tmp_path / "state"
    state.mkdir()
    now = time.time()
    (state / "rank1.host").write_text("node7\n")
    (state / "gpu-events-rank1").write_text(format_event(now - 3600, 2, "GPU-old", "xid", 13)
                                            + format_event(now - 1, 2, "GPU-b", "xid", 79))
    assert event_words(str(state), 2, ["node6", "node7"], now - 60).startswith(
        "node7 (rank 1): GPU 2 XID 79 (GPU has fallen off the bus) at ")
    assert event_words(str(state), 2, ["node6", "node7"], now) == ""   # none in this incarnation
    job: Job = job_of(render_style("local").files)
    job.cfg = job.cfg._replace(state=str(state))
    job.ranks.state = str(state)
    job.incarnation_since = now - 60
    said = job.cause_of("the server step ended")
    assert said.startswith("the server step ended; GPU events: node7 (rank 1): GPU 2 XID 79") and "XID 13" not in said


def test_a_hangs_gpus_name_uncorrected_ecc_errors(tmp_path: Path) -> None:
    line = [ln for ln in H100_CSV.read_text().splitlines() if not ln.startswith("#")][-1]
    (tmp_path / "gpu-rank0.csv").write_text(line.rsplit(", ", 1)[0] + ", 2\n")
    assert gpu_words(str(tmp_path), 1) == "rank 0: GPU 0 0% busy, 0 MiB, 2 uncorrected ECC errors"


# --------------------------------------------------------------------------- the exporter

def _state_for_export(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    (state / "rank0.host").write_text("node1\n")
    (state / "rank1.host").write_text("node2\n")
    (state / "rank2.host").write_text("node3\n")
    (state / "gpu-rank0.csv").write_text(H100_CSV.read_text())
    (state / "gpu-rank1.csv").write_text(
        "2026/11/26 14:52:33.652, 0, GPU-a, 97, 40, 1024, 81559, 512.5, 61, 1980, 3, 1\n"
        "2026/11/26 14:52:33.652, 1, GPU-b, [N/A], 40, 2048, 81559, 500, 60, 1980, 0, 0\n")
    (state / "gpu-rank2.csv").write_text((DATA / "nvidia_smi_h200.csv").read_text())
    old = time.time() - 3600
    os.utime(state / "gpu-rank2.csv", (old, old))   # a node whose sampler stopped
    (state / "gpu-events-rank1").write_text(format_event(old, 0, "GPU-a", "xid", 79) * 2
                                            + format_event(old, 1, "GPU-b", "ecc_sbe", 0))
    return state


def _metrics(text: str) -> dict[str, float]:
    return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln and ln[0] != "#"}


def test_the_exporter_serves_every_nodes_gpus_on_a_real_socket(tmp_path: Path) -> None:
    state = _state_for_export(tmp_path)
    ex = Exporter("127.0.0.1", 0, str(state), 3, max_age=60)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", ex.port, timeout=10)
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        body = r.read().decode()
        assert r.status == 200 and r.getheader("Content-Type", "").startswith("text/plain; version=0.0.4")
        conn.request("GET", "/other")
        r404 = conn.getresponse()
        r404.read()
        assert r404.status == 404
        conn.close()
    finally:
        ex.stop()
    got = _metrics(body)
    a = 'rank="1",node="node2",gpu="0",uuid="GPU-a"'
    assert got[f"ftcluster_gpu_utilization_ratio{{{a}}}"] == 0.97
    assert got[f"ftcluster_gpu_memory_used_bytes{{{a}}}"] == 1024 * 1048576
    assert got[f"ftcluster_gpu_sm_clock_hertz{{{a}}}"] == 1980e6
    assert got[f"ftcluster_gpu_ecc_uncorrected_errors_total{{{a}}}"] == 1
    assert got[f'ftcluster_gpu_xid_events_total{{{a},xid="79"}}'] == 2
    assert got['ftcluster_gpu_ecc_events_total{rank="1",node="node2",gpu="1",uuid="GPU-b",kind="ecc_sbe"}'] == 1
    assert 'ftcluster_gpu_utilization_ratio{rank="1",node="node2",gpu="1"' not in body   # [N/A]: no figure
    assert got['ftcluster_gpu_power_watts{rank="0",node="node1",gpu="0",uuid="GPU-195afd21-f8a0-bb6f-870e-95567053fab5"}'] > 0
    assert 'rank="2"' not in body   # stale samples are not shown as now
    assert body.count("# TYPE ftcluster_gpu_utilization_ratio gauge") == 1
    # The port is taken now by another: the job's exporter cannot start there (it says so and serves on).
    holder = Exporter("127.0.0.1", 0, str(state), 3, 60)
    try:
        with pytest.raises(OSError):
            Exporter("127.0.0.1", holder.port, str(state), 3, 60)
    finally:
        holder.stop()


def test_the_exporters_page_passes_promtool(tmp_path: Path) -> None:
    import shutil

    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (tests/cluster/install.sh installs it)")
    text = page(str(_state_for_export(tmp_path)), 3, 60)
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_run_publishes_its_gpu_exporter_as_a_target(tmp_path: Path) -> None:
    import socket

    from tests.unit.test_job_supervisor import job_of
    from tests.unit.test_render import render_style

    job = job_of(render_style("local").files)
    targets = tmp_path / "prometheus" / "r.json"
    job.cfg = job.cfg._replace(targets_file=str(targets), public_metrics_port=8002, gpu_exporter_address="127.0.0.1",
                      gpu_exporter_port=0, public_gpu_exporter_port=8003, metrics_interval=10, state=str(tmp_path))
    job.rank0_host = "node1"
    job.doors.publish_targets()
    assert [t["targets"] for t in json.loads(targets.read_text())] == [["node1:8002"]]   # no exporter: one
    job.doors.exporter = Exporter("127.0.0.1", 0, str(tmp_path), 1, 60)
    try:
        job.doors.publish_targets()
        triton, gpus = json.loads(targets.read_text())
        assert gpus["targets"] == [f"{socket.gethostname()}:8003"] and gpus["labels"]["job"] == "ftcluster-gpus"
        assert gpus["labels"]["ftcluster_run"] == triton["labels"]["ftcluster_run"]
    finally:
        job.doors.stop_exporter()
        job.doors.withdraw_targets()
    assert job.doors.exporter is None and not targets.exists()
