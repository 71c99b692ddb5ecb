#!/usr/bin/env bash
# Installs what building, running and testing mlx4rs needs on a Debian machine: 12 bookworm
# (DPDK 22.11), 13 trixie (24.11) or 14 forky (25.11). Idempotent and quick when everything is
# present. Never writes a host name anywhere: deb-src is enabled by adding it to the Types:
# lines of the existing Debian sources.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The build needs no DPDK source: the driver-SDK bindings are committed (ffi/sdk/). Only the
# tests that build DPDK's example programs need the source package, which Debian serves for
# bookworm's DPDK; keep it outside the work tree so a clean clone stays clean, but in a fixed
# place so it is fetched once per machine.
cache=${MLX4RS_CACHE:-/var/cache/mlx4rs}
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-unknown}")

say() { echo "setup: $*"; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "setup: must run as root to install packages ($*); run as root, or with sudo where it is installed" >&2
    exit 1
  fi
}

# tshark decodes pcap wires with checksum validation; python3-pyelftools lets dpdk-pmdinfo.py
# read the driver's PMD info; libibverbs-dev (rdma-core's verbs and mlx4dv headers) is what the
# rdma-core backend's bindings are generated from, and ibverbs-providers holds libmlx4; make
# builds DPDK's example applications from the source package (tests/dpdk_examples.rs).
pkgs=(dpdk dpdk-dev libdpdk-dev clang libclang-dev pkg-config dpkg-dev make
      iproute2 meson ninja-build gcc libc6-dev valgrind python3 fonts-dejavu-core
      tshark python3-pyelftools libibverbs-dev ibverbs-providers openvswitch-switch-dpdk socat iputils-ping)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

updated=0
apt_update() {
  if [ $updated = 0 ]; then
    say "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    updated=1
  fi
}

if [ ${#missing[@]} -gt 0 ]; then
  need_root "${missing[*]}"
  apt_update
  say "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

ver=$(pkg-config --modversion libdpdk)
src="$cache/dpdk-stable-$ver"
if [ "$codename" != bookworm ]; then
  src="(none: DPDK's example programs are built on bookworm only, where its source package is served)"
elif [ ! -f "$src/examples/l3fwd-power/main.c" ]; then
  need_root "dpdk source package"
  # Enable deb-src on the existing Debian entries, once: deb822 files get the type added; the
  # one-line format (a fresh bookworm's /etc/apt/sources.list) gets a deb-src twin of each
  # deb line, in a file of our own.
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    if grep -q '^Types: deb$' "$f"; then
      sed -i 's/^Types: deb$/Types: deb deb-src/' "$f"
      updated=0
    fi
  done
  twins=/etc/apt/sources.list.d/mlx4rs-deb-src.list
  if [ ! -f "$twins" ] && ! grep -qs '^[[:space:]]*deb-src[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list; then
    lines=$(sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
    if [ -n "$lines" ]; then
      printf '%s\n' "$lines" > "$twins"
      updated=0
    fi
  fi
  if ! grep -qs 'deb-src' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; then
    echo "setup: no Debian package source in /etc/apt to enable deb-src for;" \
         "enable deb-src for the Debian entries by hand, then rerun" >&2
    exit 1
  fi
  apt_update
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/fetch.XXXXXX")
  chmod 755 "$tmp"  # apt-get source downloads as _apt
  say "fetching the dpdk $ver source package for DPDK's example programs"
  (cd "$tmp" && apt-get source -qq --download-only "dpdk=$(dpkg-query -W -f='${Version}' libdpdk-dev)" >/dev/null)
  (cd "$tmp" && dpkg-source -x --no-check ./*.dsc src >/dev/null)
  if [ ! -f "$tmp/src/examples/l3fwd-power/main.c" ]; then
    echo "setup: the dpdk source package did not contain examples/l3fwd-power/main.c" >&2
    exit 1
  fi
  rm -rf "$src"
  mv "$tmp/src" "$src"
  rm -rf "$tmp"
fi

# Rust toolchain components used by the checks.
if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt >/dev/null 2>&1 || true
fi


say "ok (Debian $codename, DPDK $ver; DPDK examples source: $src)"
