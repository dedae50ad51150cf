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
# The first pass's tests wait on Slurm and the daemons most of the time: the unit tests marked
# `beside` (nothing made outside their own folders, no clock judged) run beside them, niced, with
# a TMPDIR of their own; their output follows the first pass's.
side=$(mktemp -d "${TMPDIR:-/tmp}/ftc-beside.XXXXXX")
beside=
# shellcheck disable=SC2317  # run by the trap below
end_beside() { [ -z "$beside" ] || kill "$beside" 2>/dev/null; wait 2>/dev/null; rm -rf -- "$side"; }
trap end_beside EXIT
TMPDIR=$side FTC_TESTS_BESIDE=1 nice -n 19 python3 -m pytest -m "beside and not bed5" -p no:cacheprovider --basetemp="$side/base" "$@" \
  >"$side/out" 2>&1 &
beside=$!
rc=0
python3 -m pytest -m "not bed5 and not beside" "$@" || rc=$?
rcb=0
wait "$beside" || rcb=$?
beside=
printf '\n==== the tests run beside the first pass (-m beside) ====\n'
cat -- "$side/out"
# "No test ran" in one of the two is no failure when the other ran some.
if (( rcb != 5 && (rc == 0 || rc == 5) )); then rc=$rcb; fi
# Then the tests that need whole nodes of a larger bed (replicas of two nodes each): the first
# pass's bed is down by then, and this pass starts one of 5 nodes (bare Slurm only: no Docker or
# Pyxis there). "No test ran" (5: arguments that select none of them) is no failure.
rc5=0
FTC_TESTBED_NODES=5 python3 -m pytest -m bed5 "$@" || rc5=$?
(( rc5 == 5 )) && rc5=0
(( rc )) && exit "$rc"
exit "$rc5"
