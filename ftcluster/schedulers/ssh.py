"""The ssh scheduler: the job script runs here, as the local scheduler's does, and reaches the
spec's fixed hosts over ssh (ftcluster.hosts.fanout); its runtime is Docker (the spec allows no
other with scheduler ssh). A stop sends SIGTERM to its process group; its trap
removes every container of the run on every host (over ssh, which takes longer than a local
rank's exit) before anything is killed.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from ftcluster.errors import UserError
from ftcluster.hosts.fanout import FanoutConfig
from ftcluster.job.config import PROXY_STAGE
from ftcluster.schedulers.local import LocalScheduler

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from ftcluster.run.layout import RunPaths
    from ftcluster.plan.parallel import Plan
    from ftcluster.spec.cluster import ClusterSpec


class SshScheduler(LocalScheduler):
    name = "ssh"
    kill_stray_ranks = False   # rank pids are container pids: the container removal ends them
    # The node-side teardown over ssh: stop the ranks, docker rm -f on every host.
    teardown_grace = 90.0

    def with_ports(self, cluster: ClusterSpec, plan: Plan) -> ClusterSpec:
        # The ranks serve on the spec's hosts, not here: a port free on this machine says nothing
        # of theirs, so the spec's ports (or the defaults) stand, as on Slurm.
        return cluster

    def check_limits(self, cluster: ClusterSpec, plan: Plan, servers: bool) -> None:
        if plan.nodes > len(cluster.hosts):
            raise UserError(f"{plan.nodes} nodes requested but hosts lists {len(cluster.hosts)}",
                            field="--nodes", hint="lower --nodes or add hosts to the cluster spec")

    def release_resources(self, paths: RunPaths) -> None:
        super().release_resources(paths)
        # The copy of Caddy the job stages here for rank 0's container on its host (access:
        # private), left by a job that was killed before the container took it.
        shutil.rmtree(paths.state / PROXY_STAGE, ignore_errors=True)

    def nodes(self, paths: RunPaths) -> tuple[str, ...]:
        try:
            return FanoutConfig.from_json((paths.scripts / "nodes.json").read_text()).hosts
        except (OSError, ValueError, KeyError, TypeError):
            return ()
