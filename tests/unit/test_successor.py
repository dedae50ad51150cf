"""The successor of a serving run on Slurm, as rendered and as submitted: the sbatch lines that
let Slurm requeue it and warn it of its time limit, the successor command in job.json, the
excluded nodes merged into sbatch_args, and sbatch's environment inside a job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftcluster.job.handover import submit_env
from ftcluster.render.scripts import RenderOptions, RunPaths, render
from ftcluster.launch.successor import with_excluded
from tests.helpers_specs import assert_one_line_error, run_cli
from tests.unit.test_render import PYTHON, RUN_DIR, SPECS, _model, _plan, cluster


def _rendered(style: str, keep_serving: bool, faults: tuple[str, ...] = (),
              **server: object) -> tuple[str, dict[str, object]]:
    # No probe: the test model's config.pbtxt is not there to make one from.
    base = dict(SPECS[style]["server"])  # type: ignore[call-overload]
    c = cluster(**{**SPECS[style], "server": {**base, "handover_lead": 600, "liveness": {"interval": 0}, **server}})
    scripts = render(c, _model(), _plan(c, 2), RunPaths("gpt-2n", RUN_DIR),
                     RenderOptions(python=PYTHON, keep_serving=keep_serving, carried_faults=faults))
    job = next(t for n, t in scripts.files.items() if n.endswith((".sbatch", ".sh")) and n.startswith("job"))
    return job, json.loads(scripts.files["job.json"])


@pytest.mark.parametrize("style", ["none", "pyxis", "docker"])
def test_a_serving_slurm_job_may_be_requeued_and_is_warned_of_its_time_limit(style: str) -> None:
    job, cfg = _rendered(style, keep_serving=True)
    for line in ("#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=B:USR1@600"):
        assert line + "\n" in job, line
    assert cfg["successor"] == [PYTHON, "-m", "ftcluster", "successor", str(RUN_DIR)]
    assert cfg["handover_lead"] == 600


def test_no_hand_over_with_a_lead_of_0_and_nothing_for_a_run_that_does_not_serve() -> None:
    # No USR1 (no hand-over): Slurm's TERM ahead of the limit instead, for a graceful end.
    job, cfg = _rendered("none", keep_serving=True, handover_lead=0)
    assert "B:USR1" not in job and "#SBATCH --signal=B:TERM@" in job and "#SBATCH --requeue\n" in job
    assert cfg["successor"]
    job, cfg = _rendered("none", keep_serving=False)
    assert "--requeue" not in job and "B:USR1" not in job and cfg["successor"] == []


def test_a_successor_keeps_the_runs_restarts_and_counts_on_from_its_predecessors_faults() -> None:
    lost = "rank 1 on n2 exited (code ?) while serving (node n2 lost)"
    _, cfg = _rendered("pyxis", keep_serving=True, faults=("the MPI world is hung", lost), restarts=3)
    assert cfg["carried_faults"] == ["the MPI world is hung", lost] and cfg["restarts"] == 3
    _, first = _rendered("pyxis", keep_serving=True, restarts=3)
    assert first["carried_faults"] == [] and first["restarts"] == 3


def test_local_runs_have_no_successor() -> None:
    _, cfg = _rendered("local", keep_serving=True)
    assert cfg["successor"] == [] and cfg["handover_lead"] == 0


def test_excluded_nodes_merge_into_one_exclude_option() -> None:
    assert with_excluded((), ["n2"]) == ("--exclude=n2",)
    assert with_excluded(("--qos=hi", "--exclude=n1,n2"), ["n2", "n3"]) == ("--qos=hi", "--exclude=n1,n2,n3")
    assert with_excluded(("--qos=hi",), []) == ("--qos=hi",)
    # Slurm's own forms: a hostlist with its brackets, the short option.
    assert with_excluded(("--exclude=node[01-03,05],n9",), ["n2"]) == ("--exclude=node[01-03,05],n9,n2",)
    assert with_excluded(("-x gpu[1-2]", "-C a100&ib"), ["n2"]) == ("-C a100&ib", "--exclude=gpu[1-2],n2")
    assert with_excluded(("-xn1",), ["n2"]) == ("--exclude=n1,n2",)


def test_sbatch_inside_a_job_gets_none_of_the_jobs_slurm_values() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SBATCH_PARTITION": "x", "SLURM_CONF": "/etc/s.conf",
           "SRUN_DEBUG": "3", "PATH": "/bin", "FTCLUSTER_STATE_DIR": "/s"}
    assert submit_env(env) == {"SLURM_CONF": "/etc/s.conf", "PATH": "/bin", "FTCLUSTER_STATE_DIR": "/s"}


@pytest.mark.parametrize(("limit", "lead", "expect"), [
    ("01:00:00", 900, 900), ("10", 900, 300), ("2", 90, 60), ("1-00:00:00", 900, 900), ("UNLIMITED", 900, 0)])
def test_the_notice_comes_at_most_half_way_through_the_limit(limit: str, lead: int, expect: int) -> None:
    # A notice at the very start would hand over at once, and the successor again, for ever.
    c = cluster(**{**SPECS["none"], "time_limit": limit,
                   "server": {**dict(SPECS["none"]["server"]), "handover_lead": lead,  # type: ignore[call-overload]
                              "liveness": {"interval": 0}}})
    scripts = render(c, _model(), _plan(c, 2), RunPaths("gpt-2n", RUN_DIR), RenderOptions(python=PYTHON, keep_serving=True))
    assert json.loads(scripts.files["job.json"])["handover_lead"] == expect
    assert (f"#SBATCH --signal=B:USR1@{expect}\n" in scripts.files["job.sbatch"]) == bool(expect)


def test_sbatch_args_take_slurm_values_as_slurm_takes_them() -> None:
    from pydantic import ValidationError

    good = ["--exclude=node[01-03]", "--nodelist=gpu[01-02]", "--constraint=a100&ib", "--constraint=[a100|h100]",
            "-C a100", "-Ca100", "--gres=gpu:8", "-O"]
    c = cluster(**{**SPECS["none"], "sbatch_args": good})
    scripts = render(c, _model(), _plan(c, 2), RunPaths("gpt-2n", RUN_DIR), RenderOptions(python=PYTHON))
    sbatch = scripts.files["job.sbatch"]
    assert all(f"#SBATCH {arg}\n" in sbatch for arg in good)
    for bad in ("--constraint=a b", "-C  a100", "--comment='q'", "--x=a\\b", "-C a100 -x n1"):
        with pytest.raises(ValidationError, match="one sbatch option as an #SBATCH line takes it"):
            cluster(**{**SPECS["none"], "sbatch_args": [bad]})


def test_srun_args_and_setup_lines_reach_the_job() -> None:
    c = cluster(**{**SPECS["none"], "srun_args": ["--cpu-bind=none", "-C a100"],
                   "setup": ["module load cuda/12.2", "source /etc/site-env.sh"]})
    scripts = render(c, _model(), _plan(c, 2), RunPaths("gpt-2n", RUN_DIR), RenderOptions(python=PYTHON))
    sbatch = scripts.files["job.sbatch"]
    assert "\nmodule load cuda/12.2\nsource /etc/site-env.sh\n" in sbatch
    assert sbatch.index("source /etc/site-env.sh") < sbatch.index("exec ")
    assert json.loads(scripts.files["job.json"])["srun_args"] == ["--cpu-bind=none", "-C", "a100"]
    # A standalone script: its own folder and log path, TERM before the time limit.
    assert f"#SBATCH --chdir={RUN_DIR}\n" in sbatch and f"#SBATCH --output={RUN_DIR}/logs/slurm-%j.out\n" in sbatch
    assert "#SBATCH --signal=B:TERM@" in sbatch


def test_a_run_folder_with_blanks_keeps_relative_paths() -> None:
    from pathlib import Path

    c = cluster(**SPECS["none"])
    odd = Path("/shared/my runs/gpt")
    sbatch = render(c, _model(), _plan(c, 2), RunPaths("gpt-2n", odd), RenderOptions(python=PYTHON)).files["job.sbatch"]
    assert "--chdir" not in sbatch and "#SBATCH --output=logs/slurm-%j.out\n" in sbatch


@pytest.mark.parametrize("cause", ["a\nb", "x\x1b[31mred", " "])
def test_a_carried_fault_must_be_one_printable_line(tmp_path: Path, cause: str) -> None:
    # Each becomes part of an events line of the successor's; refused before anything is read.
    res = run_cli("successor", str(tmp_path), "--exclude", "n2", "--fault", "the MPI world is hung", "--fault", cause)
    assert res.rc == 3
    assert_one_line_error(res, "--fault", "not a fault's cause on one line")


def test_slurm_args_that_would_override_ftclusters_own_are_refused() -> None:
    # Slurm takes an option's last value, unique abbreviations (getopt_long) and bundled short
    # options: each form of an option ftcluster sets is refused; real options are not.
    from pydantic import ValidationError

    for key, bad in (("sbatch_args", "--nodes=3"), ("sbatch_args", "-N 3"), ("sbatch_args", "--part=x"),
                     ("sbatch_args", "-vpx"), ("sbatch_args", "--out=/tmp/x"), ("srun_args", "--mpi=pmi2"),
                     ("srun_args", "--kill-on=0"), ("srun_args", "-vK"), ("srun_args", "--container-image=x")):
        with pytest.raises(ValidationError, match="ftcluster sets it"):
            cluster(**{**SPECS["none"], key: [bad]})
    c = cluster(**{**SPECS["none"], "sbatch_args": ["--gpus=8", "-Ca100", "-O", "--con=a100", "--exclude=n1"],
                   "srun_args": ["--cpu-bind=none", "-l"]})
    assert c.sbatch_args[0] == "--gpus=8"
