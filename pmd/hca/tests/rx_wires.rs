//! Receive side, wires and the threaded device loop.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx4_hca::{Hca, HcaConfig, QueueState, Wire};

const RX_SEND: u8 = 0x01;
const ST_IPV4: u32 = 1 << 22;
const ST_IPV6: u32 = 1 << 24;
const ST_TCP: u32 = 1 << 26;
const ST_UDP: u32 = 1 << 27;
const ST_IP_OK: u32 = 1 << 28;
const ST_L4_OK: u32 = 1 << 2;

/// An adapter with a TX queue, an RX queue of `rx_wqes` single-buffer WQEs (2 KiB each) and
/// packet memory.
struct Port {
    hca: Hca,
    txcq: TestCq,
    sq: TestSq,
    rxcq: TestCq,
    rq: TestRq,
    pkts: Pkts,
}

const BUF: u32 = 2048;

impl Port {
    fn new(cfg: HcaConfig, rx_wqes: u32, sges: u32) -> Port {
        let (hca, txcq, sq) = sq_rig(cfg, 64, 64);
        let rxcq = TestCq::new(&hca, 64);
        let rq = TestRq::new(&hca, rx_wqes, sges, rxcq.cqn);
        let pkts = Pkts::new(&hca, 1 << 20);
        Port {
            hca,
            txcq,
            sq,
            rxcq,
            rq,
            pkts,
        }
    }

    /// Address of RX buffer `i` (the first 64 KiB of packet memory are for TX).
    fn rx_buf(&self, i: u32) -> u64 {
        self.pkts.mem.addr() + 65536 + u64::from(i) * u64::from(BUF)
    }

    fn post_rx(&mut self, n: u32) {
        for _ in 0..n {
            let i = self.rq.prod;
            let e = [(BUF, self.pkts.lkey, self.rx_buf(i % 64))];
            self.rq.post(&e);
        }
    }

    /// Send `frame` from TX packet memory with one data segment.
    fn send(&mut self, frame: &[u8], srcrb: u8) {
        let off = (self.sq.prod as usize % 32) * 2048;
        self.pkts.mem.put(off, frame);
        let mut t = ctrl_tail(2, srcrb);
        t.extend(dseg(
            frame.len() as u32,
            self.pkts.lkey,
            self.pkts.mem.addr() + off as u64,
        ));
        self.sq.write(SEND, &t);
        self.sq.doorbell();
    }

    fn rx_data(&self, i: u32, len: usize) -> Vec<u8> {
        let off = (self.rx_buf(i) - self.pkts.mem.addr()) as usize;
        self.pkts.mem.get(off, len)
    }
}

fn udp4(payload_len: usize) -> Vec<u8> {
    // A minimal UDP/IPv4 frame with a zero (absent) UDP checksum and a valid header checksum
    // filled in by the TX offload.
    let mut f = hex("02000000000202000000000108004500");
    let total = 20 + 8 + payload_len;
    f.extend((total as u16).to_be_bytes());
    f.extend(hex("000040004011000001020304050607081234abcd"));
    f.extend(((8 + payload_len) as u16).to_be_bytes());
    f.extend([0, 0]);
    f.extend((0..payload_len).map(|i| i as u8));
    f
}

