"""Launching: a run (prepare, render, submit, follow, clean up), its successor, a replica
set, and the convert and preflight runs."""
