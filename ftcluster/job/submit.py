"""sbatch that never leaves a job unknown or twice, for `launch`, a successor and a set's balancer;
and a job's state in the queue as a job asks it (a silent Slurm told from a job it forgot).

An sbatch that slurmctld did not answer (a controller restarting or overloaded) may still have
submitted: its request waits in the controller's socket and becomes a job when the controller
reads it, possibly just after it answers a later question (each request has its own thread).
So once Slurm answers, the job submitted from the folder (the run folder: Slurm's WorkDir) is
looked for twice; sbatch runs again only when neither look found it, and should the earlier
request turn up after all, the later job (still pending: it wrote nothing) is cancelled.
Standard library only: shipped with the supervisor (a set's balancer submits its successor).
"""

from __future__ import annotations

import os
import re
import time
from typing import Callable, List, Optional, Set, Tuple

# A command's (argv, cwd, timeout) -> (exit code, stdout, stderr); a timeout is exit 124 with
# "timed out" in stderr.
Run = Callable[[List[str], Optional[str], float], Tuple[int, str, str]]

# How long a submission waits for a silent slurmctld (within a successor's 300 s).
PATIENCE_S = 180.0
# Between the two looks for a job an unanswered sbatch may have made, once Slurm answers.
SETTLE_S = 3.0
# Words of a Slurm command (or of a caller's timeout) that mean slurmctld did not answer: not a
# refusal. A request it did not answer may still be acted on.
_UNANSWERED = re.compile(r"timed out|unable to contact|zero bytes were transmitted|connection (refused|reset)|"
                         r"communication connection failure|temporarily unable|transport endpoint", re.I)


def unanswered(message: str) -> bool:
    """Whether a Slurm command's error says slurmctld did not answer."""
    return bool(_UNANSWERED.search(message))


class SubmitFailed(Exception):
    """sbatch refused the job (`refused`), or Slurm did not answer: then `unknown` says whether
    a job may exist."""

    def __init__(self, message: str, refused: bool, unknown: bool = False, code: int = 0):
        super().__init__(message)
        self.refused, self.unknown, self.code = refused, unknown, code


def submitted_from(run: Run, folder: str, newer_than: int, until: float,
                   monotonic: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> Optional[Set[str]]:
    """The jobs submitted from `folder` with ids above `newer_than`, once squeue answers (asked
    every 2 s, of a controller that may be recovering); None when it has not by `until`."""
    here = {folder, os.path.realpath(folder)}   # sbatch records its getcwd(): links resolved
    while True:
        rc, out, _ = run(["squeue", "-h", "--states=all", "-o", "%i|%Z"], None, 30.0)
        if rc == 0:
            return {i for i, _, d in (ln.partition("|") for ln in out.splitlines())
                    if d in here and i.isdigit() and int(i) > newer_than}
        if monotonic() >= until:
            return None
        sleep(2.0)


def submit(run: Run, argv: List[str], folder: str, newer_than: int = 0, patience: float = PATIENCE_S,
           monotonic: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> str:
    """Run sbatch --parsable's `argv` in `folder`; the job id. `newer_than`: a job id of the
    folder's own (a balancer's, submitting its successor): only later jobs are its submission's."""
    deadline = monotonic() + patience
    unclear = False
    while True:
        rc, out, err = run(argv, folder, 120.0)
        word = out.strip().split(";")[0]
        if rc == 0:
            if not word.isdigit():
                raise SubmitFailed(f"sbatch printed no job id: {out.strip()!r}", refused=False)
            if unclear:
                jobs = (submitted_from(run, folder, newer_than, monotonic() + 30, monotonic, sleep) or set()) | {word}
                word = min(jobs, key=int)
                for extra in jobs - {word}:
                    run(["scancel", extra], None, 60.0)
            return word
        msg = err.strip().splitlines()[-1] if err.strip() else f"exit {rc}"
        if rc == 127 or not unanswered(msg):
            raise SubmitFailed(msg, refused=True, code=rc)
        unclear = True
        found = submitted_from(run, folder, newer_than, deadline, monotonic, sleep)
        if found == set():
            sleep(SETTLE_S)
            found = submitted_from(run, folder, newer_than, deadline, monotonic, sleep)
        if found is None:
            raise SubmitFailed(f"sbatch got no answer from slurmctld ({msg}), nor has squeue since: a job may have "
                               f"been submitted from {folder}; once Slurm answers, `squeue -o '%i %Z'` shows it",
                               refused=False, unknown=True)
        if found:
            return min(found, key=int)
        if monotonic() >= deadline:
            raise SubmitFailed(f"slurmctld did not take the job in {patience:.0f} s ({msg}); nothing was submitted",
                               refused=False)


def nothing_to_cancel(err: str) -> bool:
    """Whether scancel's complaint means the job needs no cancelling: it is already ending, or
    Slurm has forgotten it (ended longer ago than MinJobAge)."""
    text = err.lower()
    return "already completing or completed" in text or "invalid job id" in text


def queue_state(run: Run, job: str) -> Optional[str]:
    """The job's state in Slurm's queue (squeue's %T): "" once squeue no longer lists it (it
    forgets an ended job after MinJobAge, and then says "Invalid job id" on stderr, exit 1),
    None when squeue did not answer."""
    rc, out, err = run(["squeue", "--noheader", "--jobs", job, "--format=%T"], None, 30.0)
    if rc == 0:
        return (out.split() or [""])[0]
    return "" if "invalid job id" in (err + out).lower() else None
