#!/usr/bin/env python3
"""The ports' counters of a running DPDK process through its telemetry socket, read when asked
(Pktgen's Lua has no xstats call, and its port counters are copies taken once a second). Used
by scripts/pktgen.lua through PG_TELEMETRY (set by scripts/pktgen.sh and scripts/c-mlx4-bench.sh):

  pktgen_telemetry.py PREFIX stats P...   `time <monotonic s>`, `cpu <s>`, then `port P opackets=N ...`
  pktgen_telemetry.py PREFIX xstats P     `name value` lines
"""
import json, os, socket, sys, time
prefix, what, ports = sys.argv[1], sys.argv[2], sys.argv[3:]
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
# EAL's runtime directory: /var/run/dpdk for root, else under XDG_RUNTIME_DIR (or /tmp).
run = "/var/run" if os.getuid() == 0 else os.environ.get("XDG_RUNTIME_DIR", "/tmp")
s.connect(f"{run}/dpdk/{prefix}/dpdk_telemetry.v2")
limit = json.loads(s.recv(1024))["max_output_len"]

def ask(cmd):
    s.send(cmd.encode())
    return json.loads(s.recv(limit))[cmd.split(",")[0]]

def lcore_cpu():
    """Seconds on a CPU of Pktgen's polling lcore (thread rte-worker-1), or -1 if not found:
    Popen runs us from a shell whose parent is Pktgen."""
    try:
        shell = os.getppid()
        pid = open(f"/proc/{shell}/stat").read().rsplit(")", 1)[1].split()[1]
        for tid in os.listdir(f"/proc/{pid}/task"):
            if open(f"/proc/{pid}/task/{tid}/comm").read().strip() == "rte-worker-1":
                return int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        pass
    return -1

if what == "stats":
    got = {p: ask(f"/ethdev/stats,{p}") for p in ports}
    print("time", time.monotonic())
    print("cpu", lcore_cpu())
    keys = ("opackets", "ipackets", "imissed", "ierrors", "oerrors", "rx_nombuf")
    for p in ports:
        print("port", p, " ".join(f"{k}={got[p][k]}" for k in keys))
else:
    for name, value in ask(f"/ethdev/xstats,{ports[0]}").items():
        print(name, value)
