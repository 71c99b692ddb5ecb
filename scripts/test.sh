#!/usr/bin/env bash
# Runs every test: the checks (rustfmt, clippy), unit tests of the formats, the software HCA and
# the driver, and the integration tests that drive real DPDK programs with the plugin. On
# Debian 12 it then runs the platform subset on Debian 13 too, in a root filesystem of it
# (scripts/test-release.sh trixie); MLX4RS_OTHER_RELEASES="" skips that, "trixie forky" adds
# the testing release.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$top/scripts/as-root.sh"
bash "$top/scripts/setup.sh"
cd "$top"
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-unknown}")
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The integration tests load the plugin that this build makes.
cargo build --workspace
cargo test --workspace -- --test-threads=2
if [ "$codename" = bookworm ]; then
  for r in ${MLX4RS_OTHER_RELEASES-trixie}; do
    bash "$top/scripts/test-release.sh" "$r"
  done
fi
