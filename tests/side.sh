#!/usr/bin/env bash
# Run a command (the tests beside the test bed's) from the checkout, in a mount namespace with a
# /tmp and /dev/shm of its own, so that each session's leftover checks see only its own runs:
#   bash tests/side.sh python3 -m pytest ...
# A checkout that lies under /tmp or /dev/shm would be hidden by them: it is bound back at its
# own path first. Exits 125 where no mount namespace can be made (not root), before running it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd -P)
unshare --mount true 2>/dev/null || { echo "tests/side.sh: cannot make a mount namespace (not root?)" >&2; exit 125; }
# A background command of a script starts with SIGINT and SIGQUIT ignored, which Python keeps
# (no KeyboardInterrupt): the Ctrl-C tests need them back.
# shellcheck disable=SC2016  # expanded by the inner bash
exec env --default-signal=INT,QUIT unshare --mount bash -c '
  set -e
  repo=$1; shift
  exec 9<"$repo"   # the checkout itself, whatever the new mounts hide
  mount -t tmpfs -o mode=1777 ftc-tmp /tmp
  mount -t tmpfs -o mode=1777 ftc-shm /dev/shm
  if [ ! -d "$repo" ]; then
    # -c: the kernel follows the descriptor to the checkout; canonicalized, the path would name
    # the empty folder just made.
    mkdir -p "$repo" && mount -c --bind /proc/self/fd/9 "$repo"
  fi
  exec 9<&-
  cd "$repo"
  exec "$@"' own-tmp "$repo" "$@"
