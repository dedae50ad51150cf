"""`report` of a service: its runs joined across hand-overs and lost nodes, when it answered and
when it did not (from the runs' own events), as words, JSON and a plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftcluster.run.events import parse_events
from ftcluster.observe.report import availability, duration, service_history, serving_spans
from ftcluster.run.store import RunRecord, RunStore

A = ("100 job_started n1 7\n110 ready n1:8000\n111 serving n1:8000\n200 rank_failed 1 n2 137\n"
     "201 restarting 1 rank 1 on n2 exited\n230 ready n1:8000\n231 serving n1:8000\n"
     "1000 successor_submitted B 8 {dir}/B n1,n2\n1100 handed_over B n3:8000\n1101 servers_stopped\n1105 done 0\n")
B = "1000 job_started n3 8\n1090 ready n3:8000\n1091 serving n3:8000\n1500 node_lost n4\n" \
    "1501 successor_submitted C 9 {dir}/C n4\n1510 done 1\n"
C = "1500 job_started n5 9\n1620 ready n5:8000\n1621 serving n5:8000\n"


def _runs(tmp_path: Path, c_tail: str = "") -> list[tuple[str, Path, int]]:
    for name, text in (("A", A), ("B", B), ("C", C + c_tail)):
        (tmp_path / name / "state").mkdir(parents=True)
        (tmp_path / name / "state" / "events").write_text(text.format(dir=tmp_path))
    (tmp_path / "B" / "state" / "metrics.jsonl").write_text("".join(
        json.dumps({"t": t, "i": 0, "models": {"m": {"ok": 10 * (t - 1100), "req_us": 1000 * (t - 1100)}}}) + "\n"
        for t in (1200, 1210, 1220)))
    (tmp_path / "C" / "state" / "metrics.jsonl").write_text("".join(
        json.dumps({"t": t, "i": 0, "models": {"m": {"ok": 5 * (t - 1600), "req_us": 500 * (t - 1600)}}}) + "\n"
        for t in (1700, 1710)))
    return [(name, tmp_path / name, 1) for name in "ABC"]


def test_a_service_that_moved_twice_answered_all_but_its_two_outages(tmp_path: Path) -> None:
    hist = service_history([(_runs(tmp_path), True)], now=2000.0)
    av = hist["availability"]
    # Answering: 110-200, 230-1500 (A and B overlap at the hand-over), 1620-now.
    assert (av["since"], av["until"], av["served_s"], av["span_s"]) == (110.0, 2000.0, 1740.0, 1890.0)
    assert av["fraction"] == round(1740 / 1890, 6)
    assert [(o["from"], o["to"], o["cause"]) for o in av["outages"]] == [
        (200.0, 230.0, "rank 1 on n2 exited (137)"), (1500.0, 1620.0, "node lost: n4")]
    assert hist["moves"] == [{"t": 1100.0, "from": "A", "to": "B", "cause": "time limit"},
                             {"t": 1500.0, "from": "B", "to": "C", "cause": "node lost: n4"}]
    assert [(r["run_id"], r["served_s"]) for r in hist["runs"]] == [("A", 960.0), ("B", 410.0), ("C", 380.0)]
    # The runs' series joined, each point naming its run.
    m = hist["models"]["m"]
    assert m["t"] == [1210, 1220, 1710] and m["run"] == ["B", "B", "C"] and m["requests_s"] == [10.0, 10.0, 5.0]
    assert [r["cause"] for r in hist["restarts"]] == ["rank 1 on n2 exited"] and hist["restarts"][0]["run"] == "A"


def test_a_service_not_answering_now_has_an_open_outage_and_an_ended_one_none(tmp_path: Path) -> None:
    runs = _runs(tmp_path, c_tail="1900 restarting 1 rank 0 did not answer\n")
    live = service_history([(runs, True)], now=2000.0)["availability"]
    assert live["outages"][-1] == {"from": 1900.0, "to": 2000.0, "seconds": 100.0, "cause": "rank 0 did not answer"}
    # Ended (its job gone): up to where it stopped answering, no trailing outage.
    ended = service_history([(runs, False)], now=5000.0)["availability"]
    assert ended["until"] == 1900.0 and len(ended["outages"]) == 2


def test_a_requeued_run_is_down_from_its_stop_to_its_next_ready() -> None:
    events = parse_events("1 job_started n1 7\n5 ready n1:8000\n50 interrupted\n52 done 143\n"
                          "90 job_started n2 7\n99 ready n2:8000\n")
    spans = serving_spans(events, until=120.0)
    assert [(s, e) for s, e, _ in spans] == [(5.0, 50.0), (99.0, 120.0)]
    av = availability(spans, 120.0)
    assert av["served_s"] == 66.0 and av["outages"][0]["cause"].startswith("the job was told to stop")


def test_a_hung_world_is_down_from_its_first_missed_probe() -> None:
    """A frozen rank: the world answered nothing from the first missed probe on, though the
    verdict (and the restart) came later; the outage starts there and carries the restart's cause."""
    events = parse_events("1 job_started n1 7\n5 ready n1:8000\n6 serving n1:8000\n"
                          "60 unanswered 52.250\n60.1 restarting 1 the MPI world is hung: ...\n"
                          "70 ready n1:8000\n71 serving n1:8000\n")
    spans = serving_spans(events, until=100.0)
    assert [(s, e) for s, e, _ in spans] == [(5.0, 52.25), (70.0, 100.0)]
    out = availability(spans, 100.0)["outages"]
    assert [(o["from"], o["to"]) for o in out] == [(52.25, 70.0)] and out[0]["cause"].startswith("the MPI world is hung")
    # Only within its own span: a later end is not moved by it, nor a span by a stray time.
    later = parse_events("5 ready n1:8000\n60 unanswered 52.250\n60.1 restarting 1 hung\n70 ready n1:8000\n"
                         "90 interrupted\n")
    assert [(s, e) for s, e, _ in serving_spans(later, until=100.0)] == [(5.0, 52.25), (70.0, 90.0)]
    stray = parse_events("5 ready n1:8000\n60 unanswered 1.0\n61 failed hung\n")
    assert [(s, e) for s, e, _ in serving_spans(stray, until=100.0)] == [(5.0, 5.0)]


