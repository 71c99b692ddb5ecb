//! Flow steering: rules on eth/vlan/ipv4/tcp/udp fields send frames to one RQ, to an RSS
//! context of their own, or drop them; by priority, before the default path; counted per rule.

mod common;

use common::*;
use mlx4_hca::{
    EthMatch, FlowAction, FlowPattern, FlowRule, Hca, Ipv4Match, L4Match, L4Proto, Masked,
    RssContext, RssFields, VlanMatch, Wire, DEFAULT_RSS_KEY,
};

const BUF: u32 = 2048;
const OUR_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// A looped adapter with `n` RQs, each with its own CQ, and 64 posted buffers each.
struct Rig {
    hca: Hca,
    _txcq: TestCq,
    sq: TestSq,
    rqs: Vec<(TestRq, TestCq)>,
    pkts: Pkts,
    next: u64,
}

impl Rig {
    fn new(n: usize) -> Rig {
        let hca = Hca::open(step_cfg()).unwrap();
        hca.set_wire(Wire::Loop).unwrap();
        let txcq = TestCq::new(&hca, 64);
        let sq = TestSq::new(&hca, 64, txcq.cqn);
        let rqs = (0..n)
            .map(|_| {
                let cq = TestCq::new(&hca, 128);
                (TestRq::new(&hca, 128, 1, cq.cqn), cq)
            })
            .collect();
        let pkts = Pkts::new(&hca, (1 << 20) + 512 * BUF as usize);
        let mut rig = Rig {
            hca,
            _txcq: txcq,
            sq,
            rqs,
            pkts,
            next: 0,
        };
        for q in 0..n {
            for _ in 0..64 {
                let addr = rig.pkts.mem.addr() + (1 << 20) + rig.next * u64::from(BUF);
                rig.next = (rig.next + 1) % 512;
                rig.rqs[q].0.post(&[(BUF, rig.pkts.lkey, addr)]);
            }
        }
        rig
    }

    fn qpns(&self) -> Vec<u32> {
        self.rqs.iter().map(|(rq, _)| rq.qpn).collect()
    }

    /// Send `frame`, run the device, and say which RQ got it (with its CQE), if any.
    fn roundtrip(&mut self, frame: &[u8]) -> Option<(usize, Vec<u8>)> {
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
        let mut got = Vec::new();
        for (i, (_, cq)) in self.rqs.iter_mut().enumerate() {
            for c in cq.drain() {
                got.push((i, c));
            }
            cq.update_ci();
        }
        assert!(got.len() <= 1);
        got.pop()
    }
}

/// TCP or UDP over IPv4 to `dst`, optionally VLAN-tagged.
fn frame(
    dst: [u8; 6],
    vlan: Option<u16>,
    udp: bool,
    (src_ip, sport): ([u8; 4], u16),
    (dst_ip, dport): ([u8; 4], u16),
) -> Vec<u8> {
    let l4_len = if udp { 8 } else { 20 };
    let mut f = dst.to_vec();
    f.extend([0x02, 0, 0, 0, 0, 0x01]);
    if let Some(v) = vlan {
        f.extend([0x81, 0x00]);
        f.extend(v.to_be_bytes());
    }
    f.extend([0x08, 0x00]);
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + l4_len + 8) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = if udp { 17 } else { 6 };
    ip[12..16].copy_from_slice(&src_ip);
    ip[16..20].copy_from_slice(&dst_ip);
    f.extend(ip);
    let mut l4 = vec![0u8; l4_len];
    l4[0..2].copy_from_slice(&sport.to_be_bytes());
    l4[2..4].copy_from_slice(&dport.to_be_bytes());
    if udp {
        l4[4..6].copy_from_slice(&16u16.to_be_bytes());
    } else {
        l4[12] = 0x50;
    }
    f.extend(l4);
    f.extend([0xab; 8]);
    f
}

fn udp_to(port: u16) -> Vec<u8> {
    frame(
        OUR_MAC,
        None,
        true,
        ([10, 0, 0, 1], 4000),
        ([10, 0, 0, 2], port),
    )
}

