#!/usr/bin/env bash
# The main job: dpdk-testpmd with two net_mlx4rs ports on the software HCA in txonly mode,
# one with write combining (BlueFlame path) and one without (doorbell path), for a few
# seconds; prints each port's rate and which TX path is live.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$top/scripts/as-root.sh"
secs=${SECS:-5}

bash "$top/scripts/setup.sh"
(cd "$top" && cargo build --release -q -p rte_net_mlx4rs)

# EAL refuses -d paths under world-writable directories: pass a bare name found through
# LD_LIBRARY_PATH, from a directory that does not hold the library.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
{
  sleep 2; echo start; sleep 1; echo "show port stats all"; sleep "$secs"
  echo "show port stats all"; echo stop; echo "show port xstats all"; echo quit
} | LD_LIBRARY_PATH="$top/target/release" timeout $((secs + 60)) stdbuf -oL dpdk-testpmd \
    -l 0-1 --no-huge -m 512 --no-pci --file-prefix="mlx4rs-run-$$" \
    -d librte_net_mlx4rs.so \
    --vdev net_mlx4rs0,wire=null,wc=on --vdev net_mlx4rs1,wire=null,wc=off \
    -- -i --forward-mode=txonly --txpkts=64 --burst=32 --total-num-mbufs=16384 \
    > testpmd.log 2>&1 || { cat testpmd.log; exit 1; }

grep -E "TX path" testpmd.log | sed 's/^/  /'
python3 - testpmd.log "$secs" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
# testpmd writes its prompt unbuffered; keep it from splitting the lines we parse.
text = re.sub(r"testpmd> [^\n#]*", "", text)
# The second `show port stats all` holds the rate over the measured interval.
blocks = re.findall(r"NIC statistics for port (\d+).*?Tx-pps:\s+(\d+)", text, re.S)
rates = {}
for port, pps in blocks:
    rates[port] = int(pps)  # keep the last
xs = {}
for port, body in re.findall(r"NIC extended statistics for port (\d+)(.*?)(?=NIC extended statistics|\Z)", text, re.S):
    xs[port] = dict((k, int(v)) for k, v in re.findall(r"^(\w+): (\d+)$", body, re.M))
total = 0
for port in sorted(rates):
    x = xs.get(port, {})
    path = "BlueFlame" if x.get("tx_path_bf") == 1 else "doorbell"
    pkts = max(x.get("tx_good_packets", 0), 1)
    print(f"port {port}: {rates[port]/1e6:.3f} Mpps txonly 64 B, TX path {path}; "
          f"per packet: {x.get('tx_doorbells',0)/pkts:.3f} doorbells, {x.get('tx_bf_writes',0)/pkts:.3f} BF writes")
    total += rates[port]
print(f"total: {total/1e6:.3f} Mpps (software HCA, 2-core machine: compare paths as ratios)")
PY
