#!/usr/bin/env bash
# DPDK's own C mlx4 driver (Debian's librte_net_mlx4.so, through the verbs stand-in) and
# net_mlx4rs side by side, on the same software HCA in the same device mode (a device thread
# per adapter, as the stand-in runs it: net_mlx4rs with device_loop=port; write combining on,
# default BlueFlame register). Each part alternates its configurations run by run and reports
# the median of N runs (default 3):
#
# - tx: dpdk-testpmd txonly, 64 B, burst 32, one port on the null wire: Mpps, and Mpps per
#   second of the forwarding lcore's CPU time, with the spread of each over the runs; doorbells,
#   BlueFlame writes and WQE fetches per packet from the model's counters over those runs; and
#   tx_burst instructions per packet from callgrind: scripts/tx_burst_cost.c sends full bursts
#   through `measured_tx` and lets the device drain between calls, so only calls that send the
#   whole burst are counted (Debian's driver is stripped: its tx_burst has no symbol to toggle).
#   net_mlx4rs runs as it comes (bf=auto: BlueFlame when write combining works) and with bf=off
#   (one doorbell per burst, what the C driver always does). rx_burst likewise
#   (tx_burst_cost.c --rx 1 on a looped wire: one measured call per delivered burst, the
#   mempool refill included).
# - cable: dpdk-testpmd io forwarding, burst 32, between a C-driven port and a net_mlx4rs port
#   joined by a cable file (wire=cable:<path>; the two ports live in the stand-in's copy of the
#   model and the plugin's), against two net_mlx4rs ports on the same kind of cable: Mpps each
#   way, every frame sent found received or counted dropped, doorbells and WQE fetches per packet
#   of each sender.
# - pktgen (where PKTGEN points to a Pktgen-DPDK built with Lua, see scripts/pktgen.sh): one
#   Pktgen process with the C port and two net_mlx4rs ports (bf=auto, bf=off) on the null wire,
#   sending 64 B frames unpaced in turns (scripts/pktgen.lua): Mpps of each.
#
# So that the two drivers' figures hold still on a 2-core machine, the tx part keeps the
# forwarding lcore (testpmd's lcore 1, on CPU 1) and the device threads apart: each device
# thread spins (busy_poll=1, in both drivers' models) pinned to CPU $PIN_CPU (default 0, where
# testpmd's main lcore only waits for commands). --no-pin leaves them to the scheduler.
#
# Usage: [PKTGEN=/path/to/pktgen] scripts/c-mlx4-bench.sh [--secs N] [--runs N] [--bursts N]
#          [--parts "tx cable pktgen"] [--out FILE] [--no-pin]
#   (default 5 s per run, 5 runs, 2000 measured bursts, parts tx and cable plus pktgen when
#   PKTGEN is set, FILE target/c-mlx4-bench.md)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
secs=5 runs=5 bursts=2000 out="$top/target/c-mlx4-bench.md" parts="" pin=1
while [ $# -gt 0 ]; do
  case "$1" in
    --secs) secs=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --bursts) bursts=$2; shift 2 ;;
    --parts) parts=$2; shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --pktgen) PKTGEN=$2; shift 2 ;; # how a re-run under sudo keeps PKTGEN
    --no-pin) pin=0; shift ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//; /^set -euo/d' >&2; exit 2 ;;
  esac
done
[ -n "$parts" ] || parts="tx cable${PKTGEN:+ pktgen}"
for p in $parts; do
  case $p in tx | cable | pktgen) ;; *) echo "c-mlx4-bench: --parts takes tx, cable and pktgen, not '$p'" >&2; exit 2 ;; esac
done
has_part() { [[ " $parts " == *" $1 "* ]]; }
if has_part pktgen; then
  # The same refusals as pktgen.sh's (unset, not a Pktgen, another DPDK, no Lua).
  bash "$top/scripts/pktgen.sh" --check
  set -- --secs "$secs" --runs "$runs" --bursts "$bursts" --parts "$parts" --out "$out" --pktgen "$PKTGEN"
else
  set -- --secs "$secs" --runs "$runs" --bursts "$bursts" --parts "$parts" --out "$out"
fi
[ "$pin" = 1 ] || set -- "$@" --no-pin
. "$top/scripts/as-root.sh"

