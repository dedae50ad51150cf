"""Local: every rank on this machine under one mpirun, beside the launcher. They share its
address and take ports PORT_STRIDE apart. Each "node" sees only its own gpus_per_node GPUs, as
on a real cluster (FT refuses a rank that sees more or fewer): rank r gets slice r of
CUDA_VISIBLE_DEVICES, or of 0..N-1 when unset (local_rank.sh)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ..config import StepConfig
from ..fileops import remove_entry
from ..leftovers import kill_marked_argv, marked_grace, python_envs, shm_glob
from ..names import FILES
from ..world import World
from .base import Scheduler

if TYPE_CHECKING:
    from ..styles import JobStyle


class LocalScheduler(Scheduler):
    guarded = True

    def __init__(self, style: JobStyle):
        super().__init__(style)
        self.mpi_tmp = ""

    def job_id(self) -> str:
        return str(os.getpid())

    def world(self) -> Optional[World]:
        return LocalWorld(self.style)

    def mpirun(self, stdout: str, argv: List[str], export: Tuple[str, ...] = ()) -> List[str]:
        exports = [a for name in ("GPUS_PER_NODE", "GPU_POOL", *export) for a in ("-x", name)]
        return [self.cfg.mpirun, "-np", str(self.cfg.nodes), "--oversubscribe", "--bind-to", "none", *exports,
                "bash", self.script("local_rank.sh"), stdout, *argv]

    def mpi_folder(self) -> str:
        # Open MPI's session folder (its PMIx sockets) in a folder of this run: a SIGKILLed mpirun
        # leaves it behind, and a later mpirun that gets the same pid cannot start its PMIx server there.
        if not self.mpi_tmp:
            self.mpi_tmp = tempfile.mkdtemp(prefix="ftc-mpi.", dir=self.job.child_env.get("TMPDIR") or None)
        return self.mpi_tmp

    def mpi_env(self) -> Dict[str, str]:
        self.mpi_folder()
        env = self.job.child_env
        n = self.cfg.nodes * self.cfg.gpus_per_node
        pool = env["CUDA_VISIBLE_DEVICES"] if "CUDA_VISIBLE_DEVICES" in env else ",".join(str(i) for i in range(n))
        return {"TMPDIR": self.mpi_tmp, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "GPUS_PER_NODE": str(self.cfg.gpus_per_node), "GPU_POOL": pool}

    def guard_argv(self, mpi_folder: str = "") -> List[str]:
        return super().guard_argv(self.mpi_folder())

    def kill_marked(self, grace: int) -> None:
        self.job.run(kill_marked_argv(self.cfg, grace), out=subprocess.DEVNULL, limit=60, interruptible=False)

    def clear_marked(self) -> None:
        self.kill_marked(0)   # the killed world's: nothing to wait for

    def teardown_nodes(self) -> bool:
        if self.style.world.started_servers():
            self.kill_marked(marked_grace(self.job))
        if self.mpi_tmp:
            shutil.rmtree(self.mpi_tmp, ignore_errors=True)
        for path in glob.glob(glob.escape(shm_glob(self.cfg)) + "*"):
            remove_entry(path)
        envs = python_envs(self.cfg)
        if envs:
            self.job.run(["bash", self.script("free_python_envs.sh"), self.cfg.run_id, *envs],
                         out=subprocess.DEVNULL, limit=60, interruptible=False)
        return True


class LocalWorld(World):
    """The ranks under one mpirun on this machine (no MPI check: one host)."""

    ended_while_serving = "a server rank exited while serving"
    world_ends_s = 0.0   # mpirun: killed at once (it takes longer to end the world itself)

    def local(self) -> LocalScheduler:
        scheduler = self.style.scheduler
        assert isinstance(scheduler, LocalScheduler)
        return scheduler

    def rank0_host(self) -> str:
        return socket.gethostname()

    def step_command(self, step: StepConfig) -> Tuple[List[str], Dict[str, str]]:
        if not step.per_node:
            return list(step.argv), {}
        # A free port for the ranks' torch.distributed rendezvous on this machine.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        local = self.local()
        return local.mpirun("-", list(step.argv), ("MASTER_PORT",)), {**local.mpi_env(), "MASTER_PORT": str(port)}

    def start_servers(self) -> None:
        local = self.local()
        stdout = os.path.join(self.cfg.logs, FILES.rank("{rank}", "stdout"))
        self.servers = self.job.start(local.mpirun(stdout, [".", self.script("rank_server.sh")], ("FTC_INCARNATION",)),
                                      out=self.job.log_path(FILES.mpirun_log),
                                      env={**local.mpi_env(), "FTC_RANK_HOST": "127.0.0.1"})

    def signal_ranks(self, sig: str, ranks: range) -> None:
        """mpirun makes each rank the leader of its own process group (its server and the
        server's stub inside): a signal to the group reaches all of them, once the rank is
        identified as the recorded one (signal_rank.sh)."""
        for r in ranks:
            pidfile = self.job.ranks.path(r, "pid")
            if os.path.exists(pidfile):
                self.job.run(["bash", self.script("signal_rank.sh"), sig, pidfile, "group"],
                             out=subprocess.DEVNULL, limit=30, interruptible=False)

    def term_rank0(self) -> bool:
        if not self.job.ranks.exists(0, "pid"):
            return False
        self.signal_ranks("TERM", range(1))
        return True

    def kill_servers(self) -> None:
        self.signal_ranks("KILL", range(self.cfg.nodes))
        self.kill_server_process()
        self.reap_servers()
