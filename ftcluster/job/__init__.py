"""The job supervisor: the one program that runs a run's job, on the job's host.

`scripts/job.sbatch` (Slurm) or `scripts/job.sh` (run here) only starts it; it reads the run's
values from `scripts/job.json` and starts the containers, the MPI check, a job step or the
servers, follows the ranks to ready, runs the client, serves, and tears everything down on
every exit. Shipped into the run folder as `scripts/ftcluster_job/` and run by the job host's
python3 (>= 3.8), so it is stdlib-only and imports its own modules relatively: the same files
run as `ftcluster.job` here and as `ftcluster_job` from a run folder.
"""