bash "$top/scripts/setup.sh"
(cd "$top" && cargo build --release -q -p mlx4-verbs -p rte_net_mlx4rs)
rel="${CARGO_TARGET_DIR:-$top/target}/release"
# EAL refuses -d paths under world-writable directories: bare names through LD_LIBRARY_PATH,
# from a directory that does not hold the libraries.
work=$(mktemp -d)
# EAL's runtime directories go too (one per prefix this script runs with).
trap 'rm -rf "$work" /var/run/dpdk/c-mlx4-bench-$$ /var/run/dpdk/c-mlx4-cg-$$ /var/run/dpdk/c-mlx4-pg-$$' EXIT
cd "$work"
eval "$(bash "$top/scripts/c-mlx4-env.sh" "$work/dev" "$rel/libmlx4_verbs.so")"
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$rel"
# net_mlx4rs claims the ConnectX-3 IDs too: with both plugins named, Debian's first gets the card.
c_pmd=$(ls "$(pkg-config --variable=libdir libdpdk)"/dpdk/pmds-*/librte_net_mlx4.so)

. "$top/scripts/lcore-cpu.sh"
pin_cpu=${PIN_CPU:-0}
load() { cut -d' ' -f1-3 /proc/loadavg; }
load_start=$(load)
# The stand-in's device for this run: $1 = wire, $2 = the file its counters go to at close.
spin=""
[ "$pin" = 1 ] && spin=",busy_poll=1"
verbs() { export MLX4RS_VERBS="ibdev=$MLX4RS_IBDEV,wire=$1,wc=on,stats=$2${3:+$spin}"; }
ours=wc=on,device_loop=port
# The tx part's own: spinning device threads where they are pinned.
ours_tx=$ours$spin

# driver -> EAL arguments of the tx part.
eal() {
  case "$1" in
    c) echo "-a $MLX4RS_PCI" ;;
    rs) echo "--no-pci -d librte_net_mlx4rs.so --vdev net_mlx4rs0,wire=null,$ours_tx" ;;
    rs-db) echo "--no-pci -d librte_net_mlx4rs.so --vdev net_mlx4rs0,wire=null,$ours_tx,bf=off" ;;
    rs-gather) echo "--no-pci -d librte_net_mlx4rs.so --vdev net_mlx4rs0,wire=null,$ours_tx,bf=off,txq_inline=0" ;;
  esac
}
drivers=(c rs rs-db)
# Instructions also with inlining off: a pointer per packet, as the C driver writes.
cg_drivers=(c rs rs-db rs-gather)

# testpmd with EAL arguments $2 and application arguments $3, fed the commands on stdin, output
# to $1.log.
testpmd() {
  timeout $((secs + 90)) stdbuf -oL dpdk-testpmd -l 0-1 --no-huge -m 512 \
    --file-prefix="c-mlx4-bench-$$" $2 -- -i $3 --burst=32 --txd=512 --rxd=512 \
    --total-num-mbufs=16384 > "$1.log" 2>&1 || { cat "$1.log"; exit 1; }
}

