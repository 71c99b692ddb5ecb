#!/usr/bin/env bash
# The main job: dpdk-testpmd txonly (64 B, burst 32) on two net_mlx4rs ports of the software
# HCA on the null wire, with the default settings, against two net_null ports in the same
# job: the two alternate, three rounds each, and the median ratio of their rates is the figure
# (absolute Mpps on a shared 2-core machine measure the machine). Prints each port's rate, its
# live TX path and where the software HCA's device loop ran, the load average, and the same
# ratio per second of CPU time the forwarding lcore got (where other jobs keep the load above
# the 2 cores, the scheduler gives it a share that differs from run to run).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$top/scripts/as-root.sh"
secs=${SECS:-5}
rounds=${ROUNDS:-3}
# Extra devargs for both ports, e.g. DEVARGS=device_loop=port to run the device on threads.
extra=${DEVARGS:+,$DEVARGS}

bash "$top/scripts/setup.sh"
(cd "$top" && cargo build --release -q -p rte_net_mlx4rs)

# EAL refuses -d paths under world-writable directories: pass a bare name found through
# LD_LIBRARY_PATH, from a directory that does not hold the library.
work=$(mktemp -d)
trap 'rm -rf "$work" "/var/run/dpdk/mlx4rs-run-$$"' EXIT
cd "$work"

. "$top/scripts/lcore-cpu.sh"
. "$top/scripts/main-job.sh"
fwd_cpu_ns() { lcore_cpu_ns "mlx4rs-run-$$"; }

# One txonly run: $1 = log file, the rest = --vdev arguments. The forwarding lcore's CPU time
# at the two `show port stats all` goes to $1.cpu.
txonly() {
  local log=$1
  shift
  {
    sleep 2; echo start; sleep 1; fwd_cpu_ns > "$log.cpu"; echo "show port stats all"
    sleep "$secs"
    fwd_cpu_ns >> "$log.cpu"; echo "show port stats all"; echo stop
    echo "show port xstats all"; echo quit
  } | LD_LIBRARY_PATH="${CARGO_TARGET_DIR:-$top/target}/release" timeout --kill-after=30 $((secs + 60)) stdbuf -oL dpdk-testpmd \
      "${main_job_eal[@]}" --file-prefix="mlx4rs-run-$$" -d librte_net_mlx4rs.so "$@" \
      -- "${main_job_app[@]}" \
      > "$log" 2>&1 || { cat "$log"; exit 1; }
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$rounds"); do
  txonly "mlx4rs.$r.log" --vdev "net_mlx4rs0$extra" --vdev "net_mlx4rs1$extra"
  txonly "null.$r.log" --vdev net_null0 --vdev net_null1
done

grep -hE "TX path|device loop" mlx4rs.1.log | sed 's/^/  /'
python3 - "$rounds" "$secs" "${DEVARGS:-}" "$load_before" <<'PY'
import re, statistics, sys
rounds, secs = int(sys.argv[1]), sys.argv[2]
load_before = sys.argv[4]
load_after = " ".join(open("/proc/loadavg").read().split()[:3])

def parse(path):
    text = open(path).read()
    # testpmd writes its prompt unbuffered; keep it from splitting the lines we parse.
    text = re.sub(r"testpmd> [^\n#]*", "", text)
    rates = {}
    # The second `show port stats all` holds the rate over the measured interval.
    for port, pps in re.findall(r"NIC statistics for port (\d+).*?Tx-pps:\s+(\d+)", text, re.S):
        rates[port] = int(pps)
    # Packets sent over the measured interval (between the two `show port stats all`), per
    # second of the forwarding lcore's CPU time.
    shows = re.findall(r"NIC statistics for port \d+\s+#+(.*?)#{8}", text, re.S)
    counts = [int(re.search(r"TX-packets:\s+(\d+)", b).group(1)) for b in shows]
    ports = len(rates)
    sent = [sum(counts[:ports]), sum(counts[ports:2 * ports])] if len(counts) >= 2 * ports else []
    cpu = [int(x) for x in open(path + ".cpu").read().split()]
    per_cpu = ((sent[1] - sent[0]) / ((cpu[1] - cpu[0]) / 1e9)
               if len(sent) == 2 and len(cpu) == 2 and cpu[1] > cpu[0] else 0.0)
    xs = {}
    for port, body in re.findall(
            r"NIC extended statistics for port (\d+)(.*?)(?=NIC extended statistics|\Z)", text, re.S):
        xs[port] = dict((k, int(v)) for k, v in re.findall(r"^(\w+): (\d+)$", body, re.M))
    return rates, xs, per_cpu

ratios, cpu_ratios = [], []
for r in range(1, rounds + 1):
    ours, xs, ours_cpu = parse(f"mlx4rs.{r}.log")
    null, _, null_cpu = parse(f"null.{r}.log")
    a, b = sum(ours.values()), sum(null.values())
    ratios.append(a / b if b else 0.0)
    cpu_ratios.append(ours_cpu / null_cpu if null_cpu else 0.0)
    parts = []
    for port in sorted(ours):
        x = xs.get(port, {})
        path = "BlueFlame" if x.get("tx_path_bf") == 1 else "doorbell"
        pkts = max(x.get("tx_good_packets", 0), 1)
        parts.append(f"port {port} {ours[port]/1e6:.2f} Mpps ({path}, "
                     f"{x.get('tx_doorbells', 0)/pkts:.3f} doorbells "
                     f"{x.get('tx_bf_writes', 0)/pkts:.3f} BF writes per packet)")
    print(f"round {r}: mlx4rs {a/1e6:.2f} Mpps [{'; '.join(parts)}], "
          f"net_null {b/1e6:.2f} Mpps, ratio {ratios[-1]:.2f}; per CPU second of the "
          f"forwarding lcore: mlx4rs {ours_cpu/1e6:.2f} Mpps, net_null {null_cpu/1e6:.2f} Mpps, "
          f"ratio {cpu_ratios[-1]:.2f}")

def summary(v):
    med = statistics.median(v)
    spread = max(abs(x - med) / med for x in v) * 100 if med else 0.0
    return f"{med:.2f} over {rounds} rounds (spread +-{spread:.0f}%)"

devargs = sys.argv[3] or "default devargs"
print(f"load average before {load_before}, after {load_after} (2 cores)")
print(f"txonly 64 B burst 32, two ports, null wire, {devargs}, {secs} s per run: "
      f"median ratio mlx4rs/net_null {summary(ratios)}")
print(f"  per CPU second of the forwarding lcore: median ratio {summary(cpu_ratios)}")
PY
