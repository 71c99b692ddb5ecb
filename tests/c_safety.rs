//! What a careless C application can do to the driver, tried from a small
//! C program (`tests/c_safety/badmbuf.c`, built here against the installed DPDK) on one port
//! with a pcap wire: an RSS key buffer smaller than the key, and bad mbufs among good ones.
//! Every bad mbuf must be refused and counted (`oerrors`, `tx_bad_mbufs`), its buffers freed
//! once, and the good frames around it must reach the wire byte for byte; nothing may abort or
//! hang (a run that does shows here as a kill after the limit, without a PASS line). And
//! bursts on a stopped queue, which must take and touch nothing, and a queue
//! stopped and started with DPDK's heap full, which must come back on its own rings.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::{plugin_dir, read_pcap, run_interactive, EalPrefix, ScratchDir, PLUGIN};

const LIMIT: Duration = Duration::from_secs(60);

/// The C program, built once per test binary into a scratch directory.
fn badmbuf() -> &'static Path {
    static BIN: OnceLock<(ScratchDir, PathBuf)> = OnceLock::new();
    let (_, bin) = BIN.get_or_init(|| {
        let dir = ScratchDir::new("badmbuf-build");
        let bin = common::build_c_program(&dir, "badmbuf", "c_safety/badmbuf.c");
        // A static is never dropped: the directory stays for the binary's whole run, and
        // goes at its exit (scratch_dir registered it).
        (dir, bin)
    });
    bin
}

struct Run {
    text: String,
    /// The frames the program sent as good ones, in order.
    sent: Vec<Vec<u8>>,
    /// What reached the wire.
    wire: Vec<Vec<u8>>,
}

fn run_case(case: &str) -> Run {
    let bin = badmbuf();
    let dir = ScratchDir::new(&format!("badmbuf-{case}"));
    let pcap = dir.join("wire.pcap");
    let prefix = EalPrefix::new(&format!("safety-{case}"));
    let mut cmd = Command::new(bin);
    cmd.current_dir(&*dir)
        .env("LD_LIBRARY_PATH", plugin_dir())
        .args(["-l", "0", "--no-huge", "-m", "256", "--no-pci"])
        .arg(prefix.arg())
        .args(["-d", PLUGIN, "--vdev"])
        .arg(format!("net_mlx4rs0,wire=pcap:{}", pcap.display()))
        .args(["--", case]);
    let out = run_interactive(cmd, &[], LIMIT);
    let text = out.all();
    assert!(
        text.contains(&format!("badmbuf: PASS {case}")),
        "{case}: no PASS line (exit {:?}; an abort or a hang the limit killed shows so):\n{text}",
        out.status
    );
    assert!(
        out.status.success(),
        "{case}: exit {:?}:\n{text}",
        out.status
    );
    let sent = out
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("frame "))
        .map(|h| {
            (0..h.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
                .collect()
        })
        .collect();
    let wire = if pcap.exists() {
        read_pcap(&pcap)
    } else {
        Vec::new()
    };
    Run { text, sent, wire }
}

/// A TX case: the good frames around the bad mbuf, exactly, and the counts (the program
/// checks opackets 2, oerrors 1, tx_bad_mbufs 1 and the pool's counts itself).
fn tx_case(case: &str) {
    let r = run_case(case);
    assert_eq!(
        r.sent.len(),
        2,
        "{case}: two good frames printed:\n{}",
        r.text
    );
    assert_eq!(
        r.wire, r.sent,
        "{case}: the wire holds exactly the two good frames, in order:\n{}",
        r.text
    );
    assert!(
        r.text.contains("tx_bad_mbufs 1"),
        "{case}: counted as a bad mbuf:\n{}",
        r.text
    );
}

#[test]
fn rss_key_query_never_writes_past_rss_key_len() {
    let r = run_case("rss");
    // From 23.11 ethdev refuses the short buffer itself, before the driver sees it; before,
    // the driver does.
    assert!(
        r.text
            .contains("RSS key buffer of 16 bytes (rss_key_len), the key has 40")
            || r.text.contains("invalid RSS key len: 16"),
        "the refusal is logged:\n{}",
        r.text
    );
}

#[test]
fn ip_checksum_with_pkt_len_below_data_len_is_refused() {
    tx_case("csum_len");
}

#[test]
fn segment_cycle_is_refused_and_each_segment_freed_once() {
    tx_case("cycle");
    tx_case("cycle3");
}

#[test]
fn data_past_the_buffer_is_refused() {
    tx_case("oob");
    tx_case("oob_seg");
}

#[test]
fn pkt_len_and_chain_length_must_match_the_segments() {
    tx_case("pkt_len");
    tx_case("short_chain");
    tx_case("long_chain");
}

#[test]
fn tso_requests_a_card_refuses_are_refused() {
    tx_case("tso_mss0");
    tx_case("tso_hdr");
}

#[test]
fn bursts_on_a_stopped_queue_take_and_touch_nothing() {
    let r = run_case("stopped");
    assert_eq!(
        r.wire, r.sent,
        "the wire holds the frame sent before the stop and the one after the start, and none \
         of those offered to the stopped queue:\n{}",
        r.text
    );
    assert_eq!(r.sent.len(), 2, "two frames printed:\n{}", r.text);
}

#[test]
fn a_queue_restarts_on_its_own_rings() {
    // With DPDK's heap full, a queue start that made new device queues fails; one that
    // brings the same rings back sends.
    let r = run_case("restart");
    assert_eq!(r.sent.len(), 4, "four frames printed:\n{}", r.text);
    assert_eq!(
        r.wire, r.sent,
        "the wire holds the frame before the stops and one after each start, in order:\n{}",
        r.text
    );
}
