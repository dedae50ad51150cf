"""What a runtime does for the job: how a step's command enters the image (srun's container
flags, a wrapper command in front), the run's containers up and down, the proof that the first
step ran in the image, clearing a killed world before a restart, the MPI world where it brings
its own, and the endpoint's proxy (beside the job, unless the runtime runs it elsewhere).
Without containers (none, Charliecloud) what killed ranks leave on the nodes is the scheduler's
to remove."""

from __future__ import annotations

import os
import socket
import subprocess
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ..config import PROXY_TOKEN_ENV
from ..part import Part

if TYPE_CHECKING:
    from ..world import World


class Runtime(Part):
    def container_flags(self) -> List[str]:
        """srun's flags that put a step in the image (Pyxis); none here."""
        return []

    def in_image(self, argv: List[str]) -> List[str]:
        """A step task's command where the runtime runs it: as it is here (on the node, or in the
        container srun's own flags give it); a runtime whose container is a wrapper command
        (Charliecloud's ch-run) puts that in front."""
        return list(argv)

    def world(self) -> Optional[World]:
        """The MPI world it brings (None: the scheduler's)."""
        return None

    def proxy(self) -> Proxy:
        return Proxy(self.style)

    def up(self) -> None:
        """The run's containers on every node (none here)."""

    def down(self) -> bool:
        """Removes the run's containers on every node; False when a node failed. Without
        containers, what SIGKILLed ranks (the servers', the MPI check's) leave on the nodes goes
        instead (the scheduler's node teardown)."""
        return self.style.scheduler.teardown_nodes()

    def first_step_seen(self, failed: bool, logs: List[str]) -> None:
        """After the first step that runs in the image (the MPI check, a job step) ended, or once
        the servers' rank 0 started (or their step ended first: `failed`): a runtime that
        creates its containers in that step checks them here. `logs`: that step's output."""

    def clear_servers(self) -> None:
        """Before a restart's servers start: what the killed world left where they will run.
        On the nodes themselves the world's end killed every rank; a python backend stub that
        its server's end orphaned is found by the run's mark (the scheduler's clear_marked)."""
        self.style.scheduler.clear_marked()

    def clean_left_over(self) -> None:
        """What the earlier supervisor's ranks left on the nodes goes, as at its teardown."""
        self.style.world.checked = True   # the node step runs, as after a world of its own
        self.down()


class Proxy(Part):
    """The endpoint's proxy (access: private) as a child of the job, beside rank 0."""

    # Whether the proxy runs in rank 0's container, the job on another machine (ssh + Docker):
    # the job's own requests to rank 0 then go through the proxy, with the run's token.
    proxy_in_container = False

    def proxy_command(self, binary: str, token: str) -> Tuple[List[str], Dict[str, str]]:
        """The proxy's command and what its environment adds, a child of the job: here, beside
        rank 0. Caddy's home is the run's own: it writes nothing else. The token reaches Caddy
        through its environment (its config names {env.FTC_PROXY_TOKEN})."""
        p = self.cfg.proxy
        assert p is not None
        home = self.state_file("proxy")
        os.makedirs(home, mode=0o700, exist_ok=True)
        return [binary, "run", "--config", p.config], {"HOME": home, "XDG_CONFIG_HOME": home, "XDG_DATA_HOME": home,
                                                       **({PROXY_TOKEN_ENV: token} if token else {})}

    def wait_proxy_listening(self, proxy: subprocess.Popen[bytes]) -> None:
        """Once the proxy was started: until it holds the endpoint's ports, where that takes a
        word from elsewhere (a child of the job here fails at once when a port is taken)."""

    def stop_proxy(self) -> None:
        """At the teardown, before the job's proxy children are ended: a proxy that runs
        elsewhere is asked to stop there."""

    def proxy_host(self) -> str:
        """Where the job reaches the proxy."""
        return "127.0.0.1"

    def proxy_node(self) -> str:
        """The node the proxy runs on, for messages."""
        return socket.gethostname()
