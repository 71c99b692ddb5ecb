#!/usr/bin/env bash
# Instructions per packet of tx_burst per TX path, counted by callgrind: txbench --callgrind
# pushes a fixed number of packets through the driver's TX queue against the software HCA
# stepped in the same thread (no EAL, no device thread), and only `measured_burst` (the queue's
# burst function) is collected, so the count is the driver's and repeats exactly.
# A second table counts burst 1 with doorbell avoidance on; a third a call on a full ring (the
# device held), which sends nothing; a fourth the same bursts with real rte_mbufs through EAL;
# a fifth rx_burst.
# Usage: apps/txbench/callgrind.sh [packets]   (default 100000)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
packets=${1:-100000}
cd "$top"
cargo build --release -q -p txbench
bin="${CARGO_TARGET_DIR:-$top/target}/release/txbench"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '| path | burst | size | inline | instructions/packet | doorbells/pkt | BF writes/pkt |\n|---|---|---|---|---|---|---|\n'
for path in bf-wc bf-nowc doorbell; do
  for point in "1 64 104" "32 64 104" "32 512 104" "32 512 928"; do
    set -- $point
    out="$work/cg.$path.$1.$2.$3"
    valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect='*measured_burst*' \
      "$bin" --callgrind --path "$path" --burst "$1" --size "$2" --inline "$3" --packets "$packets" \
      > "$out.stdout" 2> "$out.stderr"
    ir=$(sed -n 's/^==[0-9]*== Collected : \([0-9]*\)/\1/p' "$out.stderr")
    db=$(sed -n 's/.*doorbells\/pkt \([0-9.]*\).*/\1/p' "$out.stdout")
    bf=$(sed -n 's/.*bf_writes\/pkt \([0-9.]*\).*/\1/p' "$out.stdout")
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$path" "$1" "$2" "$3" \
      "$(awk -v a="$ir" -v n="$packets" 'BEGIN { printf "%.1f", a / n }')" "$db" "$bf"
  done
done
# Doorbell avoidance on, at burst 1: the device runs after every burst, so nothing is skipped,
# and the count is what avoidance costs a call (the detour, a completion asked per doorbell).
printf '\n| path | burst | size | inline | instructions/packet, doorbell avoidance on | doorbells/pkt | BF writes/pkt |\n|---|---|---|---|---|---|---|\n'
for path in bf-wc doorbell; do
  out="$work/cg.avoid.$path"
  valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect='*measured_burst*' \
    "$bin" --callgrind --avoid --path "$path" --burst 1 --size 64 --inline 104 \
    --packets "$packets" > "$out.stdout" 2> "$out.stderr"
  ir=$(sed -n 's/^==[0-9]*== Collected : \([0-9]*\)/\1/p' "$out.stderr")
  db=$(sed -n 's/.*doorbells\/pkt \([0-9.]*\).*/\1/p' "$out.stdout")
  bf=$(sed -n 's/.*bf_writes\/pkt \([0-9.]*\).*/\1/p' "$out.stdout")
  printf '| %s | 1 | 64 | 104 | %s | %s | %s |\n' "$path" \
    "$(awk -v a="$ir" -v n="$packets" 'BEGIN { printf "%.1f", a / n }')" "$db" "$bf"
done
# A call on a full ring sends nothing: instructions per call, a row of its own.
printf '\n| path | burst | size | inline | instructions per call on a full ring |\n|---|---|---|---|---|\n'
for path in bf-wc doorbell; do
  out="$work/cg.full.$path"
  valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect='*measured_full_ring*' \
    "$bin" --callgrind --full-ring --path "$path" --burst 32 --size 64 --inline 104 \
    --packets "$packets" > "$out.stdout" 2> "$out.stderr"
  ir=$(sed -n 's/^==[0-9]*== Collected : \([0-9]*\)/\1/p' "$out.stderr")
  printf '| %s | 32 | 64 | 104 | %s |\n' "$path" \
    "$(awk -v a="$ir" -v n="$packets" 'BEGIN { printf "%.1f", a / n }')"
done
# Real rte_mbufs through EAL and rte_eth_fp_ops, the device on its own thread (hence
# --fair-sched=yes); every measured call sends its whole burst. The mempool put is the
# inclusive cost of rte_pktmbuf_free_bulk or mlx4rs_mempool_put_bulk, which the second
# figure leaves out.
mbuf_packets=$(( packets < 20000 ? packets : 20000 ))
printf '\n| path | burst | size | inline | instructions/packet, rte_mbuf through EAL | without the mempool put |\n|---|---|---|---|---|---|\n'
for path in bf-wc doorbell; do
  for point in "1 64 104" "32 64 104" "32 512 104"; do
    set -- $point
    out="$work/cg.mbuf.$path.$1.$2.$3"
    valgrind --tool=callgrind --fair-sched=yes --callgrind-out-file="$out" \
      --toggle-collect='*measured_eal_burst*' \
      "$bin" --callgrind --mbufs --path "$path" --burst "$1" --size "$2" --inline "$3" \
      --packets "$mbuf_packets" > "$out.stdout" 2> "$out.stderr"
    ir=$(sed -n 's/^==[0-9]*== Collected : \([0-9]*\)/\1/p' "$out.stderr")
    # DPDK's free, or the straight put of a batch of mbufs that need nothing else.
    put=$(callgrind_annotate --inclusive=yes "$out" 2>/dev/null \
      | sed -n 's/^ *\([0-9,]*\) .*:\(rte_pktmbuf_free_bulk\|mlx4rs_mempool_put_bulk\) .*/\1/p' \
      | tr -d , | awk '{ s += $1 } END { print s + 0 }')
    printf '| %s | %s | %s | %s | %s | %s |\n' "$path" "$1" "$2" "$3" \
      "$(awk -v a="$ir" -v n="$mbuf_packets" 'BEGIN { printf "%.1f", a / n }')" \
      "$(awk -v a="$ir" -v p="${put:-0}" -v n="$mbuf_packets" 'BEGIN { printf "%.1f", (a - p) / n }')"
  done
done
# rx_burst, frames looped back by the device in step mode, the refill included.
printf '\n| rx_burst | burst | size | instructions/packet |\n|---|---|---|---|\n'
for point in "32 64" "1 64"; do
  set -- $point
  out="$work/cg.rx.$1.$2"
  valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect='*measured_rx_burst*' \
    "$bin" --callgrind --rx --burst "$1" --size "$2" --packets "$packets" \
    > "$out.stdout" 2> "$out.stderr"
  ir=$(sed -n 's/^==[0-9]*== Collected : \([0-9]*\)/\1/p' "$out.stderr")
  printf '| step mode | %s | %s | %s |\n' "$1" "$2" \
    "$(awk -v a="$ir" -v n="$packets" 'BEGIN { printf "%.1f", a / n }')"
done
