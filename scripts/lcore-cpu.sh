# Sourced by the benchmark scripts: what a testpmd's threads did, read from /proc.
# On a shared machine the scheduler decides how much of an interval a thread ran, so rates are
# also given per second of the forwarding lcore's CPU time.

# Nanoseconds the forwarding lcore (testpmd's only worker thread: rte-worker-1 up to DPDK 22.11,
# dpdk-worker1 from 23.11) of the process run with --file-prefix=$1 has run so far; 0 if none.
lcore_cpu_ns() {
  local pid t
  for pid in $(pgrep -f -- "--file-prefix=$1 "); do
    for t in /proc/"$pid"/task/*; do
      case "$(cat "$t/comm" 2>/dev/null)" in
        rte-worker-1 | dpdk-worker1)
          cut -d' ' -f1 "$t/schedstat"
          return
          ;;
      esac
    done
  done
  echo 0
}

# Pin the threads named $3 (a glob on the thread's name) of the process run with
# --file-prefix=$1 to CPU $2; prints how many it pinned.
pin_threads() {
  local pid t n=0
  for pid in $(pgrep -f -- "--file-prefix=$1 "); do
    for t in /proc/"$pid"/task/*; do
      # shellcheck disable=SC2053
      if [[ "$(cat "$t/comm" 2>/dev/null)" == $3 ]]; then
        taskset -p -c "$2" "${t##*/}" > /dev/null && n=$((n + 1))
      fi
    done
  done
  echo "$n"
}
