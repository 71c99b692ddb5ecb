//! What the port does to a received frame before an RQ sees it: destination-MAC filter, MTU,
//! and Toeplitz RSS over a redirection table.

mod common;

use common::*;
use mlx4_hca::{Hca, HcaError, RssFields, Wire, DEFAULT_RSS_KEY};

/// RX buffer size: large enough for the jumbo frames of the MTU test.
const BUF: u32 = 16384;
/// Packet memory below this offset is for frames to send.
const TX_AREA: usize = 1 << 20;

/// A looped adapter: what it sends comes back on its RQs, each with its own CQ.
struct Rig {
    hca: Hca,
    _txcq: TestCq,
    sq: TestSq,
    rqs: Vec<(TestRq, TestCq)>,
    pkts: Pkts,
    next_buf: u64,
}

impl Rig {
    fn new(nrqs: usize) -> Rig {
        let hca = Hca::open(step_cfg()).unwrap();
        hca.set_wire(Wire::Loop).unwrap();
        let txcq = TestCq::new(&hca, 64);
        let sq = TestSq::new(&hca, 64, txcq.cqn);
        let rqs = (0..nrqs)
            .map(|_| {
                let cq = TestCq::new(&hca, 64);
                (TestRq::new(&hca, 64, 1, cq.cqn), cq)
            })
            .collect();
        let pkts = Pkts::new(&hca, TX_AREA + 64 * 4 * BUF as usize);
        let mut rig = Rig {
            hca,
            _txcq: txcq,
            sq,
            rqs,
            pkts,
            next_buf: 0,
        };
        for q in 0..nrqs {
            rig.post_rx(q, 32);
        }
        rig
    }

    fn post_rx(&mut self, q: usize, n: u32) {
        for _ in 0..n {
            let addr = self.pkts.mem.addr() + TX_AREA as u64 + self.next_buf * u64::from(BUF);
            self.next_buf = (self.next_buf + 1) % 256;
            self.rqs[q].0.post(&[(BUF, self.pkts.lkey, addr)]);
        }
    }

    fn qpns(&self) -> Vec<u32> {
        self.rqs.iter().map(|(rq, _)| rq.qpn).collect()
    }

    /// Send `frame` (one data segment, no completion) and run the device until it is idle.
    fn send(&mut self, frame: &[u8]) {
        let off = (self.sq.prod as usize % 16) * 65536;
        self.pkts.mem.put(off, frame);
        let mut t = ctrl_tail(2, UNSIGNALED);
        t.extend(dseg(
            frame.len() as u32,
            self.pkts.lkey,
            self.pkts.mem.addr() + off as u64,
        ));
        self.sq.write(SEND, &t);
        self.sq.doorbell();
        self.hca.step();
    }

    /// Every CQE written since the last call, as (RQ index, CQE).
    fn received(&mut self) -> Vec<(usize, Vec<u8>)> {
        let mut all = Vec::new();
        for (i, (_, cq)) in self.rqs.iter_mut().enumerate() {
            for c in cq.drain() {
                all.push((i, c));
            }
            cq.update_ci();
        }
        all
    }

    /// Send `frame` and return the RQ and CQE it produced, if any.
    fn roundtrip(&mut self, frame: &[u8]) -> Option<(usize, Vec<u8>)> {
        self.send(frame);
        let mut r = self.received();
        assert!(r.len() <= 1);
        r.pop()
    }
}

const OUR_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// An Ethernet frame to `dst` carrying TCP or UDP over IPv4 from `src:sport` to `dip:dport`,
/// padded with `payload` bytes.
fn l4_frame(
    dst: [u8; 6],
    tcp: bool,
    (src, sport): ([u8; 4], u16),
    (dip, dport): ([u8; 4], u16),
    payload: usize,
) -> Vec<u8> {
    let l4_len = if tcp { 20 } else { 8 };
    let mut f = dst.to_vec();
    f.extend([0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00]);
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + l4_len + payload) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = if tcp { 6 } else { 17 };
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&dip);
    f.extend(ip);
    let mut l4 = vec![0u8; l4_len];
    l4[0..2].copy_from_slice(&sport.to_be_bytes());
    l4[2..4].copy_from_slice(&dport.to_be_bytes());
    if tcp {
        l4[12] = 0x50;
    } else {
        l4[4..6].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
    }
    f.extend(l4);
    f.extend((0..payload).map(|i| i as u8));
    f
}

