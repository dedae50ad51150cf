#!/usr/bin/env bash
# Build and install NVIDIA Enroot and Pyxis from source (Debian 12, as root) for the Slurm test
# bed, whose nodes are network+UTS namespaces sharing one filesystem. Idempotent; about 10 s.
#
#   tests/pyxis/install.sh [SRC_DIR]   SRC_DIR holds enroot.tar.gz and pyxis.tar.gz (`git archive`
#                                      exports with top folders enroot/ and pyxis/); default
#                                      ../shared/third_party beside the checkout
#
# Needs Slurm installed (tests/cluster/install.sh) and Debian's mirror. Env: BUILD_DIR (default
# /tmp/ftc-pyxis-build), ENROOT_DATA_TMPFS (1: a tmpfs on /var/lib/enroot/data, the default;
# 0: on disk), ENROOT_DATA_TMPFS_SIZE (default 50%).
#
# Only the plugin is installed: the test bed enables it per cluster (a PlugStackConfig= line in
# the slurm.conf it renders, with its own plugstack file). It must not go under
# /etc/slurm/plugstack.conf.d/: Debian's plugstack.conf includes that folder for every client
# reading /etc/slurm/slurm.conf, while the bed's slurmds (-f DIR/slurm.conf) do not, and then
# srun accepts --container-image and the step silently runs on the host.
#
# What differs from upstream's `make install` (all outside the sources):
#  - deps/ submodules are absent from `git archive`: musl comes from Debian's musl-tools (its gcc
#    specs get upstream's deps/musl.patch static-pie fix, in a private copy), linux headers from
#    linux-libc-dev, makeself from Debian's makeself 2.4.5 (= upstream's pinned version); the
#    vendored deps/libbsd is built by enroot's own deps/Makefile.
#  - an enroot.conf drop-in makes the runtime/data/cache paths per node and per user.
#  - the PMIx hook (50-slurm-pmi.sh) is enabled; container root filesystems go to a tmpfs.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(readlink -f "${1:-$HERE/../../../shared/third_party}")
BUILD=${BUILD_DIR:-/tmp/ftc-pyxis-build}
ENROOT_PREFIX=/usr           # like the upstream .deb: /usr/bin/enroot, /etc/enroot
PYXIS_PREFIX=/usr/local      # upstream default: /usr/local/lib/slurm/spank_pyxis.so

