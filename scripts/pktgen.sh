#!/usr/bin/env bash
# Measures the driver with Pktgen-DPDK: PKTGEN=/path/to/pktgen bash scripts/pktgen.sh
#
# The project holds no Pktgen: the user builds Pktgen-DPDK (23.06, with its Lua support) against
# the installed DPDK and points PKTGEN at the binary. Runs, each one Pktgen process on two
# lcores (lcore 0 is Pktgen's display and timers, lcore 1 polls both ports), with the default
# device mode (the software HCA runs in the polling lcore):
#  1. TX rate, for each TX path (BlueFlame; doorbell with bf=off) and frame size: port 0 ours
#     on the null wire, port 1 net_null (no-rx=1), in the same Pktgen process; they take
#     turns, unpaced, --rounds times, and the median ratio of their rates is the figure.
#  2. Two of our ports cabled (wire=peer), both sending unpaced: TX and RX rates of both, the
#     frames lost and the counters that hold them (imissed, ierrors, rx_nombuf; hca_* causes).
#     Then only port 0 sends while port 1 is polled for fewer frames than that (a receiver
#     slower than its sender), and then both send paced, from the rate the receivers took down
#     by halves, until every frame arrives.
#  3. (--parts profile) Where the time goes: one port at a time sending 64 B frames under
#     callgrind, counting instructions per packet in Pktgen's send function, split into Pktgen,
#     the driver's tx_burst and the device the burst glue runs. Exact, whatever the load.
# Prints the tables and writes them, with each run's results and log, to the report directory.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
args=("$@")

usage() {
  cat <<'EOF'
usage: PKTGEN=/path/to/pktgen bash scripts/pktgen.sh [options]
  --out DIR       report directory (default: target/pktgen-report)
  --secs N        seconds per measured interval (default 5)
  --rounds N      turns of ours and net_null per point (default 3)
  --sizes "A B"   frame sizes in bytes with CRC, as Pktgen counts them (default "64 128 512 1518")
  --parts "P ..." what to run, of tx, cable, profile (default "tx cable")
  --burst N       Pktgen's burst on every port (`set all burst N`; default: Pktgen's own, 64)
  --devargs "K=V,..." devargs added to each of our ports (e.g. "tx_db_avoid=1,device_loop=port")
  --plugin-dir D  use the librte_net_mlx4rs.so in D instead of building a release one (tests)
  --check         only check PKTGEN and exit
PKTGEN must be a Pktgen-DPDK binary built with Lua support against the installed DPDK.
EOF
}

die() {
  echo "pktgen.sh: $*" >&2
  exit 1
}

out=$top/target/pktgen-report
secs=5
rounds=3
sizes="64 128 512 1518"
parts="tx cable"
plugin_dir=""
check_only=0
burst=""
devargs=""
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --secs) secs=${2:?--secs needs a number}; shift 2 ;;
    --rounds) rounds=${2:?--rounds needs a number}; shift 2 ;;
    --sizes) sizes=${2:?--sizes needs sizes}; shift 2 ;;
    --parts) parts=${2:?--parts needs parts}; shift 2 ;;
    --burst) burst=${2:?--burst needs a number}; shift 2 ;;
    --devargs) devargs=${2:?--devargs needs devargs}; shift 2 ;;
    --plugin-dir) plugin_dir=${2:?--plugin-dir needs a directory}; shift 2 ;;
    --check) check_only=1; shift ;;
    --pktgen) PKTGEN=${2:?}; shift 2 ;; # how a re-run under sudo keeps PKTGEN
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
[[ $secs =~ ^[1-9][0-9]*$ ]] || die "--secs takes a whole number of seconds, not '$secs'"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "--rounds takes a positive number, not '$rounds'"
[[ $sizes =~ ^[0-9]+( [0-9]+)*$ ]] || die "--sizes takes frame sizes separated by spaces, not '$sizes'"
for s in $sizes; do
  [ "$s" -ge 64 ] && [ "$s" -le 1518 ] || die "frame size $s is outside 64..1518"
done
for p in $parts; do
  case $p in tx | cable | profile) ;; *) die "--parts takes tx, cable and profile, not '$p'" ;; esac