def test_no_ready_no_figures() -> None:
    av = availability(serving_spans(parse_events("1 job_started n1 7\n"), until=9.0), 9.0)
    assert av["fraction"] is None and av["outages"] == []


@pytest.mark.parametrize(("seconds", "words"), [(12, "12 s"), (250, "4 min 10 s"), (7500, "2 h 5 min"),
                                                 (3 * 86400 + 4 * 3600 + 59, "3 d 4 h"), (3600, "1 h")])
def test_durations_in_words(seconds: float, words: str) -> None:
    assert duration(seconds) == words


def test_report_of_the_first_run_covers_the_service(tmp_path: Path) -> None:
    """The command: `report A` follows the chain from the run store (A's and B's events name
    their successors), in words, JSON and a plot with the moves and outages marked."""
    runs = _runs(tmp_path, c_tail="2000 interrupted\n2003 done 143\n")
    state = tmp_path / "store"
    store = RunStore(state / "runs.sqlite")
    for k, (run_id, run_dir, _) in enumerate(runs):
        store.add(RunRecord(run_id=run_id, created=1000.0 + k, cluster_name="c", cluster_source="", scheduler="local",
                            style="local", run_dir=str(run_dir), nodes=1, model="m", status="CANCELLED",
                            job_id=str(7 + k), predecessor="AB"[k - 1] if k else None))
    env = {**os.environ, "FTCLUSTER_STATE_DIR": str(state)}

    def report(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ftcluster", "report", "A", *args], capture_output=True,
                              text=True, env=env, check=False)

    words = report()
    assert words.returncode == 0, words.stderr
    assert "3 runs, 2 moves (time limit, node lost: n4)" in words.stdout, words.stdout
    assert "answered 29 min of 31 min 30 s since its first ready (92.06%); 2 outage(s):" in words.stdout
    assert "2 min from " in words.stdout and ": node lost: n4" in words.stdout
    doc = json.loads(report("--json").stdout)
    assert doc["kind"] == "report" and [r["run_id"] for r in doc["runs"]] == ["A", "B", "C"]
    assert doc["availability"]["served_s"] == 1740.0
    pytest.importorskip("matplotlib", reason="the plot extra")   # tests/run.sh installs it
    from matplotlib.image import imread

    drawn = report("--plot", str(tmp_path / "service.png"))
    assert drawn.returncode == 0, drawn.stderr
    img = imread(str(tmp_path / "service.png"))
    assert img.shape[0] > 200 and float(img.std()) > 0.01