#[test]
fn loop_wire_delivers_with_rx_cqe_and_checksum_status() {
    let mut p = Port::new(step_cfg(), 8, 1);
    p.hca.set_wire(Wire::Loop).unwrap();
    p.post_rx(8);
    let tcp = hex(TCP4);
    p.send(&tcp, SIGNALED);
    p.hca.step();
    let cqe = p.rxcq.poll().expect("RX CQE");
    assert_eq!(cqe[31], RX_SEND, "owner 0 in pass 0, S/R 0, opcode RX_SEND");
    assert_eq!(be32(&cqe, 0) & 0xff_ffff, p.rq.qpn);
    assert_eq!(be32(&cqe, 20), tcp.len() as u32, "byte_cnt");
    assert_eq!(be16(&cqe, 24), 0, "wqe_index");
    assert_eq!(
        be32(&cqe, 16),
        ST_IPV4 | ST_TCP | ST_IP_OK | ST_L4_OK,
        "status"
    );
    assert_eq!(p.rx_data(0, tcp.len()), tcp);
    assert_eq!(p.txcq.drain().len(), 1);

    // A corrupted TCP payload is classified but not L4-OK; a changed TTL breaks only the IP
    // header checksum (TTL is not in the pseudo-header).
    let mut bad = tcp.clone();
    bad[60] ^= 1;
    p.send(&bad, UNSIGNALED);
    let mut bad_ip = tcp.clone();
    bad_ip[22] = 1; // TTL
    p.send(&bad_ip, UNSIGNALED);
    p.hca.step();
    let c1 = p.rxcq.poll().unwrap();
    assert_eq!(be32(&c1, 16), ST_IPV4 | ST_TCP | ST_IP_OK);
    assert_eq!(be16(&c1, 24), 1);
    let c2 = p.rxcq.poll().unwrap();
    assert_eq!(be32(&c2, 16), ST_IPV4 | ST_TCP | ST_L4_OK);

    // IPv6 in a VLAN tag, and a UDP/IPv4 frame without UDP checksum (valid by definition).
    p.send(&hex(UDP6_VLAN), UNSIGNALED);
    p.send(&udp4(10), UNSIGNALED | IP_CSUM);
    p.hca.step();
    assert_eq!(
        be32(&p.rxcq.poll().unwrap(), 16),
        ST_IPV6 | ST_UDP | ST_IP_OK | ST_L4_OK
    );
    assert_eq!(
        be32(&p.rxcq.poll().unwrap(), 16),
        ST_IPV4 | ST_UDP | ST_IP_OK | ST_L4_OK
    );
    let c = p.hca.counters();
    assert_eq!((c.tx_frames, c.rx_frames, c.rx_drops_no_wqe), (5, 5, 0));
}

#[test]
fn rx_scatters_across_entries() {
    let mut p = Port::new(step_cfg(), 4, 4);
    p.hca.set_wire(Wire::Loop).unwrap();
    // Three entries of 100, 50 and 2048 bytes, then the INVALID_LKEY terminator.
    let a = p.rx_buf(0);
    let e = [
        (100, p.pkts.lkey, a),
        (50, p.pkts.lkey, a + 1000),
        (2048, p.pkts.lkey, a + 4000),
    ];
    p.rq.post(&e);
    let f = udp4(300);
    p.send(&f, UNSIGNALED);
    p.hca.step();
    let cqe = p.rxcq.poll().unwrap();
    assert_eq!(be32(&cqe, 20), f.len() as u32);
    let base = (a - p.pkts.mem.addr()) as usize;
    let mut got = p.pkts.mem.get(base, 100);
    got.extend(p.pkts.mem.get(base + 1000, 50));
    got.extend(p.pkts.mem.get(base + 4000, f.len() - 150));
    assert_eq!(got, f);
}

#[test]
fn rx_too_long_is_an_error_cqe_but_the_queue_goes_on() {
    let mut p = Port::new(step_cfg(), 4, 1);
    p.hca.set_wire(Wire::Loop).unwrap();
    p.rq.post(&[(64, p.pkts.lkey, p.rx_buf(0))]);
    p.post_rx(1);
    p.send(&udp4(100), UNSIGNALED);
    p.send(&udp4(100), UNSIGNALED);
    p.hca.step();
    let e = p.rxcq.poll().unwrap();
    assert_eq!(
        (e[31] & 0x1f, e[27]),
        (0x1e, 0x01),
        "error CQE, LOCAL_LENGTH"
    );
    assert_eq!(be16(&e, 24), 0);
    let ok = p.rxcq.poll().unwrap();
    assert_eq!(ok[31], RX_SEND);
    assert_eq!(be16(&ok, 24), 1);
    assert_eq!(p.hca.rq_state(p.rq.qpn).unwrap(), QueueState::Ready);
    assert_eq!(p.hca.counters().rx_drops_too_long, 1);
}

#[test]
fn rx_bad_lkey_puts_the_queue_in_error() {
    let mut p = Port::new(step_cfg(), 4, 1);
    p.hca.set_wire(Wire::Loop).unwrap();
    p.rq.post(&[(2048, 0x00ab_cd01, p.rx_buf(0))]);
    p.post_rx(1);
    p.send(&udp4(10), UNSIGNALED);
    p.send(&udp4(10), UNSIGNALED);
    p.hca.step();
    let e = p.rxcq.poll().unwrap();
    assert_eq!((e[31] & 0x1f, e[27]), (0x1e, 0x04));
    assert!(p.rxcq.poll().is_none());
    assert_eq!(p.hca.rq_state(p.rq.qpn).unwrap(), QueueState::Error);
    let c = p.hca.counters();
    assert_eq!(c.rx_drops_error, 2);
}

