//! The receive path and the control surface through real `dpdk-testpmd`: forwarding between
//! cabled ports, a looped wire, RSS over several queues, MAC filtering, MTU, checksum flags,
//! and a Linux TAP interface with the kernel on the other side.

mod common;

use common::{
    every_port_moved, every_port_received, number_after, port_xstat, testpmd, xstat, Step::*,
    MOVED, SENT, TRAFFIC_LIMIT,
};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(90);

/// Frames a forwarding test waits for on every port, each way: well past the 32 a first
/// burst sends, so that forwarding, not only the first burst, is what gets checked.
const FRAMES: u64 = 256;

/// Forwarding across the cable until each port has moved `FRAMES` each way, then every port
/// stopped (which drains TX) and all xstats shown.
fn forward_across_cable(app_args: &[&str], first: &str) -> String {
    let out = testpmd(
        &cabled(),
        app_args,
        &[
            Cmd(first),
            Until {
                cmd: "show fwd stats all",
                done: every_port_moved::<FRAMES>,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            // Port stop drains TX; what is still in RX rings stays counted by the device.
            Cmd("port stop all"),
            Cmd("show port xstats all"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = out.all();
    assert!(out.status.success(), "{all}");
    all
}

/// What port `a` sent went out, and port `b`'s device received all of it and dropped
/// nothing; returns (sent, handed up by port `b`).
fn assert_cable_conserves(all: &str, a: u32, b: u32) -> (u64, u64) {
    let sent = port_xstat(all, a, "tx_good_packets");
    assert!(sent > 32, "port {a} forwarded only {sent}:\n{all}");
    assert_eq!(
        port_xstat(all, a, "hca_tx_frames"),
        sent,
        "port {a} TX reached the wire"
    );
    assert_eq!(
        port_xstat(all, b, "hca_rx_frames"),
        sent,
        "port {b} got all port {a} sent"
    );
    for d in [
        "hca_rx_drops_no_wqe",
        "hca_rx_drops_wire",
        "hca_rx_drops_filter",
        "hca_rx_drops_mtu",
        "hca_rx_drops_too_long",
        "rx_errors",
    ] {
        assert_eq!(port_xstat(all, b, d), 0, "{d} on port {b}");
    }
    let got = port_xstat(all, b, "rx_good_packets");
    assert!(
        got > 0 && got <= sent && got + 1024 >= sent,
        "port {b} handed up {got} of {sent}"
    );
    (sent, got)
}

fn cabled() -> [&'static str; 2] {
    [
        "net_mlx4rs0,wire=peer:net_mlx4rs1",
        "net_mlx4rs1,wire=peer:net_mlx4rs0",
    ]
}

/// Cabled ports whose devices run on threads of their own: the receiver's filters act on
/// frames even while nobody polls it (with device_loop=lcore, a port's device runs when the
/// port is polled).
fn cabled_threaded() -> [&'static str; 2] {
    [
        "net_mlx4rs0,wire=peer:net_mlx4rs1,device_loop=port",
        "net_mlx4rs1,wire=peer:net_mlx4rs0,device_loop=port",
    ]
}

#[test]
fn io_forwarding_across_a_cable_loses_nothing() {
    let all = forward_across_cable(
        &["--forward-mode=io", "--total-num-mbufs=8192"],
        "start tx_first 4",
    );
    for (a, b) in [(0, 1), (1, 0)] {
        assert_cable_conserves(&all, a, b);
    }
}

#[test]
fn looped_wire_returns_every_frame() {
    let out = testpmd(
        &["net_mlx4rs0,wire=loop"],
        &["--forward-mode=io", "--total-num-mbufs=4096"],
        &[
            Cmd("start tx_first"),
            Until {
                cmd: "show fwd stats all",
                done: every_port_moved::<FRAMES>,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("port stop all"),
            Cmd("show port xstats all"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = out.all();
    assert!(out.status.success(), "{all}");
    let sent = port_xstat(&all, 0, "hca_tx_frames");
    let back = port_xstat(&all, 0, "hca_rx_frames");
    assert!(sent > 32, "frames circulated: {sent}\n{all}");
    assert_eq!(back, sent, "every transmitted frame came back");
    assert_eq!(port_xstat(&all, 0, "hca_rx_drops_no_wqe"), 0);
}

/// txonly on a looped wire never polls its receive queue: the device fills it (in the default
/// device loop, when the port stops: it delivers what waits at the port), and the rest are
/// missed. Stopping the port drops what the queue held; those frames are counted
/// (`rx_discarded`), so every frame the device delivered is accounted for.
#[test]
fn frames_left_in_a_receive_queue_at_stop_are_counted() {
    fn looped(ans: &str) -> bool {
        xstat(ans, "hca_tx_frames").is_some_and(|n| n >= 4096)
    }
    let out = testpmd(
        &["net_mlx4rs0,wire=loop"],
        &[
            "--forward-mode=txonly",
            "--rxd=512",
            "--total-num-mbufs=4096",
        ],
        &[
            Cmd("start"),
            Until {
                cmd: "show port xstats 0",
                done: looped,
                limit: LIMIT,
            },
            Cmd("stop"),
            Cmd("port stop all"),
            Cmd("show port stats all"),
            Cmd("show port xstats all"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = out.all();
    assert!(out.status.success(), "{all}");
    let delivered = port_xstat(&all, 0, "hca_rx_frames");
    let discarded = port_xstat(&all, 0, "rx_discarded");
    let taken = number_after(&all, "RX-packets:").expect("RX-packets");
    assert_eq!(
        discarded, 512,
        "the full ring's frames were dropped at stop\n{all}"
    );
    assert_eq!(
        delivered,
        taken + discarded,
        "every delivered frame is counted\n{all}"
    );
    assert_eq!(port_xstat(&all, 0, "rx_q0_discarded"), discarded);
}

/// Queues 0 and 1 of both ports have received (the last `show port xstats all` counts).
fn both_queues_received(xstats: &str) -> bool {
    ["rx_q0_packets:", "rx_q1_packets:"].iter().all(|q| {
        let n = common::numbers_after(xstats, q);
        n.len() == 2 && n.iter().all(|&n| n > 0)
    })
}

#[test]
fn rss_spreads_flows_over_queues() {
    let out = testpmd(
        &cabled(),
        &[
            "--forward-mode=io",
            "--rxq=2",
            "--txq=2",
            "--txonly-multi-flow",
            "--total-num-mbufs=16384",
        ],
        &[
            Cmd("start tx_first 2"),
            Until {
                cmd: "show port xstats all",
                done: both_queues_received,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("show port 1 rss-hash key"),
            Cmd("show port 1 rss reta 128 (0xffffffffffffffff,0xffffffffffffffff)"),
            Cmd("port stop all"),
            Cmd("show port xstats all"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = out.all();
    assert!(out.status.success(), "{all}");
    for port in [0, 1] {
        let q0 = port_xstat(&all, port, "rx_q0_packets");
        let q1 = port_xstat(&all, port, "rx_q1_packets");
        assert!(
            q0 > 0 && q1 > 0,
            "port {port}: queue 0 got {q0}, queue 1 got {q1}\n{all}"
        );
    }
    assert!(
        all.contains(
            "6D5A56DA255B0EC24167253D43A38FB0D0CA2BCBAE7B30B477CB2DA38030F20C6A42B73BBEAC01FA"
        ),
        "default Toeplitz key reported:\n{all}"
    );
    // Default redirection table: round robin over the two queues.
    assert!(
        all.contains("RSS RETA configuration: hash index=0, queue=0"),
        "{all}"
    );
    assert!(
        all.contains("RSS RETA configuration: hash index=1, queue=1"),
        "{all}"
    );
}

/// After txonly stopped: port 0's device has sent all that was posted, and port 1's has taken
/// all of it (filtered, or dropped at its wire when its thread fell behind). Both devices run
/// on threads of their own, which go on after `stop` with what is still in the rings and on
/// the cable.
fn all_sent_arrived(answer: &str) -> bool {
    let Some((p0, p1)) = answer.split_once("NIC extended statistics for port 1") else {
        return false;
    };
    let get = |t: &str, n: &str| xstat(t, n).unwrap_or(u64::MAX);
    let on_cable = get(p0, "hca_tx_frames");
    let arrived: u64 = p1
        .lines()
        .filter_map(|l| l.trim().split_once(": "))
        .filter(|(k, _)| *k == "hca_rx_frames" || k.starts_with("hca_rx_drops_"))
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum();
    on_cable > 0
        && get(p0, "tx_good_packets") == on_cable + get(p0, "hca_tx_drops_wire")
        && arrived == on_cable
}

#[test]
fn promiscuous_off_filters_and_on_delivers() {
    // txonly sends to 02:00:00:00:00:01 (testpmd's default peer address for port 1's peer),
    // never port 1's own MAC.
    let out = testpmd(
        &cabled_threaded(),
        &["--forward-mode=txonly", "--total-num-mbufs=8192"],
        &[
            Cmd("set promisc 1 off"),
            Cmd("set portlist 0"),
            Cmd("start"),
            Until {
                cmd: "show port xstats 1",
                done: |x| xstat(x, "hca_rx_drops_filter").is_some_and(|n| n > 0),
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Until {
                cmd: "show port xstats all",
                done: all_sent_arrived,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("set promisc 1 on"),
            Cmd("start"),
            Until {
                cmd: "show port xstats 1",
                done: |x| xstat(x, "hca_rx_frames").is_some_and(|n| n > 0),
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("port stop all"),
            Cmd("show port xstats 1"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = out.all();
    assert!(out.status.success(), "{all}");
    // Port 1's xstats answers in order: those of promiscuous off (and of the first polls after
    // it went on, before a frame arrived) deliver nothing; the last is the end of the session.
    let answers: Vec<&str> = all
        .split("NIC extended statistics for port 1")
        .skip(1)
        .collect();
    let off = answers
        .iter()
        .rev()
        .find(|a| xstat(a, "hca_rx_frames") == Some(0))
        .unwrap_or_else(|| panic!("no answer with promiscuous off:\n{all}"));
    let on = answers.last().unwrap();
    let filtered = xstat(off, "hca_rx_drops_filter").unwrap();
    assert!(filtered > 0, "promiscuous off drops foreign frames:\n{all}");
    assert_eq!(xstat(off, "hca_rx_frames"), Some(0), "{all}");
    assert!(
        xstat(on, "hca_rx_frames").unwrap() > 0,
        "promiscuous on delivers:\n{all}"
    );
    assert_eq!(
        xstat(on, "hca_rx_drops_filter"),
        Some(filtered),
        "no more filter drops"
    );
}

#[test]
fn mtu_drops_longer_frames_and_counts_them() {
    let out = testpmd(
        &cabled_threaded(),
        &[
            "--forward-mode=txonly",
            "--txpkts=300",
            "--total-num-mbufs=8192",
        ],
        &[
            Cmd("port stop 1"),
            Cmd("port config mtu 1 256"),
            Cmd("port start 1"),
            Cmd("set portlist 0"),
            Cmd("start"),
            Until {
                cmd: "show port xstats 1",
                done: |x| xstat(x, "hca_rx_drops_mtu").is_some_and(|n| n > 0),
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("port stop all"),
            Cmd("show port xstats 1"),
            Cmd("show port info 1"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = out.all();
    assert!(out.status.success(), "{all}");
    assert!(all.contains("MTU: 256"), "{all}");
    assert!(xstat(&all, "hca_rx_drops_mtu").unwrap() > 0, "{all}");
    assert_eq!(xstat(&all, "hca_rx_frames"), Some(0), "{all}");
}

#[test]
fn rx_checksum_and_packet_type_flags() {
    // rxonly, so that the verbose dump ends with tx_first's frames: a loop of frames printed
    // without end keeps stdout's lock from testpmd's main thread, and its answers stall.
    let out = testpmd(
        &cabled(),
        &[
            "--forward-mode=rxonly",
            "--enable-rx-cksum",
            "--total-num-mbufs=8192",
        ],
        &[
            Cmd("set verbose 1"),
            Cmd("start tx_first"),
            MOVED,
            Cmd("stop"),
            Cmd("set verbose 0"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = out.all();
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("hw ptype: L2_ETHER L3_IPV4_EXT_UNKNOWN L4_UDP"),
        "{all}"
    );
    assert!(all.contains("RTE_MBUF_F_RX_IP_CKSUM_GOOD"), "{all}");
    assert!(all.contains("RTE_MBUF_F_RX_L4_CKSUM_GOOD"), "{all}");
    assert!(!all.contains("CKSUM_BAD"), "{all}");
}

#[test]
fn tap_wire_talks_to_the_kernel() {
    if !std::path::Path::new("/dev/net/tun").exists() || unsafe_uid() != 0 {
        eprintln!("skipped: needs root and /dev/net/tun");
        return;
    }
    let id = std::process::id() % 100_000;
    let ifname = format!("m4t{id}");
    let ns = format!("mlx4rs-{id}");
    let dir = common::scratch_dir("tap");
    let count = dir.join("kernel_rx");
    let quiet_del = || {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &ns])
            .stderr(std::process::Stdio::null())
            .status();
    };
    quiet_del();
    let vdev = format!("net_mlx4rs0,wire=tap:{ifname}");
    // The kernel side lives in a namespace of its own; it sends 50 frames of a local
    // experimental EtherType from a raw socket, and counts what testpmd sends it.
    let setup = format!(
        "ip netns add {ns} && ip link set {ifname} netns {ns} && \
         ip netns exec {ns} sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 && \
         ip -n {ns} link set {ifname} up"
    );
    let send = format!(
        "ip netns exec {ns} python3 -c \"import socket; s=socket.socket(socket.AF_PACKET, socket.SOCK_RAW); \
         s.bind(('{ifname}', 0)); f=bytes.fromhex('ffffffffffff02aabbccddee88b5')+bytes(46); \
         [s.send(f) for _ in range(50)]\""
    );
    let read = format!(
        "ip netns exec {ns} cat /sys/class/net/{ifname}/statistics/rx_packets > {}",
        count.display()
    );
    let out = testpmd(
        &[&vdev],
        &["--forward-mode=rxonly", "--total-num-mbufs=4096"],
        &[
            Shell(&setup),
            Cmd("set verbose 1"),
            Cmd("start"),
            Shell(&send),
            Until {
                cmd: "show fwd stats all",
                done: every_port_received::<50>,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("set verbose 0"),
            Cmd("show port stats 0"),
            Cmd("set fwd txonly"),
            Cmd("start"),
            SENT,
            Cmd("stop"),
            Cmd("port stop all"),
            Cmd("show port xstats 0"),
            Shell(&read),
            Cmd("quit"),
        ],
        LIMIT,
    );
    quiet_del();
    let all = out.all();
    assert!(out.status.success(), "{all}");
    let stats = &all[all.find("NIC statistics for port 0").expect("port stats")..];
    assert_eq!(
        common::number_after(stats, "RX-packets:"),
        Some(50),
        "the kernel's 50 frames arrived:\n{all}"
    );
    // Verbose lines from the forwarding core can interleave with the prompt; most are whole.
    assert!(all.matches("type=0x88b5").count() >= 45, "{all}");
    let sent = xstat(&all, "tx_good_packets").unwrap();
    assert!(sent > 0, "{all}");
    assert_eq!(xstat(&all, "hca_tx_frames"), Some(sent), "{all}");
    let kernel: u64 = std::fs::read_to_string(&count)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(kernel, sent, "the kernel received every frame testpmd sent");
    std::fs::remove_dir_all(&dir).ok();
}

fn unsafe_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .and_then(|u| u.parse().ok())
        .unwrap_or(u32::MAX)
}

#[test]
fn jumbo_frames_multi_segment_tx_and_scattered_rx() {
    // tx_first sends 4000-byte frames of 2 x 2000-byte segments (gather WQEs); each receiver
    // scatters them over 2 KiB mbufs and forwards the chains (gather again) across the cable.
    let all = forward_across_cable(
        &[
            "--forward-mode=io",
            "--txpkts=2000,2000",
            "--max-pkt-len=9018",
            "--enable-scatter",
            "--tx-offloads=0x8000",
            "--total-num-mbufs=8192",
        ],
        "start tx_first",
    );
    for (a, b) in [(0, 1), (1, 0)] {
        let (sent, got) = assert_cable_conserves(&all, a, b);
        assert_eq!(
            port_xstat(&all, a, "tx_gather_packets"),
            sent,
            "chains use gather WQEs"
        );
        assert_eq!(port_xstat(&all, a, "tx_good_bytes"), sent * 4000);
        assert_eq!(
            port_xstat(&all, b, "rx_good_bytes"),
            got * 4000,
            "whole frames reassembled"
        );
    }
}

#[test]
fn checksum_offload_through_the_csum_engine() {
    // testpmd's csum engine asks for the IP checksum in hardware (it leaves the field as it
    // found it, already right); the device recomputes it over the field it must zero first,
    // the frames loop back, and the same engine checks the receive verdicts. A device or
    // driver that summed over the stale field, or mapped the flags wrongly, shows up as bad.
    // Every 300th frame received fails, so the loop drains after at most 32 x 300 frames
    // (each failure takes at least its own frame): a verbose dump without end keeps stdout's
    // lock from testpmd's main thread, and its answers stall. 299 good frames come first.
    let out = testpmd(
        &["net_mlx4rs0,wire=loop,faults=rx_error:300"],
        &[
            "--forward-mode=csum",
            "--enable-rx-cksum",
            "--total-num-mbufs=4096",
        ],
        &[
            Cmd("port stop 0"),
            Cmd("csum set ip hw 0"),
            Cmd("csum set udp hw 0"),
            Cmd("port start 0"),
            Cmd("set verbose 1"),
            Cmd("start tx_first"),
            Until {
                cmd: "show fwd stats all",
                done: every_port_moved::<FRAMES>,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("set verbose 0"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = out.all();
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("tx: flags=RTE_MBUF_F_TX_IP_CKSUM"),
        "hardware checksum requested:\n{all}"
    );
    // The forwarding statistics at stop, the last printed.
    let rx = *common::numbers_after(&all, "RX-packets:").last().unwrap();
    assert!(
        rx > 32,
        "frames looped through the csum engine: {rx}\n{all}"
    );
    // Every answer, the polls' and the one at stop, counts no bad checksum.
    for bad in ["Bad-ipcsum:", "Bad-l4csum:"] {
        let n = common::numbers_after(&all, bad);
        assert!(
            !n.is_empty() && n.iter().all(|&n| n == 0),
            "{bad} {n:?}\n{all}"
        );
    }
}

#[test]
fn scattered_queue_reports_descriptors_as_buffers() {
    // Descriptors count buffers, as in mlx4: 1024 of them over 9018-byte frames make fewer
    // WQEs, but the queue still reports the 1024 it was given.
    let out = testpmd(
        &["net_mlx4rs0"],
        &[
            "--max-pkt-len=9018",
            "--enable-scatter",
            "--total-num-mbufs=8192",
        ],
        &[Cmd("show rxq info 0 0"), Cmd("quit")],
        LIMIT,
    );
    let all = out.all();
    assert!(out.status.success(), "{all}");
    assert!(all.contains("RX scattered packets: on"), "{all}");
    assert_eq!(
        common::number_after(&all, "Number of RXDs:"),
        Some(1024),
        "{all}"
    );
}
