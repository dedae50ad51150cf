#!/usr/bin/env bash
# Test-bed Docker (root, Debian 12): Debian's docker.io (dockerd 20.10, containerd, runc) and
# debootstrap for the test image. Quick when everything is already there.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  echo "tests/docker/install.sh: needs root; the docker tests will be skipped" >&2
  exit 0
fi
want=(docker.io debootstrap docker-compose)
missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

# No service may start by itself (the test bed starts its own daemons, one per node).
made_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
  made_policy=1
fi
trap '[ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
