"""python -m tests.cluster up [--nodes N] [--dir DIR] [--sshd] | down [--dir DIR] | status"""

from __future__ import annotations

import argparse
import json
import sys

from .testbed import DEFAULT_DIR, SlurmTestbed
from .util import TestbedError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the cluster (restarts it if one is recorded)")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--octet", type=int, default=77, help="subnet 10.OCTET.0.0/24")
    up.add_argument("--sshd", action="store_true", help="also sshd on port 11068 per node")
    up.add_argument("--pyxis", action=argparse.BooleanOptionalAction, default=None,
                    help="load Pyxis (default: when tests/pyxis/install.sh installed it)")
    up.add_argument("--no-system-conf", action="store_true",
                    help="leave /etc/slurm/slurm.conf alone (use SLURM_CONF=DIR/slurm.conf)")
    for p in (up, sub.add_parser("down"), sub.add_parser("status")):
        p.add_argument("--dir", default=str(DEFAULT_DIR))
    a = ap.parse_args(argv)
    try:
        if a.cmd == "up":
            tb = SlurmTestbed(a.dir, a.nodes, octet=a.octet, sshd=a.sshd,
                              system_conf=not a.no_system_conf, pyxis=a.pyxis).up()
            print(f"up: {', '.join(f'{n}={tb.ip(n)}' for n in tb.nodes)}; conf {tb.conf_path}")
            if tb.with_sshd:
                print(f"ssh {' '.join(tb.ssh_options)} {tb.nodes[0]}")
            if tb.pyxis:
                print(f"pyxis: {tb.plugstack}")
            print("timings: " + ", ".join(f"{k} {v:.2f}s" for k, v in tb.timings.items()))
        elif a.cmd == "down":
            tb = SlurmTestbed.from_state(a.dir)
            tb.down()
            left = tb.leftovers()
            print(f"down in {tb.timings['down']:.2f}s" + (f"; LEFT: {left}" if left else ""))
            return 1 if left else 0
        else:
            tb = SlurmTestbed.from_state(a.dir)
            if not tb.state_file.exists():
                print(f"down (nothing recorded in {tb.dir})")
                return 1
            print(json.dumps(json.loads(tb.state_file.read_text()), indent=1))
            print(tb.slurm(["sinfo", "-N", "-l"], check=False).stdout)
            return 0 if tb.is_up() else 1
    except TestbedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
