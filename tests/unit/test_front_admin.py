"""The front's requests to Caddy's admin API outlive Caddy replacing its admin server: Caddy does
so on every config it loads (the old server shuts down in the background), so a request right
after a /load may find its connection dropped. Here a real unix-socket server drops the first
connection unanswered, as the closing admin server does, then answers."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from ftcluster.job import front
from ftcluster.job.front import Front


def _admin_server(path: Path, drop: int) -> tuple[socket.socket, list[bytes]]:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(8)
    asked: list[bytes] = []

    def serve() -> None:
        n = 0
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                asked.append(conn.recv(65536))
                n += 1
                if n <= drop:
                    continue   # closed without a response
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
    threading.Thread(target=serve, daemon=True).start()
    return srv, asked


def test_a_request_dropped_while_caddy_replaces_its_admin_server_is_asked_again(tmp_path: Path) -> None:
    srv, asked = _admin_server(tmp_path / "admin.sock", drop=2)
    try:
        got = Front.admin(SimpleNamespace(socket=str(tmp_path / "admin.sock")), "GET",  # type: ignore[arg-type]
                          "/config/apps/http/servers/http/routes")
    finally:
        srv.close()
    assert got == b"{}" and len(asked) == 3


def test_an_admin_server_that_never_answers_fails_after_the_retry_time(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(front, "ADMIN_RETRY_S", 0.3)
    srv, asked = _admin_server(tmp_path / "admin.sock", drop=10_000)
    try:
        with pytest.raises(ConnectionError):
            Front.admin(SimpleNamespace(socket=str(tmp_path / "admin.sock")), "GET", "/x")  # type: ignore[arg-type]
    finally:
        srv.close()
    assert len(asked) >= 2
