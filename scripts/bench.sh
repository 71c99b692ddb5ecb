#!/usr/bin/env bash
# The benchmark suite: txbench (TX sweep against net_null and net_ring) and latency (ping-pong
# over a looped wire), one report with plots. Full run under 10 minutes on 2 cores; --short in
# about a minute.
# Usage: scripts/bench.sh [--short] [--out DIR]     (default DIR: target/bench-report)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
short=()
out="$top/target/bench-report"
while [ $# -gt 0 ]; do
  case "$1" in
    --short) short=(--short); shift ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --out=*) out=$(realpath -m "${1#--out=}"); shift ;;
    *) echo "usage: scripts/bench.sh [--short] [--out DIR]" >&2; exit 2 ;;
  esac
done
bash "$top/scripts/setup.sh"
(cd "$top" && cargo build --release -q -p txbench -p latency)
mkdir -p "$out"
rm -f "$out"/txbench.md "$out"/latency.md
start=$(date +%s)
# Each app stops cleanly on Ctrl-C and writes what it has; the suite then stops too.
trap 'echo "bench: interrupted" >&2' INT
tx_rc=0
"${CARGO_TARGET_DIR:-$top/target}/release/txbench" "${short[@]}" --out "$out" > "$out/txbench.log" || tx_rc=$?
lat_rc=0
if [ $tx_rc -ne 130 ]; then
  "${CARGO_TARGET_DIR:-$top/target}/release/latency" "${short[@]}" --out "$out" > "$out/latency.log" || lat_rc=$?
fi
{
  echo "# mlx4rs benchmark report"
  echo
  echo "Command: \`scripts/bench.sh ${short[*]:-}\` on $(date -u '+%Y-%m-%d %H:%M UTC'), $(($(date +%s) - start)) s."
  echo "Machine: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc --all) cores, $(uname -sr)."
  echo "txbench exit status $tx_rc, latency exit status $lat_rc (0 ok, 3 no RX, 130 interrupted)."
  echo
  [ -f "$out/txbench.md" ] && cat "$out/txbench.md"
  echo
  [ -f "$out/latency.md" ] && cat "$out/latency.md"
} > "$out/report.md"
echo "bench: report in $out/report.md"
[ $tx_rc -eq 0 ] || exit $tx_rc
exit $lat_rc
