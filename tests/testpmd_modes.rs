//! The software HCA's device loop in each of its places (`device_loop=lcore|port|process`),
//! through real `dpdk-testpmd`: txonly, io and rxonly forward and conserve frames across a
//! loop and a cable, and a receiver nobody polls counts what it cannot take as `imissed`
//! (`rx_missed_errors`), as a NIC does, then receives again once polled.

mod common;

use common::{
    every_port_moved, every_port_received, every_port_sent, port_xstat, testpmd, Step::*,
    TRAFFIC_LIMIT,
};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(90);
const MODES: [&str; 3] = ["lcore", "port", "process"];

fn cabled(mode: &str) -> Vec<String> {
    vec![
        format!("net_mlx4rs0,wire=peer:net_mlx4rs1,device_loop={mode}"),
        format!("net_mlx4rs1,wire=peer:net_mlx4rs0,device_loop={mode}"),
    ]
}

fn run(vdevs: &[String], app_args: &[&str], steps: &[common::Step]) -> String {
    let vdevs: Vec<&str> = vdevs.iter().map(String::as_str).collect();
    let out = testpmd(&vdevs, app_args, steps, LIMIT);
    let all = out.all();
    assert!(out.status.success(), "{all}");
    all
}

/// The probe log names the device loop each port runs with.
fn assert_mode_logged(all: &str, mode: &str) {
    assert!(
        all.contains(&format!("device loop {mode}")),
        "the log says where the device runs ({mode}):\n{all}"
    );
}

#[test]
fn txonly_sends_in_every_mode() {
    for mode in MODES {
        let all = run(
            &[
                format!("net_mlx4rs0,wire=null,device_loop={mode}"),
                format!("net_mlx4rs1,wire=null,wc=off,device_loop={mode}"),
            ],
            &["--forward-mode=txonly", "--total-num-mbufs=16384"],
            &[
                Cmd("start"),
                Until {
                    cmd: "show fwd stats all",
                    done: every_port_sent::<2000>,
                    limit: TRAFFIC_LIMIT,
                },
                Cmd("stop"),
                // Port stop drains what tx_burst took.
                Cmd("port stop all"),
                Cmd("show port xstats all"),
                Cmd("quit"),
            ],
        );
        assert_mode_logged(&all, mode);
        for port in [0, 1] {
            let sent = port_xstat(&all, port, "tx_good_packets");
            assert!(sent > 1000, "{mode}: port {port} sent {sent}\n{all}");
            assert_eq!(
                port_xstat(&all, port, "hca_tx_frames"),
                sent,
                "{mode}: port {port}: every packet taken reached the wire"
            );
        }
    }
}

#[test]
fn io_across_a_cable_and_a_loop_conserves_in_every_mode() {
    for mode in MODES {
        let all = run(
            &cabled(mode),
            &["--forward-mode=io", "--total-num-mbufs=8192"],
            &[
                Cmd("start tx_first 4"),
                Until {
                    cmd: "show fwd stats all",
                    done: every_port_moved::<512>,
                    limit: TRAFFIC_LIMIT,
                },
                Cmd("stop"),
                Cmd("port stop all"),
                Cmd("show port xstats all"),
                Cmd("quit"),
            ],
        );
        for (a, b) in [(0, 1), (1, 0)] {
            let sent = port_xstat(&all, a, "hca_tx_frames");
            assert!(sent > 128, "{mode}: port {a} forwarded {sent}\n{all}");
            assert_eq!(
                port_xstat(&all, b, "hca_rx_frames"),
                sent,
                "{mode}: port {b} received all port {a} sent\n{all}"
            );
            assert_eq!(port_xstat(&all, b, "rx_missed_errors"), 0, "{mode}");
        }
        let all = run(
            &[format!("net_mlx4rs0,wire=loop,device_loop={mode}")],
            &["--forward-mode=io", "--total-num-mbufs=4096"],
            &[
                Cmd("start tx_first"),
                Until {
                    cmd: "show fwd stats all",
                    done: every_port_moved::<256>,
                    limit: TRAFFIC_LIMIT,
                },
                Cmd("stop"),
                Cmd("port stop all"),
                Cmd("show port xstats all"),
                Cmd("quit"),
            ],
        );
        let sent = port_xstat(&all, 0, "hca_tx_frames");
        assert!(sent > 32, "{mode}: frames circulated: {sent}\n{all}");
        assert_eq!(
            port_xstat(&all, 0, "hca_rx_frames"),
            sent,
            "{mode}: every frame came back"
        );
        assert_eq!(port_xstat(&all, 0, "rx_missed_errors"), 0, "{mode}");
    }
}

