#!/usr/bin/env bash
# Makes (once) and prints the path of a root filesystem of another Debian release, for building and
# testing the driver against that release's DPDK: scripts/release-root.sh trixie|forky
#
# The root is made with debootstrap from the same package sources as this machine, then
# scripts/setup.sh installs that release's packages inside it, so the set-up a user of that release
# runs is the one tested. It is kept in the cache (MLX4RS_CACHE, /var/cache/mlx4rs): a second call
# only checks that it is complete.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$top/scripts/as-root.sh"
suite=${1:?usage: release-root.sh SUITE (trixie, forky)}
cache=${MLX4RS_CACHE:-/var/cache/mlx4rs}
root="$cache/root-$suite"

say() { echo "release-root($suite): $*" >&2; }

case "$suite" in
  bookworm|trixie|forky|sid) ;;
  *) echo "release-root: unknown Debian release '$suite' (bookworm, trixie, forky or sid)" >&2; exit 2 ;;
esac

# The mirror this machine's own package sources name (deb822 or one-line format); no host is
# written into the project.
mirror() {
  local m
  m=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null |
      grep -v -- '-security' | head -n 1 || true)
  [ -n "$m" ] || m=$(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\).*/\2/p' \
      /etc/apt/sources.list 2>/dev/null | grep -v -- '-security' | head -n 1 || true)
  [ -n "$m" ] || { echo "release-root: no Debian package source found in /etc/apt" >&2; exit 1; }
  echo "$m"
}

if ! command -v debootstrap >/dev/null 2>&1; then
  say "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null ||
    { DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
fi

if [ ! -f "$root/.mlx4rs-base" ]; then
  m=$(mirror)
  # An older debootstrap has no script for the newest releases; they bootstrap as sid does.
  script=/usr/share/debootstrap/scripts/$suite
  [ -e "$script" ] || script=/usr/share/debootstrap/scripts/sid
  rm -rf "$root.tmp"
  mkdir -p "$cache"
  say "debootstrap into $root"
  debootstrap --variant=minbase --include=ca-certificates,pkg-config,gcc,libc6-dev,git,procps \
    "$suite" "$root.tmp" "$m" "$script" >"$cache/debootstrap-$suite.log" 2>&1 ||
    { tail -n 20 "$cache/debootstrap-$suite.log" >&2; echo "release-root: debootstrap $suite failed" >&2; exit 1; }
  cat >"$root.tmp/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $m
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -f "$root.tmp/etc/apt/sources.list"
  # The package sources here may be a fixed snapshot; testing's Release files carry a
  # Valid-Until date that such a snapshot outlives.
  echo 'Acquire::Check-Valid-Until "false";' >"$root.tmp/etc/apt/apt.conf.d/99mlx4rs-snapshot"
  touch "$root.tmp/.mlx4rs-base"
  # Never remove a root that still has something mounted in it (test-release.sh binds /dev).
  if grep -q " $root/" /proc/mounts; then
    echo "release-root: $root has mounts left; unmount them (umount -R $root/...) first" >&2
    exit 1
  fi
  rm -rf "$root"
  mv "$root.tmp" "$root"
fi
cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
echo "$root"