done
[ -n "$parts" ] || die "--parts takes tx, cable and profile"
[ -z "$burst" ] || [[ $burst =~ ^[1-9][0-9]*$ ]] && [ "${burst:-1}" -le 256 ] ||
  die "--burst takes a number of packets from 1 to 256, not '$burst'"
[[ -z $devargs || $devargs =~ ^[A-Za-z_]+=[^,[:space:]]+(,[A-Za-z_]+=[^,[:space:]]+)*$ ]] ||
  die "--devargs takes key=value pairs separated by commas, not '$devargs'"
# Our port's vdev with the devargs of the run and those of --devargs.
ours() {
  local v=$1
  [ -z "$devargs" ] || v+=",$devargs"
  echo "$v"
}
has_part() { [[ " $parts " == *" $1 "* ]]; }

# Is PKTGEN a Pktgen built with Lua against the DPDK installed here? Answered from the file
# alone (what it is and what the dynamic loader would give it), without running it.
check_pktgen() {
  [ -n "${PKTGEN:-}" ] || die "PKTGEN is not set: point it to a Pktgen-DPDK binary built with \
Lua support against the installed DPDK, e.g. PKTGEN=\$HOME/Pktgen-DPDK/build/app/pktgen bash scripts/pktgen.sh"
  [ -f "$PKTGEN" ] && [ -x "$PKTGEN" ] || die "PKTGEN=$PKTGEN is not an executable file"
  dpdk_version=$(pkg-config --modversion libdpdk 2>/dev/null) ||
    die "no installed DPDK found (pkg-config libdpdk): run scripts/setup.sh first"
  local libdir eal_link deps eal missing
  libdir=$(pkg-config --variable=libdir libdpdk)
  eal_link=$(readlink "$libdir/librte_eal.so") || die "no $libdir/librte_eal.so: run scripts/setup.sh first"
  pktgen_version=$(grep -aoE -m1 'Pktgen [0-9]+\.[0-9]+(\.[0-9]+)?' "$PKTGEN" | head -n1) ||
    die "PKTGEN=$PKTGEN is not Pktgen-DPDK (no 'Pktgen <version>' string in it)"
  deps=$(ldd "$PKTGEN" 2>&1) || die "PKTGEN=$PKTGEN is not a dynamically linked program \
(ldd: ${deps//$'\n'/ }); it must link the installed DPDK $dpdk_version's shared libraries to load the plugin"
  missing=$(awk '/not found/ { printf "%s%s", sep, $1; sep = ", " }' <<<"$deps")
  [ -z "$missing" ] || die "PKTGEN=$PKTGEN was not built against the installed DPDK $dpdk_version \
($eal_link): the loader finds no $missing"
  eal=$(awk '$1 ~ /^librte_eal\.so/ { print $3 }' <<<"$deps")
  [ -n "$eal" ] || die "PKTGEN=$PKTGEN does not link DPDK's shared librte_eal: it was not built \
against the installed DPDK $dpdk_version (a static DPDK cannot load the plugin with -d)"
  [ "$(readlink -f "$eal")" = "$(readlink -f "$libdir/librte_eal.so")" ] ||
    die "PKTGEN=$PKTGEN loads $eal, not the installed DPDK $dpdk_version's $libdir/$eal_link: \
it was built against another DPDK"
  grep -q 'liblua' <<<"$deps" || die "PKTGEN=$PKTGEN was built without Lua support (it links no \
liblua): the runs here are Lua scripts (-f script.lua); rebuild Pktgen with Lua enabled"
}
check_pktgen
if [ "$check_only" = 1 ]; then
  echo "pktgen.sh: $PKTGEN is $pktgen_version, built with Lua against the installed DPDK $dpdk_version"
  exit 0
fi
command -v script >/dev/null || die "needs 'script' (util-linux): Pktgen wants a terminal on stdin"
if has_part profile; then
  command -v valgrind >/dev/null && command -v callgrind_annotate >/dev/null ||
    die "--parts profile needs valgrind (callgrind)"
fi

set -- "${args[@]}" --pktgen "$PKTGEN"
. "$top/scripts/as-root.sh"
bash "$top/scripts/setup.sh"
if [ -z "$plugin_dir" ]; then
  (cd "$top" && cargo build --release -q -p rte_net_mlx4rs)
  plugin_dir=${CARGO_TARGET_DIR:-$top/target}/release