if has_part tx; then
  for run in $(seq 1 "$runs"); do
    for d in "${drivers[@]}"; do
      verbs null "$work/$d.$run.model" tx
      prefix="c-mlx4-bench-$$"
      {
        sleep 2
        if [ "$pin" = 1 ]; then
          n=$(pin_threads "$prefix" "$pin_cpu" 'mlx4-hca*')
          [ "$n" -gt 0 ] || echo "c-mlx4-bench: no device thread of $d to pin" >&2
        fi
        echo start; sleep 1; lcore_cpu_ns "$prefix" > "$d.$run.cpu"; echo "show port stats 0"
        sleep "$secs"
        lcore_cpu_ns "$prefix" >> "$d.$run.cpu"; echo "show port stats 0"; echo stop
        echo "show port xstats 0"; echo quit
      } | testpmd "$d.$run" "$(eal "$d")" "--forward-mode=txonly --txpkts=64"
      echo "c-mlx4-bench: tx run $run $d done" >&2
    done
  done

  gcc -O2 -g -o tx_burst_cost "$top/scripts/tx_burst_cost.c" $(pkg-config --cflags --libs libdpdk)
  for d in "${cg_drivers[@]}"; do
    verbs null "$work/$d.cg.model"
    valgrind --tool=callgrind --fair-sched=yes --toggle-collect=measured_tx \
      --callgrind-out-file="$work/$d.cg" ./tx_burst_cost -l 0-1 --no-huge -m 512 \
      --file-prefix="c-mlx4-cg-$$" $(eal "$d") -- --bursts "$bursts" \
      > "$d.cg.log" 2>&1 || { cat "$d.cg.log"; exit 1; }
    echo "c-mlx4-bench: callgrind $d done" >&2
  done
  # rx_burst the same way, on a looped wire (the refill from the mempool included).
  for d in c rs; do
    verbs loop "$work/$d.cgrx.model"
    eal_rx=$(eal "$d" | sed 's/wire=null/wire=loop/')
    valgrind --tool=callgrind --fair-sched=yes --toggle-collect=measured_rx \
      --callgrind-out-file="$work/$d.cgrx" ./tx_burst_cost -l 0-1 --no-huge -m 512 \
      --file-prefix="c-mlx4-cg-$$" $eal_rx -- --rx 1 --bursts "$bursts" \
      > "$d.cgrx.log" 2>&1 || { cat "$d.cgrx.log"; exit 1; }
    echo "c-mlx4-bench: callgrind rx $d done" >&2
  done
fi

if has_part cable; then
  # cab-c: port 0 the C driver's, port 1 ours; cab-rs: both ours. A fresh cable file per run.
  for run in $(seq 1 "$runs"); do
    for d in cab-c cab-rs; do
      cable="$work/$d.$run.cable"
      verbs "cable:$cable" "$work/$d.$run.model"
      if [ "$d" = cab-c ]; then
        args="-a $MLX4RS_PCI -d $c_pmd -d librte_net_mlx4rs.so --vdev net_mlx4rs0,wire=cable:$cable,$ours"
      else
        args="--no-pci -d librte_net_mlx4rs.so --vdev net_mlx4rs0,wire=cable:$cable,$ours"
        args+=" --vdev net_mlx4rs1,wire=cable:$cable,$ours"
      fi
      # 8 bursts of 32 each way circulate; after stop the device delivers what is in flight
      # before the ports stop, so that every frame sent is received or counted.
      {
        sleep 2; echo "start tx_first 8"; sleep 1; echo "show port stats all"; sleep "$secs"
        echo "show port stats all"; echo stop; sleep 1; echo "port stop all"
        echo "show port xstats all"; echo quit
      } | testpmd "$d.$run" "$args" "--forward-mode=io"
      echo "c-mlx4-bench: cable run $run $d done" >&2
    done
  done
fi

if has_part pktgen; then
  # Port 0 the C driver's, ports 1 and 2 ours (bf=auto, bf=off), all on the null wire; lcore 1
  # serves all three, lcore 0 is Pktgen's own. Pktgen wants a terminal on stdin: `script`.
  verbs null "$work/pg.model"
  prefix="c-mlx4-pg-$$"
  pg=("$PKTGEN" -l 0-1 --no-huge -m 6144 --file-prefix="$prefix" -a "$MLX4RS_PCI" -d "$c_pmd"
    -d librte_net_mlx4rs.so --vdev "net_mlx4rs0,wire=null,$ours"
    --vdev "net_mlx4rs1,wire=null,$ours,bf=off" -- -m "1.[0-2]" -f "$top/scripts/pktgen.lua")
  echo "${pg[*]}" > pg.cmd
  PG_OUT="$work/pg.res" PG_MODE=tx PG_SECS="$secs" PG_ROUNDS="$runs" PG_SIZES=64 PG_PORTS="0 1 2" \
    PG_TELEMETRY="python3 $top/scripts/pktgen_telemetry.py $prefix" \
    timeout $((120 + 3 * runs * (secs + 30))) script -qfec "$(printf '%q ' "${pg[@]}")" /dev/null \
    < /dev/null > pg.log 2>&1 || { tail -c 3000 pg.log; echo "c-mlx4-bench: Pktgen failed" >&2; exit 1; }
  if grep -q '^error' pg.res; then
    echo "c-mlx4-bench: the Lua script stopped: $(grep '^error' pg.res)" >&2
    exit 1
  fi
  echo "c-mlx4-bench: pktgen done" >&2