log() { printf '[pyxis install %s] %s\n' "$(date +%T)" "$*"; }
die() { printf '[pyxis install] ERROR: %s\n' "$*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b-a}'; }

[ "$(id -u)" = 0 ] || die "must run as root"
for f in enroot.tar.gz pyxis.tar.gz; do [ -f "$SRC/$f" ] || die "missing $SRC/$f"; done
command -v slurmd >/dev/null || die "Slurm is not installed (run tests/cluster/install.sh)"
SLURM_VER=$(dpkg-query -W -f='${Version}' slurmd 2>/dev/null) || die "slurmd is not a Debian package"

# ---- 1. packages ---------------------------------------------------------------------------
t0=$(now)
# libslurm-dev must be the exact release of the installed Slurm: since 21.08 Slurm refuses a
# SPANK plugin built against another release's spank.h ("Incompatible plugin version").
PKGS=(gcc make musl-tools linux-libc-dev "libslurm-dev=$SLURM_VER"
      bash curl gawk jq parallel passwd squashfs-tools zstd bsdmainutils pigz makeself
      squashfuse fuse-overlayfs)
missing=()
for p in "${PKGS[@]}"; do
  name=${p%%=*}; want=${p#*=}
  have=$(dpkg-query -W -f='${db:Status-Status} ${Version}' "$name" 2>/dev/null || true)
  if [ "${have%% *}" != installed ] || { [ "$name" != "$p" ] && [ "${have#* }" != "$want" ]; }; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt: installing ${missing[*]}"
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then   # no service may start by itself
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt_install() {
    apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}" \
      >"$BUILD.apt.log" 2>&1
  }
  mkdir -p "$(dirname "$BUILD")"
  if ! apt_install; then
    apt-get -o DPkg::Lock::Timeout=600 update -q >"$BUILD.apt.log" 2>&1 || { cat "$BUILD.apt.log" >&2; exit 1; }
    apt_install || { if [ $made_policy = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
                     cat "$BUILD.apt.log" >&2; exit 1; }
  fi
  if [ $made_policy = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
log "packages ready in $(since "$t0") s"

# ---- 2. enroot -----------------------------------------------------------------------------
t0=$(now)
rm -rf "$BUILD"; mkdir -p "$BUILD"
tar -xzf "$SRC/enroot.tar.gz" -C "$BUILD"
E=$BUILD/enroot
[ -f "$E/Makefile" ] && [ -d "$E/deps/libbsd" ] || die "$SRC/enroot.tar.gz: no enroot/ tree"
D=$E/deps
MUSL_LIB=/usr/lib/x86_64-linux-musl
[ -f "$MUSL_LIB/musl-gcc.specs" ] && [ -f "$MUSL_LIB/rcrt1.o" ] || die "musl-tools: no specs/rcrt1.o in $MUSL_LIB"
mkdir -p "$D/dist/musl/bin" "$D/dist/musl/lib" "$D/dist/linux/include" "$D/musl" "$D/linux-headers" "$D/makeself"
# musl-gcc with static-pie support: upstream patches musl's specs (deps/musl.patch); same edit here.
sed -e "s|%{!shared: $MUSL_LIB/Scrt1.o}|%{static-pie: $MUSL_LIB/rcrt1.o} %{!static-pie: %{!shared: $MUSL_LIB/Scrt1.o}}|" \
    -e "s|^-dynamic-linker /lib/ld-musl-x86_64.so.1 |%{static-pie:-no-dynamic-linker -static -pie} %{!static-pie:-dynamic-linker /lib/ld-musl-x86_64.so.1} |" \
    "$MUSL_LIB/musl-gcc.specs" >"$D/dist/musl/lib/musl-gcc.specs"
grep -q 'static-pie:-no-dynamic-linker' "$D/dist/musl/lib/musl-gcc.specs" || die "could not patch musl-gcc.specs"
printf '#!/bin/sh\nexec "${REALGCC:-gcc}" "$@" -specs "%s"\n' "$D/dist/musl/lib/musl-gcc.specs" >"$D/dist/musl/bin/musl-gcc"
chmod 755 "$D/dist/musl/bin/musl-gcc"
# Kernel UAPI headers (musl-gcc uses -nostdinc): the ones of linux-libc-dev.
ln -sfn /usr/include/linux "$D/dist/linux/include/linux"
ln -sfn /usr/include/asm-generic "$D/dist/linux/include/asm-generic"
ln -sfn "/usr/include/$(gcc -dumpmachine)/asm" "$D/dist/linux/include/asm"
touch "$D/musl/.stamp" "$D/linux-headers/.stamp"     # deps/Makefile: already "built"
cp /usr/bin/makeself "$D/makeself/makeself.sh"        # installed as enroot-makeself
( cd "$E" && make -j"$(nproc)" prefix=$ENROOT_PREFIX sysconfdir=/etc >"$BUILD/enroot-build.log" 2>&1 ) ||
  { tail -30 "$BUILD/enroot-build.log" >&2; die "enroot build failed"; }
for b in enroot-nsenter enroot-switchroot enroot-mount enroot-aufs2ovlfs enroot-mksquashovlfs; do
  # static-pie: a position-independent ELF (DYN) without a program interpreter
  readelf -h "$E/bin/$b" | grep -q 'Type: *DYN' && ! readelf -lW "$E/bin/$b" | grep -q INTERP ||
    die "$b is not a static-pie binary"
done
log "enroot built in $(since "$t0") s"
( cd "$E" && make install prefix=$ENROOT_PREFIX sysconfdir=/etc >"$BUILD/enroot-install.log" 2>&1 ) ||
  { cat "$BUILD/enroot-install.log" >&2; die "enroot install failed"; }

# Per-node, per-user paths: the test-bed nodes share /run and /var; $(hostname) is the node
# (each node has its own UTS namespace). Parents are sticky and world-writable like /tmp.
install -d -m 1777 /var/lib/enroot /var/lib/enroot/data /var/lib/enroot/cache /run/enroot
# Container root filesystems on tmpfs: unpacking the 173 MB test image took 5-10 s (all kernel
# time) on this VM's ext4 and 0.4 s on tmpfs. ENROOT_DATA_TMPFS=0 keeps them on disk. Mount it
# before the cluster starts (the root mount is private: later mounts do not reach per-node
# mount namespaces).
if [ "${ENROOT_DATA_TMPFS:-1}" = 1 ] && ! mountpoint -q /var/lib/enroot/data; then
  mount -t tmpfs -o "mode=1777,size=${ENROOT_DATA_TMPFS_SIZE:-50%}" ftc-enroot-data /var/lib/enroot/data
fi
cat >/etc/enroot/enroot.conf.d/ftc-testbed.conf <<'EOF'
# ftcluster test bed: the Slurm "nodes" are network+UTS namespaces that share one filesystem,
# so every path that enroot keeps per host is made per node (the node's hostname) and per user.
# The parents are sticky world-writable directories (mode 1777, like /tmp).
ENROOT_RUNTIME_PATH /run/enroot/$(hostname).user-$(id -u)
ENROOT_DATA_PATH    /var/lib/enroot/data/$(hostname).user-$(id -u)
ENROOT_CACHE_PATH   /var/lib/enroot/cache/$(hostname).user-$(id -u)
ENROOT_TEMP_PATH    /tmp
EOF
# PMIx inside containers: pass PMIX_* and bind-mount PMIX_SERVER_TMPDIR (upstream extra hook).
ln -sfn /usr/share/enroot/hooks.d/50-slurm-pmi.sh /etc/enroot/hooks.d/50-slurm-pmi.sh
log "enroot $(enroot version) installed ($ENROOT_PREFIX/bin/enroot, /etc/enroot)"

# ---- 3. pyxis ------------------------------------------------------------------------------
t0=$(now)
tar -xzf "$SRC/pyxis.tar.gz" -C "$BUILD"
P=$BUILD/pyxis
[ -f /usr/include/slurm/spank.h ] || die "no /usr/include/slurm/spank.h (libslurm-dev)"
( cd "$P" && make -j"$(nproc)" >"$BUILD/pyxis-build.log" 2>&1 ) ||
  { tail -30 "$BUILD/pyxis-build.log" >&2; die "pyxis build failed"; }
log "pyxis built in $(since "$t0") s (against libslurm-dev $SLURM_VER)"
( cd "$P" && make install prefix=$PYXIS_PREFIX >"$BUILD/pyxis-install.log" 2>&1 ) ||
  { cat "$BUILD/pyxis-install.log" >&2; die "pyxis install failed"; }
SO=$PYXIS_PREFIX/lib/slurm/spank_pyxis.so
[ -f "$SO" ] || die "no $SO after make install"
rm -f /etc/slurm/plugstack.conf.d/pyxis-testbed.conf   # never there (see the top of this file)
log "pyxis $(sed -n 's/^PYXIS_VER ?= //p' "$P/Makefile") installed: $SO"