/// Published Toeplitz vectors (Microsoft, default key): source, destination, IPv4-only hash,
/// IPv4/TCP hash.
type Vector = ([u8; 4], u16, [u8; 4], u16, u32, u32);
const VECTORS: [Vector; 3] = [
    (
        [66, 9, 149, 187],
        2794,
        [161, 142, 100, 80],
        1766,
        0x323e_8fc2,
        0x51cc_c178,
    ),
    (
        [199, 92, 111, 2],
        14230,
        [65, 69, 140, 83],
        4739,
        0xd718_262a,
        0xc626_b0ea,
    ),
    (
        [24, 19, 198, 95],
        12898,
        [12, 22, 207, 184],
        38024,
        0xd2d0_a5de,
        0x5c2b_394a,
    ),
];

/// A 128-entry redirection table over `qpns`, round robin, as the driver programs it.
fn reta(qpns: &[u32]) -> Vec<u32> {
    (0..128).map(|i| qpns[i % qpns.len()]).collect()
}

#[test]
fn rss_spreads_flows_over_the_redirection_table() {
    let mut rig = Rig::new(4);
    let qpns = rig.qpns();
    let table = reta(&qpns);
    rig.hca.set_rx_steering(&table).unwrap();
    assert_eq!(rig.hca.rss(), (DEFAULT_RSS_KEY, RssFields::ALL));

    // The published flows carry their published hash, and land where the table says.
    for (src, sport, dst, dport, _, tcp_hash) in VECTORS {
        let f = l4_frame(OUR_MAC, true, (src, sport), (dst, dport), 0);
        let (q, cqe) = rig.roundtrip(&f).expect("delivered");
        assert_eq!(be32(&cqe, 4), tcp_hash, "immed_rss_invalid");
        assert_eq!(be32(&cqe, 0) & 0xff_ffff, qpns[q]);
        assert_eq!(qpns[q], table[tcp_hash as usize % 128]);
    }

    // Many flows: each on the table's queue for its hash, and together on every queue.
    let mut used = [0usize; 4];
    for port in 0..32u16 {
        let f = l4_frame(
            OUR_MAC,
            false,
            ([10, 0, 0, 1], 1000 + port),
            ([10, 0, 0, 2], 53),
            16,
        );
        let (q, cqe) = rig.roundtrip(&f).expect("delivered");
        let hash = be32(&cqe, 4);
        assert_eq!(qpns[q], table[hash as usize % 128], "flow {port}");
        used[q] += 1;
        // Frames of one flow always go the same way.
        let (q2, cqe2) = rig.roundtrip(&f).expect("delivered");
        assert_eq!((q2, be32(&cqe2, 4)), (q, hash));
        rig.post_rx(q, 2);
    }
    assert!(used.iter().all(|&n| n > 0), "flows per RQ: {used:?}");
}