#[test]
fn rx_without_posted_wqe_drops_and_counts() {
    let mut p = Port::new(step_cfg(), 4, 1);
    p.hca.set_wire(Wire::Loop).unwrap();
    p.post_rx(1);
    for _ in 0..3 {
        p.send(&udp4(10), UNSIGNALED);
    }
    p.hca.step();
    assert_eq!(p.rxcq.drain().len(), 1);
    let c = p.hca.counters();
    assert_eq!((c.tx_frames, c.rx_frames, c.rx_drops_no_wqe), (3, 1, 2));
}

#[test]
fn rx_waits_for_cq_room() {
    let hca = Hca::open(step_cfg()).unwrap();
    hca.set_wire(Wire::Loop).unwrap();
    let txcq = TestCq::new(&hca, 8);
    let mut sq = TestSq::new(&hca, 64, txcq.cqn);
    let mut rxcq = TestCq::new(&hca, 2);
    let mut rq = TestRq::new(&hca, 8, 1, rxcq.cqn);
    let pkts = Pkts::new(&hca, 65536);
    for i in 0..8 {
        rq.post(&[(2048, pkts.lkey, pkts.mem.addr() + 8192 + i * 2048)]);
    }
    let f = udp4(10);
    pkts.mem.put(0, &f);
    for _ in 0..4 {
        let mut t = ctrl_tail(2, UNSIGNALED);
        t.extend(dseg(f.len() as u32, pkts.lkey, pkts.mem.addr()));
        sq.write(SEND, &t);
    }
    sq.doorbell();
    hca.step();
    assert_eq!(rxcq.drain().len(), 2);
    assert_eq!(hca.counters().cq_full_stalls, 1);
    rxcq.update_ci();
    hca.step();
    assert_eq!(rxcq.drain().len(), 2);
    let c = hca.counters();
    assert_eq!((c.rx_frames, c.rx_drops_no_wqe), (4, 0));
}

#[test]
fn peer_wire_cables_two_adapters() {
    let mut a = Port::new(
        HcaConfig {
            name: "test_peer_a".into(),
            ..step_cfg()
        },
        8,
        1,
    );
    let mut b = Port::new(
        HcaConfig {
            name: "test_peer_b".into(),
            ..step_cfg()
        },
        8,
        1,
    );
    assert!(Hca::open(HcaConfig {
        name: "test_peer_a".into(),
        ..step_cfg()
    })
    .is_err());
    a.hca.set_wire("peer:test_peer_b".parse().unwrap()).unwrap();
    b.hca.set_wire(Wire::Peer("test_peer_a".into())).unwrap();
    b.post_rx(2);
    a.post_rx(2);
    let f = udp4(20);
    a.send(&f, UNSIGNALED);
    a.hca.step();
    b.hca.step();
    assert_eq!(b.rxcq.drain().len(), 1);
    assert_eq!(b.rx_data(0, f.len()), f);
    let g = udp4(30);
    b.send(&g, UNSIGNALED);
    b.hca.step();
    a.hca.step();
    assert_eq!(a.rxcq.drain().len(), 1);
    assert_eq!(a.rx_data(0, g.len()), g);

    // A peer port that is down drops (counted on its side, as missed), never blocks the
    // sender, for which the frame left the port.
    b.hca.set_port_up(false);
    a.send(&f, SIGNALED);
    a.hca.step();
    b.hca.step();
    assert_eq!(a.txcq.drain().len(), 1);
    assert!(b.rxcq.poll().is_none());
    let (ca, cb) = (a.hca.counters(), b.hca.counters());
    assert_eq!((cb.rx_drops_wire, cb.rx_missed()), (1, 1));
    assert_eq!((ca.tx_frames, ca.tx_drops_wire), (2, 0));
    assert_eq!(ca.tx_frames, cb.rx_frames + cb.rx_dropped());
}