fn udp_dst(port: u16) -> FlowPattern {
    FlowPattern {
        eth: Some(EthMatch::default()),
        ipv4: Some(Ipv4Match::default()),
        l4: Some(L4Match {
            proto: L4Proto::Udp,
            src_port: Masked::default(),
            dst_port: Masked::exact(port, 0xffff),
        }),
        ..FlowPattern::default()
    }
}

/// testpmd's `flow create 0 ingress pattern eth / ipv4 / udp dst is 53 / end actions queue
/// index 1 / end`, as the model sees it.
#[test]
fn a_rule_steers_its_frames_to_a_queue_before_the_default_path() {
    let mut rig = Rig::new(2);
    let q = rig.qpns();
    rig.hca.set_rx_steering(&[q[0]]).unwrap();
    let id = rig
        .hca
        .create_flow(&FlowRule {
            priority: 0,
            pattern: udp_dst(53),
            action: FlowAction::Queue(q[1]),
        })
        .unwrap();
    assert_eq!(rig.roundtrip(&udp_to(53)).map(|r| r.0), Some(1));
    assert_eq!(rig.roundtrip(&udp_to(54)).map(|r| r.0), Some(0), "default");
    let tcp53 = frame(
        OUR_MAC,
        None,
        false,
        ([10, 0, 0, 1], 4000),
        ([10, 0, 0, 2], 53),
    );
    assert_eq!(
        rig.roundtrip(&tcp53).map(|r| r.0),
        Some(0),
        "TCP is not UDP"
    );
    // The rule, not the MAC filter, decides for the frames it matches.
    rig.hca.set_rx_filter(OUR_MAC, false, false);
    let mut other = udp_to(53);
    other[5] = 0x99;
    assert_eq!(rig.roundtrip(&other).map(|r| r.0), Some(1));
    let mut other54 = udp_to(54);
    other54[5] = 0x99;
    assert!(rig.roundtrip(&other54).is_none());
    let hits = rig.hca.flow_counters(id).unwrap();
    assert_eq!(hits.frames, 2);
    assert_eq!(hits.bytes, 2 * udp_to(53).len() as u64);
    assert_eq!(rig.hca.counters().rx_drops_filter, 1);
    // Gone: the default path again.
    // Only the rules deliver, as on a verbs device.
    rig.hca.set_flows_only(true);
    assert_eq!(rig.roundtrip(&udp_to(53)).map(|r| r.0), Some(1));
    assert!(rig.roundtrip(&udp_to(54)).is_none());
    assert_eq!(rig.hca.counters().rx_drops_filter, 2);
    rig.hca.set_flows_only(false);
    rig.hca.destroy_flow(id).unwrap();
    assert!(rig.hca.flows().is_empty());
    assert_eq!(rig.roundtrip(&udp_to(53)).map(|r| r.0), Some(0));
    assert!(rig.hca.destroy_flow(id).is_err());
    assert!(rig.hca.flow_counters(id).is_err());
}

#[test]
fn lower_priority_numbers_win_and_equal_ones_go_by_age() {
    let mut rig = Rig::new(3);
    let q = rig.qpns();
    let any_udp = FlowPattern {
        l4: Some(L4Match {
            proto: L4Proto::Udp,
            src_port: Masked::default(),
            dst_port: Masked::default(),
        }),
        ..FlowPattern::default()
    };
    let wide = rig
        .hca
        .create_flow(&FlowRule {
            priority: 2,
            pattern: any_udp,
            action: FlowAction::Queue(q[0]),
        })
        .unwrap();
    let narrow = rig
        .hca
        .create_flow(&FlowRule {
            priority: 1,
            pattern: udp_dst(53),
            action: FlowAction::Queue(q[1]),
        })
        .unwrap();
    let same = rig
        .hca
        .create_flow(&FlowRule {
            priority: 1,
            pattern: udp_dst(53),
            action: FlowAction::Queue(q[2]),
        })
        .unwrap();
    let order: Vec<u32> = rig.hca.flows().iter().map(|f| f.0).collect();
    assert_eq!(
        order,
        [narrow, same, wide],
        "the order rules are checked in"
    );
    assert_eq!(rig.roundtrip(&udp_to(53)).map(|r| r.0), Some(1));
    assert_eq!(rig.roundtrip(&udp_to(99)).map(|r| r.0), Some(0));
    rig.hca.destroy_flow(narrow).unwrap();
    assert_eq!(rig.roundtrip(&udp_to(53)).map(|r| r.0), Some(2));
    let c = |id| rig.hca.flow_counters(id).unwrap().frames;
    assert_eq!((c(same), c(wide)), (1, 1));
}