#[test]
fn rss_key_and_fields_choose_the_hash() {
    let mut rig = Rig::new(2);
    let qpns = rig.qpns();
    let table = reta(&qpns);
    rig.hca.set_rx_steering(&table).unwrap();
    let (src, sport, dst, dport, ip_hash, tcp_hash) = VECTORS[0];
    let tcp = l4_frame(OUR_MAC, true, (src, sport), (dst, dport), 0);

    assert!(matches!(
        rig.hca.set_rss(&DEFAULT_RSS_KEY[..39], RssFields::ALL),
        Err(HcaError::InvalidArgument(_))
    ));
    assert!(rig.hca.set_rss(&[0; 41], RssFields::ALL).is_err());

    // Only the IPv4 set: the addresses alone.
    rig.hca.set_rss(&DEFAULT_RSS_KEY, RssFields::IPV4).unwrap();
    let (q, cqe) = rig.roundtrip(&tcp).unwrap();
    assert_eq!(be32(&cqe, 4), ip_hash);
    assert_eq!(qpns[q], table[ip_hash as usize % 128]);

    // IPv6 only: an IPv4 frame is not hashed and goes to the first entry.
    rig.hca
        .set_rss(&DEFAULT_RSS_KEY, RssFields::IPV6 | RssFields::IPV6_TCP)
        .unwrap();
    let (q, cqe) = rig.roundtrip(&tcp).unwrap();
    assert_eq!((qpns[q], be32(&cqe, 4)), (table[0], 0));

    // Another key, another hash; back to the default, the published one.
    let mut key = DEFAULT_RSS_KEY;
    key[5] ^= 0x10;
    rig.hca.set_rss(&key, RssFields::ALL).unwrap();
    assert_eq!(rig.hca.rss(), (key, RssFields::ALL));
    let (_, cqe) = rig.roundtrip(&tcp).unwrap();
    assert_ne!(be32(&cqe, 4), tcp_hash);
    rig.hca.set_rss(&DEFAULT_RSS_KEY, RssFields::ALL).unwrap();
    let (_, cqe) = rig.roundtrip(&tcp).unwrap();
    assert_eq!(be32(&cqe, 4), tcp_hash);

    // Not IP: hash 0, first entry of the table.
    let mut arp = tcp.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    let (q, cqe) = rig.roundtrip(&arp).unwrap();
    assert_eq!((qpns[q], be32(&cqe, 4)), (table[0], 0));

    // Without a table, hash 0 means the first RQ.
    rig.hca.set_rx_steering(&[]).unwrap();
    let (q, _) = rig.roundtrip(&arp).unwrap();
    assert_eq!(q, 0);
}

#[test]
fn mac_filter_drops_and_counts_what_is_not_for_us() {
    let mut rig = Rig::new(1);
    let flow = (([10, 0, 0, 1], 1), ([10, 0, 0, 2], 2));
    let to = |mac: [u8; 6]| l4_frame(mac, false, flow.0, flow.1, 8);
    let other = [0x02, 0, 0, 0, 0, 0x99];
    let bcast = [0xff; 6];
    let mcast = [0x01, 0x00, 0x5e, 0x00, 0x00, 0x01];

    // Promiscuous until told otherwise.
    assert!(rig.roundtrip(&to(other)).is_some());

    rig.hca.set_rx_filter(OUR_MAC, false, false);
    assert!(rig.roundtrip(&to(OUR_MAC)).is_some());
    assert!(rig.roundtrip(&to(bcast)).is_some(), "broadcast always");
    assert!(rig.roundtrip(&to(other)).is_none());
    assert!(rig.roundtrip(&to(mcast)).is_none());
    assert!(rig.roundtrip(&[0x02, 0, 0]).is_none(), "runt: no MAC");
    assert_eq!(rig.hca.counters().rx_drops_filter, 3);

    rig.hca.set_rx_filter(OUR_MAC, false, true);
    assert!(rig.roundtrip(&to(mcast)).is_some(), "all-multicast");
    assert!(rig.roundtrip(&to(other)).is_none());

    rig.hca.set_rx_filter(OUR_MAC, true, false);
    assert!(rig.roundtrip(&to(other)).is_some(), "promiscuous again");
    assert!(rig.roundtrip(&to(mcast)).is_some());

    let k = rig.hca.counters();
    assert_eq!(k.rx_drops_filter, 4);
    assert_eq!(k.rx_frames, 6);
    assert_eq!(k.tx_frames, 10, "the filter is on the receive side only");
    assert!(mlx4_hca::Counters::NAMES.contains(&"rx_drops_filter"));
}

