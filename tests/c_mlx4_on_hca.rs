//! DPDK's own C mlx4 driver (Debian's unmodified `librte_net_mlx4.so`) on the software HCA,
//! through the verbs stand-in (`pmd/verbs`), under `dpdk-testpmd`: the strongest check that the
//! model is a ConnectX-3 as another driver sees one (doc/c-mlx4.md).
//!
//! The device is presented as `c_mlx4` describes (a sysfs tree of the test's own, the stand-in
//! first on `LD_LIBRARY_PATH`, `MLX4RS_VERBS`). Where the C driver cannot run, the failure
//! names the entry point or behaviour that stopped it.

mod c_mlx4;
mod common;

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::Duration;

use c_mlx4::{assert_probed, diagnose, CDevice};
use common::{every_port_moved, every_port_sent, number_after, xstat, Step::*, TRAFFIC_LIMIT};

const LIMIT: Duration = Duration::from_secs(120);
/// ConnectX-3 (not Pro: the C driver then uses no tunnel offload bits).
const CX3: u16 = 0x1003;

fn nm(args: &[&str], file: &std::path::Path) -> String {
    let out = Command::new("nm")
        .args(args)
        .arg(file)
        .output()
        .expect("nm not found (binutils)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every process that finds the stand-in as `libibverbs.so.1` loads what testpmd links (the
/// mlx5 stack) and every PMD in EAL's plugin directory with `RTLD_NOW`: each versioned
/// rdma-core symbol any of them needs must be exported with that version, or the process does
/// not start.
#[test]
fn stand_in_exports_every_rdma_core_symbol_dpdk_links() {
    let lib = c_mlx4::preflight();
    let mut consumers: Vec<_> = std::fs::read_dir(c_mlx4::pmd_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "so"))
        .collect();
    let testpmd = Command::new("sh")
        .args(["-c", "command -v dpdk-testpmd"])
        .output()
        .unwrap();
    consumers.push(String::from_utf8_lossy(&testpmd.stdout).trim().into());
    let mut needed = HashSet::new();
    for c in &consumers {
        for l in nm(&["-D", "--undefined-only"], c).lines() {
            let sym = l.split_whitespace().last().unwrap_or("");
            if let Some((name, ver)) = sym.split_once('@') {
                if ["IBVERBS_", "MLX4_", "MLX5_", "MANA_"]
                    .iter()
                    .any(|p| ver.starts_with(p))
                {
                    needed.insert((name.to_owned(), ver.to_owned()));
                }
            }
        }
    }
    assert!(
        needed.contains(&("mlx4dv_init_obj".into(), "MLX4_1.0".into())),
        "librte_net_mlx4.so links mlx4dv_init_obj@MLX4_1.0: {needed:?}"
    );
    let exported: HashSet<(String, String)> = nm(&["-D", "--defined-only"], &lib)
        .lines()
        .filter_map(|l| {
            let sym = l.split_whitespace().last()?;
            let (name, ver) = sym.split_once("@@")?;
            Some((name.to_owned(), ver.to_owned()))
        })
        .collect();
    let mut missing: Vec<_> = needed.difference(&exported).collect();
    missing.sort();
    assert!(
        missing.is_empty(),
        "the stand-in lacks these versioned entry points (add them to pmd/verbs/symbols.txt): \
         {missing:?}"
    );
}

fn model(dev: &CDevice, out: &common::Output) -> HashMap<String, u64> {
    assert!(
        dev.stats.exists(),
        "the model's counters were not written (the C driver did not close its contexts):\n{}",
        diagnose(out)
    );
    dev.counters()
}

/// The last `NIC statistics for port <p>` block.
fn port_stats(all: &str, p: u32) -> &str {
    let marker = format!("NIC statistics for port {p} ");
    let i = all
        .rfind(&marker)
        .unwrap_or_else(|| panic!("no port {p} statistics:\n{all}"));
    let rest = &all[i..];
    // The block ends with a line of '#'s after its header line.
    let body = rest.find('\n').map_or(rest.len(), |n| n + 1);
    let end = rest[body..].find("  ####").map_or(rest.len(), |e| body + e);
    &rest[..end]
}

fn stat(block: &str, key: &str) -> u64 {
    number_after(block, key).unwrap_or_else(|| panic!("no {key} in:\n{block}"))
}

#[test]
fn txonly_frames_on_a_pcap_wire_decode_as_testpmds() {
    let dir = common::scratch_dir("c-pcap");
    let pcap = dir.join("c.pcap");
    let dev = CDevice::new("c-txonly", &format!("pcap:{}", pcap.display()), CX3);
    let out = dev.testpmd(
        &[],
        &["--forward-mode=txonly", "--total-num-mbufs=8192"],
        &[
            Cmd("start"),
            Until {
                cmd: "show fwd stats all",
                done: every_port_sent::<2000>,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("show port stats all"),
            Cmd("show port info 0"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    assert_probed(&out, &dev);
    assert!(out.status.success(), "{}", diagnose(&out));
    let all = out.all();
    let sent = stat(port_stats(&all, 0), "TX-packets:");
    assert!(sent > 1000, "txonly sent only {sent}:\n{}", diagnose(&out));
    let m = model(&dev, &out);
    assert_eq!(
        m["tx_frames"], sent,
        "every frame the C driver counted reached the wire"
    );
    assert_eq!(
        m["wqe_fetched"], sent,
        "one WQE per frame, fetched from ring memory"
    );
    assert_eq!(m["error_cqes"], 0, "no WQE the device refused");
    // The C driver asks for a completion every 64 WQEs (min(64, desc/4) with 512 descriptors).
    assert_eq!(m["cqes"], sent / 64, "one CQE per 64 WQEs");
    assert!(m["doorbells"] >= 1 && m["doorbells"] <= sent, "{m:?}");

    let frames = common::read_pcap(&pcap);
    assert_eq!(frames.len() as u64, sent, "pcap holds every frame");
    let mac = all
        .lines()
        .find_map(|l| l.split("port 1 MAC address is ").nth(1))
        .expect("the C driver logs its MAC")
        .trim()
        .to_lowercase();
    let tshark = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(&pcap)
        .args([
            "-o",
            "ip.check_checksum:TRUE",
            "-T",
            "fields",
            "-E",
            "separator=,",
        ])
        .args([
            "-e",
            "frame.len",
            "-e",
            "eth.src",
            "-e",
            "eth.dst",
            "-e",
            "ip.src",
        ])
        .args(["-e", "ip.dst", "-e", "udp.srcport", "-e", "udp.dstport"])
        .args(["-e", "ip.checksum.status"])
        .output()
        .expect("tshark not found: run scripts/setup.sh");
    assert!(tshark.status.success(), "tshark: {tshark:?}");
    let text = String::from_utf8_lossy(&tshark.stdout);
    let want = format!("64,{mac},02:00:00:00:00:00,198.18.0.1,198.18.0.2,9,9,1");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len() as u64, sent, "tshark decodes every frame");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(*l, want, "frame {i} is not testpmd's txonly frame");
    }
}

#[test]
fn io_on_a_looped_wire_counts_and_survives_stop_start() {
    let dev = CDevice::new("c-loop", "loop", CX3);
    let out = dev.testpmd(
        &[],
        &["--forward-mode=io", "--total-num-mbufs=8192"],
        &[
            Cmd("start tx_first"),
            Grows {
                cmd: "show port stats 0",
                key: "RX-packets:",
                by: 64,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("port stop all"),
            Cmd("port start all"),
            Cmd("start tx_first"),
            Grows {
                cmd: "show port stats 0",
                key: "RX-packets:",
                by: 64,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("show port stats all"),
            Cmd("clear port stats all"),
            Cmd("show port stats all"),
            Cmd("port stop all"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    assert_probed(&out, &dev);
    assert!(out.status.success(), "{}", diagnose(&out));
    let all = out.all();
    // Two forwarding runs, each with frames of its own.
    let runs: Vec<u64> = all
        .match_indices("Forward statistics for port 0")
        .map(|(i, _)| stat(&all[i..], "TX-packets:"))
        .collect();
    assert_eq!(runs.len(), 2, "{}", diagnose(&out));
    assert!(
        runs.iter().all(|&n| n > 32),
        "both runs forwarded (port stop/start works): {runs:?}\n{}",
        diagnose(&out)
    );
    let cumulative = &all[..all.rfind("clear port stats all").expect("clear")];
    let s = port_stats(cumulative, 0);
    let (tx, rx) = (stat(s, "TX-packets:"), stat(s, "RX-packets:"));
    assert_eq!(stat(s, "RX-errors:"), 0);
    assert_eq!(stat(s, "TX-errors:"), 0);
    let cleared = port_stats(&all, 0);
    assert_eq!(
        (stat(cleared, "RX-packets:"), stat(cleared, "TX-packets:")),
        (0, 0),
        "stats reset"
    );
    let m = model(&dev, &out);
    assert_eq!(
        m["tx_frames"], tx,
        "the device sent what the driver counted"
    );
    // Each run keeps the 32 frames of `start tx_first` circulating. Those in flight when a
    // run's `port stop all` took the queues and rules away are dropped, counted (how depends on
    // how far the C driver's stop had got); the device may also have delivered frames testpmd
    // never polled. Either way at most 32 a run, and none lost uncounted.
    let dropped: u64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("rx_drops_"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(
        m["rx_frames"] + dropped,
        tx,
        "every frame the loop brought back was delivered or counted as dropped: {m:?}\n{}",
        diagnose(&out)
    );
    for k in ["rx_drops_mtu", "rx_drops_too_long", "error_cqes"] {
        assert_eq!(m[k], 0, "{k}: {m:?}");
    }
    assert!(
        rx <= m["rx_frames"] && tx - rx <= 64,
        "at most the 32 circulating frames of each run not polled back: driver TX {tx}, RX {rx}, \
         {m:?}"
    );
}

/// The C driver steers with verbs flows (a MAC rule, a broadcast rule, a promiscuous rule) and
/// sets the MTU on its netdev; the model filters and drops what a ConnectX-3 port would.
#[test]
fn filtering_and_mtu_follow_the_c_drivers_flows_and_netdev() {
    let mut dev = CDevice::new("c-filter", "loop", CX3);
    // testpmd's first tx burst goes to the peer address, 02:00:00:00:00:00 by default: make
    // that the port's own MAC.
    dev.extra = "mac=02:00:00:00:00:00".into();
    let out = dev.testpmd(
        &[],
        &["--forward-mode=io", "--total-num-mbufs=8192"],
        &[
            Cmd("set promisc all off"),
            // To our MAC: a MAC flow takes it.
            Cmd("start tx_first"),
            Grows {
                cmd: "show port stats 0",
                key: "RX-packets:",
                by: 64,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("show port stats 0"),
            // To another MAC without promiscuous mode: no flow takes the 32 frames.
            Cmd("set eth-peer 0 02:00:00:00:00:77"),
            Cmd("start tx_first"),
            // The device drops them, which the C driver has no counter for.
            Sleep(300),
            Cmd("stop"),
            Cmd("show port stats 0"),
            // Promiscuous: the default flow takes them.
            Cmd("set promisc all on"),
            Cmd("start tx_first"),
            Grows {
                cmd: "show port stats 0",
                key: "RX-packets:",
                by: 64,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("show port stats 0"),
            // 1200-byte frames over a 1000-byte MTU (set on the netdev, which the port follows).
            Cmd("port config mtu 0 1000"),
            Cmd("set txpkts 1200"),
            Cmd("start tx_first"),
            // As above: dropped, and no counter of the C driver's shows it.
            Sleep(300),
            Cmd("stop"),
            Cmd("show port stats 0"),
            Cmd("port stop all"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    assert_probed(&out, &dev);
    assert!(out.status.success(), "{}", diagnose(&out));
    let all = out.all();
    let runs: Vec<(u64, u64)> = all
        .match_indices("Forward statistics for port 0")
        .map(|(i, _)| {
            (
                stat(&all[i..], "RX-packets:"),
                stat(&all[i..], "TX-packets:"),
            )
        })
        .collect();
    assert_eq!(runs.len(), 4, "{}", diagnose(&out));
    assert!(runs[0].0 > 32, "frames to our MAC circulate: {runs:?}");
    assert_eq!(
        runs[1],
        (0, 32),
        "frames to another MAC are not received: {runs:?}"
    );
    assert!(runs[2].0 > 32, "promiscuous frames circulate: {runs:?}");
    assert_eq!(
        runs[3],
        (0, 32),
        "frames over the MTU are not received: {runs:?}"
    );
    let m = model(&dev, &out);
    assert_eq!(m["rx_drops_filter"], 32, "{m:?}");
    assert_eq!(m["rx_drops_mtu"], 32, "{m:?}");
    assert_eq!(
        m["rx_frames"] + m["rx_drops_filter"] + m["rx_drops_mtu"],
        m["tx_frames"],
        "every frame on the loop is received or counted as dropped: {m:?}"
    );
}

/// Four RX queues: the C driver creates four WQs, an indirection table over them and a Toeplitz
/// hash QP its flows point at; the model spreads frames of different flows over the four.
#[test]
fn rss_spreads_frames_over_the_c_drivers_wqs() {
    let dev = CDevice::new("c-rss", "loop", CX3);
    let out = dev.testpmd(
        &[],
        &[
            "--forward-mode=io",
            "--rxq=4",
            "--txq=4",
            "--txonly-multi-flow",
            "--total-num-mbufs=16384",
        ],
        &[
            Cmd("start tx_first"),
            Until {
                cmd: "show port xstats 0",
                done: |x| (0..4).all(|q| xstat(x, &format!("rx_q{q}_packets")) >= Some(64)),
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("show port xstats 0"),
            Cmd("port stop all"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    assert_probed(&out, &dev);
    assert!(out.status.success(), "{}", diagnose(&out));
    let all = out.all();
    let per_queue: Vec<u64> = (0..4)
        .map(|q| {
            common::xstat(&all, &format!("rx_q{q}_packets"))
                .unwrap_or_else(|| panic!("no rx_q{q}_packets:\n{}", diagnose(&out)))
        })
        .collect();
    let total: u64 = per_queue.iter().sum();
    assert!(
        total > 128,
        "frames circulated: {per_queue:?}\n{}",
        diagnose(&out)
    );
    for (q, n) in per_queue.iter().enumerate() {
        assert!(
            *n > total / 16,
            "queue {q} got {n} of {total}: RSS spreads flows ({per_queue:?})"
        );
    }
    let m = model(&dev, &out);
    assert_eq!(m["rx_frames"], m["tx_frames"], "{m:?}");
    assert_eq!(m["rx_drops_no_wqe"], 0, "{m:?}");
}

/// A C-driven port and a `net_mlx4rs` port cabled to each other through a file
/// (`wire=cable:<path>`). The two ports live in two copies of the model in one process (the
/// stand-in's and the plugin's); the cable file joins them as it joins two processes.
#[test]
fn io_across_a_cable_to_net_mlx4rs_conserves_every_frame() {
    let dir = common::scratch_dir("c-cable-wire");
    let cable = dir.join("cable");
    let dev = CDevice::new("c-cable", &format!("cable:{}", cable.display()), CX3);
    let rs = format!("net_mlx4rs0,wire=cable:{}", cable.display());
    let out = dev.testpmd(
        &[&rs],
        &["--forward-mode=io", "--total-num-mbufs=8192"],
        &[
            Cmd("start tx_first 4"),
            Until {
                cmd: "show fwd stats all",
                done: every_port_moved::<512>,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            // Frames on the cable land; what the C port's device executed shows only in the
            // model's counters at close.
            Sleep(300),
            Cmd("port stop all"),
            Cmd("show port xstats 1"),
            Cmd("show port stats all"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_probed(&out, &dev);
    assert!(out.status.success(), "{}", diagnose(&out));
    let all = out.all();
    assert!(
        all.contains("Port 1: ") || all.contains("port 1"),
        "two ports (C mlx4 and net_mlx4rs):\n{all}"
    );
    let m = model(&dev, &out);
    let rs_tx = common::xstat(&all, "hca_tx_frames").expect("net_mlx4rs xstats");
    let rs_rx = common::xstat(&all, "hca_rx_frames").expect("net_mlx4rs xstats");
    assert!(
        m["tx_frames"] > 128,
        "the C port forwarded: {m:?}\n{}",
        diagnose(&out)
    );
    assert!(rs_tx > 128, "the net_mlx4rs port forwarded:\n{all}");
    assert_eq!(
        rs_rx, m["tx_frames"],
        "net_mlx4rs received all the C port sent"
    );
    assert_eq!(
        m["rx_frames"], rs_tx,
        "the C port received all net_mlx4rs sent"
    );
    assert_eq!(m["tx_drops_wire"], 0);
    for k in [
        "rx_drops_no_wqe",
        "rx_drops_wire",
        "rx_drops_filter",
        "rx_drops_mtu",
    ] {
        assert_eq!(m[k], 0, "C port {k}: {m:?}");
        assert_eq!(
            common::xstat(&all, &format!("hca_{k}")),
            Some(0),
            "net_mlx4rs {k}"
        );
    }
    assert_eq!(common::xstat(&all, "hca_tx_drops_wire"), Some(0));
}

/// rte_flow through the C driver: its verbs flows (Ethernet, IPv4 and UDP specs on a one-WQ
/// hash QP; a flow on its drop QP) become the model's flow rules. testpmd's frames are UDP to
/// port 9 of one flow, which the default RSS puts on queue 1: a rule sends them all to queue 0
/// instead, then a drop rule drops them all. (mlx4 wants the destination MAC in a rule with
/// more items: the frames go to testpmd's peer address.)
#[test]
fn rte_flow_rules_steer_and_drop_through_the_c_drivers_verbs_flows() {
    let dev = CDevice::new("c-flow", "loop", CX3);
    let out = dev.testpmd(
        &[],
        &[
            "--forward-mode=io",
            "--rxq=2",
            "--txq=2",
            "--total-num-mbufs=16384",
        ],
        &[
            Cmd(concat!(
                "flow create 0 ingress pattern eth dst is 02:00:00:00:00:00 / ipv4 / ",
                "udp dst is 9 / end actions queue index 0 / end"
            )),
            Cmd("flow list 0"),
            Cmd("start tx_first"),
            Until {
                cmd: "show port xstats 0",
                done: |x| xstat(x, "rx_q0_packets") >= Some(128),
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("show port xstats 0"),
            Cmd("flow flush 0"),
            Cmd(concat!(
                "flow create 0 ingress pattern eth dst is 02:00:00:00:00:00 / ipv4 / ",
                "udp dst is 9 / end actions drop / end"
            )),
            Cmd("clear port stats all"),
            Cmd("start tx_first"),
            // The rule drops them, which the C driver has no counter for.
            Sleep(500),
            Cmd("stop"),
            Cmd("show port stats 0"),
            Cmd("port stop all"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    assert_probed(&out, &dev);
    assert!(out.status.success(), "{}", diagnose(&out));
    let all = out.all();
    assert!(
        all.contains("Flow rule #0 created"),
        "the C driver took the rule:\n{}",
        diagnose(&out)
    );
    let q = |n: u32| {
        common::xstat(&all, &format!("rx_q{n}_packets"))
            .unwrap_or_else(|| panic!("no rx_q{n}_packets:\n{}", diagnose(&out)))
    };
    assert!(q(0) > 64, "the rule's queue received them: {}", q(0));
    assert_eq!(q(1), 0, "nothing took the default RSS");
    let last = all
        .rfind("Forward statistics for port 0")
        .expect("forward statistics");
    assert_eq!(
        stat(&all[last..], "RX-packets:"),
        0,
        "the drop rule drops them:\n{}",
        &all[last..]
    );
    let m = model(&dev, &out);
    assert!(m["rx_drops_flow"] >= 32, "{m:?}");
    assert_eq!(
        m["rx_frames"] + m["rx_drops_flow"],
        m["tx_frames"],
        "every frame on the loop is received or dropped by the rule: {m:?}"
    );
}

/// A ConnectX-3 Pro (0x1007): the C driver offers what the model now does (tunnel checksum
/// offloads, KEEP_CRC through FCS scatter), reports the model's firmware, and frames circulate
/// on a loop with the Pro's CQEs.
#[test]
fn a_connectx3_pro_offers_tunnel_offloads_keep_crc_and_the_firmware_version() {
    let dev = CDevice::new("c-pro", "loop", 0x1007);
    let out = dev.testpmd(
        &[],
        &["--forward-mode=io", "--total-num-mbufs=8192"],
        &[
            Cmd("show port info 0"),
            Cmd("show port 0 rx_offload capabilities"),
            Cmd("show port 0 tx_offload capabilities"),
            Cmd("start tx_first"),
            Grows {
                cmd: "show port stats 0",
                key: "RX-packets:",
                by: 64,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("port stop all"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    assert_probed(&out, &dev);
    assert!(out.status.success(), "{}", diagnose(&out));
    let all = out.all();
    assert!(
        all.contains("Firmware-version: 2.42.5000"),
        "the model's firmware:\n{}",
        diagnose(&out)
    );
    for capa in ["KEEP_CRC", "OUTER_IPV4_CKSUM"] {
        assert!(all.contains(capa), "{capa} offered:\n{}", diagnose(&out));
    }
    let m = model(&dev, &out);
    assert!(m["rx_frames"] > 32, "frames circulated: {m:?}");
    // The 32 frames of `start tx_first` circulate; those in flight when `port stop all` took
    // the rules away are dropped and counted (as `io_on_a_looped_wire_...` explains).
    let dropped: u64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("rx_drops_"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(m["rx_frames"] + dropped, m["tx_frames"], "{m:?}");
    assert!(
        dropped <= 32,
        "at most the circulating frames dropped: {m:?}"
    );
    assert_eq!(m["error_cqes"], 0, "{m:?}");
}
