"""The job's side of each container runtime: how a command enters the image, the run's
containers up and down, the proof that a step ran in the image, what a killed world leaves in
them, and where the endpoint's proxy runs (none, Pyxis, Charliecloud, Docker).
`ftcluster.job.styles` composes one with a scheduler per run."""