#[test]
fn mtu_drops_and_counts_longer_frames() {
    let mut rig = Rig::new(1);
    let flow = (([10, 0, 0, 1], 1), ([10, 0, 0, 2], 2));
    // L3 length = 20 + 8 + payload.
    let l3 = |n: usize| l4_frame(OUR_MAC, false, flow.0, flow.1, n - 28);
    assert_eq!(rig.hca.mtu(), 1500);

    assert!(rig.roundtrip(&l3(1500)).is_some());
    assert!(rig.roundtrip(&l3(1501)).is_none());
    // A VLAN tag does not count against the MTU.
    let mut tagged = l3(1500);
    tagged.splice(12..12, [0x81, 0x00, 0x00, 0x64]);
    assert!(rig.roundtrip(&tagged).is_some());
    let mut qinq = l3(1500);
    qinq.splice(12..12, [0x88, 0xa8, 0x00, 0x01, 0x81, 0x00, 0x00, 0x64]);
    assert!(rig.roundtrip(&qinq).is_some());
    qinq.push(0);
    assert!(rig.roundtrip(&qinq).is_none());

    let k = rig.hca.counters();
    assert_eq!((k.rx_drops_mtu, k.rx_frames), (2, 3));
    assert_eq!(k.tx_frames, 5, "transmit is not checked against the MTU");

    rig.hca.set_mtu(9000).unwrap();
    assert_eq!(rig.hca.mtu(), 9000);
    let (_, cqe) = rig.roundtrip(&l3(9000)).expect("jumbo frame");
    assert_eq!(be32(&cqe, 20), 9014, "byte_cnt");
    assert!(rig.roundtrip(&l3(9001)).is_none());

    rig.hca.set_mtu(68).unwrap();
    assert!(rig.roundtrip(&l3(68)).is_some());
    assert!(rig.roundtrip(&l3(69)).is_none());
    assert_eq!(rig.hca.counters().rx_drops_mtu, 4);
    rig.hca.reset_counters();
    assert_eq!(rig.hca.counters().rx_drops_mtu, 0);
}

#[test]
fn mac_table_of_128_addresses_and_a_multicast_list() {
    let mut rig = Rig::new(1);
    let flow = (([10, 0, 0, 1], 1), ([10, 0, 0, 2], 2));
    let to = |mac: [u8; 6]| l4_frame(mac, false, flow.0, flow.1, 8);
    let uc = |i: u8| [0x02, 0, 0, 0, 1, i];
    let table: Vec<[u8; 6]> = (0..128).map(uc).collect();
    rig.hca.set_promisc(false);
    rig.hca.set_mac_table(&table).unwrap();
    assert_eq!(rig.hca.caps().max_mac_addrs, 128);
    // Every one of the 128 passes, others do not.
    for i in (0..128).step_by(9).chain([127]) {
        assert!(rig.roundtrip(&to(uc(i))).is_some(), "entry {i}");
    }
    rig.post_rx(0, 16);
    assert!(rig.roundtrip(&to(uc(200))).is_none());
    assert!(rig.roundtrip(&to(OUR_MAC)).is_none());
    // 129 is one too many; a multicast address is not a unicast entry. The table stays.
    let mut more = table.clone();
    more.push(uc(200));
    assert!(matches!(
        rig.hca.set_mac_table(&more),
        Err(HcaError::NoResources(_))
    ));
    let mcast = [0x01, 0x00, 0x5e, 0x00, 0x00, 0x07];
    assert!(matches!(
        rig.hca.set_mac_table(&[mcast]),
        Err(HcaError::InvalidArgument(_))
    ));
    assert_eq!(rig.hca.rx_filter().unicast.len(), 128);

    // Multicast: only the listed groups, or all with all-multicast.
    let other_group = [0x01, 0x00, 0x5e, 0x00, 0x00, 0x08];
    assert!(rig.roundtrip(&to(mcast)).is_none());
    rig.hca.set_mc_list(&[mcast]).unwrap();
    assert!(rig.roundtrip(&to(mcast)).is_some());
    assert!(rig.roundtrip(&to(other_group)).is_none());
    assert!(rig.hca.set_mc_list(&[OUR_MAC]).is_err(), "not multicast");
    rig.hca.set_allmulti(true);
    assert!(rig.roundtrip(&to(other_group)).is_some());
    rig.hca.set_allmulti(false);
    rig.hca.set_mc_list(&[]).unwrap();
    assert!(rig.roundtrip(&to(mcast)).is_none());
    let f = rig.hca.rx_filter();
    assert!(!f.promisc && !f.allmulti && f.multicast.is_empty());
    let k = rig.hca.counters();
    assert_eq!((k.rx_frames, k.rx_drops_filter), (16 + 2, 5));
}

