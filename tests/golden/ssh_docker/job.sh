#!/bin/bash
# ftcluster run gpt-2n (ssh_docker): 2 node(s), tensor_para_size=8, pipeline_para_size=2;
# a Docker container per host over ssh (python -m ftcluster.hosts.fanout), mpirun over ssh from rank 0's.
# Runs on this host as its own process group:
#   Start: setsid bash /shared/runs/gpt-2n/scripts/job.sh    Stop: kill -TERM -- -<its pid> (it tears down first)
# This file only starts the run's job supervisor, scripts/ftcluster_job/ (Python, stdlib only),
# with the run's values in scripts/job.json. The supervisor brings up the containers, runs
# the MPI check, a job step or the servers (scripts/rank_server.sh on every node), follows the
# ranks to ready, runs the client, serves, and tears everything down on every exit; it writes
# its milestones to state/events.
# -S: no site (the supervisor needs the standard library only; the site's start-up and .pth
# hooks cost every job's start some 10-40 ms).
# shellcheck disable=SC2016  # shell-quoted data: a $ inside a value is literal
exec /opt/ftcluster/venv/bin/python -S /shared/runs/gpt-2n/scripts/ftcluster_job /shared/runs/gpt-2n/scripts/job.json
