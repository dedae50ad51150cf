"""The run's containers on every node, through a node script's `guard`, `reap` and `down`
(written once for Pyxis and Docker), run by the scheduler's fan-out."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import TYPE_CHECKING, List, Optional

from ..fileops import remove_entry
from ..names import EV
from ..text import last_line, read_text, squeeze

if TYPE_CHECKING:
    from ..styles import JobStyle

# The guards' own removal of the containers, when the teardown asks for it: done and recorded
# within this long (a node whose guard records nothing gets the teardown's `down` step).
GUARD_RECORD_S = 30.0


class NodeContainers:
    """A guard per node while the run may have containers (when the job cannot run its teardown
    -- cancelled by hand, out of time, the machine running it lost -- the guard step ends and
    each guard removes its node's containers), and a `down` on every node whose outcome each
    node writes to state/<kind>/<node>.down ("ok" or "failed WHY")."""

    def __init__(self, style: JobStyle, kind: str, node_script: str, hint: str, guards_record: bool = False):
        self.style, self.job = style, style.job
        self.kind, self.node_script, self.hint = kind, node_script, hint
        # The guards' own removal writes each node's record (Pyxis): the teardown ends the guard
        # step and needs no `down` step of its own (a step launch fewer), but where a guard left
        # no record (it died with its node's step, say).
        self.guards_record = guards_record
        self.started = False
        self.guard: Optional[subprocess.Popen[bytes]] = None

    def dir(self) -> str:
        return os.path.join(self.job.cfg.state, self.kind)

    def node_step(self, what: str, log: str) -> List[str]:
        return [*self.style.scheduler.every_node(os.path.join(self.job.cfg.logs, f"{self.kind}-{log}-%N.log")),
                "bash", self.node_script, what]

    def start_guards(self) -> None:
        os.makedirs(self.dir(), exist_ok=True)
        for name in os.listdir(self.dir()):   # an earlier job's (a requeue) say nothing of this one's
            if name.endswith(".down"):
                remove_entry(os.path.join(self.dir(), name))
        self.started = True
        self.guard = self.job.start(self.node_step("guard", "guard"))

    def stop_guards(self) -> None:
        # Each guard removes its node's containers as it ends (already gone after a `down` step).
        if self.guard is not None:
            self.job.end_child(self.guard, 30)
            self.guard = None

    def reap(self) -> None:
        """Every process of the killed world still in the run's containers, killed on every node
        (a restart's servers start in empty containers)."""
        if self.job.run(self.node_step("reap", "reap"), limit=120, interruptible=False):
            logs = sorted(n for n in os.listdir(self.job.cfg.logs) if n.startswith(f"{self.kind}-reap-"))
            problem = next(filter(None, (last_line(read_text(self.job.log_path(n))) for n in logs)), "")
            self.job.fail(f"the killed servers' processes could not be cleared from the containers: "
                          f"{squeeze(problem) or f'see logs/{self.kind}-reap-*.log'}")

    def down(self, hosts: List[str]) -> bool:
        if not self.started:
            return True
        job = self.job
        job.event(EV.containers_stopping)
        records = [os.path.join(self.dir(), f"{h}.down") for h in hosts]
        if self.guards_record and self.guard is not None and self.guard.poll() is None:
            # srun passes USR1 on to the guards and ends with them (a TERM it does not pass on:
            # it kills the step, and the guards with it).
            self.guard.send_signal(signal.SIGUSR1)
            try:
                self.guard.wait(GUARD_RECORD_S)
            except subprocess.TimeoutExpired:
                pass
            self.stop_guards()
        if not all(os.path.exists(r) for r in records):
            job.run(self.node_step("down", "down"), limit=120, interruptible=False)
        bad = []
        for h, record in zip(hosts, records):
            st = read_text(record).strip() or "failed no answer from the teardown step"
            if st != "ok":
                bad.append(h)
                why = st[len("failed "):] if st.startswith("failed ") else st
                job.event(EV.teardown_failed, h, why)
                job.say(f"ftcluster: removing the containers of the run on {h} failed: {why}; remove them by hand there: "
                        + self.hint)
        self.stop_guards()
        if bad:
            job.event(EV.failed, f"teardown failed on {' '.join(bad)}")
            return False
        job.event(EV.containers_stopped)
        return True
