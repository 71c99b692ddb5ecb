#!/usr/bin/env bash
# Runs every test: unit tests of the formats, the software HCA and the driver, and the
# integration tests that drive real DPDK programs with the plugin.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$top/scripts/as-root.sh"
bash "$top/scripts/setup.sh"
cd "$top"
# The integration tests load the plugin that this build makes.
cargo build --workspace
cargo test --workspace -- --test-threads=2
