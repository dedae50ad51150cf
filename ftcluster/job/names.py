"""The names the job and the launcher share, defined once: event kinds and the run folder's files.

The templates get these objects as `ev` and `files`; the supervisor and the launcher use EV and
FILES. Stdlib only: shipped with the supervisor. Plain classes of constants (empty __slots__, so
nothing can be set on an instance), not dataclasses: the job's Python imports this on the way
to its servers, and generating two dataclasses of some 35 fields took it 5 ms there and again
in every command.
"""

from __future__ import annotations

from typing import Union


class Kinds:
    """Every event kind a job writes (`EPOCH KIND ARGS...` lines in state/events)."""

    __slots__ = ()

    job_started: str = "job_started"            # HOST JOB_ID
    interrupted: str = "interrupted"            # INT/TERM acted on
    stopped: str = "stopped"                    # that INT/TERM was `ftcluster stop`'s (state/stop): a clean end
    mpicheck_started: str = "mpicheck_started"
    mpicheck_ok: str = "mpicheck_ok"
    mpicheck_again: str = "mpicheck_again"      # WHERE: a rank of the check crashed; it runs once more
    step_started: str = "step_started"          # WHAT (preflight, convert): a run's one job step
    step_done: str = "step_done"                # WHAT EXIT_CODE
    containers_starting: str = "containers_starting"   # HOSTS... (docker styles)
    node_ready: str = "node_ready"              # HOST DETAIL
    node_failed: str = "node_failed"            # HOST WHY
    containers_ready: str = "containers_ready"  # MPI_HOSTS
    proxy_started: str = "proxy_started"        # PORT (access: private: the proxy beside rank 0)
    servers_starting: str = "servers_starting"  # RANK0_HOST
    ready: str = "ready"                        # RANK0_HOST:PORT
    client_started: str = "client_started"
    client_done: str = "client_done"            # EXIT_CODE
    serving: str = "serving"                    # RANK0_HOST:PORT (--keep-serving)
    rank_failed: str = "rank_failed"            # RANK NODE EXIT_CODE|?
    unanswered: str = "unanswered"              # SINCE: a hung world's first missed probe (its verdict follows)
    restarting: str = "restarting"              # TRY CAUSE...: the world is restarted (serving)
    successor_submitted: str = "successor_submitted"   # RUN_ID JOB_ID RUN_DIR EXCLUDED_NODES (a,b)
    handed_over: str = "handed_over"            # RUN_ID ENDPOINT: the successor serves; this job ends
    handover_failed: str = "handover_failed"    # WHY...: this job serves on to its end
    node_lost: str = "node_lost"                # NODE...: no step runs there; the run moves
    slurm_unanswered: str = "slurm_unanswered"  # WHY...: no step ran, the batch host's neither: slurmctld is waited for
    records_resumed: str = "records_resumed"    # SINCE SKIPPED: the run folder's filesystem refused writes from SINCE
    on_failure_done: str = "on_failure_done"    # EXIT_CODE of the spec's on_failure command
    failed: str = "failed"                      # WHY...
    servers_stopped: str = "servers_stopped"
    containers_stopping: str = "containers_stopping"
    teardown_failed: str = "teardown_failed"    # HOST WHY
    containers_stopped: str = "containers_stopped"
    done: str = "done"                          # EXIT_CODE of the job


EV = Kinds()


