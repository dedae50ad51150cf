"""Connecting over SSH to a host that cannot be reached is a user error naming the field, never
a traceback: a refused port, and a name Python's IDNA codec refuses before any lookup (a label
over 63 characters raises UnicodeError from getaddrinfo, which is no OSError)."""

from __future__ import annotations

import socket

import pytest

from ftcluster.errors import UserError
from ftcluster.remote import SshTarget, connect

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
