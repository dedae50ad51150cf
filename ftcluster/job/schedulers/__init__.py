"""The job's side of each scheduler: its job id and nodes, a command on every node or on the
first host, lost nodes, the MPI world it starts where the runtime brings none, and how the job
ends (local, ssh, Slurm). `ftcluster.job.styles` composes one with a runtime per run."""
