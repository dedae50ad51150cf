"""Connecting over SSH to a host that cannot be reached is a user error naming the field, never
a traceback: a refused port, and a name Python's IDNA codec refuses before any lookup (a label
over 63 characters raises UnicodeError from getaddrinfo, which is no OSError)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from ftcluster.errors import UserError
from ftcluster.hosts.login import SshTarget, connect

pytest.importorskip("fabric")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])   # closed again when the block ends


@pytest.mark.parametrize("host, port", [("l" * 64 + ".example.org", 22), ("a..b", 22), ("127.0.0.1", None)])
def test_unreachable_host_is_a_user_error(host: str, port: int | None) -> None:
    target = SshTarget(host=host, user="nobody", port=port or _closed_port(), identity_file=None, known_hosts=None)
    with pytest.raises(UserError, match=r"^tunnel: cannot reach "):
        connect(target, field="tunnel", timeout=5)


def test_a_tunnel_follows_the_service_and_ends_with_it() -> None:
    """What a tunnel does after each `status` of its run (as the login node gives it)."""
    from ftcluster.access.tunnel import next_move

    serving = {"state": "RUNNING", "phase": "serving", "endpoint": "n1:8000", "successor": None}
    assert next_move(serving, "r1", "n1:8000") == ("stay", "")
    # Slurm did not answer the login node's `status`: the job's state is UNKNOWN, which says
    # nothing of it (before, the tunnel took it for the service's end and ended).
    assert next_move({**serving, "state": "UNKNOWN", "source": "error"}, "r1", "n1:8000") == ("stay", "")
    # Handing over: stays until the successor serves, then follows it.
    starting = {**serving, "successor": {"run_id": "r2", "handed_over": False, "failure": None}}
    assert next_move(starting, "r1", "n1:8000") == ("stay", "")
    assert next_move({**serving, "successor": {"run_id": "r2", "handed_over": True}}, "r1", "n1:8000") == \
        ("follow", "r2")
    # Off a lost node: the run ended, its successor is starting elsewhere.
    lost = {"state": "COMPLETED", "phase": "done", "endpoint": "n1:8000",
            "successor": {"run_id": "r2", "handed_over": False, "failure": None}}
    assert next_move(lost, "r1", "n1:8000") == ("follow", "r2")
    # Preempted and requeued: the same run, wherever it serves next; already serving elsewhere.
    assert next_move({"state": "PENDING", "phase": "requeued", "successor": None}, "r1", "n1:8000") == \
        ("follow", "r1")
    assert next_move({**serving, "endpoint": "n3:8000"}, "r1", "n1:8000") == ("follow", "r1")
    # Ended for good, or its hand-over failed and it ran to its end.
    assert next_move({"state": "CANCELLED", "phase": "done", "successor": None}, "r1", "n1:8000")[0] == "end"
    failed = {"state": "TIMEOUT", "phase": "done", "successor": {"run_id": "r2", "handed_over": False,
                                                                 "failure": "it failed"}}
    assert next_move(failed, "r1", "n1:8000")[0] == "end"


def test_a_tunnel_outlives_a_login_node_that_does_not_answer() -> None:
    """A `status` on the login node that fails is said once and gives None (the tunnel keeps
    forwarding); the next answer is said once and returned."""
    from ftcluster.access.tunnel import Asker

    answers: list[Any] = [UserError("squeue: Socket timed out", field="RUN"), OSError("reset"), {"state": "RUNNING"}]
    said: list[str] = []

    def ask(run: str) -> dict[str, Any]:
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return dict(got)
    asker = Asker(ask, said.append)
    assert asker("r1") is None and asker("r1") is None
    assert asker("r1") == {"state": "RUNNING"}
    assert len(said) == 2 and "did not answer" in said[0] and "squeue: Socket timed out" in said[0]
    assert said[1] == "tunnel: the login node answers for run r1 again"
