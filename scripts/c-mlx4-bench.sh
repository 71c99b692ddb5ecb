#!/usr/bin/env bash
# DPDK's own C mlx4 driver (Debian's librte_net_mlx4.so, through the verbs stand-in) and
# net_mlx4rs side by side, on the same software HCA in the same device mode (a device thread
# of its own, null wire, write combining on, default BlueFlame register):
#
# - Mpps: dpdk-testpmd txonly, 64 B, burst 32, one port, the drivers alternating run by run,
#   median of N runs (default 3);
# - doorbells, BlueFlame writes and WQE fetches per packet, from the model's counters over those
#   runs;
# - tx_burst instructions per packet, from callgrind: scripts/tx_burst_cost.c sends full bursts
#   through `measured_tx` and lets the device drain between calls, so only calls that send the
#   whole burst are counted (Debian's driver is stripped: its tx_burst has no symbol to toggle).
#
# net_mlx4rs runs twice: as it comes (bf=auto: BlueFlame when write combining works) and with
# bf=off (one doorbell per burst, what the C driver always does).
#
# Usage: scripts/c-mlx4-bench.sh [--secs N] [--runs N] [--bursts N] [--out FILE]
#   (default 5 s per run, 3 runs, 2000 measured bursts, FILE target/c-mlx4-bench.md)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$top/scripts/as-root.sh"
secs=5 runs=3 bursts=2000 out="$top/target/c-mlx4-bench.md"
while [ $# -gt 0 ]; do
  case "$1" in
    --secs) secs=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --bursts) bursts=$2; shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//; /^set -euo/d' >&2; exit 2 ;;
  esac
done

bash "$top/scripts/setup.sh"
(cd "$top" && cargo build --release -q -p mlx4-verbs -p rte_net_mlx4rs)
rel="$top/target/release"
# EAL refuses -d paths under world-writable directories: bare names through LD_LIBRARY_PATH,
# from a directory that does not hold the libraries.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
eval "$(bash "$top/scripts/c-mlx4-env.sh" "$work/dev" "$rel/libmlx4_verbs.so")"
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$rel"
gcc -O2 -g -o tx_burst_cost "$top/scripts/tx_burst_cost.c" $(pkg-config --cflags --libs libdpdk)

load() { cut -d' ' -f1-3 /proc/loadavg; }
load_start=$(load)

# driver -> EAL arguments; the C port's device mode is set through MLX4RS_VERBS.
eal() {
  case "$1" in
    c) echo "-a $MLX4RS_PCI" ;;
    rs) echo "--no-pci -d librte_net_mlx4rs.so --vdev net_mlx4rs0,wire=null,wc=on" ;;
    rs-db) echo "--no-pci -d librte_net_mlx4rs.so --vdev net_mlx4rs0,wire=null,wc=on,bf=off" ;;
  esac
}
drivers=(c rs rs-db)

for run in $(seq 1 "$runs"); do
  for d in "${drivers[@]}"; do
    export MLX4RS_VERBS="ibdev=$MLX4RS_IBDEV,wire=null,wc=on,stats=$work/$d.$run.model"
    {
      sleep 2; echo start; sleep 1; echo "show port stats 0"; sleep "$secs"
      echo "show port stats 0"; echo stop; echo "show port xstats 0"; echo quit
    } | timeout $((secs + 90)) stdbuf -oL dpdk-testpmd -l 0-1 --no-huge -m 512 \
        --file-prefix="c-mlx4-bench-$$" $(eal "$d") \
        -- -i --forward-mode=txonly --txpkts=64 --burst=32 --txd=512 --rxd=512 \
        --total-num-mbufs=16384 > "$d.$run.log" 2>&1 || { cat "$d.$run.log"; exit 1; }
    echo "c-mlx4-bench: run $run $d done" >&2
  done
done

