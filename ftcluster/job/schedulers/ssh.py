"""A plain host list over ssh: the job runs on the launching machine, beside its launcher, and
every node command goes over ssh, at most node_ssh.parallel at once (python -m
ftcluster.hosts.fanout with scripts/nodes.json); rank 0 is the first host. It starts no MPI world
of its own: the runtime brings one (Docker: mpirun over ssh from rank 0's container)."""

from __future__ import annotations

import os
from typing import List

from .base import Scheduler


class SshScheduler(Scheduler):
    guarded = True
    on_rank0_node = False

    def job_id(self) -> str:
        # No id of its own: the job's start names the Slurm allocation the launcher ran in, if any.
        return os.environ.get("SLURM_JOB_ID", "")

    def job_nodes(self) -> List[str]:
        return list(self.cfg.run_hosts)

    def hosts_rank0_first(self) -> List[str]:
        return list(self.cfg.run_hosts)

    def fanout(self) -> List[str]:
        return [self.cfg.python, "-m", "ftcluster.hosts.fanout", "--config", self.script("nodes.json")]

    def every_node(self, output: str) -> List[str]:
        return [*self.fanout(), "--hosts", ",".join(self.cfg.run_hosts), f"--output={output}"]

    def on_first_host(self) -> List[str]:
        return [*self.fanout(), "--hosts", self.cfg.run_hosts[0], "--"]