fi

python3 - "$work" "$runs" "$secs" "$bursts" "$load_start" "$(load)" "$parts" "$pin" > "$out" <<'PY'
import os, re, statistics, sys
work, runs, secs, bursts, load0, load1, parts, pin = sys.argv[1:]
runs = int(runs)
parts = parts.split()
C = "net_mlx4 (DPDK's C driver)"
names = {"c": C, "rs": "net_mlx4rs (bf=auto)", "rs-db": "net_mlx4rs (bf=off)",
         "rs-gather": "net_mlx4rs (bf=off, txq_inline=0)"}


def read(path):
    return open(path, errors="replace").read()


def model_file(path):
    """The model's counters the stand-in wrote when the C driver closed its context."""
    return {k: int(v) for k, v in re.findall(r"^(\w+) (\d+)$", read(path), re.M)}


def xstats_by_port(log):
    """{port: {counter: value}} of the model (hca_* xstats) from testpmd's `show port xstats`."""
    got = {}
    for port, body in re.findall(r"NIC extended statistics for port (\d+)\s*\n(.*?)(?=#####|testpmd>|\Z)",
                                 log, re.S):
        got[int(port)] = {k[4:]: int(v) for k, v in re.findall(r"^(hca_\w+): (\d+)$", body, re.M)}
    return got


def pps_by_port(log, key):
    """{port: [values of `key` in each `show port stats` of that port, in order]}."""
    got = {}
    for port, body in re.findall(r"NIC statistics for port (\d+)\s+#+\n(.*?)#####", log, re.S):
        m = re.search(key + r":\s+(\d+)", body)
        if m:
            got.setdefault(int(port), []).append(int(m.group(1)))
    return got


def instructions(d, log="cg"):
    """tx_burst (rx_burst: log "cgrx") instructions per packet under callgrind, and the calls
    that moved less than the burst."""
    cg = read(f"{work}/{d}.{log}.log")
    ir = int(re.search(r"Collected : (\d+)", cg).group(1))
    m = re.search(r"packets (\d+) short (\d+)", cg)
    return ir / int(m.group(1)), int(m.group(2))


def per_pkt(tot, key):
    return tot.get(key, 0) / max(tot.get("tx_frames", 0), 1)


def runs_s(xs):
    return " / ".join(f"{x:.2f}" for x in xs)


def spread(xs):
    """(max - min) / median, in per cent."""
    return f"{100 * (max(xs) - min(xs)) / statistics.median(xs):.0f}%" if xs else "?"