/// Frames the software HCA's port buffers on receive (`HcaConfig::rx_inbox_frames`).
const HCA_RX_BUFFER: u64 = 2048;

/// txonly on two cabled ports: neither polls its receive queue, so once its ring (and the
/// port's buffer) is full each port misses what arrives. Then rxonly takes what waited, and
/// io forwarding receives continuously again.
#[test]
fn an_unpolled_receiver_counts_missed_frames_then_receives_in_every_mode() {
    for mode in MODES {
        let all = run(
            &cabled(mode),
            &[
                "--forward-mode=txonly",
                "--txpkts=64",
                "--total-num-mbufs=16384",
            ],
            &[
                // Sent well past what port 1's ring and buffer hold, even with a device
                // thread a ring behind the lcore.
                Cmd("start"),
                Until {
                    cmd: "show fwd stats all",
                    done: every_port_sent::<30_000>,
                    limit: TRAFFIC_LIMIT,
                },
                Cmd("stop"),
                Cmd("show port xstats all"),
                Cmd("clear port xstats all"),
                Cmd("set fwd rxonly"),
                Cmd("start"),
                Until {
                    cmd: "show fwd stats all",
                    done: every_port_received::<1000>,
                    limit: TRAFFIC_LIMIT,
                },
                Cmd("stop"),
                Cmd("show port xstats 1"),
                Cmd("clear port xstats all"),
                Cmd("set fwd io"),
                Cmd("start tx_first"),
                Until {
                    cmd: "show fwd stats all",
                    done: every_port_moved::<2048>,
                    limit: TRAFFIC_LIMIT,
                },
                Cmd("stop"),
                Cmd("show port xstats 1"),
                Cmd("quit"),
            ],
        );
        let marker = "NIC extended statistics for port 1";
        let blocks: Vec<usize> = all.match_indices(marker).map(|(i, _)| i).collect();
        assert_eq!(blocks.len(), 3, "{mode}: three xstats blocks:\n{all}");
        let unpolled = &all[..blocks[1]];
        let rxonly = &all[..blocks[2]];
        let missed = port_xstat(unpolled, 1, "rx_missed_errors");
        let no_wqe = port_xstat(unpolled, 1, "hca_rx_drops_no_wqe");
        let wire = port_xstat(unpolled, 1, "hca_rx_drops_wire");
        let got = port_xstat(unpolled, 1, "hca_rx_frames");
        // What port 0's device put towards the wire; the cable refuses what port 1's buffer
        // cannot hold, and both ends count that (the sender as tx_drops_wire).
        let sent =
            port_xstat(unpolled, 0, "hca_tx_frames") + port_xstat(unpolled, 0, "hca_tx_drops_wire");
        assert!(
            missed > 10_000,
            "{mode}: an unpolled receiver misses frames: {missed}\n{all}"
        );
        assert_eq!(
            missed,
            no_wqe + wire,
            "{mode}: imissed is the device's count of frames lost for want of a buffer or room"
        );
        assert!(
            got <= 1024,
            "{mode}: at most a ring's worth was delivered while nobody polled: {got}"
        );
        assert_eq!(
            port_xstat(unpolled, 1, "rx_good_packets"),
            0,
            "{mode}: nobody polled"
        );
        // Frames may wait at port 1 (its buffer holds HCA_RX_BUFFER), and a device thread may
        // still execute what port 0 posted while the counters are read.
        assert!(
            got + missed + HCA_RX_BUFFER >= sent && got + missed <= sent + HCA_RX_BUFFER,
            "{mode}: port 1 accounts for what port 0 sent ({sent}): {got} received, {missed} missed"
        );
        let waited = port_xstat(rxonly, 1, "rx_good_packets");
        assert!(
            (1000..=1024 + HCA_RX_BUFFER).contains(&waited),
            "{mode}: rxonly took what waited in the ring and at the port: {waited}\n{all}"
        );
        let received = port_xstat(&all, 1, "rx_good_packets");
        assert!(
            received > 1024,
            "{mode}: polled again, the port receives: {received}\n{all}"
        );
        assert_eq!(port_xstat(&all, 1, "rx_missed_errors"), 0, "{mode}");
    }
}