fi
plugin_dir=$(cd "$plugin_dir" && pwd)
[ -f "$plugin_dir/librte_net_mlx4rs.so" ] || die "no librte_net_mlx4rs.so in $plugin_dir"

mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/*.res "$out"/*.log "$out"/report.md "$out"/*.csv "$out"/*.callgrind "$out"/*.annotate
# EAL refuses -d paths under world-writable directories: pass a bare name found through
# LD_LIBRARY_PATH, from a directory that does not hold the library.
work=$(mktemp -d)
# EAL's runtime directories go too (one per Pktgen run).
trap 'rm -rf "$work" /var/run/dpdk/mlx4rs-pktgen-$$-*' EXIT
cd "$work"


runs=$out/runs.txt
: >"$runs"
# One Pktgen process: $1 = run name, $2 = PG_MODE, the rest = --vdev arguments; RUN_SIZES,
# RUN_PORTS, RUN_SECS, RUN_ROUNDS override the run's parameters and the array `wrap` holds a
# program to run Pktgen under. Its results go to $out/<name>.res, its screen and log to
# $out/<name>.log.
wrap=()
run_pktgen() {
  local name=$1 mode=$2 run_sizes=${RUN_SIZES:-$sizes} run_secs=${RUN_SECS:-$secs}
  local run_rounds=${RUN_ROUNDS:-$rounds} run_ports=${RUN_PORTS:-0 1}
  shift 2
  local prefix="mlx4rs-pktgen-$$-$name" cmd
  cmd=("${wrap[@]}" "$PKTGEN" -l 0-1 --no-huge -m 4096 --no-pci --file-prefix="$prefix"
    -d librte_net_mlx4rs.so "$@" -- -m "1.[0-1]" -f "$top/scripts/pktgen.lua")
  local trials=10
  if [ "$mode" = tx ]; then
    trials=$(($(wc -w <<<"$run_ports") * run_rounds * $(wc -w <<<"$run_sizes")))
  fi
  local limit=$((60 + (run_secs + 15) * trials + ${#wrap[@]} * 60))
  echo "== $name: load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  {
    echo "$name: load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "$name: PG_BURST=$burst PG_MODE=$mode PG_SECS=$run_secs PG_ROUNDS=$run_rounds PG_SIZES=\"$run_sizes\"" \
      "PG_PORTS=\"$run_ports\" LD_LIBRARY_PATH=$plugin_dir ${cmd[*]}"
  } >>"$runs"
  # Pktgen wants a terminal on stdin; `script` gives it one.
  if ! PG_OUT="$out/$name.res" PG_BURST=$burst PG_MODE=$mode PG_SECS=$run_secs PG_ROUNDS=$run_rounds \
    PG_SIZES="$run_sizes" PG_PORTS="$run_ports" PG_TELEMETRY="python3 $top/scripts/pktgen_telemetry.py $prefix" \
    LD_LIBRARY_PATH="$plugin_dir" timeout "$limit" script -qfec "$(printf '%q ' "${cmd[@]}")" \
    /dev/null </dev/null >"$out/$name.log" 2>&1; then
    tail -c 2000 "$out/$name.log" | sed 's/\x1b\[[0-9;]*[A-Za-z]//g' >&2
    die "$name: Pktgen failed or ran over ${limit}s (log: $out/$name.log)"
  fi
  echo "$name: load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$runs"
  if grep -q '^error' "$out/$name.res" 2>/dev/null; then
    die "$name: the Lua script stopped: $(grep '^error' "$out/$name.res")"
  fi
  [ -s "$out/$name.res" ] || die "$name: Pktgen wrote no results (log: $out/$name.log)"
}

if has_part tx; then
  run_pktgen tx-bf tx --vdev "$(ours net_mlx4rs0)" --vdev net_null0,no-rx=1
  run_pktgen tx-doorbell tx --vdev "$(ours net_mlx4rs0,bf=off)" --vdev net_null0,no-rx=1
fi
if has_part cable; then
  RUN_SIZES=${sizes%% *} run_pktgen cable cable \
    --vdev "$(ours net_mlx4rs0,wire=peer:net_mlx4rs1)" --vdev "$(ours net_mlx4rs1,wire=peer:net_mlx4rs0)"
fi
if has_part profile; then
  # Instructions in Pktgen's send function and everything it calls (the burst, the device the
  # glue runs, the mbuf frees), one port sending 64 B frames for 20 s (under valgrind, some
  # 5 million packets); the count per packet does not depend on how many.
  for run in "prof-bf 0 net_mlx4rs0" "prof-doorbell 0 net_mlx4rs0,bf=off" "prof-null 1 net_mlx4rs0"; do
    read -r name port vdev <<<"$run"
    wrap=(valgrind --tool=callgrind --fair-sched=yes --callgrind-out-file="$out/$name.callgrind"
      --toggle-collect=pktgen_send_pkts)
    RUN_SIZES=64 RUN_PORTS=$port RUN_SECS=20 RUN_ROUNDS=1 run_pktgen "$name" tx \
      --vdev "$(ours "$vdev")" --vdev net_null0,no-rx=1
    callgrind_annotate --inclusive=yes "$out/$name.callgrind" >"$out/$name.annotate"
  done
  wrap=()
fi

commit=$(git -C "$top" describe --always --dirty 2>/dev/null || echo unknown)
python3 - "$out" "$pktgen_version" "$dpdk_version" "$secs" "$rounds" "$plugin_dir" "$commit" \
  "$burst" "$devargs" \
  <<'PY' | tee "$out/report.md"
import os, re, statistics, sys

out, pktgen_version, dpdk_version, secs, rounds, plugin_dir, commit, burst, devargs = sys.argv[1:10]


def records(name):
    """The lines a run's Lua script wrote: (kind, {key: value}) with numbers as numbers."""
    path = os.path.join(out, name + ".res")
    if not os.path.exists(path):
        return []
    recs = []
    for line in open(path):
        words = line.split()
        fields = {}
        for w in words[1:]:
            if "=" in w:
                k, v = w.split("=", 1)
                try:
                    fields[k] = int(v)
                except ValueError:
                    try:
                        fields[k] = float(v)
                    except ValueError:
                        fields[k] = v
            else:
                fields["tag"] = w
        recs.append((words[0], fields))
    return recs


def log_lines(name, pattern):
    path = os.path.join(out, name + ".log")
    if not os.path.exists(path):
        return []
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]|\x1b[78]", "", open(path, errors="replace").read())
    return sorted(set(m.strip() for m in re.findall(pattern, text)))


def mpps(r, key):
    """The rate of counter `key` over the trial's measuring window, in Mpps."""
    return r["tx_pps" if key == "opackets" else "rx_pps"] / 1e6


print(f"# Pktgen measurements of net_mlx4rs\n")
runtime = log_lines("tx-bf", r"Pktgen \S+ \(DPDK [^)]*\)") or log_lines("cable", r"Pktgen \S+ \(DPDK [^)]*\)")
print(f"{pktgen_version} built with Lua against the installed DPDK {dpdk_version}"
      + (f" (it reports `{runtime[0]}`)" if runtime else "") + ";")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"{os.cpu_count()} CPUs ({cpu}); `pktgen -l 0-1 --no-huge -m 4096 --no-pci -- -m \"1.[0-1]\"`: "
      f"lcore 1 polls both ports, {secs} s per interval; the plugin {plugin_dir}/librte_net_mlx4rs.so "
      f"(mlx4rs {commit}), default devargs but those named"
      + (f" and `{devargs}` on each of our ports" if devargs else "")
      + f"; Pktgen's burst {burst or 'its default (64)'}. Load average (1, 5, 15 min) around each "
      f"run:\n")
for line in open(os.path.join(out, "runs.txt")):
    if "load average" in line:
        print(f"    {line.rstrip()}")
print()

verdicts = []
tx_runs = [("BlueFlame", "tx-bf"), ("doorbell", "tx-doorbell")]
if any(records(name) for _, name in tx_runs):
    print(f"## TX rate: one port on the null wire against net_null, same Pktgen process, "
          f"alternating, median of {rounds}\n")
    print("| TX path | frame | mlx4rs Mpps | net_null Mpps | ratio | ratio per round | mlx4rs Mpps per round "
          "| lcore 1's share of the window, mlx4rs / net_null | ratio per second of lcore 1 |")
    print("|---|---|---|---|---|---|---|---|---|")
    csv = ["path,size,round,mlx4rs_mpps,net_null_mpps,ratio,mlx4rs_lcore_share,net_null_lcore_share"]
    for path, name in tx_runs:
        recs = [f for k, f in records(name) if k == "tx"]
        worst = None
        for size in sorted({f["size"] for f in recs}):
            ours, null, ratios, shares, per_cpu = [], [], [], [], []
            for rnd in sorted({f["round"] for f in recs if f["size"] == size}):
                a = next(f for f in recs if f["size"] == size and f["round"] == rnd and f["port"] == 0)
                b = next(f for f in recs if f["size"] == size and f["round"] == rnd and f["port"] == 1)
                ours.append(mpps(a, "opackets"))
                null.append(mpps(b, "opackets"))
                ratios.append(ours[-1] / null[-1] if null[-1] else 0.0)
                shares.append(f"{a['lcore_share']:.2f} / {b['lcore_share']:.2f}")
                if a["lcore_share"] > 0 and b["lcore_share"] > 0 and null[-1]:
                    per_cpu.append(ratios[-1] * b["lcore_share"] / a["lcore_share"])
                csv.append(f"{path},{size},{rnd},{ours[-1]:.3f},{null[-1]:.3f},{ratios[-1]:.4f},"
                           f"{a['lcore_share']:.3f},{b['lcore_share']:.3f}")
            med = statistics.median(ratios)
            worst = med if worst is None else min(worst, med)
            cpu_med = f"{statistics.median(per_cpu):.3f}" if per_cpu else "?"
            print(f"| {path} | {size} B | {statistics.median(ours):.2f} | {statistics.median(null):.2f} "
                  f"| **{med:.3f}** | {' / '.join(f'{x:.3f}' for x in ratios)} "
                  f"| {' / '.join(f'{x:.2f}' for x in ours)} | {', '.join(shares)} | {cpu_med} |")
        if worst is not None:
            verdicts.append(f"TX ratio against net_null >= 0.5 on the {path} path: "
                            f"{'met' if worst >= 0.5 else 'MISSED'} (lowest median {worst:.3f})")
    open(os.path.join(out, "tx.csv"), "w").write("\n".join(csv) + "\n")
    print()
    print("Driver and device counters of port 0 over the whole run (per packet sent):\n")
    print("| TX path | driver's decision | tx_path_bf | BF writes | doorbells | tx_doorbells_avoided "
          "| WQEs from BF copies | tx_ring_full |")
    print("|---|---|---|---|---|---|---|---|")
    for path, name in tx_runs:
        x = next((f for k, f in records(name) if k == "xstats"), None)
        if not x:
            continue
        n = max(x.get("tx_good_packets", 0), 1)
        decision = "; ".join(log_lines(name, r"net_mlx4rs0: (TX path [^\n]*)")) or "?"
        print(f"| {path} | {decision} | {x.get('tx_path_bf')} | {x.get('tx_bf_writes', 0) / n:.4f} "
              f"| {x.get('tx_doorbells', 0) / n:.4f} | {x.get('tx_doorbells_avoided', 0) / n:.4f} "
              f"| {x.get('hca_wqe_from_bf', 0) / n:.4f} "
              f"| {x.get('tx_ring_full', 0) / n:.3f} |")
    print()

cable = records("cable")
if cable:
    causes = ["hca_rx_drops_no_wqe", "hca_rx_drops_wire", "hca_rx_drops_cq_full", "hca_rx_drops_error",
              "hca_rx_drops_filter", "hca_rx_drops_mtu", "hca_rx_drops_too_long", "hca_tx_drops_wire"]
    snaps = [(f["tag"], f) for k, f in cable if k == "xstats"]

    def why(tag, port):
        """The device's drop causes at `port` during step `tag` (differences of its counters)."""
        tags = [t for t, f in snaps if f["port"] == port]
        if tag not in tags or tags.index(tag) == 0:
            return "?"
        now = next(f for t, f in snaps if t == tag and f["port"] == port)
        before = next(f for t, f in snaps if t == tags[tags.index(tag) - 1] and f["port"] == port)
        parts = [f"{c[4:]} {now.get(c, 0) - before.get(c, 0)}" for c in causes
                 if now.get(c, 0) != before.get(c, 0)]
        return ", ".join(parts) or "none"

    def directions(recs):
        """(sender, receiver, sent, received, lost, receiver's record) for each direction used."""
        rows = []
        for a, b in ((0, 1), (1, 0)):
            s = next(f for f in recs if f["port"] == a)
            r = next(f for f in recs if f["port"] == b)
            if s["opackets"]:
                rows.append((a, b, s["opackets"], r["ipackets"], s["opackets"] - r["ipackets"], r))
        return rows

    all_counted = True

    def step_tables(title, kind, tag):
        global all_counted
        recs = [f for k, f in cable if k == kind]
        if not recs:
            return
        print(f"{title}\n")
        print("| port | TX Mpps | RX Mpps | sent | received | imissed | ierrors | rx_nombuf | oerrors |")
        print("|---|---|---|---|---|---|---|---|---|")
        for f in recs:
            print(f"| {f['port']} | {mpps(f, 'opackets'):.3f} | {mpps(f, 'ipackets'):.3f} | {f['opackets']} "
                  f"| {f['ipackets']} | {f['imissed']} | {f['ierrors']} | {f['rx_nombuf']} | {f['oerrors']} |")
        print()
        print("| direction | sent | received | lost | receiver's imissed | receiver's ierrors + rx_nombuf "
              "| lost and not counted | the device's causes at the receiver (hca_*) |")
        print("|---|---|---|---|---|---|---|---|")
        for a, b, sent, got, lost, r in directions(recs):
            other = r["ierrors"] + r["rx_nombuf"]
            all_counted &= lost == r["imissed"]
            print(f"| {a} -> {b} | {sent} | {got} | {lost} ({100 * lost / sent:.2f}%) | {r['imissed']} "
                  f"| {other} | {lost - r['imissed'] - other} | {why(tag, b)} |")
        print()

    size = next(f["size"] for k, f in cable if k == "cable")
    step_tables(f"## Two ports cabled (wire=peer), both sending {size} B frames as fast as they can",
                "cable", "cable")
    step_tables(f"## The cable with a receiver slower than its sender: port 0 sends as fast as it can, "
                f"port 1 is polled for 16 frames per call", "slow_rx", "slow_rx")
    paced = [f for k, f in cable if k == "paced"]
    if paced:
        print("## The cable paced: both ports at a rate (percent of the 40G link), from the rate the "
              "receivers took unpaced down by halves, until every frame arrives\n")
        print("| rate | offered Mpps per port | 0 -> 1 delivered | 1 -> 0 delivered | imissed 1 / 0 |")
        print("|---|---|---|---|---|")
        kept_up = None
        for st in sorted({f["step"] for f in paced}):
            recs = [f for f in paced if f["step"] == st]
            cells, ok = [], True
            for a, b, sent, got, lost, r in directions(recs):
                cells.append(f"{got}/{sent} ({100 * got / sent:.3f}%)")
                ok &= lost == 0
                all_counted &= lost == r["imissed"]
            ok &= len(cells) == 2
            offered = statistics.mean(mpps(f, "opackets") for f in recs)
            missed = " / ".join(str(next(f for f in recs if f["port"] == p)["imissed"]) for p in (1, 0))
            print(f"| {recs[0]['rate']}% | {offered:.3f} | {' | '.join(cells)} | {missed} |")
            if ok:
                kept_up = (recs[0]["rate"], offered)
        print()
        verdicts.append("a rate the receivers keep up with: " + (
            f"{kept_up[0]}% of the link, {kept_up[1]:.3f} Mpps per port each way, 100% delivered"
            if kept_up else "NOT FOUND within the steps tried"))
    verdicts.append("every lost frame counted in the receiving port's imissed: "
                    + ("met" if all_counted else "MISSED (see the tables)"))

def inclusive(name):
    """Inclusive instruction counts by function name from a callgrind_annotate listing."""
    path = os.path.join(out, name + ".annotate")
    if not os.path.exists(path):
        return {}
    got = {}
    for line in open(path, errors="replace"):
        m = re.match(r"^\s*([\d,]+) \([^)]*\)\s+\S*?:(\S+) \[\S+\]$", line)
        if m:
            got.setdefault(m.group(2), int(m.group(1).replace(",", "")))
    return got


def inlined(name, fn):
    """Instructions of code from other source files inlined into `fn` (callgrind_annotate's
    file:function lines without an object), by file."""
    path = os.path.join(out, name + ".annotate")
    got = {}
    for line in open(path, errors="replace"):
        m = re.match(r"^\s*([\d,]+) \([^)]*\)\s+(\S+?):(\S+)$", line)
        if m and m.group(3) == fn:
            f = re.sub(r"^.*/library/", "", re.sub(r"^.*/pmd/", "", m.group(2)))
            got[f] = got.get(f, 0) + int(m.group(1).replace(",", ""))
    return got


