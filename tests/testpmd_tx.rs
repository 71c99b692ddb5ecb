//! The transmit path through the real `dpdk-testpmd`: txonly frames land in a pcap file
//! exactly as testpmd built them, counts agree, and xstats show the path in use.

mod common;

use common::{read_pcap, scratch_dir, testpmd, xstat, Step::*, SENT, TRAFFIC_LIMIT};
use std::time::Duration;

/// The device has put on the wire every packet the driver counted as sent.
fn drained(xstats: &str) -> bool {
    let sent = xstat(xstats, "tx_good_packets");
    sent.is_some() && xstat(xstats, "hca_tx_frames") == sent
}

/// testpmd txonly on one port with `wire=pcap`; returns (frames, output).
fn txonly_to_pcap(devargs: &str, burst: u32) -> (Vec<Vec<u8>>, String) {
    let dir = scratch_dir("txpcap");
    let pcap = dir.join("tx.pcap");
    let vdev = format!("net_mlx4rs0,wire=pcap:{}{devargs}", pcap.display());
    let burst_arg = format!("--burst={burst}");
    let out = testpmd(
        &[&vdev],
        &[
            "--forward-mode=txonly",
            "--txpkts=64",
            &burst_arg,
            "--total-num-mbufs=4096",
        ],
        &[
            Cmd("start"),
            SENT,
            Cmd("stop"),
            // The device executes what was posted before the counters are read.
            Until {
                cmd: "show port xstats 0",
                done: drained,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("show port stats 0"),
            Cmd("show port xstats 0"),
            Cmd("port stop all"),
            Cmd("quit"),
        ],
        Duration::from_secs(60),
    );
    let all = out.all();
    assert!(out.status.success(), "testpmd failed:\n{all}");
    let frames = read_pcap(&pcap);
    std::fs::remove_dir_all(&dir).ok();
    (frames, all)
}

fn check(frames: &[Vec<u8>], all: &str) {
    let opackets = xstat(all, "tx_good_packets").expect("tx_good_packets");
    assert!(opackets > 0, "{all}");
    assert_eq!(
        frames.len() as u64,
        opackets,
        "every counted packet reached the wire, once"
    );
    assert_eq!(xstat(all, "hca_tx_frames"), Some(opackets));
    // testpmd's txonly packet: Ethernet / IPv4 / UDP, 64 bytes, IP checksum computed by
    // testpmd, all frames identical.
    let first = &frames[0];
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f, first, "frame {i} differs from frame 0");
    }
    assert_eq!(first.len(), 64);
    assert_eq!(&first[12..14], &[0x08, 0x00], "IPv4");
    assert_eq!(first[14] >> 4, 4);
    assert_eq!(first[23], 17, "UDP");
    assert_eq!(
        common::inet_csum(&first[14..34]),
        0,
        "IP header checksum intact"
    );
    assert_eq!(
        u16::from_be_bytes([first[16], first[17]]),
        50,
        "IP total length"
    );
    assert_eq!(
        xstat(all, "tx_inline_packets"),
        Some(opackets),
        "64-byte frames are inlined"
    );
    assert_eq!(xstat(all, "tx_gather_packets"), Some(0));
    assert_eq!(xstat(all, "tx_error_cqes"), Some(0));
}

#[test]
fn txonly_blueflame_burst_32() {
    let (frames, all) = txonly_to_pcap(",wc=on", 32);
    check(&frames, &all);
    assert_eq!(xstat(&all, "tx_path_bf"), Some(1), "{all}");
    assert!(xstat(&all, "tx_bf_writes").unwrap() > 0);
    assert_eq!(
        xstat(&all, "tx_doorbells"),
        Some(0),
        "every burst ended in a BF write"
    );
    let bursts = xstat(&all, "tx_bf_writes").unwrap();
    let pkts = frames.len() as u64;
    assert!(
        bursts <= pkts && bursts * 32 >= pkts,
        "one BF write per burst of up to 32"
    );
    assert!(xstat(&all, "hca_bf_bursts").unwrap() > 0);
}

#[test]
fn txonly_doorbell_burst_1() {
    let (frames, all) = txonly_to_pcap(",wc=off", 1);
    check(&frames, &all);
    assert_eq!(xstat(&all, "tx_path_bf"), Some(0), "{all}");
    assert_eq!(xstat(&all, "tx_bf_writes"), Some(0));
    let pkts = frames.len() as u64;
    assert_eq!(
        xstat(&all, "tx_doorbells"),
        Some(pkts),
        "burst 1: one doorbell per packet"
    );
}

#[test]
fn txonly_doorbell_burst_32_and_bf_off() {
    let (frames, all) = txonly_to_pcap(",bf=off", 32);
    check(&frames, &all);
    assert_eq!(xstat(&all, "tx_path_bf"), Some(0));
    assert!(all.contains("TX path doorbell: bf=off"), "{all}");
    let db = xstat(&all, "tx_doorbells").unwrap();
    let pkts = frames.len() as u64;
    assert!(
        db * 32 >= pkts && db < pkts,
        "one doorbell per burst, not per packet: {db} for {pkts}"
    );
}

#[test]
fn no_inline_uses_gather() {
    let (frames, all) = txonly_to_pcap(",txq_inline=0", 32);
    let pkts = frames.len() as u64;
    assert_eq!(xstat(&all, "tx_gather_packets"), Some(pkts), "{all}");
    assert_eq!(xstat(&all, "tx_inline_packets"), Some(0));
    assert_eq!(xstat(&all, "tx_good_packets"), Some(pkts));
}

#[test]
fn vlan_insertion_goes_through_the_doorbell() {
    let dir = scratch_dir("txvlan");
    let pcap = dir.join("vlan.pcap");
    let vdev = format!("net_mlx4rs0,wire=pcap:{},wc=on", pcap.display());
    let out = testpmd(
        &[&vdev],
        &[
            "--forward-mode=txonly",
            "--txpkts=64",
            "--total-num-mbufs=4096",
        ],
        &[
            Cmd("port stop 0"),
            Cmd("tx_vlan set 0 291"),
            Cmd("port start 0"),
            Cmd("start"),
            SENT,
            Cmd("stop"),
            Cmd("port stop all"),
            Cmd("show port xstats 0"),
            Cmd("quit"),
        ],
        Duration::from_secs(60),
    );
    let all = out.all();
    assert!(out.status.success(), "{all}");
    let frames = read_pcap(&pcap);
    std::fs::remove_dir_all(&dir).ok();
    let sent = xstat(&all, "tx_good_packets").unwrap();
    assert!(sent > 0, "{all}");
    assert_eq!(frames.len() as u64, sent);
    for f in &frames {
        assert_eq!(f.len(), 68, "64-byte packet plus the tag");
        assert_eq!(&f[12..16], &[0x81, 0x00, 0x01, 0x23], "802.1Q tag, VID 291");
        assert_eq!(&f[16..18], &[0x08, 0x00], "then the original EtherType");
    }
    // The BlueFlame path is live, but a VLAN-inserting WQE cannot go through it.
    assert_eq!(xstat(&all, "tx_path_bf"), Some(1));
    assert_eq!(xstat(&all, "tx_bf_writes"), Some(0), "{all}");
    assert!(xstat(&all, "tx_doorbells").unwrap() > 0);
}
