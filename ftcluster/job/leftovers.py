"""What a run's killed ranks leave on a node, by the names the ranks give it: their marked
processes (rank_server.sh's FTC_SERVER_OF), their /dev/shm entries, the python backend's /tmp
folders they claimed. The scheduler's node teardown and the guards remove them."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, List

from .names import FILES
from .text import read_text

if TYPE_CHECKING:
    from .config import JobConfig
    from .supervisor import Job

# Triton's python backend's own /tmp folder (mkdtemp of /tmp/python_env_XXXXXX).
PYTHON_ENV_DIR = re.compile(r"/tmp/python_env_[A-Za-z0-9]{6}")
# Seconds x 10 a teardown that is not a failure's gives the marked processes (kill_marked.sh).
MARKED_GRACE = 30


def marked_grace(job: Job) -> int:
    """Tenths of a second the run's leftover server processes get to end by themselves:
    none when the world broke (failing; a restart), some at a stop."""
    return 0 if job.failing or job.restarting else MARKED_GRACE


def shm_glob(cfg: JobConfig) -> str:
    """What the run's ranks name in /dev/shm, as a prefix (rank_server.sh)."""
    return os.path.join(FILES.shm_dir, FILES.shm_prefix(cfg.run_id))


def python_envs(cfg: JobConfig) -> List[str]:
    """The python backend's /tmp folders the run's SIGKILLed ranks left (rank_server.sh
    notes them): only names of that one shape, whatever the file says."""
    lines = read_text(os.path.join(cfg.state, FILES.python_envs)).split()
    return sorted({p for p in lines if PYTHON_ENV_DIR.fullmatch(p)})


def kill_marked_argv(cfg: JobConfig, grace: int) -> List[str]:
    """The command that kills the run's marked processes where it runs, after `grace`
    tenths of a second for them to end by themselves (scripts/kill_marked.sh)."""
    return ["bash", os.path.join(cfg.scripts, "kill_marked.sh"), cfg.run_id, str(grace)]