profiles = [("BlueFlame", "prof-bf", 0), ("doorbell", "prof-doorbell", 0), ("net_null", "prof-null", 1)]
if any(inclusive(name) for _, name, _ in profiles):
    print("## Where the time goes: instructions per packet (callgrind, 64 B, one port sending)\n")
    print("Counted in Pktgen's `pktgen_send_pkts` and everything it calls: Pktgen's own part (mbuf "
          "allocation, its TX buffer), the driver's `tx_burst` (with the mbuf frees), and the rest of "
          "our burst glue, which is the software HCA executing the WQEs (device loop `lcore`).\n")
    print("| port | instructions/packet | Pktgen | driver tx_burst | device (in the burst glue) |")
    print("|---|---|---|---|---|")
    per_packet = {}
    for label, name, port in profiles:
        fns = inclusive(name)
        rec = next((f for k, f in records(name) if k == "tx" and f["port"] == port), None)
        if not fns or not rec or not rec["opackets"]:
            continue
        n = rec["opackets"]
        total = fns.get("pktgen_send_pkts", 0) / n
        per_packet[label] = total
        if port == 0:
            glue = fns.get("mlx4rs::ethdev::queue::tx_burst_lcore", 0) / n
            # The device is what the glue's runner spends in the model; the driver's burst is
            # inlined into the glue, so it is the glue less the device.
            device = fns.get("mlx4_hca::device::DevState::poll_sq", 0) / n
            print(f"| {label} | {total:.1f} | {total - glue:.1f} | {glue - device:.1f} | {device:.1f} |")
        else:
            print(f"| {label} | {total:.1f} | Pktgen and net_null's tx_burst together (net_null is "
                  f"stripped) | | |")
    if "net_null" in per_packet:
        print()
        for label in ("BlueFlame", "doorbell"):
            if label in per_packet:
                print(f"- {label}: net_null's {per_packet['net_null']:.1f} instructions per packet against "
                      f"{per_packet[label]:.1f}: instruction ratio {per_packet['net_null'] / per_packet[label]:.3f}")
    print()
    # Inside the device's walk and the driver's post: the code inlined into each, by source file.
    inner = [("device", "mlx4_hca::sq::Sq::walk"), ("driver", "mlx4rs::txq::TxQueue<B>::post"),
             ("mbuf frees", "rte_pktmbuf_free_bulk")]
    lines = []
    for label, name, port in profiles[:2]:
        rec = next((f for k, f in records(name) if k == "tx" and f["port"] == port), None)
        if not rec or not rec["opackets"]:
            continue
        n = rec["opackets"]
        fns = inclusive(name)
        for part, fn in inner:
            if fn not in fns:
                continue
            by_file = inlined(name, fn)
            top = sorted(by_file.items(), key=lambda kv: -kv[1])[:6]
            detail = ", ".join(f"{f} {c / n:.1f}" for f, c in top)
            lines.append(f"| {label} | {part}: `{fn}` | {fns[fn] / n:.1f} | {detail} |")
    if lines:
        print("Inside them (instructions per packet; the code inlined into the function by its source file, with what that code calls):\n")
        print("| port | function | instructions/packet | of which inlined from |")
        print("|---|---|---|---|")
        print("\n".join(lines))
        print()

print("## Targets\n")
for v in verdicts:
    print(f"- {v}")
print("\n## Commands run (each under `script -qfec ... /dev/null` from an empty directory, with PG_OUT and PG_TELEMETRY set by the script)\n")
for line in open(os.path.join(out, "runs.txt")):
    if "load average" not in line:
        print(f"    {line.rstrip()}")
PY
echo "pktgen.sh: report in $out/report.md" >&2