#[test]
fn a_drop_rule_drops_and_counts() {
    let mut rig = Rig::new(1);
    let id = rig
        .hca
        .create_flow(&FlowRule {
            priority: 0,
            pattern: udp_dst(7),
            action: FlowAction::Drop,
        })
        .unwrap();
    assert!(rig.roundtrip(&udp_to(7)).is_none());
    assert!(rig.roundtrip(&udp_to(8)).is_some());
    let k = rig.hca.counters();
    assert_eq!((k.rx_drops_flow, k.rx_frames, k.rx_dropped()), (1, 1, 1));
    assert_eq!(rig.hca.flow_counters(id).unwrap().frames, 1);
}

#[test]
fn an_rss_action_hashes_with_its_own_context() {
    let mut rig = Rig::new(3);
    let q = rig.qpns();
    rig.hca.set_rx_steering(&[q[0]]).unwrap();
    // The published Toeplitz vector (default key): 66.9.149.187:2794 -> 161.142.100.80:1766,
    // 0x323e8fc2 over the addresses, 0x51ccc178 with the ports.
    let tcp = frame(
        OUR_MAC,
        None,
        false,
        ([66, 9, 149, 187], 2794),
        ([161, 142, 100, 80], 1766),
    );
    let ctx = RssContext {
        key: DEFAULT_RSS_KEY,
        fields: RssFields::IPV4,
        rqs: vec![q[1], q[2]],
    };
    let id = rig.hca.create_rss_context(&ctx).unwrap();
    assert_eq!(rig.hca.rss_context(id).unwrap(), ctx);
    let tcp_pattern = FlowPattern {
        ipv4: Some(Ipv4Match::default()),
        l4: Some(L4Match {
            proto: L4Proto::Tcp,
            src_port: Masked::default(),
            dst_port: Masked::default(),
        }),
        ..FlowPattern::default()
    };
    let flow = rig
        .hca
        .create_flow(&FlowRule {
            priority: 0,
            pattern: tcp_pattern,
            action: FlowAction::Rss(id),
        })
        .unwrap();
    let (rq, cqe) = rig.roundtrip(&tcp).expect("delivered");
    assert_eq!(
        be32(&cqe, 4),
        0x323e_8fc2,
        "the context's fields: addresses only"
    );
    let hash = 0x323e_8fc2usize;
    assert_eq!(rq, [1, 2][hash % 2], "rqs[hash % 2] of the context");
    // The port's default RSS (all fields) is untouched: UDP takes it.
    let (rq, _) = rig.roundtrip(&udp_to(1)).unwrap();
    assert_eq!(rq, 0);
    // Flows spread over both RQs of the context.
    let mut seen = [false; 3];
    for port in 0..16 {
        let f = frame(
            OUR_MAC,
            None,
            false,
            ([10, 0, 0, port], 1),
            ([10, 0, 0, 2], 2),
        );
        seen[rig.roundtrip(&f).unwrap().0] = true;
    }
    assert_eq!(seen, [false, true, true]);
    assert!(rig.hca.destroy_rss_context(id).is_err(), "a rule uses it");
    rig.hca.destroy_flow(flow).unwrap();
    rig.hca.destroy_rss_context(id).unwrap();
    // Rules and contexts must name what exists.
    let bad_q = FlowRule {
        priority: 0,
        pattern: FlowPattern::default(),
        action: FlowAction::Queue(0x7777),
    };
    assert!(rig.hca.create_flow(&bad_q).is_err());
    let bad_ctx = FlowRule {
        action: FlowAction::Rss(id),
        ..bad_q
    };
    assert!(rig.hca.create_flow(&bad_ctx).is_err());
    assert!(rig
        .hca
        .create_rss_context(&RssContext {
            rqs: vec![],
            ..ctx.clone()
        })
        .is_err());
    assert!(rig
        .hca
        .create_rss_context(&RssContext {
            rqs: vec![0x7777],
            ..ctx
        })
        .is_err());
}

