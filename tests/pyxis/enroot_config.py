"""The Enroot start configuration that Pyxis writes for a step, rebuilt exactly as Pyxis 0.24's
source does, so that tests can source it with bash as Enroot does (`enroot start --conf`).

- args.c `spank_option_mount`: the --container-mounts value is split on ','; `parse_mount_option`
  splits each entry on ':' into SRC[:DST[:FLAGS]] (DST defaults to SRC) and turns '+' in FLAGS
  into ','; `add_mount` prefixes the default flags "x-create=auto,rbind" (for a SRC starting
  with '/' or '.').
- pyxis_slurmstepd.c `enroot_create_start_config`: `mounts() {` then one line per mount,
  `\\techo "%s %s %s"` with `fstab_escape`d SRC and DST (common.c: ' ' -> \\040, '\\t' -> \\011,
  '\\n' -> \\012, '\\\\' -> \\134; nothing else), then `}`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

_FSTAB = {" ": "\\040", "\t": "\\011", "\n": "\\012", "\\": "\\134"}


def fstab_escape(s: str) -> str:
    return "".join(_FSTAB.get(c, c) for c in s)


def fstab_unescape(s: str) -> str:
    for plain, esc in _FSTAB.items():
        s = s.replace(esc, plain)
    return s


def parse_container_mounts(value: str) -> list[tuple[str, str, str]]:
    mounts = []
    for entry in value.split(","):
        parts = entry.split(":", 2)
        src = parts[0]
        dst = parts[1] if len(parts) > 1 else src
        flags = parts[2].replace("+", ",") if len(parts) > 2 and parts[2] else None
        default = "x-create=auto,rbind"
        mounts.append((src, dst, f"{default},{flags}" if flags else default))
    return mounts


def start_config(container_mounts: str) -> str:
    lines = ["mounts() {"]
    for src, dst, flags in parse_container_mounts(container_mounts):
        lines.append(f'\techo "{fstab_escape(src)} {fstab_escape(dst)} {flags}"')
    lines.append("}")
    return "\n".join(lines) + "\n"


def source_mounts(container_mounts: str, folder: Path) -> list[tuple[str, str, str]]:
    """Source the config in bash, as Enroot does, and call mounts(): each line split on blanks
    (Enroot reads them as fstab entries) with SRC and DST unescaped."""
    conf = folder / "enroot_config"
    conf.write_text(start_config(container_mounts))
    r = subprocess.run(["bash", "-c", 'source "$1" && mounts', "_", str(conf)], cwd=folder,
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    out = []
    for line in r.stdout.splitlines():
        src, dst, flags = line.split(" ")
        out.append((fstab_unescape(src), fstab_unescape(dst), flags))
    return out
