#!/usr/bin/env bash
# Install the system packages of the Slurm test bed (Debian 12, as root). Idempotent:
# nothing is downloaded when everything is already installed.
set -euo pipefail

PKGS=(slurm-wlm slurmctld slurmd slurm-client munge openmpi-bin libopenmpi-dev
      libpmix2 libpmix-dev libpmix-bin openssh-server openssh-client iproute2
      shellcheck    # the rendered scripts are shellchecked by the tests
      charliecloud-runtime    # ch-run: the Slurm + Charliecloud style
      prometheus)             # promtool: the published scrape targets are checked with it

if [ "$(id -u)" != 0 ]; then
  echo "install.sh: must run as root" >&2
  exit 1
fi

missing=()
for p in "${PKGS[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install.sh: installing ${missing[*]}"

# No service may start by itself during the install (the test bed starts its own daemons).
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  created_policy=1
fi
cleanup() { if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
apt_install() {
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/ftc-install.log 2>&1
}
# apt-get update only when the lists are missing or the install cannot find a package.
if ! ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1 || ! apt_install; then
  apt-get update -q >/tmp/ftc-install.log 2>&1 || { cat /tmp/ftc-install.log >&2; exit 1; }
  apt_install || { cat /tmp/ftc-install.log >&2; exit 1; }
fi
echo "install.sh: done"
