//! The port counters a card's MAC keeps: broadcast, multicast and the RMON size buckets, each
//! way, for frames of known addresses and lengths on a looped wire.

mod common;

use common::*;
use mlx4_hca::{Counters, Hca, Wire};

/// A frame of `len` bytes to `dst` (an experimental EtherType, zero payload).
fn frame(dst: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend([2, 0, 0, 0, 0, 1, 0x88, 0xb5]);
    f.resize(len, 0);
    f
}

const BCAST: [u8; 6] = [0xff; 6];
const MCAST: [u8; 6] = [0x01, 0x00, 0x5e, 0x00, 0x00, 0x01];
const UCAST: [u8; 6] = [0x02, 0, 0, 0, 0, 2];

fn rx(c: &Counters) -> [u64; 7] {
    [
        c.rx_size_64,
        c.rx_size_65_to_127,
        c.rx_size_128_to_255,
        c.rx_size_256_to_511,
        c.rx_size_512_to_1023,
        c.rx_size_1024_to_1522,
        c.rx_size_1523_to_max,
    ]
}

fn tx(c: &Counters) -> [u64; 7] {
    [
        c.tx_size_64,
        c.tx_size_65_to_127,
        c.tx_size_128_to_255,
        c.tx_size_256_to_511,
        c.tx_size_512_to_1023,
        c.tx_size_1024_to_1522,
        c.tx_size_1523_to_max,
    ]
}

#[test]
fn looped_frames_are_counted_by_kind_and_size_each_way() {
    let hca = Hca::open(step_cfg()).unwrap();
    hca.set_wire(Wire::Loop).unwrap();
    // Promiscuous: every frame reaches the RQ.
    hca.set_rx_filter(UCAST, true, false);
    let mut txcq = TestCq::new(&hca, 64);
    let mut sq = TestSq::new(&hca, 64, txcq.cqn);
    let mut rxcq = TestCq::new(&hca, 64);
    let mut rq = TestRq::new(&hca, 32, 1, rxcq.cqn);
    let pkts = Pkts::new(&hca, 1 << 20);
    let rx_base = pkts.mem.addr() + 65536;
    for i in 0..32u64 {
        rq.post(&[(2048, pkts.lkey, rx_base + i * 2048)]);
    }
    let mut send = |f: &[u8]| {
        let off = (sq.prod as usize % 32) * 2048;
        pkts.mem.put(off, f);
        let mut t = ctrl_tail(2, SIGNALED);
        t.extend(dseg(
            f.len() as u32,
            pkts.lkey,
            pkts.mem.addr() + off as u64,
        ));
        sq.write(SEND, &t);
        sq.doorbell();
        hca.step();
    };
    // Lengths without the FCS: 42 and 60 are both a 64-byte frame on the wire (padded); 1514
    // is the largest untagged frame the default MTU of 1500 lets in (1518 on the wire); 1519
    // is 1523 bytes on the wire, too long for the port (an L3 length of 1505): an oversize
    // frame, sent but not received.
    for f in [
        frame(BCAST, 42),
        frame(BCAST, 60),
        frame(MCAST, 61),
        frame(MCAST, 123),
        frame(UCAST, 124),
        frame(UCAST, 300),
        frame(UCAST, 1019),
        frame(UCAST, 1020),
        frame(UCAST, 1514),
        frame(BCAST, 1519),
    ] {
        send(&f);
    }
    hca.set_mtu(2000).unwrap();
    send(&frame(UCAST, 1600));
    assert_eq!(txcq.drain().len(), 11);
    let got = rxcq.drain().len();
    assert_eq!(got, 10, "{:?}", hca.counters());
    let c = hca.counters();
    assert_eq!(c.tx_frames, 11);
    assert_eq!((c.tx_broadcast, c.tx_multicast), (3, 2));
    assert_eq!(tx(&c), [2, 2, 1, 1, 1, 2, 2]);
    assert_eq!(c.rx_frames, 10);
    assert_eq!(c.rx_drops_mtu, 1, "the oversize frame");
    assert_eq!((c.rx_broadcast, c.rx_multicast), (2, 2));
    assert_eq!(rx(&c), [2, 2, 1, 1, 1, 2, 1]);
    assert_eq!(rx(&c).iter().sum::<u64>(), c.rx_frames);
    hca.reset_counters();
    let c = hca.counters();
    assert_eq!((rx(&c), tx(&c)), ([0; 7], [0; 7]));
}
