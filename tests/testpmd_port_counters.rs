//! The standard xstat names other drivers give a card's port counters (what Open vSwitch maps
//! by name), and RSS configured with `RTE_ETH_RSS_IP` unmasked, through `dpdk-testpmd`.

mod common;

use common::{port_xstat, testpmd, xstat, Step::*};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(90);
const WAIT: Duration = Duration::from_secs(20);

/// The 22 names Open vSwitch 3.1 reads into its interface statistics.
const OVS_NAMES: [&str; 22] = [
    "rx_broadcast_packets",
    "rx_multicast_packets",
    "rx_size_64_packets",
    "rx_size_65_to_127_packets",
    "rx_size_128_to_255_packets",
    "rx_size_256_to_511_packets",
    "rx_size_512_to_1023_packets",
    "rx_size_1024_to_1522_packets",
    "rx_size_1523_to_max_packets",
    "tx_broadcast_packets",
    "tx_multicast_packets",
    "tx_size_64_packets",
    "tx_size_65_to_127_packets",
    "tx_size_128_to_255_packets",
    "tx_size_256_to_511_packets",
    "tx_size_512_to_1023_packets",
    "tx_size_1024_to_1522_packets",
    "tx_size_1523_to_max_packets",
    "rx_undersized_errors",
    "rx_oversize_errors",
    "rx_fragmented_errors",
    "rx_jabber_errors",
];

fn circulated(a: &str) -> bool {
    xstat(a, "hca_tx_frames").is_some_and(|n| n > 1000)
}

/// testpmd with `--rss-ip` (RTE_ETH_RSS_IP, 0xa38c, not masked by dev_info) on two queues of a
/// looped port; a burst of 32 broadcast frames of 60 bytes (64 on the wire) goes around under
/// io forwarding, then, after a restart, 32 multicast frames of 1000 bytes. Every frame the
/// device sent or received is in exactly one size bucket and counted by kind.
#[test]
fn standard_port_counters_count_known_traffic() {
    let out = testpmd(
        &["net_mlx4rs0,wire=loop"],
        &[
            "--forward-mode=io",
            "--rxq=2",
            "--txq=2",
            "--rss-ip",
            "--total-num-mbufs=8192",
        ],
        &[
            Cmd("show port 0 rss-hash"),
            Cmd("set eth-peer 0 ff:ff:ff:ff:ff:ff"),
            Cmd("set txpkts 60"),
            Cmd("start tx_first"),
            Until {
                cmd: "show port xstats 0",
                done: circulated,
                limit: WAIT,
            },
            Cmd("stop"),
            Cmd("port stop all"),
            Cmd("show port xstats 0"),
            Cmd("clear port xstats 0"),
            Cmd("port start all"),
            Cmd("set eth-peer 0 01:00:5e:00:00:01"),
            Cmd("set txpkts 1000"),
            Cmd("start tx_first"),
            Until {
                cmd: "show port xstats 0",
                done: circulated,
                limit: WAIT,
            },
            Cmd("stop"),
            Cmd("port stop all"),
            Cmd("show port xstats 0"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = out.all();
    assert!(out.status.success(), "{all}");
    assert!(!all.contains("invalid rss_hf"), "{all}");
    let hash = &all[all.find("RSS functions:").expect("rss-hash shown")..];
    assert!(hash.contains("ipv6-ex"), "IPV6_EX configured: {hash}");
    // The first phase's last block: the clear zeroed the broadcast counts the second phase's
    // blocks (its polls and its end) show.
    let first = all
        .split("NIC extended statistics for port 0")
        .skip(1)
        .filter(|b| xstat(b, "tx_broadcast_packets").is_some_and(|n| n > 0))
        .last()
        .unwrap_or_else(|| panic!("no xstats block of the first phase:\n{all}"));
    let phase = |text: &str, kind: &str, bucket: &str| {
        let get = |n: &str| xstat(text, n).unwrap_or_else(|| panic!("no xstat {n}:\n{text}"));
        for n in OVS_NAMES {
            get(n);
        }
        let (sent, back) = (get("hca_tx_frames"), get("hca_rx_frames"));
        assert!(sent > 1000, "{text}");
        assert_eq!(back, sent, "every frame came back:\n{text}");
        assert_eq!(get(&format!("tx_{kind}_packets")), sent, "{text}");
        assert_eq!(get(&format!("rx_{kind}_packets")), back, "{text}");
        assert_eq!(get(&format!("tx_size_{bucket}_packets")), sent, "{text}");
        assert_eq!(get(&format!("rx_size_{bucket}_packets")), back, "{text}");
        let total: u64 = OVS_NAMES[2..9].iter().map(|n| get(n)).sum();
        assert_eq!(total, back, "one bucket each:\n{text}");
        // What the device delivered, polled or left in the rings at stop.
        assert!(get("rx_good_packets") <= back, "{text}");
        for n in &OVS_NAMES[18..] {
            assert_eq!(get(n), 0, "{n}:\n{text}");
        }
    };
    phase(first, "broadcast", "64");
    assert_eq!(xstat(first, "rx_multicast_packets"), Some(0));
    phase(&all, "multicast", "512_to_1023");
    assert_eq!(port_xstat(&all, 0, "rx_broadcast_packets"), 0, "cleared");
}
