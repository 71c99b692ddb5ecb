#!/usr/bin/env bash
# The soak: random TX traffic through the driver's TX queue and the software
# HCA in step mode, every frame checked byte for byte and every buffer freed exactly once; then
# the same with faults injected (error completions, lost doorbells, link flaps), where the
# frames missing from the wire must be exactly those counted lost. No EAL, no hugepages.
# Usage: scripts/soak.sh [PACKETS] [FAULTS]   (default 100000000 and
#        tx_error:5000/db_drop:13/flap:40000+300; CI runs 10^6 as pmd/tests/soak.rs)
# Prints, per run: packets, frames checked, lost and counted, buffers freed once, time.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
packets=${1:-100000000}
faults=${2:-tx_error:5000/db_drop:13/flap:40000+300}
case "$packets" in
  ''|*[!0-9]*) echo "usage: scripts/soak.sh [PACKETS] [FAULTS]" >&2; exit 2 ;;
esac
cd "$top"
cargo test --release -q -p mlx4rs --test soak --no-run
start=$(date +%s)
echo "soak: $packets packets per run, faults $faults, $(date -u '+%Y-%m-%d %H:%M UTC')"
SOAK_PACKETS=$packets SOAK_FAULTS=$faults \
  cargo test --release -q -p mlx4rs --test soak -- --nocapture --test-threads=1 2>&1 \
  | grep --line-buffered -E '^\.*soak: (packets|\.\.\.)|test result|panicked|assert' | sed -u 's/^\.*//'
echo "soak: both runs passed in $(($(date +%s) - start)) s"
