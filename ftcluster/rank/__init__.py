"""Code that runs on every rank (compute nodes): checks and probes; imports nothing from the CLI."""
