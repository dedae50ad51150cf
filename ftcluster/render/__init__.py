"""Pure rendering: the job request, the job scripts from job_templates/, the per-run model
repository, the liveness probe's request, the supervisor's bytecode."""