#[test]
fn peer_wire_to_nobody_drops() {
    let mut a = Port::new(step_cfg(), 4, 1);
    a.hca.set_wire(Wire::Peer("nobody_here".into())).unwrap();
    a.send(&udp4(5), SIGNALED);
    a.hca.step();
    assert_eq!(a.txcq.drain().len(), 1, "the WQE completes anyway");
    assert_eq!(a.hca.counters().tx_drops_wire, 1);
}

#[test]
fn peer_inbox_is_bounded() {
    let mut a = Port::new(
        HcaConfig {
            name: "test_bounded_a".into(),
            ..step_cfg()
        },
        4,
        1,
    );
    let b = Port::new(
        HcaConfig {
            name: "test_bounded_b".into(),
            rx_inbox_frames: 4,
            ..step_cfg()
        },
        4,
        1,
    );
    a.hca.set_wire(Wire::Peer("test_bounded_b".into())).unwrap();
    for _ in 0..10 {
        a.send(&udp4(5), UNSIGNALED);
    }
    a.hca.step();
    assert_eq!(b.hca.counters().rx_drops_wire, 6);
    b.hca.step();
    assert_eq!(b.hca.counters().rx_drops_no_wqe, 4);
}

#[test]
fn pcap_wire_writes_a_readable_file() {
    let path = std::env::temp_dir().join(format!("mlx4_hca_test_{}.pcap", std::process::id()));
    let mut p = Port::new(step_cfg(), 4, 1);
    p.hca.set_wire(Wire::Pcap(path.clone())).unwrap();
    let f1 = hex(TCP4);
    let f2 = udp4(100);
    p.send(&f1, UNSIGNALED);
    p.send(&f2, UNSIGNALED);
    p.hca.step();
    // Read while the wire is still open: records must already be flushed.
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        &bytes[..24],
        &[0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 1, 0, 0, 0]
    );
    let mut off = 24;
    for want in [&f1, &f2] {
        let incl = u32::from_le_bytes(bytes[off + 8..off + 12].try_into().unwrap()) as usize;
        let orig = u32::from_le_bytes(bytes[off + 12..off + 16].try_into().unwrap()) as usize;
        assert_eq!((incl, orig), (want.len(), want.len()));
        assert_eq!(&bytes[off + 16..off + 16 + incl], want.as_slice());
        off += 16 + incl;
    }
    assert_eq!(off, bytes.len());
    p.hca.set_wire(Wire::Null).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(p
        .hca
        .set_wire(Wire::Pcap("/nonexistent/dir/x.pcap".into()))
        .is_err());
}

#[test]
fn tap_wire_when_available() {
    let p = Port::new(step_cfg(), 4, 1);
    let name = format!("mlx4t{}", std::process::id() % 10000);
    match p.hca.set_wire(Wire::Tap(name.clone())) {
        Err(e) => {
            println!("skipping TAP test: cannot create {name}: {e}");
        }
        Ok(()) => {
            assert_eq!(p.hca.wire(), format!("tap:{name}"));
            let mut p = p;
            p.send(&udp4(10), SIGNALED);
            p.hca.step();
            assert_eq!(p.txcq.drain().len(), 1);
            let c = p.hca.counters();
            // The interface is down, so the kernel may refuse the frame: either way it is counted.
            assert_eq!(c.tx_frames + c.tx_drops_wire, 1);
            p.hca.set_wire(Wire::Null).unwrap();
        }
    }
}

#[test]
fn port_down_drops_tx_but_completes() {
    let mut p = Port::new(step_cfg(), 4, 1);
    let frames = sink(&p.hca);
    p.hca.set_port_up(false);
    assert!(!p.hca.port_up());
    p.send(&udp4(5), SIGNALED);
    p.hca.step();
    assert_eq!(p.txcq.drain().len(), 1);
    assert!(frames.lock().is_empty());
    p.hca.set_port_up(true);
    p.send(&udp4(5), SIGNALED);
    p.hca.step();
    assert_eq!(frames.lock().len(), 1);
    let c = p.hca.counters();
    assert_eq!((c.tx_frames, c.tx_drops_wire), (1, 1));
    p.hca.reset_counters();
    assert_eq!(p.hca.counters(), mlx4_hca::Counters::default());
}