/// BlueFlame under sustained load: txonly with the default settings, so
/// every burst ends with a BlueFlame copy of its last WQE and no doorbell. Every copy the device
/// saw is accounted for: executed from the copy, superseded by a newer write before the walk
/// reached it, torn, or ignored. Where the device runs in the polling lcore it looks right after
/// each burst, so it keeps up by construction and takes every copy the driver wrote; on device
/// threads, sharing 2 cores with testpmd, it may fall behind, and what it missed must show as
/// unseen or superseded, not torn.
#[test]
fn blueflame_copies_are_taken_under_sustained_load_in_every_mode() {
    for mode in MODES {
        let all = run(
            &[
                format!("net_mlx4rs0,wire=null,device_loop={mode}"),
                format!("net_mlx4rs1,wire=null,device_loop={mode}"),
            ],
            &[
                "--forward-mode=txonly",
                "--txpkts=64",
                "--burst=32",
                "--total-num-mbufs=16384",
            ],
            &[
                // Not the start-up self-test's copies.
                Cmd("clear port xstats all"),
                // Well past 1000 bursts of 32 on each port.
                Cmd("start"),
                Until {
                    cmd: "show fwd stats all",
                    done: every_port_sent::<64_000>,
                    limit: TRAFFIC_LIMIT,
                },
                Cmd("stop"),
                Cmd("port stop all"),
                Cmd("show port xstats all"),
                Cmd("quit"),
            ],
        );
        for port in [0, 1] {
            let x = |name: &str| port_xstat(&all, port, name);
            assert_eq!(
                x("tx_path_bf"),
                1,
                "{mode}: port {port} runs BlueFlame\n{all}"
            );
            let (writes, seen) = (x("tx_bf_writes"), x("hca_bf_bursts"));
            let (used, superseded) = (x("hca_wqe_from_bf"), x("hca_bf_superseded"));
            let (torn, ignored) = (x("hca_bf_torn"), x("hca_bf_ignored"));
            let (sent, doorbells) = (x("tx_good_packets"), x("tx_doorbells"));
            let what = format!(
                "{mode}: port {port}: {sent} packets, {doorbells} doorbells, {writes} BF writes, \
                 {seen} seen: {used} used, {superseded} superseded, {torn} torn, {ignored} ignored"
            );
            println!("{what}");
            assert!(writes > 1000 && (writes + doorbells) * 32 >= sent, "{what}");
            assert!(seen <= writes, "{what}");
            // A copy still latched when the counters were read (one per half) is not yet
            // accounted for.
            let ended = used + superseded + torn + ignored;
            assert!(ended <= seen && seen <= ended + 2, "{what}");
            assert!(torn * 100 <= seen, "whole copies are not torn: {what}");
            assert_eq!(x("hca_tx_frames"), sent, "{what}");
            if mode == "lcore" {
                assert_eq!(
                    (seen, used, superseded, torn),
                    (writes, writes, 0, 0),
                    "a device that keeps up takes every copy: {what}"
                );
            } else {
                assert!(used > 0, "{what}");
            }
        }
    }
}
