#!/usr/bin/env bash
# DPDK's own pmd_perf_autotest (dpdk-test, continuous rx/tx on one lcore, the default mode) on
# one looped port, for net_mlx4rs and for DPDK's C mlx4 on the same software HCA (through the
# verbs stand-in, scripts/c-mlx4-env.sh), with net_null as the harness's own floor, in one run:
#
#   rs       net_mlx4rs0,wire=loop                  (device_loop=lcore, the default)
#   rs-port  net_mlx4rs0,wire=loop,device_loop=port (a device thread per port, as the C side)
#   c        Debian's librte_net_mlx4.so, MLX4RS_VERBS wire=loop (the stand-in's device thread)
#   null     net_null0                              (rx hands out its one mbuf; tx frees)
#
# The test would run until 2 s of line rate came back (119 M frames at the 40 Gb/s we report,
# 30 M at the C port's 10 Gb/s); each run is stopped with SIGUSR1, the test's own stop, after
# SECS seconds of measuring, and the test prints its cycles per packet over what it forwarded.
# Configurations alternate run by run; the median of RUNS is reported, with the ratio to
# net_null.
#
# Usage: scripts/pmd-perf.sh [--secs N] [--runs N] [--configs "rs rs-port c null"] [--out FILE]
#   (default 5 s, 3 runs, all four, FILE target/pmd-perf.md)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
secs=5 runs=3 configs="rs rs-port c null" out="$top/target/pmd-perf.md"
while [ $# -gt 0 ]; do
  case "$1" in
    --secs) secs=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//; /^set -euo/d' >&2; exit 2 ;;
  esac
done
set -- --secs "$secs" --runs "$runs" --configs "$configs" --out "$out"
. "$top/scripts/as-root.sh"

bash "$top/scripts/setup.sh"
(cd "$top" && cargo build --release -q -p mlx4-verbs -p rte_net_mlx4rs)
rel="${CARGO_TARGET_DIR:-$top/target}/release"
work=$(mktemp -d)
pid=""
cleanup() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  rm -rf "$work" /var/run/dpdk/mlx4rs-pmdperf-$$-*
}
trap cleanup EXIT
cd "$work"
eval "$(bash "$top/scripts/c-mlx4-env.sh" "$work/dev" "$rel/libmlx4_verbs.so")"
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$rel"
export MLX4RS_VERBS="ibdev=$MLX4RS_IBDEV,wire=loop,wc=on,stats=$work/c-stats"

eal() {
  case "$1" in
    rs) echo "--no-pci -d librte_net_mlx4rs.so --vdev net_mlx4rs0,wire=loop" ;;
    rs-port) echo "--no-pci -d librte_net_mlx4rs.so --vdev net_mlx4rs0,wire=loop,device_loop=port" ;;
    c) echo "-a $MLX4RS_PCI" ;;
    null) echo "--no-pci --vdev net_null0" ;;
    *) echo "pmd-perf: unknown configuration $1" >&2; exit 2 ;;
  esac
}

# Waits (at most $3 s) for $2 in file $1.
wait_for() {
  local end=$((SECONDS + $3))
  until grep -q "$2" "$1"; do
    if [ $SECONDS -ge $end ] || ! kill -0 "$pid" 2>/dev/null; then
      echo "pmd-perf: no '$2' after $3 s:" >&2; cat "$1" >&2; return 1
    fi
    sleep 0.1
  done
}

# One run: prints "<cycles per packet> <packets>".
run() {
  local log="$work/$1-$2.log" fifo="$work/in"
  rm -f "$fifo"; mkfifo "$fifo"
  # shellcheck disable=SC2046
  stdbuf -oL dpdk-test -l 0-1 --no-huge -m 512 --file-prefix="mlx4rs-pmdperf-$$-$1-$2" \
    $(eal "$1") <"$fifo" >"$log" 2>&1 &
  pid=$!
  exec 3>"$fifo"
  echo pmd_perf_autotest >&3
  wait_for "$log" "Test will stop after" 60
  sleep "$secs"
  kill -USR1 "$pid"
  wait_for "$log" "^Test \(OK\|Failed\)" 60
  echo quit >&3
  exec 3>&-
  wait "$pid" || { echo "pmd-perf: dpdk-test ($1) exit $?:" >&2; cat "$log" >&2; exit 1; }
  pid=""
  grep -q "^Test OK" "$log" || { cat "$log" >&2; exit 1; }
  echo "$(sed -n 's/^Result: \([0-9]*\) cycles per packet/\1/p' "$log") $(sed -n 's/^\([0-9]*\) packet, .*/\1/p' "$log")"
}

declare -A res pk
for r in $(seq 1 "$runs"); do
  for c in $configs; do
    read -r cyc n < <(run "$c" "$r")
    res[$c]="${res[$c]:-} $cyc"; pk[$c]="${pk[$c]:-} $n"
    echo "run $r $c: $cyc cycles/pkt over $n packets"
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
null_med=""
[[ " $configs " == *" null "* ]] && null_med=$(echo "${res[null]}" | median)
{
  echo "# pmd_perf_autotest, continuous rx/tx, one looped port"
  echo
  echo "$(date -u +%F\ %H:%M) UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg) at the end;" \
    "$runs runs of ${secs} s each, alternating; median."
  echo "Command: scripts/pmd-perf.sh --secs $secs --runs $runs --configs \"$configs\""
  echo
  echo "| configuration | cycles/pkt (median) | runs | ratio to net_null |"
  echo "|---|---|---|---|"
  for c in $configs; do
    m=$(echo "${res[$c]}" | median)
    ratio=-
    [ -z "$null_med" ] || ratio=$(awk -v a="$m" -v b="$null_med" 'BEGIN {printf "%.1f", a / b}')
    echo "| $c | $m | ${res[$c]# } | $ratio |"
  done
} | tee "$out"
