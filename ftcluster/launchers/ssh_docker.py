"""scheduler `ssh` + Docker: the job script runs here, as the local style's does, and reaches
the hosts over ssh (ftcluster.fanout). A stop sends SIGTERM to its process group; its trap
removes every container of the run on every host (over ssh, which takes longer than a local
rank's exit) before anything is killed.
"""

from __future__ import annotations

import signal
import time

from ftcluster.errors import UserError
from ftcluster.fanout import FanoutConfig
from ftcluster.launchers.local import LocalLauncher, _killpg, _pid
from ftcluster.plan import Plan
from ftcluster.render import RunPaths
from ftcluster.spec import ClusterSpec

# The node-side teardown over ssh: stop the ranks, docker rm -f on every host.
TEARDOWN_GRACE = 90.0


class SshDockerLauncher(LocalLauncher):
    kill_stray_ranks = False   # rank pids are container pids: the container removal ends them

    def check(self, cluster: ClusterSpec, plan: Plan) -> None:
        if plan.nodes > len(cluster.hosts):
            raise UserError(f"{plan.nodes} nodes requested but hosts lists {len(cluster.hosts)}",
                            field="--nodes", hint="lower --nodes or add hosts to the cluster spec")

    def nodes(self, paths: RunPaths) -> tuple[str, ...]:
        try:
            return FanoutConfig.from_json((paths.scripts / "nodes.json").read_text()).hosts
        except (OSError, ValueError, KeyError, TypeError):
            return ()

    def cancel(self, job_id: str, paths: RunPaths, grace: float = 10.0) -> None:
        pid = _pid(job_id)
        if self._script_alive(pid, paths):
            _killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace + TEARDOWN_GRACE
            while self._script_alive(pid, paths) and time.monotonic() < deadline:
                time.sleep(0.05)
        super().cancel(job_id, paths, grace)