#[test]
fn eth_vlan_and_ipv4_fields_match_under_their_masks() {
    let mut rig = Rig::new(2);
    let q = rig.qpns();
    rig.hca.set_rx_steering(&[q[0]]).unwrap();
    let to_q1 = |pattern| FlowRule {
        priority: 0,
        pattern,
        action: FlowAction::Queue(q[1]),
    };
    let flow = (([192, 168, 7, 9], 1), ([10, 0, 0, 2], 2));
    let plain = frame(OUR_MAC, None, true, flow.0, flow.1);
    let steered = |rig: &mut Rig, f: &[u8]| rig.roundtrip(f).map(|r| r.0) == Some(1);

    // Every multicast destination (the mask of MC_DEFAULT rules).
    let mc = rig
        .hca
        .create_flow(&to_q1(FlowPattern {
            eth: Some(EthMatch {
                dst: Masked {
                    value: [1, 0, 0, 0, 0, 0],
                    mask: [1, 0, 0, 0, 0, 0],
                },
                ..EthMatch::default()
            }),
            ..FlowPattern::default()
        }))
        .unwrap();
    assert!(!steered(&mut rig, &plain));
    let group = frame([0x01, 0, 0x5e, 0, 0, 9], None, true, flow.0, flow.1);
    assert!(steered(&mut rig, &group));
    rig.hca.destroy_flow(mc).unwrap();

    // The EtherType after the tags: ARP.
    let arp_rule = rig
        .hca
        .create_flow(&to_q1(FlowPattern {
            eth: Some(EthMatch {
                ether_type: Masked::exact(0x0806, 0xffff),
                ..EthMatch::default()
            }),
            ..FlowPattern::default()
        }))
        .unwrap();
    let mut arp = plain.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    assert!(steered(&mut rig, &arp));
    let mut tagged_arp = arp.clone();
    tagged_arp.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
    assert!(steered(&mut rig, &tagged_arp));
    assert!(!steered(&mut rig, &plain));
    rig.hca.destroy_flow(arp_rule).unwrap();

    // VLAN 5 (priority bits aside); an untagged frame does not match a VLAN item.
    let vlan = rig
        .hca
        .create_flow(&to_q1(FlowPattern {
            vlan: Some(VlanMatch {
                vid: Masked::exact(5, 0x0fff),
            }),
            ..FlowPattern::default()
        }))
        .unwrap();
    assert!(steered(
        &mut rig,
        &frame(OUR_MAC, Some(0xe005), true, flow.0, flow.1)
    ));
    assert!(!steered(
        &mut rig,
        &frame(OUR_MAC, Some(6), true, flow.0, flow.1)
    ));
    assert!(!steered(&mut rig, &plain));
    rig.hca.destroy_flow(vlan).unwrap();

    // A source prefix 192.168.0.0/16 and an exact destination.
    let ip = rig
        .hca
        .create_flow(&to_q1(FlowPattern {
            ipv4: Some(Ipv4Match {
                src: Masked {
                    value: [192, 168, 0, 0],
                    mask: [255, 255, 0, 0],
                },
                dst: Masked::exact([10, 0, 0, 2], [255; 4]),
            }),
            ..FlowPattern::default()
        }))
        .unwrap();
    assert!(steered(&mut rig, &plain));
    assert!(!steered(
        &mut rig,
        &frame(OUR_MAC, None, true, ([192, 169, 7, 9], 1), flow.1)
    ));
    assert!(!steered(
        &mut rig,
        &frame(OUR_MAC, None, true, flow.0, ([10, 0, 0, 3], 2))
    ));
    assert!(!steered(&mut rig, &arp), "not IPv4");
    assert_eq!(rig.hca.flow_counters(ip).unwrap().frames, 1);
}
