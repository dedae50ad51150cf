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
# The tests that use the test bed (marked `bed` by tests/conftest.py) wait on Slurm and the
# daemons most of the time: the others (unit tests, runs on this machine) run beside them, in a
# mount namespace with a /tmp and /dev/shm of their own (tests/side.sh), so that each session's
# leftover checks see only its own runs. Their output follows the bed's. Where no mount
# namespace can be made (not root), they run after the bed's tests.
side=$(mktemp -d "${TMPDIR:-/tmp}/ftc-side.XXXXXX")
others=
# shellcheck disable=SC2317  # run by the trap below
end_others() { [ -z "$others" ] || kill "$others" 2>/dev/null; wait 2>/dev/null; rm -rf -- "$side"; }
trap end_others EXIT
# Each pass adds how many tests it selected (tests/conftest.py); tests/selected.py checks the sum.
exec 8>>"$side/selected"
FTC_SELECTED=8:$(stat -c %d:%i "$side/selected")
export FTC_SELECTED
if unshare --mount true 2>/dev/null; then
  bash tests/side.sh python3 -m pytest -m "not bed and not bed5" -p no:cacheprovider "$@" >"$side/out" 2>&1 &
  others=$!
fi
rc=0
# Whoever started this script may have left SIGINT ignored (a background job of a shell does),
# which Python would keep: the Ctrl-C tests' launches would never see theirs.
env --default-signal=INT,QUIT python3 -m pytest -m "bed and not bed5" "$@" || rc=$?
rco=0
if [ -n "$others" ]; then
  wait "$others" || rco=$?
  others=
  printf '\n==== beside them: the tests without the test bed (-m "not bed"), in their own /tmp and /dev/shm ====\n'
  cat -- "$side/out"
else
  python3 -m pytest -m "not bed and not bed5" "$@" || rco=$?
fi
# "No test ran" in one of the two is no failure when the other ran some.
if (( rco != 5 && (rc == 0 || rc == 5) )); then rc=$rco; fi
# Then the tests that need whole nodes of a larger bed (replicas of two nodes each): the first
# pass's bed is down by then, and this pass starts one of 5 nodes (bare Slurm only: no Docker or
# Pyxis there). "No test ran" (5: arguments that select none of them) is no failure.
rc5=0
FTC_TESTBED_NODES=5 env --default-signal=INT,QUIT python3 -m pytest -m bed5 "$@" || rc5=$?
(( rc5 == 5 )) && rc5=0
# The whole suite that selected almost nothing fails, whatever the passes said. Options that
# change only the output (CI's -q, -v, -x) still run the whole suite; a path, -k, -m or a
# deselection does not.
whole=1
for a in "$@"; do
  case $a in -k*|-m*|--deselect*|--lf|--last-failed|--sw|--stepwise) whole=0 ;; -*) ;; *) whole=0 ;; esac
done
if (( whole )) && ! python3 tests/selected.py "$side/selected"; then
  (( rc )) || rc=1
fi
(( rc )) && exit "$rc"
exit "$rc5"