class RunFiles:
    """The names of the files in the run's folders."""

    __slots__ = ()

    events: str = "events"                 # state/: one line per milestone
    # state/: written by `ftcluster stop` before it signals the job, so that the job can tell a
    # stop asked for from Slurm's own TERM (time limit, preemption); removed at each job start.
    stop_request: str = "stop"
    rank_exits: str = "exits"              # state/: "RANK CODE EPOCH died|stopped INCARNATION" per rank exit
    rank_loads: str = "loads"              # state/: "RANK EPOCH INCARNATION" per rank in model load
    health: str = "health.json"            # state/: the liveness probes while serving
    metrics: str = "metrics.jsonl"         # state/: rank 0's Triton metrics while serving (job/metrics.py)
    gpu_samples: str = "gpu-rank{r}.csv"   # state/: a rank's node's GPUs while serving (job/gpu_samples.py)
    gpu_events: str = "gpu-events-rank{r}"  # state/: its XID and ECC events (NVML; job/gpu_samples.py)
    python_envs: str = "python_envs"       # state/: the python backend's /tmp folders the ranks made
    job_out: str = "job.out"               # logs/: the job's output (styles run here)
    client_log: str = "client.log"         # logs/
    mpicheck_log: str = "mpicheck.log"     # logs/
    mpicheck_crash_log: str = "mpicheck-crashed.log"   # logs/: the first check's, when it crashed and ran again
    mpirun_log: str = "mpirun.log"         # logs/
    step_log: str = "step.log"             # logs/: the output of a preflight's or convert's step
    on_failure_log: str = "on_failure.log"  # logs/: the on_failure command's output
    handover_log: str = "handover.log"     # logs/: the successor's submission
    front_job: str = "front-job.json"      # state/: the job whose front serves a replica set's endpoint now
    # state/: "EPOCH JOB" per start of a job again (Slurm's requeue, a front's takeover): the last
    # sign of life of what ran before (it may have written no last word: its node lost).
    last_alive: str = "last-alive"
    # state/: the marker of a job whose run another job took over (a front's hand-over on its
    # node); that job's last events go to events.job<JOB>, the run's events go on as the new job's.
    taken_over: str = "taken-over-{job}"
    incarnation_dir: str = "incarnation-{n}"  # logs/: an earlier incarnation's rank logs and files
    preflight_dir: str = "preflight"       # results/: the preflight's rank files and preflight.json
    client_json: str = "client.json"       # results/
    mpicheck_json: str = "mpicheck.json"   # results/
    job_config: str = "job.json"           # scripts/: the supervisor's values (0600: the env)
    env_file: str = "env.sh"               # scripts/: the spec's env as `export K=V` (0600)
    specs: str = "specs.json"              # scripts/: the specs and facts the run was launched with (0600)
    token: str = "token"                   # scripts/: a private run's bearer token (0600)
    proxy_config: str = "proxy.json"       # scripts/: the proxy's config (no secret in it)
    proxy_log: str = "proxy.log"           # logs/: the proxy's own output
    supervisor: str = "ftcluster_job"      # scripts/: the supervisor's package

    # Per-rank files: state/rank<R>.{pid,host,exit,loaded,problem} (written by rank_server.sh),
    # logs/rank<R>.stdout (the wrapper's own output).
    RANK_FILES = ("pid", "host", "exit", "loaded", "problem", "progress", "stdout")

    def rank(self, rank: Union[int, str], what: str) -> str:
        if what not in self.RANK_FILES:
            raise ValueError(f"no per-rank file {what!r}")
        return f"rank{rank}.{what}"

    def server_log(self, rank: Union[int, str]) -> str:   # logs/: tritonserver's log of a rank
        return f"server-rank{rank}.log"

    # Shared memory the ranks name in /dev/shm: /dev/shm/ftc+RUN+r<R>+i<INCARNATION>+... ("+" is
    # not in a run id, so no run's prefix is another's). A SIGKILLed rank leaves its entries there:
    # each rank's wrapper removes its earlier incarnations' at start and its own at its end, the
    # teardown every node's, and a rank of a later run on the node those of runs no process there
    # serves any more (a job Slurm ended without its teardown).
    shm_dir: str = "/dev/shm"

    def shm_prefix(self, run_id: str, rank: Union[int, str] = "", incarnation: Union[int, str] = "") -> str:
        return (f"ftc+{run_id}+" + (f"r{rank}+" if rank != "" else "")
                + (f"i{incarnation}+" if rank != "" and incarnation != "" else ""))


FILES = RunFiles()