#[test]
fn threaded_device_loop_smoke() {
    let mut p = Port::new(
        HcaConfig {
            threaded: true,
            ..HcaConfig::default()
        },
        64,
        1,
    );
    p.hca.set_wire(Wire::Loop).unwrap();
    p.post_rx(64);
    p.hca.start().unwrap();
    p.hca.start().unwrap();
    let total = 2000u32;
    let f = udp4(50);
    p.pkts.mem.put(0, &f);
    let (mut posted, mut tx_done, mut rx_done) = (0u32, 0u32, 0u32);
    let deadline = Instant::now() + Duration::from_secs(20);
    while rx_done < total {
        assert!(
            Instant::now() < deadline,
            "stuck: posted {posted} tx {tx_done} rx {rx_done}"
        );
        // Bursts of up to 16, one doorbell each, a completion requested on the last.
        let mut burst = 0;
        while posted < total && posted - tx_done < 48 && burst < 16 && posted - rx_done < 48 {
            let last = burst == 15 || posted + 1 == total || posted - tx_done == 47;
            let mut t = ctrl_tail(2, if last { SIGNALED } else { UNSIGNALED });
            t.extend(dseg(f.len() as u32, p.pkts.lkey, p.pkts.mem.addr()));
            p.sq.write(SEND, &t);
            posted += 1;
            burst += 1;
            if last {
                break;
            }
        }
        if burst > 0 {
            p.sq.doorbell();
        }
        while let Some(c) = p.txcq.poll() {
            tx_done = (be16(&c, 24) as u32) + 1;
        }
        p.txcq.update_ci();
        while let Some(c) = p.rxcq.poll() {
            assert_eq!(c[31] & 0x1f, RX_SEND);
            assert_eq!(be32(&c, 20), f.len() as u32);
            rx_done += 1;
            p.post_rx(1);
        }
        p.rxcq.update_ci();
        std::thread::yield_now();
    }
    p.hca.stop();
    p.hca.stop();
    let c = p.hca.counters();
    assert_eq!((c.tx_frames, c.rx_frames), (total as u64, total as u64));
    assert_eq!(c.rx_drops_no_wqe, 0);
}

#[test]
fn dropping_the_last_handle_stops_the_thread() {
    let hca = Hca::open(HcaConfig {
        threaded: true,
        busy_poll: true,
        ..HcaConfig::default()
    })
    .unwrap();
    hca.start().unwrap();
    let h2 = hca.clone();
    drop(hca);
    assert_eq!(h2.counters().doorbells, 0);
    drop(h2);
}

/// Rough device-side rate on the null wire (run with `--release --ignored --nocapture`): the
/// device loop must keep up with a driver posting one doorbell per 32-packet burst.
#[test]
#[ignore]
fn null_wire_rate() {
    let (hca, mut cq, mut sq) = sq_rig(HcaConfig::default(), 1024, 1024);
    let pkts = Pkts::new(&hca, 4096);
    hca.start().unwrap();
    let mut t = ctrl_tail(2, UNSIGNALED);
    t.extend(dseg(64, pkts.lkey, pkts.mem.addr()));
    let mut ts = t.clone();
    ts[7] = SIGNALED;
    let (mut posted, mut done) = (0u32, 0u32);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        if posted.wrapping_sub(done) <= 1024 - 32 - 33 {
            for i in 0..32 {
                sq.write(SEND, if i == 31 { &ts } else { &t });
            }
            posted += 32;
            sq.doorbell();
        }
        while let Some(c) = cq.poll() {
            done = (u32::from(be16(&c, 24)) | (done & !0xffff)) + 1;
        }
        cq.update_ci();
    }
    let secs = start.elapsed().as_secs_f64();
    hca.stop();
    let c = hca.counters();
    println!(
        "null wire: {:.2} Mpps device-side ({} frames, {} doorbells)",
        c.tx_frames as f64 / secs / 1e6,
        c.tx_frames,
        c.doorbells
    );
}

