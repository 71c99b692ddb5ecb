//! The foundation, through the real `dpdk-testpmd`: probe, link, stats, bad devargs,
//! run-time attach and detach, clean exit.

mod common;

use common::{testpmd, Step::*, SENT};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn two_ports_link_follows_start_and_stop() {
    let out = testpmd(
        &["net_mlx4rs0", "net_mlx4rs1"],
        &["--total-num-mbufs=4096", "--forward-mode=txonly"],
        &[
            // testpmd starts every port before its prompt.
            Cmd("port stop all"),
            Cmd("show port info 0"),
            Cmd("port start all"),
            Cmd("show port info all"),
            Cmd("start"),
            SENT,
            Cmd("stop"),
            Cmd("show port stats 0"),
            Cmd("clear port stats all"),
            Cmd("show port stats 0"),
            Cmd("start"),
            SENT,
            Cmd("stop"),
            Cmd("clear port xstats 0"),
            Cmd("show port xstats 0"),
            Cmd("port stop all"),
            Cmd("show port info 1"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = out.all();
    assert!(out.status.success(), "testpmd failed:\n{all}");
    // Both probed, driver name shown.
    assert_eq!(
        out.stdout.matches("Driver name: net_mlx4rs").count(),
        4,
        "{all}"
    );
    assert!(all.contains("Port 0: "), "{all}");
    assert!(all.contains("Port 1: "), "{all}");
    // Sensible limits in `show port info`.
    assert!(all.contains("Max possible RX queues: 16"), "{all}");
    assert!(
        all.contains("Max possible number of RXDs per queue: 16384"),
        "{all}"
    );
    assert!(all.contains("Link speed: 40 Gbps"), "{all}");
    // Link: down when stopped, up for both after start, down after stop.
    let status: Vec<&str> = out
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("Link status: "))
        .map(str::trim)
        .collect();
    assert_eq!(status, ["down", "up", "up", "down"], "{all}");
    // Basic stats count and reset.
    let shown: Vec<u64> = out
        .stdout
        .split("NIC statistics for port 0")
        .skip(1)
        .filter_map(|block| common::number_after(block, "TX-packets:"))
        .collect();
    let (before, after) = (shown[0], shown[1]);
    assert!(before > 0, "{all}");
    assert_eq!(after, 0, "stats reset:\n{all}");
    // xstats reset clears driver, basic and device counters alike.
    for name in [
        "tx_good_packets",
        "tx_doorbells",
        "tx_bf_writes",
        "hca_tx_frames",
    ] {
        assert_eq!(
            common::xstat(&all, name),
            Some(0),
            "{name} after xstats reset:\n{all}"
        );
    }
    assert!(all.contains("Bye..."), "{all}");
}

#[test]
fn bad_devarg_fails_only_that_port() {
    let out = testpmd(
        &["net_mlx4rs0,colour=blue", "net_mlx4rs1,wire=loop"],
        &["--total-num-mbufs=2048"],
        &[
            Cmd("port start all"),
            Cmd("show port info all"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = out.all();
    assert!(out.status.success(), "testpmd failed:\n{all}");
    assert!(
        all.contains("net_mlx4rs: net_mlx4rs0: invalid devarg colour=\"blue\": unknown key"),
        "{all}"
    );
    assert_eq!(
        out.stdout.matches("Driver name: net_mlx4rs").count(),
        1,
        "{all}"
    );
    assert!(all.contains("Device name: net_mlx4rs1"), "{all}");
    assert!(all.contains("Link status: up"), "{all}");
}

#[test]
fn bad_values_name_key_value_and_allowed() {
    let out = testpmd(
        &[
            "net_mlx4rs0,bf=sometimes",
            "net_mlx4rs1,txq_inline=5",
            "net_mlx4rs2,wire=ether",
            "net_mlx4rs3,mac=01:00:5e:00:00:01",
        ],
        &["--total-num-mbufs=2048"],
        &[Cmd("quit")],
        LIMIT,
    );
    let all = out.all();
    for line in [
        "net_mlx4rs0: invalid devarg bf=\"sometimes\": auto, on or off",
        "net_mlx4rs1: invalid devarg txq_inline=\"5\": 0 (no inlining) or 17..=928 bytes",
        "net_mlx4rs2: invalid devarg wire=\"ether\"",
        "net_mlx4rs3: invalid devarg mac=\"01:00:5e:00:00:01\"",
    ] {
        assert!(all.contains(line), "missing {line:?} in:\n{all}");
    }
    assert!(!all.contains("Driver name: net_mlx4rs"), "{all}");
}

#[test]
fn attach_and_detach_at_run_time() {
    let out = testpmd(
        &["net_mlx4rs0"],
        &["--total-num-mbufs=4096"],
        &[
            Cmd("port attach net_mlx4rs7,wire=loop"),
            Cmd("port start 1"),
            Cmd("show port info 1"),
            Cmd("port stop 1"),
            Cmd("port close 1"),
            Cmd("device detach net_mlx4rs7"),
            Cmd("port attach net_mlx4rs8,bf=nope"),
            Cmd("show port summary all"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = out.all();
    assert!(out.status.success(), "testpmd failed:\n{all}");
    assert!(all.contains("Port 1 is attached."), "{all}");
    assert!(all.contains("Device name: net_mlx4rs7"), "{all}");
    assert!(all.contains("Link status: up"), "{all}");
    assert!(all.contains("Device net_mlx4rs7 is detached"), "{all}");
    assert!(
        all.contains("net_mlx4rs8: invalid devarg bf=\"nope\""),
        "{all}"
    );
    assert!(!all.contains("Device name: net_mlx4rs8"), "{all}");
    assert!(all.contains("Bye..."), "{all}");
}

#[test]
fn bad_wire_targets_fail_their_probe_and_the_healthy_port_forwards() {
    let long = format!("net_mlx4rs4,wire=pcap:/tmp/{}", "x".repeat(4096));
    let out = testpmd(
        &[
            "net_mlx4rs0,wire=pcap:/nonexistent-dir/x.pcap",
            "net_mlx4rs1,wire=pcap:/dev/full",
            "net_mlx4rs2,wire=tap:a/b",
            "net_mlx4rs3,wire=tap:a\tb",
            &long,
            "net_mlx4rs5,wire=null",
        ],
        &["--total-num-mbufs=2048", "--forward-mode=txonly"],
        &[
            Cmd("start"),
            SENT,
            Cmd("stop"),
            Cmd("show port info all"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = out.all();
    assert!(out.status.success(), "testpmd failed:\n{all}");
    for line in [
        "net_mlx4rs0: invalid devarg wire=\"pcap:/nonexistent-dir/x.pcap\": pcap:<path> must be in an existing directory",
        "net_mlx4rs1: invalid devarg wire=\"pcap:/dev/full\": pcap:<path> must be a regular file",
        "net_mlx4rs2: invalid devarg wire=\"tap:a/b\": tap:<ifname> takes",
        "net_mlx4rs3: invalid devarg wire=\"tap:a\\tb\": null, loop, peer:<vdev name>, pcap:<path> or tap:<ifname>; whitespace and control characters are not allowed",
        "(4106 bytes): pcap:<path> cannot be used: File name too long",
    ] {
        assert!(all.contains(line), "missing {line:?} in:\n{all}");
    }
    assert!(
        !all.contains('\t'),
        "a control character reached the log:\n{all}"
    );
    assert_eq!(
        out.stdout.matches("Driver name: net_mlx4rs").count(),
        1,
        "{all}"
    );
    assert!(all.contains("Device name: net_mlx4rs5"), "{all}");
    // The healthy port forwarded: testpmd did not refuse to start because of the others.
    let tx: u64 = all
        .lines()
        .filter_map(|l| l.trim().strip_prefix("TX-packets: "))
        .filter_map(|v| v.split_whitespace().next()?.parse().ok())
        .max()
        .unwrap_or(0);
    assert!(tx > 0, "no packets sent on the healthy port:\n{all}");
}
