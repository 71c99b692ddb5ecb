#!/usr/bin/env bash
# The main job counted in instructions: testpmd txonly (64 B, burst 32, two ports) under
# callgrind, once on two net_null ports and once on two net_mlx4rs ports per setting, and the
# forwarding lcore's instructions per packet sent. Rates on a shared 2-core machine move by 20%
# from run to run; these counts move by well under 1%, so they say whether a change cut the
# lcore's work, and the gap between their ratio and the rates' ratio is what the work costs
# beyond its instructions (stalls, not code).
#
#   bash scripts/main-callgrind.sh                      # default devargs, then bf=off
#   bash scripts/main-callgrind.sh "" device_loop=port  # each argument: one port setting
#
# Each run is about a minute (valgrind runs testpmd some 40 times slower). For net_mlx4rs it
# also prints the share of the PMD's tx_burst and, within it, of the software HCA's device loop
# run in the lcore (`DevState::poll_sq`, by name from callgrind's inclusive table).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$top/scripts/as-root.sh"
. "$top/scripts/main-job.sh"
secs=${SECS:-20}
bash "$top/scripts/setup.sh"
command -v valgrind >/dev/null || { echo "main-callgrind: valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
(cd "$top" && cargo build --release -q -p rte_net_mlx4rs)
lib="${CARGO_TARGET_DIR:-$top/target}/release"
[ $# -gt 0 ] || set -- "" "bf=off"

work=$(mktemp -d)
trap 'rm -rf "$work"; rm -rf /var/run/dpdk/mlx4rs-cg-$$*' EXIT
cd "$work"

# One run: $1 = tag, the rest = --vdev arguments. Prints "tag instructions-per-packet ...".
run() {
  local tag=$1
  shift
  # EAL's start-up under valgrind takes some 20 s: `start` waits for testpmd's first prompt
  # (written unbuffered), then the lcore sends for $secs.
  {
    for _ in $(seq 1 240); do grep -q "testpmd> " "$tag.log" 2>/dev/null && break; sleep 0.5; done
    echo start; sleep "$secs"; echo stop; sleep 2; echo quit
  } | LD_LIBRARY_PATH="$lib" timeout --kill-after=30 $((secs + 240)) valgrind --tool=callgrind --separate-threads=yes \
      --fair-sched=yes --callgrind-out-file="$work/cg.$tag.%p" dpdk-testpmd "${main_job_eal[@]}" \
      --file-prefix="mlx4rs-cg-$$-$tag" -d librte_net_mlx4rs.so "$@" -- "${main_job_app[@]}" \
      > "$tag.log" 2>&1 || { tail -40 "$tag.log"; echo "main-callgrind: the $tag run failed" >&2; exit 1; }
  python3 - "$work" "$tag" <<'PY'
import glob, re, subprocess, sys
work, tag = sys.argv[1], sys.argv[2]
log = open(f"{work}/{tag}.log").read()
m = re.search(r"Accumulated forward statistics.*?TX-packets:\s+(\d+)", log, re.S)
if not m:
    sys.exit(f"main-callgrind: no forward statistics in the {tag} run:\n{log[-2000:]}")
sent = int(m.group(1))
if sent == 0:
    sys.exit(f"main-callgrind: the {tag} run sent nothing")
# The forwarding lcore is the thread that ran the most instructions.
def total(f):
    for line in open(f):
        if line.startswith("summary:"):
            return int(line.split()[1])
    return 0
f = max(glob.glob(f"{work}/cg.{tag}.*-*"), key=total)
ir = total(f)
out = f"{tag}: {sent} packets, {ir / sent:.1f} instructions a packet in the forwarding lcore"
if tag != "net_null":
    ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", f],
                         capture_output=True, text=True).stdout
    def incl(pat):
        best = 0
        for line in ann.splitlines():
            if re.search(pat, line):
                n = int(line.split()[0].replace(",", ""))
                best = max(best, n)
        return best
    tx = incl(r"ethdev::queue::tx_burst\w* \[")
    dev = incl(r"DevState>::poll_sq \[")
    out += f" (tx_burst {tx / sent:.1f}, of which the device loop {dev / sent:.1f})"
print(out, flush=True)
PY
}

run net_null --vdev net_null0 --vdev net_null1 | tee -a summary
i=0
for setting in "$@"; do
  i=$((i + 1))
  extra=${setting:+,$setting}
  run "mlx4rs$i" --vdev "net_mlx4rs0$extra" --vdev "net_mlx4rs1$extra" | sed "s/^mlx4rs$i/net_mlx4rs ${setting:-default devargs}/" | tee -a summary
done
python3 - summary <<'PY'
import re, sys
rows = [l for l in open(sys.argv[1])]
per = [float(re.search(r"([\d.]+) instructions a packet", l).group(1)) for l in rows]
for l, p in zip(rows[1:], per[1:]):
    print(f"ratio net_null / {l.split(':')[0]}: {per[0] / p:.3f} (instructions a packet)")
PY
