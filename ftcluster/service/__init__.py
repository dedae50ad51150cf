"""A node as a long-running service (docker compose, the Docker SDK), images, and a
runnable CPU tritonserver for machines without one."""
