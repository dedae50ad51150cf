#!/usr/bin/env bash
# Everything the tests need on a fresh Debian machine, then the tests:
#   system packages for the Slurm test bed (as root), the package with its dev extra, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then
  bash tests/cluster/install.sh
  bash tests/docker/install.sh
  # Real Enroot + Pyxis, built from the sources beside the checkout when they are there (the
  # Pyxis tests skip, saying so, when they are not).
  if [ -f ../shared/third_party/enroot.tar.gz ] && [ -f ../shared/third_party/pyxis.tar.gz ]; then
    bash tests/pyxis/install.sh ../shared/third_party
  fi
fi
# A fresh environment's pip (23.x) may not resolve the extras' pins: bring pip up to date first.
python3 -m pip install -q --disable-pip-version-check --upgrade pip
python3 -m pip install -q --disable-pip-version-check -e '.[cpu-triton,client,ssh,docker,gateway,text,plot,dev]'
# Then the tests that need whole nodes of a larger bed (replicas of two nodes each): the first
# pass's bed is down by then, and this pass starts one of 5 nodes (bare Slurm only: no Docker or
# Pyxis there). "No test ran" (5: arguments that select none of them) is no failure.
rc=0
python3 -m pytest -m "not bed5" "$@" || rc=$?
rc5=0
FTC_TESTBED_NODES=5 python3 -m pytest -m bed5 "$@" || rc5=$?
(( rc5 == 5 )) && rc5=0
(( rc )) && exit "$rc"
exit "$rc5"
