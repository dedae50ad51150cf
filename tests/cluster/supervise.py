"""The test bed's supervisor: restarts a daemon that died, as systemd's Restart=on-failure does
for slurmctld, slurmd, munged, sshd and dockerd on a real cluster.

    python -m tests.cluster.supervise DIR     (started detached by SlurmTestbed.up)

Every 0.5 s it reads DIR/state.json; a recorded daemon (one with an argv under "argv") that is
gone is started again with the same argv -- slurmctld without -c, so that it recovers its jobs
from StateSaveLocation -- and the restart is appended to DIR/log/supervisor.log and to the
state's "restarts" list (the test session's summary names them). It exits when the state file
is gone or names another supervisor.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .statefile import locked_update, read_state
from .util import pid_alive, tail

POLL_S = 0.5
# A daemon that keeps dying is left down after this many restarts (its log says why).
MAX_RESTARTS = 5


def restart_argv(name: str, argv: list[str]) -> list[str]:
    """slurmctld recovers its state on a restart; -c (a clean start) is for the first start only."""
    return [a for a in argv if a != "-c"] if name == "slurmctld" else argv


def _spawn(folder: Path, name: str, argv: list[str], user: str | None, log_to: str | None) -> int:
    with open(log_to or folder / "log" / f"{name}.out", "ab") as log:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True, user=user, group=user,
                             extra_groups=[] if user else None)
    return p.pid


def _log_tail(folder: Path, name: str, log: str | None) -> str:
    if log:
        path = Path(log)
    else:
        path = folder / "munge" / "munged.log" if name == "munged" else folder / "log" / f"{name}.log"
    return tail(path, 3)


def check_once(folder: Path, me: int) -> bool:
    """Restart what died; False when this supervisor should exit."""
    state = read_state(folder)
    if not state or state.get("supervisor") != me:
        return False
    dead = [n for n, pid in state.get("pids", {}).items()
            if n in state.get("argv", {}) and not pid_alive(pid)]
    if not dead:
        return True
    counts: dict[str, int] = {}
    for r in state.get("restarts", []):
        counts[r["name"]] = counts.get(r["name"], 0) + 1
    started: dict[str, tuple[int, int, str]] = {}
    for name in dead:
        if counts.get(name, 0) >= MAX_RESTARTS:
            continue
        spec = state["argv"][name]
        why = _log_tail(folder, name, spec.get("log"))
        new = _spawn(folder, name, restart_argv(name, spec["argv"]), spec.get("user"), spec.get("log"))
        started[name] = (state["pids"][name], new, why)
    if not started:
        return True

    def apply(s: dict[str, Any]) -> None:
        for name, (old, new, why) in started.items():
            s.setdefault("pids", {})[name] = new
            s.setdefault("restarts", []).append(
                {"name": name, "at": time.time(), "old_pid": old, "new_pid": new, "last_log": why})

    locked_update(folder, apply)
    with open(folder / "log" / "supervisor.log", "a") as fh:
        for name, (old, new, why) in started.items():
            fh.write(f"{time.strftime('%H:%M:%S')} restarted {name}: pid {old} was gone, now {new}; "
                     f"its log ended: {why!r}\n")
    return True


def _reap() -> None:
    """Collect the daemons we started that have exited, so they show as gone, not as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    me = os.getpid()
    # Not SIGCHLD=SIG_IGN: the daemons would inherit it and slurmd could not reap its steps.
    while check_once(folder, me):
        _reap()
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