if "tx" in parts:
    rows = []
    for d in ("c", "rs", "rs-db"):
        mpps, per_cpu, tot = [], [], {}
        for run in range(1, runs + 1):
            log = read(f"{work}/{d}.{run}.log")
            clean = re.sub(r"testpmd> [^\n#]*", "", log)
            pps = pps_by_port(clean, "Tx-pps").get(0, [])
            if len(pps) < 2:
                sys.exit(f"no rate in {d} run {run}:\n{log}")
            mpps.append(pps[-1] / 1e6)
            # Packets sent between the two `show port stats`, per second of the lcore's CPU.
            sent = pps_by_port(clean, "TX-packets").get(0, [])
            cpu = [int(x) for x in read(f"{work}/{d}.{run}.cpu").split()]
            if len(sent) >= 2 and len(cpu) == 2 and cpu[1] > cpu[0]:
                per_cpu.append((sent[-1] - sent[-2]) / ((cpu[1] - cpu[0]) / 1e9) / 1e6)
            m = model_file(f"{work}/{d}.{run}.model") if d == "c" else xstats_by_port(log)[0]
            # The driver's own writes (ours count them; the model's count is a lower bound).
            for k, v in re.findall(r"^tx_(doorbells|bf_writes): (\d+)$", log, re.M):
                m["driver_" + k] = m.get("driver_" + k, 0) + int(v)
            for k, v in m.items():
                tot[k] = tot.get(k, 0) + v
        ipp, short = instructions(d)
        path = re.search(r"TX path (\w+)", read(f"{work}/{d}.1.log"))
        writes = tot.get("driver_doorbells", 0) + tot.get("driver_bf_writes", 0)
        writes = f"{writes / max(tot.get('tx_frames', 0), 1):.4f}" if d != "c" else "n/a"
        rows.append((names[d], statistics.median(mpps), mpps, per_cpu, ipp, short, writes,
                     per_pkt(tot, "doorbells"), per_pkt(tot, "bf_bursts"),
                     per_pkt(tot, "wqe_fetched"), per_pkt(tot, "wqe_from_bf"),
                     path.group(1) if path else "doorbell"))

    print("### testpmd txonly\n")
    print("| driver | TX path | Mpps (median) | runs | spread | Mpps per lcore CPU-second (median) | runs | spread | tx_burst instr/pkt | the driver's doorbells + BF writes/pkt | doorbells/pkt | BF writes/pkt | WQEs fetched/pkt | WQEs from BF/pkt |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, med, all_, cpu, ipp, short, writes, db, bf, fetch, frombf, path in rows:
        note = f" ({short} short calls)" if short else ""
        cmed = f"{statistics.median(cpu):.2f}" if cpu else "?"
        print(f"| {name} | {path} | {med:.2f} | {runs_s(all_)} | {spread(all_)} | {cmed} | {runs_s(cpu)} | {spread(cpu)} | {ipp:.1f}{note} | {writes} | {db:.4f} | {bf:.4f} | {fetch:.4f} | {frombf:.4f} |")
    print(f"| {names['rs-gather']} | doorbell, gather | | | | | | | {instructions('rs-gather')[0]:.1f} | | | | | |")
    med = {r[0]: r for r in rows}
    c, rs, db = med[names["c"]], med[names["rs"]], med[names["rs-db"]]
    if c[3] and rs[3] and db[3]:
        print(f"\nOurs / C, per lcore CPU-second (medians): bf=auto "
              f"{statistics.median(rs[3]) / statistics.median(c[3]):.2f}, bf=off "
              f"{statistics.median(db[3]) / statistics.median(c[3]):.2f}; by wall-clock Mpps: "
              f"{rs[1] / c[1]:.2f} and {db[1] / c[1]:.2f}.")
    print()
    print("| driver | rx_burst instr/pkt, burst 32, refill included |\n|---|---|")
    for d in ("c", "rs"):
        ipp, short = instructions(d, "cgrx")
        note = f" ({short} short calls)" if short else ""
        print(f"| {names[d]} | {ipp:.1f}{note} |")
    print()
    placement = (f"device threads spinning, pinned to CPU {os.environ.get('PIN_CPU', '0')}; the lcore on CPU 1"
                 if pin == "1" else "threads left to the scheduler")
    print(f"testpmd txonly, 64 B, burst 32, {secs} s per run, drivers alternating, median of {runs}; {placement}. "
          f"Instructions: callgrind over {bursts} full bursts of 32 (scripts/tx_burst_cost.c), "
          f"including the mbuf frees each driver does inside tx_burst and rte_eth_tx_burst's "
          f"inline wrapper.\n")

if "cable" in parts:
    DROPS = ("rx_drops_no_wqe", "rx_drops_wire", "rx_drops_cq_full", "rx_drops_too_long",
             "rx_drops_error", "rx_drops_not_ready", "rx_drops_filter", "rx_drops_mtu",
             "rx_drops_vlan", "rx_drops_flow")
    print("### testpmd io forwarding across a cable\n")
    print("| ports | direction (sender) | Mpps (median) | runs | sent | received | dropped and counted | lost uncounted | doorbells/pkt | BF writes/pkt | WQEs fetched/pkt |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for d, label, senders in (("cab-c", "C port 0 - net_mlx4rs port 1", ("net_mlx4, C", "net_mlx4rs")),
                              ("cab-rs", "net_mlx4rs port 0 - net_mlx4rs port 1", ("net_mlx4rs", "net_mlx4rs"))):
        mpps = {0: [], 1: []}
        tot = {0: {}, 1: {}}
        for run in range(1, runs + 1):
            log = read(f"{work}/{d}.{run}.log")
            pps = pps_by_port(re.sub(r"testpmd> [^\n#]*", "", log), "Tx-pps")
            x = xstats_by_port(log)
            if d == "cab-c":
                x[0] = model_file(f"{work}/{d}.{run}.model")
            for p in (0, 1):
                if len(pps.get(p, [])) < 2 or p not in x:
                    sys.exit(f"no rate or counters of port {p} in {d} run {run}:\n{log}")
                mpps[p].append(pps[p][1] / 1e6)
                for k, v in x[p].items():
                    tot[p][k] = tot[p].get(k, 0) + v
        for a, b in ((0, 1), (1, 0)):
            sent, got = tot[a].get("tx_frames", 0), tot[b].get("rx_frames", 0)
            dropped = sum(tot[b].get(k, 0) for k in DROPS) + tot[a].get("tx_drops_wire", 0)
            print(f"| {label} | {a} -> {b} ({senders[a]}) | {statistics.median(mpps[a]):.3f} | "
                  f"{' / '.join(f'{x:.3f}' for x in mpps[a])} | {sent:,} | {got:,} | {dropped:,} | "
                  f"{sent - got - dropped:,} | {per_pkt(tot[a], 'doorbells'):.4f} | "
                  f"{per_pkt(tot[a], 'bf_bursts'):.4f} | {per_pkt(tot[a], 'wqe_fetched'):.4f} |")
    print()
    print(f"testpmd io forwarding, burst 32, `start tx_first 8` (256 frames each way in flight), "
          f"{secs} s per run, the two cablings alternating, median of {runs}; counts are the "
          f"model's over the {runs} runs, taken after `stop` and `port stop all` (frames in "
          f"flight delivered).\n")

if "pktgen" in parts:
    recs = []
    for line in open(f"{work}/pg.res"):
        w = line.split()
        recs.append((w[0], dict(x.split("=", 1) for x in w[1:] if "=" in x)))
    labels = {0: C, 1: "net_mlx4rs (bf=auto)", 2: "net_mlx4rs (bf=off)"}
    print("### Pktgen-DPDK\n")
    print("| port | Mpps (median) | rounds | lcore 1's share of each window | Mpps per second of lcore 1 (median) | doorbells/pkt | BF writes/pkt | WQEs fetched/pkt |")
    print("|---|---|---|---|---|---|---|---|")
    for p in (0, 1, 2):
        tx = [f for k, f in recs if k == "tx" and int(f["port"]) == p]
        mpps = [float(f["tx_pps"]) / 1e6 for f in tx]
        share = " / ".join(f"{float(f['lcore_share']):.2f}" for f in tx)
        # What the lcore would send with a core of its own (the neighbours take the rest).
        per_cpu = [float(f["tx_pps"]) / 1e6 / float(f["lcore_share"]) for f in tx
                   if float(f["lcore_share"]) > 0]
        per_cpu = f"{statistics.median(per_cpu):.2f}" if per_cpu else "?"
        x = next((f for k, f in recs if k == "xstats" and int(f["port"]) == p), {})
        if "hca_tx_frames" in x:
            n = max(int(x["hca_tx_frames"]), 1)
            model = " | ".join(f"{int(x.get('hca_' + k, 0)) / n:.4f}" for k in ("doorbells", "bf_bursts", "wqe_fetched"))
        else:
            # The stand-in writes the model's counters when the C driver closes its context;
            # Pktgen exits without closing its ports.
            model = "n/a | n/a | n/a"
        print(f"| {labels[p]} | {statistics.median(mpps):.2f} | {runs_s(mpps)} | {share} | {per_cpu} | {model} |")
    print()
    cmd = read(f"{work}/pg.cmd").strip()
    print(f"One Pktgen process, 64 B frames, unpaced (`tx_cycles 1`), the ports sending in turns "
          f"(scripts/pktgen.lua, PG_MODE=tx PG_SIZES=64 PG_ROUNDS={runs} PG_SECS={secs} "
          f"PG_PORTS=\"0 1 2\"), rates over a window that opens once frames flow: `{cmd}`.\n")

print(f"Software HCA with a device thread per adapter (net_mlx4rs: device_loop=port), write "
      f"combining on; release builds. Load average before/after: {load0} / {load1} "
      f"({os.cpu_count()} CPUs, shared).")
PY
cat "$out"
