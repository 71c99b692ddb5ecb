//! Where the frames a port loses are counted, through real `dpdk-testpmd`: a receiver nobody
//! polls counts what it cannot take as `imissed` (`rx_missed_errors`), as a NIC does, and
//! receives again once polled.

mod common;

use common::{testpmd, xstat, Step::*};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(90);

/// xstat `name` of port `port` from the last `show port xstats` of that port in `all`.
fn port_xstat(all: &str, port: u32, name: &str) -> u64 {
    let marker = format!("NIC extended statistics for port {port}");
    let start = all
        .rfind(&marker)
        .unwrap_or_else(|| panic!("no xstats of port {port}:\n{all}"));
    let rest = &all[start + marker.len()..];
    let end = rest
        .find("NIC extended statistics for port")
        .unwrap_or(rest.len());
    xstat(&rest[..end], name).unwrap_or_else(|| panic!("no {name} for port {port}:\n{all}"))
}

fn cabled(extra: &str) -> [String; 2] {
    [
        format!("net_mlx4rs0,wire=peer:net_mlx4rs1{extra}"),
        format!("net_mlx4rs1,wire=peer:net_mlx4rs0{extra}"),
    ]
}

/// txonly on two cabled ports: neither polls its receive queue, so once its ring is full each
/// port misses what arrives. Then io forwarding polls again and frames are received.
fn unpolled_receiver(extra: &str) {
    let vdevs = cabled(extra);
    let vdevs: Vec<&str> = vdevs.iter().map(String::as_str).collect();
    let out = testpmd(
        &vdevs,
        &[
            "--forward-mode=txonly",
            "--txpkts=64",
            "--total-num-mbufs=16384",
        ],
        &[
            Cmd("start"),
            Sleep(1500),
            Cmd("stop"),
            Cmd("show port xstats 1"),
            Cmd("clear port xstats all"),
            Cmd("set fwd io"),
            Cmd("start tx_first"),
            Sleep(1000),
            Cmd("stop"),
            Cmd("show port xstats 1"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = out.all();
    assert!(out.status.success(), "{all}");
    let marker = "NIC extended statistics for port 1";
    let first = all.find(marker).expect("first xstats of port 1");
    let second = all.rfind(marker).expect("second xstats of port 1");
    assert!(first < second, "two xstats blocks:\n{all}");
    let unpolled = &all[..second];
    let missed = port_xstat(unpolled, 1, "rx_missed_errors");
    let no_wqe = port_xstat(unpolled, 1, "hca_rx_drops_no_wqe");
    let wire = port_xstat(unpolled, 1, "hca_rx_drops_wire");
    let got = port_xstat(unpolled, 1, "hca_rx_frames");
    assert!(
        missed > 10_000,
        "an unpolled receiver misses frames: {missed}\n{all}"
    );
    assert_eq!(
        missed,
        no_wqe + wire,
        "imissed is the device's count of frames lost for want of a buffer or room"
    );
    assert!(
        got <= 1024,
        "at most a ring's worth of frames was delivered while nobody polled: {got}"
    );
    assert_eq!(
        port_xstat(unpolled, 1, "rx_good_packets"),
        0,
        "nobody polled"
    );
    let polled = &all[second..];
    let received = port_xstat(polled, 1, "rx_good_packets");
    assert!(
        received > 1024,
        "polled again, the port receives: {received}\n{polled}"
    );
}

#[test]
fn unpolled_receiver_counts_missed_frames_then_receives() {
    unpolled_receiver("");
}