def test_a_batch_host_lost_ends_the_span_at_its_last_sign_of_life() -> None:
    """The batch host lost: the job could write nothing; Slurm requeued it and it started
    again. The earlier attempt answered until its last metrics sample, not until the new start."""
    events = parse_events("1 job_started n1 7\n5 ready n1:8000\n6 serving n1:8000\n"
                          "200 job_started n2 7\n260 ready n2:8000\n")
    spans = serving_spans(events, until=300.0, alive=[20.0, 35.0, 50.0, 205.0, 290.0])
    assert [(s, e) for s, e, _ in spans] == [(5.0, 50.0), (260.0, 300.0)]
    assert "unheard" in spans[0][2]
    # No sample: its last event.
    assert serving_spans(events, until=300.0)[0][:2] == (5.0, 6.0)


def test_a_replica_sets_members_answer_for_it_while_any_one_does(tmp_path: Path) -> None:
    runs = {"m0": "1 job_started n1 7\n10 ready n1:8000\n100 rank_failed 0 n1 137\n101 restarting 1 rank 0 died\n"
                  "140 ready n1:8000\n",
            "m1": "1 job_started n2 8\n30 ready n2:8000\n120 interrupted\n125 done 143\n",
            "m2": "110 job_started n3 9\n130 ready n3:8000\n"}
    chains = []
    for name, text in runs.items():
        (tmp_path / name / "state").mkdir(parents=True)
        (tmp_path / name / "state" / "events").write_text(text)
        chains.append(([(name, tmp_path / name, 1)], name != "m1"))
    av = service_history(chains, now=200.0)["availability"]
    # m0 down 100-140, covered by m1 (to 120) and m2 (from 130): one outage, 120-130.
    assert (av["since"], av["served_s"], av["span_s"]) == (10.0, 180.0, 190.0)
    assert [(o["from"], o["to"]) for o in av["outages"]] == [(120.0, 130.0)]
    assert av["outages"][0]["cause"].startswith("the job was told to stop")


def _folder(at: Path, **state: str) -> Path:
    """A run folder whose state/ holds these files (name: text; `last_alive` for last-alive)."""
    (at / "state").mkdir(parents=True)
    for name, text in state.items():
        (at / "state" / name.replace("_", "-")).write_text(text)
    return at


def test_a_sets_balancer_bounds_when_it_answered(tmp_path: Path) -> None:
    """A set answers while its balancer serves too. The balancer hands over in place to a job
    of its own (500: no gap), whose node is later lost: Slurm requeues that job (900), and the
    balancer's span ends at its last sign of life (state/last-alive), not at the requeue."""
    from ftcluster.observe.report import front_spans

    # Each front's start kept the last look of the front before it: the old one's at the
    # hand-over (it still served), the lost one's at the requeue.
    set_dir = _folder(tmp_path / "set", events="1 job_started n9 5\n2 step_started front\n"
                                               "500 job_started n9 6\n501 step_started front\n"
                                               "900 job_started n7 6\n901 step_started front\n",
                      last_alive="499.8 6\n840.0 6\n")
    member = _folder(tmp_path / "m0", events="3 job_started n1 7\n10 ready n1:8000\n")
    gate = front_spans(set_dir, until=1000.0)
    assert [(s, e) for s, e, _ in gate] == [(2.0, 840.0), (901.0, 1000.0)]
    av = service_history([([("m0", member, 1)], True)], now=1000.0, gate=gate)["availability"]
    assert (av["since"], av["served_s"], av["span_s"]) == (10.0, 929.0, 990.0)
    (outage,) = av["outages"]
    assert (outage["from"], outage["to"]) == (840.0, 901.0)
    assert outage["cause"].startswith("the balancer: the job ended unheard"), outage


def test_a_requeued_run_without_samples_ends_at_the_sign_of_life_its_next_start_kept(tmp_path: Path) -> None:
    """No metrics sampled (server.metrics_interval 0): the requeued job kept its earlier
    attempt's last probe time in state/last-alive, where that attempt's span ends."""
    run = _folder(tmp_path / "r", events="1 job_started n1 7\n5 ready n1:8000\n6 serving n1:8000\n"
                                         "200 job_started n2 7\n201 restarting 1 Slurm requeued the job\n"
                                         "260 ready n2:8000\n", last_alive="150.0 7\n")
    av = service_history([([("r", run, 1)], True)], now=300.0)["availability"]
    assert [(o["from"], o["to"]) for o in av["outages"]] == [(150.0, 260.0)] and av["served_s"] == 185.0
