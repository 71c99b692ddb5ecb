#!/usr/bin/env bash
# Runs the platform subset of the tests on another Debian release, in a root filesystem of it
# (scripts/release-root.sh), against that release's DPDK and rdma-core:
#   bash scripts/test-release.sh trixie     # Debian 13, DPDK 24.11 (CI runs this)
#   bash scripts/test-release.sh forky      # Debian 14 (testing), DPDK 25.11
#   bash scripts/test-release.sh trixie -- cargo build   # set-up, then one command instead
#
# Inside the root, as a user of that release would: scripts/setup.sh, then the build, clippy and
# the subset below. The work tree and this machine's Rust toolchain are bind-mounted in; the
# build goes to a target directory of the root's own, kept with the root in the cache.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$top/scripts/as-root.sh"
suite=${1:?usage: test-release.sh SUITE (trixie, forky) [-- COMMAND...]}
shift
[ "${1:-}" = -- ] && shift
root=$(bash "$top/scripts/release-root.sh" "$suite")
cargo_home=${CARGO_HOME:-$HOME/.cargo}
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
for d in "$cargo_home" "$rustup_home"; do
  [ -d "$d" ] || { echo "test-release: no Rust toolchain at $d (set CARGO_HOME/RUSTUP_HOME)" >&2; exit 1; }
done

# The subset: every test binary that drives DPDK programs through a platform boundary.
# Tests that build DPDK's example programs need bookworm's DPDK source package and stay there.
tests=(testpmd_tx testpmd_rx testpmd_features testpmd_flow testpmd_faults meson_install
       multiprocess testpmd_verbs c_mlx4_on_hca)
. "$top/scripts/example-tests.sh"

mounts=()
mount_in() { # SRC DEST [bind|rbind]
  mkdir -p "$root$2"
  mount --"${3:-bind}" "$1" "$root$2"
  mounts=("$root$2" "${mounts[@]}")
}
cleanup() {
  for m in "${mounts[@]}"; do umount -R "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
}
trap cleanup EXIT
# The root is a mount point of its own, so that `ip netns exec` can make its mounts slaves.
mount --bind "$root" "$root"
mounts=("$root")
mount --make-private "$root"
mount_in /proc /proc
mount_in /sys /sys rbind
mount_in /dev /dev rbind
mount_in "$top" /mlx4rs
mount_in "$cargo_home" /opt/cargo
mount_in "$rustup_home" /opt/rustup
mkdir -p "$root/tmp" && chmod 1777 "$root/tmp"

test_args=()
for t in "${tests[@]}"; do test_args+=(--test "$t"); done
if [ $# -gt 0 ]; then
  run=$(printf '%q ' "$@")
else
  run="cargo build --workspace
    cargo clippy --workspace --all-targets -- -D warnings
    cargo test -p dpdk-sys -p mlx4rs --lib
    cargo test --no-fail-fast ${test_args[*]} -- --test-threads=2 ${example_skips[*]}"
fi

echo "test-release($suite): in $root"
chroot "$root" /usr/bin/env -i HOME=/root PATH=/opt/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  CARGO_HOME=/opt/cargo RUSTUP_HOME=/opt/rustup CARGO_TARGET_DIR=/var/cache/mlx4rs-target \
  TERM=dumb LANG=C.UTF-8 CI="${CI:-}" \
  bash -euo pipefail -c '
    cd /mlx4rs
    . /etc/os-release
    echo "test-release: Debian $VERSION_CODENAME"
    bash scripts/setup.sh
    echo "test-release: DPDK $(pkg-config --modversion libdpdk), rdma-core $(pkg-config --modversion libibverbs)"
    '"$run"'
  '