#[test]
fn vlan_filter_drops_and_counts_tags_not_in_the_table() {
    let mut rig = Rig::new(1);
    let flow = (([10, 0, 0, 1], 1), ([10, 0, 0, 2], 2));
    let tagged = |tpid: u16, vid: u16| {
        let mut f = l4_frame(OUR_MAC, false, flow.0, flow.1, 8);
        let t = tpid.to_be_bytes();
        let v = vid.to_be_bytes();
        f.splice(12..12, [t[0], t[1], v[0], v[1]]);
        f
    };
    let untagged = l4_frame(OUR_MAC, false, flow.0, flow.1, 8);
    rig.hca.set_rx_filter(OUR_MAC, false, false);
    // Off: every tag passes.
    assert!(rig.roundtrip(&tagged(0x8100, 6)).is_some());
    rig.hca.set_vlan_filtering(true);
    rig.hca.set_vlan(5, true).unwrap();
    rig.hca.set_vlan(4095, true).unwrap();
    assert!(rig.hca.set_vlan(4096, true).is_err());
    assert!(rig.roundtrip(&tagged(0x8100, 5)).is_some());
    assert!(rig.roundtrip(&tagged(0x8100, 4095)).is_some());
    assert!(rig.roundtrip(&tagged(0x8100, 6)).is_none());
    assert!(rig.roundtrip(&tagged(0x88a8, 6)).is_none(), "outer S-tag");
    assert!(rig.roundtrip(&untagged).is_some(), "untagged frames pass");
    assert!(rig.roundtrip(&tagged(0x8100, 0)).is_some(), "priority tag");
    // The priority bits are not the VLAN ID.
    assert!(rig.roundtrip(&tagged(0x8100, 0xa005)).is_some());
    assert_eq!(rig.hca.rx_filter().vlans, vec![5, 4095]);
    rig.hca.set_vlan(5, false).unwrap();
    assert!(rig.roundtrip(&tagged(0x8100, 5)).is_none());
    // Promiscuous filters nothing.
    rig.hca.set_promisc(true);
    assert!(rig.roundtrip(&tagged(0x8100, 6)).is_some());
    let k = rig.hca.counters();
    assert_eq!((k.rx_drops_vlan, k.rx_drops_filter), (3, 0));
    assert_eq!(k.rx_dropped(), 3, "counted as dropped, not missed");
    assert_eq!(k.rx_missed(), 0);
}

#[test]
fn flow_control_is_stored_and_reported_and_changes_no_frame() {
    let mut rig = Rig::new(1);
    let fc = rig.hca.flow_control();
    assert!(
        fc.rx_pause && fc.tx_pause && !fc.autoneg,
        "mlx4_en's defaults"
    );
    let want = mlx4_hca::FlowControl {
        rx_pause: false,
        tx_pause: true,
        autoneg: true,
        pause_time: 100,
        high_water: 8000,
        low_water: 2000,
        send_xon: true,
        mac_ctrl_frame_fwd: true,
    };
    rig.hca.set_flow_control(&want).unwrap();
    assert_eq!(rig.hca.flow_control(), want);
    let bad = mlx4_hca::FlowControl {
        low_water: 9000,
        ..want
    };
    assert!(matches!(
        rig.hca.set_flow_control(&bad),
        Err(HcaError::InvalidArgument(_))
    ));
    assert_eq!(
        rig.hca.flow_control(),
        want,
        "unchanged by a refused setting"
    );
    // No pause frame is generated, and a received one is just a frame (EtherType 0x8808).
    let mut pause = vec![
        0x01, 0x80, 0xc2, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 1, 0x88, 0x08,
    ];
    pause.extend([0x00, 0x01, 0xff, 0xff]);
    pause.resize(60, 0);
    assert!(rig.roundtrip(&pause).is_some());
    let k = rig.hca.counters();
    assert_eq!((k.tx_frames, k.rx_frames), (1, 1));
}