/// Device-only cost per WQE on the null wire (step mode, ring pre-filled): run with
/// `--release --ignored --nocapture`.
#[test]
#[ignore]
fn null_wire_device_cost() {
    let (hca, _cq, mut sq) = sq_rig(step_cfg(), 1024, 1024);
    let pkts = Pkts::new(&hca, 4096);
    let mut t = ctrl_tail(2, UNSIGNALED);
    t.extend(dseg(64, pkts.lkey, pkts.mem.addr()));
    let mut total = Duration::ZERO;
    let mut frames = 0u64;
    for _ in 0..64 {
        for _ in 0..1024 {
            sq.write(SEND, &t);
        }
        sq.doorbell();
        let s = Instant::now();
        hca.step();
        total += s.elapsed();
        frames += 1024;
    }
    assert_eq!(hca.counters().tx_frames, frames);
    println!(
        "null wire: {:.1} ns per WQE in the device ({:.1} Mpps)",
        total.as_nanos() as f64 / frames as f64,
        frames as f64 / total.as_secs_f64() / 1e6
    );
}

#[test]
fn threaded_blueflame_posts_all_complete_in_order() {
    for wc in [true, false] {
        let hca = Hca::open(HcaConfig {
            wc,
            ..HcaConfig::default()
        })
        .unwrap();
        let frames = sink(&hca);
        let mut cq = TestCq::new(&hca, 64);
        let mut sq = TestSq::new(&hca, 64, cq.cqn);
        hca.start().unwrap();
        let total = 3000u32;
        let deadline = Instant::now() + Duration::from_secs(20);
        for i in 0..total {
            // One inline SEND per post, every one through BlueFlame, as a latency test does.
            let mut t = ctrl_tail(4, SIGNALED);
            t.extend(inline_hdr(40));
            t.extend(i.to_be_bytes().repeat(10));
            t.resize(60, 0);
            let c = sq.write(SEND, &t);
            let wqe = sq.wqe_bytes(c);
            sq.bf_copy(c, wqe);
            let cqe = loop {
                if let Some(q) = cq.poll() {
                    break q;
                }
                assert!(
                    Instant::now() < deadline,
                    "no completion for post {i} (wc={wc})"
                );
                std::thread::yield_now();
            };
            assert_eq!(be16(&cqe, 24), i as u16);
            assert_eq!(cqe[31] & 0x1f, SEND);
            cq.update_ci();
        }
        hca.stop();
        let f = frames.lock();
        assert_eq!(f.len(), total as usize);
        assert!(f
            .iter()
            .enumerate()
            .all(|(i, fr)| fr[..4] == (i as u32).to_be_bytes()));
        let k = hca.counters();
        assert_eq!(k.bf_bursts, u64::from(total));
        assert_eq!(k.wqe_fetched + k.wqe_from_bf, u64::from(total));
        if wc {
            assert_eq!(k.wqe_from_bf + k.bf_torn, u64::from(total));
        } else {
            assert_eq!((k.wqe_from_bf, k.bf_torn), (0, u64::from(total)));
        }
    }
}

#[test]
fn rx_steering_table_picks_the_queue() {
    let mut p = Port::new(step_cfg(), 8, 1);
    p.hca.set_wire(Wire::Loop).unwrap();
    let mut cq2 = TestCq::new(&p.hca, 16);
    let mut rq2 = TestRq::new(&p.hca, 8, 1, cq2.cqn);
    for i in 0..8 {
        rq2.post(&[(BUF, p.pkts.lkey, p.rx_buf(32 + i))]);
    }
    p.post_rx(8);
    assert!(
        p.hca.set_rx_steering(&[p.sq.info.qpn]).is_err(),
        "an SQ is not an RQ"
    );
    p.hca.set_rx_steering(&[rq2.qpn]).unwrap();
    for i in 0..4 {
        let mut f = udp4(10);
        f[30] = i; // vary the destination address so flows differ
        p.send(&f, UNSIGNALED);
    }
    p.hca.step();
    assert!(p.rxcq.poll().is_none());
    let got = cq2.drain();
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|c| be32(c, 0) & 0xff_ffff == rq2.qpn));
    // Back to all queues: sixteen different flows over two RQs. The last destination byte
    // varies: under the first byte's low nibble the default key's window has only zero low
    // bits, so those flows would all hash even.
    p.hca.set_rx_steering(&[]).unwrap();
    for i in 0..16 {
        let mut f = udp4(10);
        f[33] = i;
        p.send(&f, UNSIGNALED);
    }
    p.hca.step();
    let (a, b) = (p.rxcq.drain().len(), cq2.drain().len());
    assert!(a > 0 && b > 0, "both queues receive: {a} / {b}");
}
