"""Who listens on a TCP port of this machine (its network namespace), from /proc.

Caddy binds its ports with SO_REUSEPORT: a second Caddy on a port another one holds starts
fine and the kernel splits the new connections between them -- a proxy left over from an
earlier run (with that run's token) would take some of this run's clients. So a proxy is
started only on ports that no process but the job's own holds. Stdlib only.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Dict, Iterable, List, Set

_LISTEN = "0A"   # /proc/net/tcp's st of a listening socket


def port_free(port: int) -> bool:
    """Whether a listener could bind `port` on every address without sharing it: the bind a
    proxy's would be, less SO_REUSEPORT (SO_REUSEADDR: connections in TIME_WAIT do not count)."""
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:   # no IPv6 here
            continue
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, port))
            return True   # [::] is dual-stack: it covers IPv4's listeners too
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            # IPv6 off in this namespace (EADDRNOTAVAIL): IPv4's bind says it
        finally:
            s.close()
    return True


def listening_inodes(port: int) -> Set[str]:
    """The socket inodes listening on `port` (any address, IPv4 or IPv6)."""
    found: Set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == _LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                found.add(cols[9])
    return found


def holders(port: int) -> Dict[int, str]:
    """pid -> command line of each process that holds a listening socket on `port` (those this
    user may look into; root sees every one)."""
    inodes = {f"socket:[{i}]" for i in listening_inodes(port)}
    found: Dict[int, str] = {}
    if not inodes:
        return found
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if not any(_link(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds):
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                # On one line: it goes into an event
                found[int(pid)] = " ".join(f.read().replace(b"\0", b" ").decode(errors="replace").split())
        except OSError:   # gone meanwhile, or not ours to look into
            continue
    return found


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def taken_ports(ports: Iterable[int], ours: Iterable[int] = ()) -> List[str]:
    """Each port of `ports` that a process other than `ours` (pids) listens on, in words:
    "8000 (pid 42: caddy run --config ...)"; a holder this user cannot see is named so."""
    mine = set(ours)
    said = []
    for port in ports:
        if port_free(port):
            continue
        found = holders(port)
        others = {pid: cmd for pid, cmd in found.items() if pid not in mine}
        if found and not others:
            continue   # the job's own (a proxy of its own that drains)
        who = "; ".join(f"pid {pid}: {cmd[:200]}" for pid, cmd in sorted(others.items())) \
            or "a process of another user or of another network namespace"
        said.append(f"{port} ({who})")
    return said
