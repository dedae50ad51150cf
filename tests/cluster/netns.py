"""Nodes as network + UTS namespaces on one bridge, and their /etc/hosts block.

Every step is idempotent and every teardown step tolerates a half-made node,
so that `down` works after an `up` that failed anywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .util import TestbedError, run, which

HOSTS = Path("/etc/hosts")


@dataclass(frozen=True)
class Net:
    """Names and addresses of one test cluster's network (all derived from `octet`)."""

    octet: int  # the cluster lives in 10.<octet>.0.0/24
    nodes: int
    prefix: str = "node"  # node hostnames: prefix1..prefixN

    @property
    def tag(self) -> str:
        return f"ftc{self.octet}"

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    @property
    def gateway(self) -> str:
        return f"10.{self.octet}.0.1"

    @property
    def cidr(self) -> str:
        return f"10.{self.octet}.0.0/24"

    @property
    def names(self) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(1, self.nodes + 1)]

    def ip(self, i: int) -> str:
        return f"10.{self.octet}.0.{10 + i}"

    def netns(self, i: int) -> str:
        return f"{self.tag}-{self.prefix}{i}"

    def netns_file(self, i: int) -> Path:
        return Path("/run/netns") / self.netns(i)

    @property
    def uts_dir(self) -> Path:
        return Path("/run") / self.tag / "uts"

    def uts_file(self, i: int) -> Path:
        return self.uts_dir / f"{self.prefix}{i}"

    def index(self, node: str) -> int:
        if node not in self.names:
            raise TestbedError(f"no node {node!r} in {self.names}")
        return self.names.index(node) + 1

    def enter(self, node: str) -> list[str]:
        """argv prefix that runs a command inside a node (nsenter keeps /sys and cgroups)."""
        i = self.index(node)
        return [which("nsenter"), f"--net={self.netns_file(i)}", f"--uts={self.uts_file(i)}"]


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def create(net: Net) -> None:
    ip = which("ip")
    if not _link_exists(net.bridge):
        run([ip, "link", "add", net.bridge, "type", "bridge"])
        run([ip, "addr", "add", f"{net.gateway}/24", "dev", net.bridge])
    run([ip, "link", "set", net.bridge, "up"])
    net.uts_dir.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(net.names, 1):
        ns, veth = net.netns(i), f"{net.tag}v{i}"
        if not net.netns_file(i).exists():
            run([ip, "netns", "add", ns])
        if not _link_exists(veth):
            # The peer is created directly inside the namespace as eth0.
            run([ip, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        run([ip, "link", "set", veth, "master", net.bridge, "up"])
        addrs = run([ip, "-n", ns, "-o", "addr", "show", "dev", "eth0"]).stdout
        if f"{net.ip(i)}/" not in addrs:
            run([ip, "-n", ns, "addr", "add", f"{net.ip(i)}/24", "dev", "eth0"])
        run([ip, "-n", ns, "link", "set", "lo", "up"])
        run([ip, "-n", ns, "link", "set", "eth0", "up"])
        run([ip, "-n", ns, "route", "replace", "default", "via", net.gateway])
        uts = net.uts_file(i)
        if not _is_mountpoint(uts):
            uts.touch()
            # A persistent UTS namespace (bind-mounted on the file) holds the hostname.
            run([which("unshare"), f"--uts={uts}", which("hostname"), name])
    hosts_add(net)


def destroy(net: Net, max_nodes: int = 64) -> None:
    """Remove everything `create` may have made, for up to max_nodes nodes."""
    ip = which("ip")
    hosts_remove(net)
    for i in range(1, max_nodes + 1):
        uts = net.uts_file(i)
        if _is_mountpoint(uts):
            run([which("umount"), str(uts)], check=False)
        uts.unlink(missing_ok=True)
        if net.netns_file(i).exists():
            # Deleting the namespace also deletes the veth pair.
            run([ip, "netns", "del", net.netns(i)], check=False)
        if _link_exists(f"{net.tag}v{i}"):
            run([ip, "link", "del", f"{net.tag}v{i}"], check=False)
    if _link_exists(net.bridge):
        run([ip, "link", "del", net.bridge], check=False)
    for d in (net.uts_dir, net.uts_dir.parent):
        try:
            d.rmdir()
        except (FileNotFoundError, OSError):
            pass


def leftovers(net: Net) -> list[str]:
    """What of this network still exists (empty after a clean teardown)."""
    out: list[str] = []
    if _link_exists(net.bridge):
        out.append(f"bridge {net.bridge}")
    listing = run([which("ip"), "netns", "list"], check=False).stdout
    out += [f"netns {ln.split()[0]}" for ln in listing.splitlines()
            if ln.startswith(f"{net.tag}-")]
    mounts = Path("/proc/mounts").read_text()
    out += [f"mount {ln.split()[1]}" for ln in mounts.splitlines()
            if f"/{net.tag}/" in ln or f"/netns/{net.tag}-" in ln]
    if _marker(net, "BEGIN") in HOSTS.read_text():
        out.append("/etc/hosts block")
    return out


def _is_mountpoint(p: Path) -> bool:
    return any(ln.split()[1] == str(p) for ln in Path("/proc/mounts").read_text().splitlines())


def _marker(net: Net, what: str) -> str:
    return f"# {what} ftcluster testbed {net.tag}"


def hosts_add(net: Net) -> None:
    hosts_remove(net)
    block = [_marker(net, "BEGIN")]
    block += [f"{net.ip(i)}\t{n}" for i, n in enumerate(net.names, 1)]
    block.append(_marker(net, "END"))
    text = HOSTS.read_text()
    if text and not text.endswith("\n"):
        text += "\n"
    _write_hosts(text + "\n".join(block) + "\n")


def hosts_remove(net: Net) -> None:
    lines, out, inside = HOSTS.read_text().splitlines(keepends=True), [], False
    for ln in lines:
        if ln.strip() == _marker(net, "BEGIN"):
            inside = True
        elif ln.strip() == _marker(net, "END"):
            inside = False
        elif not inside:
            out.append(ln)
    if len(out) != len(lines):
        _write_hosts("".join(out))


def _write_hosts(text: str) -> None:
    # In place (not rename): /etc/hosts is often a bind mount in containers.
    with open(HOSTS, "r+") as f:
        f.write(text)
        f.truncate()
        os.fsync(f.fileno())
