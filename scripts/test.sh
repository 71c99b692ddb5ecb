#!/usr/bin/env bash
# Runs every test: the checks (rustfmt, clippy), unit tests of the formats, the software HCA and
# the driver, and the integration tests that drive real DPDK programs with the plugin. On
# Debian 12 it then runs the platform subset on Debian 13 too, in a root filesystem of it
# (scripts/test-release.sh trixie); MLX4RS_OTHER_RELEASES="" skips that, "trixie forky" adds
# the testing release.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$top/scripts/as-root.sh"
. "$top/scripts/example-tests.sh"
bash "$top/scripts/setup.sh"
cd "$top"
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-unknown}")
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The integration tests load the plugin that this build makes.
cargo build --workspace
if [ "$codename" = bookworm ]; then
  cargo test --workspace --no-fail-fast -- --test-threads=2
else
  # DPDK's example programs are built from the DPDK source package, which Debian serves only
  # for bookworm: every other test target runs, and the ones that build examples are named.
  mapfile -t targets < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" in t["kind"] and t["name"] != "'"$example_target"'":
            print("--test=" + t["name"])')
  echo "test.sh: Debian $codename has no DPDK source package: skipping $example_target and" \
       "the l3fwd-power and multi_process example tests (they run on bookworm)"
  cargo test --workspace --no-fail-fast --lib --bins "${targets[@]}" -- --test-threads=2 "${example_skips[@]}"
fi
if [ "$codename" = bookworm ]; then
  for r in ${MLX4RS_OTHER_RELEASES-trixie}; do
    bash "$top/scripts/test-release.sh" "$r"
  done
fi
