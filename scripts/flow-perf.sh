#!/usr/bin/env bash
# dpdk-test-flow-perf (Debian's dpdk-dev) on one looped port: rte_flow insertion and deletion
# rates (K rules/s, one core, batches of 100) for net_mlx4rs and for DPDK's C mlx4 on the same
# software HCA (through the verbs stand-in, scripts/c-mlx4-env.sh), for each rule shape we
# accept; a shape the C driver refuses is reported with its message. Alternating, median of
# RUNS runs.
#
# Usage: scripts/flow-perf.sh [--rules 1000] [--runs 3] [--out FILE]   (FILE target/flow-perf.md)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rules=1000 runs=3 out="$top/target/flow-perf.md"
while [ $# -gt 0 ]; do
  case "$1" in
    --rules) rules=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//; /^set -euo/d' >&2; exit 2 ;;
  esac
done
set -- --rules "$rules" --runs "$runs" --out "$out"
. "$top/scripts/as-root.sh"
bash "$top/scripts/setup.sh" >/dev/null
(cd "$top" && cargo build --release -q -p mlx4-verbs -p rte_net_mlx4rs)
rel="${CARGO_TARGET_DIR:-$top/target}/release"
work=$(mktemp -d)
trap 'rm -rf "$work" /var/run/dpdk/mlx4rs-flowperf-$$' EXIT
cd "$work"
eval "$(bash "$top/scripts/c-mlx4-env.sh" "$work/dev" "$rel/libmlx4_verbs.so")"
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$rel"
export MLX4RS_VERBS="ibdev=$MLX4RS_IBDEV,wire=loop,wc=on,stats=$work/c-stats"

shapes=("--ether --queue" "--ether --drop" "--ether --ipv4 --queue" "--ether --ipv4 --udp --queue" "--ether --ipv4 --tcp --drop")
eal() {
  case "$1" in
    rs) echo "--no-pci -d librte_net_mlx4rs.so --vdev net_mlx4rs0,wire=loop" ;;
    c) echo "-a $MLX4RS_PCI" ;;
  esac
}
# One run: "<insert K/s> <delete K/s>", or "refused <message>".
run() {
  local log="$work/log"
  # shellcheck disable=SC2046,SC2086
  if dpdk-test-flow-perf --no-huge -m 512 -l 0-1 --file-prefix="mlx4rs-flowperf-$$" $(eal "$1") \
      -- --ingress $2 --rules-count="$rules" --rules-batch=100 --deletion >"$log" 2>&1; then
    echo "$(sed -n 's/.*Core 0 :: Rules insertion rate -> \([0-9.]*\).*/\1/p' "$log")" \
      "$(sed -n 's/.*Core 0 :: Rules deletion rate -> \([0-9.]*\).*/\1/p' "$log")"
  else
    echo "refused $(sed -n 's/.*message: //p' "$log" | head -1)"
  fi
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {printf "%.1f\n", a[int((NR+1)/2)]}'; }
declare -A ins del why
for r in $(seq 1 "$runs"); do
  for i in "${!shapes[@]}"; do
    for d in rs c; do
      read -r a b < <(run "$d" "${shapes[$i]}")
      if [ "$a" = refused ]; then why[$d$i]=$b; else ins[$d$i]="${ins[$d$i]:-} $a"; del[$d$i]="${del[$d$i]:-} $b"; fi
    done
  done
done
cell() {
  if [ -n "${why[$1]:-}" ]; then echo "refused: ${why[$1]}"
  else echo "$(echo "${ins[$1]}" | median) / $(echo "${del[$1]}" | median)"; fi
}
{
  echo "# dpdk-test-flow-perf, one looped port, $rules rules in batches of 100"
  echo
  echo "$(date -u +%F\ %H:%M) UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); median of $runs runs."
  echo "Command: scripts/flow-perf.sh --rules $rules --runs $runs"
  echo
  echo "| rule (flow-perf options) | net_mlx4rs insert / delete K rules/s | C mlx4 insert / delete K rules/s |"
  echo "|---|---|---|"
  for i in "${!shapes[@]}"; do
    echo "| \`${shapes[$i]}\` | $(cell rs$i) | $(cell c$i) |"
  done
} | tee "$out"
