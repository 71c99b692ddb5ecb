#!/usr/bin/env bash
# The rte_flow fuzzer of tests/flow_fuzz.rs (tests/flow_fuzz/flowfuzz.c), longer: random seeds
# (or the ones given), N rules each, for at most SECS seconds in all; with --valgrind each run
# is under memcheck (an invalid access, or a definite leak allocated in our driver or model,
# fails it; Debian's other PMDs that EAL loads leak at dlopen, which is not ours; slow: use
# fewer rules).
# Stops at the first failure and prints the seed that reproduces it:
#
#   scripts/flow-fuzz.sh [--secs 600] [--rules 20000] [--valgrind] [--debug] [SEED...]
#
# Uses the release plugin (--debug: the debug one).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
secs=600 rules=20000 vg="" profile=release seeds=()
while [ $# -gt 0 ]; do
  case "$1" in
    --secs) secs=$2; shift 2 ;;
    --rules) rules=$2; shift 2 ;;
    --valgrind) vg=1; shift ;;
    --debug) profile=debug; shift ;;
    -*) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//; /^set -euo/d' >&2; exit 2 ;;
    *) seeds+=("$1"); shift ;;
  esac
done
args=(--secs "$secs" --rules "$rules")
[ -z "$vg" ] || args+=(--valgrind)
[ $profile = release ] || args+=(--debug)
set -- "${args[@]}" "${seeds[@]}"
. "$top/scripts/as-root.sh"
bash "$top/scripts/setup.sh" >/dev/null
if [ $profile = release ]; then
  (cd "$top" && cargo build --release -q -p rte_net_mlx4rs)
else
  (cd "$top" && cargo build -q -p rte_net_mlx4rs)
fi
work=$(mktemp -d)
trap 'rm -rf "$work" /var/run/dpdk/mlx4rs-flowfuzz-$$' EXIT
# shellcheck disable=SC2046
cc -O1 -g -Wall -Werror -o "$work/flowfuzz" "$top/tests/flow_fuzz/flowfuzz.c" $(pkg-config --cflags --libs libdpdk)
cd "$work"
export LD_LIBRARY_PATH="${CARGO_TARGET_DIR:-$top/target}/$profile"
end=$((SECONDS + secs)) runs=0 created=0 refused=0
while [ $SECONDS -lt $end ]; do
  if [ ${#seeds[@]} -gt 0 ]; then
    [ $runs -lt ${#seeds[@]} ] || break
    seed=${seeds[$runs]}
  else
    seed=$(od -An -N6 -tu8 /dev/urandom | tr -d ' ')
  fi
  wrap=()
  [ -z "$vg" ] || wrap=(valgrind -q --error-exitcode=3 --leak-check=full --errors-for-leak-kinds=none)
  if ! timeout $((end - SECONDS + 60)) "${wrap[@]}" ./flowfuzz -l 0 --no-huge -m 256 --no-pci \
      --file-prefix=mlx4rs-flowfuzz-$$ -d librte_net_mlx4rs.so --vdev net_mlx4rs0,wire=loop \
      -- "$seed" "$rules" >"$work/log" 2>&1 || ! grep -q "^flowfuzz: PASS" "$work/log"; then
    grep -v '^EAL' "$work/log" | tail -30 >&2
    echo "flow-fuzz: FAILED on seed $seed ($rules rules): scripts/flow-fuzz.sh --rules $rules${vg:+ --valgrind} $seed" >&2
    exit 1
  fi
  # A definite leak record whose stack passes through our code.
  if [ -n "$vg" ] && awk '/definitely lost/ {r = 1; ours = 0} r && /mlx4rs|mlx4_hca/ {ours = 1}
      r && /^==[0-9]+== *$/ {if (ours) bad = 1; r = 0} END {exit !bad}' "$work/log"; then
    grep -A30 "definitely lost" "$work/log" >&2
    echo "flow-fuzz: our code leaked on seed $seed: scripts/flow-fuzz.sh --rules $rules --valgrind $seed" >&2
    exit 1
  fi
  line=$(grep "^flowfuzz: PASS" "$work/log")
  created=$((created + $(echo "$line" | sed 's/.* created \([0-9]*\).*/\1/')))
  refused=$((refused + $(echo "$line" | sed 's/.* refused \([0-9]*\).*/\1/')))
  runs=$((runs + 1))
done
echo "flow-fuzz: $runs runs of $rules rules ($profile${vg:+, valgrind}) passed: $created created, $refused refused, distinct refusals: $(grep -c '^flowfuzz: refusal' "$work/log") in the last run"
