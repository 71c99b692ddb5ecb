#!/usr/bin/env bash
# Coverage-guided fuzzing on stable Rust with AFL++ through cargo-afl (crates.io): the targets
# in fuzz/ (outside the workspace) for the software HCA's frame parser (frame), devargs parsing
# (devargs) and flow specs as the device takes them (flow), each for SECS seconds from the
# seeds in fuzz/seeds/<target>. Installs cargo-afl with `cargo install` when it is missing.
# Findings stay in fuzz/out/<target>/default/{crashes,hangs}; each crash replays with
#   fuzz/target/release/<target> < fuzz/out/<target>/default/crashes/<file>
#
# Usage: scripts/afl-fuzz.sh [--secs 180] [TARGET...]   (default: frame devargs flow)
# Exits non-zero if any target found a crash or a hang.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
secs=180 targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --secs) secs=$2; shift 2 ;;
    -*) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//; /^set -euo/d' >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(frame devargs flow)
command -v cargo-afl >/dev/null || cargo install cargo-afl
# The AFL++ runtime for this rustc; a no-op (that says so) once built.
cargo afl config --build >/dev/null 2>&1 || true
cd "$top/fuzz"
cargo afl build --release -q
# A container's core_pattern pipes cores to a handler and its CPU governor is not ours: AFL++
# asks for neither when told.
export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1
found=0
for t in "${targets[@]}"; do
  rm -rf "out/$t"; mkdir -p out
  cargo afl fuzz -V "$secs" -i "seeds/$t" -o "out/$t" "target/release/$t" >"out-$t.log" 2>&1 || {
    tail -20 "out-$t.log" >&2; echo "afl-fuzz: $t did not run" >&2; exit 1; }
  stats="out/$t/default/fuzzer_stats"
  get() { sed -n "s/^$1 *: //p" "$stats"; }
  crashes=$(get saved_crashes) hangs=$(get saved_hangs)
  echo "afl-fuzz: $t: $(get execs_done) execs in $(get run_time) s, $(get corpus_count) paths," \
    "edges $(get edges_found)/$(get total_edges), $crashes crashes, $hangs hangs"
  [ "$crashes" = 0 ] && [ "$hangs" = 0 ] || found=1
  rm -f "out-$t.log"
done
exit $found