for d in "${drivers[@]}"; do
  export MLX4RS_VERBS="ibdev=$MLX4RS_IBDEV,wire=null,wc=on,stats=$work/$d.cg.model"
  valgrind --tool=callgrind --fair-sched=yes --toggle-collect=measured_tx \
    --callgrind-out-file="$work/$d.cg" ./tx_burst_cost -l 0-1 --no-huge -m 512 \
    --file-prefix="c-mlx4-cg-$$" $(eal "$d") -- --bursts "$bursts" \
    > "$d.cg.log" 2>&1 || { cat "$d.cg.log"; exit 1; }
  echo "c-mlx4-bench: callgrind $d done" >&2
done

python3 - "$work" "$runs" "$secs" "$bursts" "$load_start" "$(load)" > "$out" <<'PY'
import re, statistics, sys
work, runs, secs, bursts, load0, load1 = sys.argv[1:]
runs = int(runs)
names = {"c": "net_mlx4 (DPDK's C driver)", "rs": "net_mlx4rs (bf=auto)",
         "rs-db": "net_mlx4rs (bf=off)"}

def model(d, run):
    """The model's counters: the stand-in's file for the C port, hca_* xstats for ours."""
    if d == "c":
        text = open(f"{work}/{d}.{run}.model").read()
        return {k: int(v) for k, v in re.findall(r"^(\w+) (\d+)$", text, re.M)}
    text = open(f"{work}/{d}.{run}.log").read()
    return {k[4:]: int(v) for k, v in re.findall(r"^(hca_\w+): (\d+)$", text, re.M)}

rows = []
for d in ("c", "rs", "rs-db"):
    mpps, tot = [], {}
    for run in range(1, runs + 1):
        log = re.sub(r"testpmd> [^\n#]*", "", open(f"{work}/{d}.{run}.log").read())
        pps = re.findall(r"Tx-pps:\s+(\d+)", log)
        if len(pps) < 2:
            sys.exit(f"no rate in {d} run {run}:\n{log}")
        mpps.append(int(pps[-1]) / 1e6)
        for k, v in model(d, run).items():
            tot[k] = tot.get(k, 0) + v
    cg = open(f"{work}/{d}.cg.log").read()
    ir = int(re.search(r"Collected : (\d+)", cg).group(1))
    m = re.search(r"packets (\d+) short (\d+)", cg)
    pkts, short = int(m.group(1)), int(m.group(2))
    path = re.search(r"TX path (\w+)", open(f"{work}/{d}.1.log").read())
    f = max(tot.get("tx_frames", 0), 1)
    rows.append((names[d], statistics.median(mpps), mpps, ir / pkts, short,
                 tot.get("doorbells", 0) / f, tot.get("bf_bursts", 0) / f,
                 tot.get("wqe_fetched", 0) / f, tot.get("wqe_from_bf", 0) / f,
                 path.group(1) if path else "doorbell"))

print("| driver | TX path | Mpps (median) | runs | tx_burst instr/pkt | doorbells/pkt | BF writes/pkt | WQEs fetched/pkt | WQEs from BF/pkt |")
print("|---|---|---|---|---|---|---|---|---|")
for name, med, all_, ipp, short, db, bf, fetch, frombf, path in rows:
    runs_s = " / ".join(f"{x:.2f}" for x in all_)
    note = f" ({short} short calls)" if short else ""
    print(f"| {name} | {path} | {med:.2f} | {runs_s} | {ipp:.1f}{note} | {db:.4f} | {bf:.4f} | {fetch:.4f} | {frombf:.4f} |")
print()
print(f"testpmd txonly, 64 B, burst 32, {secs} s per run, drivers alternating, median of {runs}; "
      f"software HCA with a device thread of its own, null wire, WC on; release builds. "
      f"Instructions: callgrind over {bursts} full bursts of 32 (scripts/tx_burst_cost.c), "
      f"including the mbuf frees each driver does inside tx_burst and rte_eth_tx_burst's "
      f"inline wrapper. Load average before/after: {load0} / {load1} (2 cores shared).")
PY
cat "$out"
