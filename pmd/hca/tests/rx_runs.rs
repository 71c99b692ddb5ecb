//! The receive delivery's runs (frames of one flow delivered to one RQ with its state found
//! once) against the per-frame path: the same frames, sent all at once so that they are
//! delivered in runs and stretches, or one at a time through the general receive
//! ([`Hca::set_rx_stretches`] off), must leave the same CQEs, the same bytes in the receive
//! buffers and the same counters.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx4_hca::{Counters, Faults, Hca, Wire};

const BUF: u32 = 2048;
/// Receive buffers, one per RQ WQE.
const RX_WQES: u32 = 64;
/// Frames the device is given at once: the SQ holds them all.
const TXBBS: u32 = 64;

/// The counters a frame's delivery moves, whichever path it takes.
fn rx_counters(c: &Counters) -> Vec<(&'static str, u64)> {
    c.iter()
        .filter(|(n, _)| {
            n.starts_with("rx_")
                || [
                    "cqes",
                    "error_cqes",
                    "cq_events",
                    "cq_full_stalls",
                    "inj_rx_errors",
                    "dma_write_bytes",
                ]
                .contains(n)
        })
        .collect()
}

/// Frames received or dropped so far: each is counted once, in `rx_frames` or a drop.
fn accounted(c: &Counters) -> u64 {
    c.iter()
        .filter(|(n, _)| *n == "rx_frames" || n.starts_with("rx_drops_"))
        .map(|(_, v)| v)
        .sum()
}

/// What a case sets up: the CQ's size, the WQEs posted (and which of them name a key the
/// device does not know, or a buffer outside its region), and faults.
#[derive(Clone, Copy)]
struct Case {
    cqes: u32,
    posted: u32,
    bad_lkey_at: Option<u32>,
    /// A WQE whose buffer runs past the end of its region, though the frame would fit.
    long_buf_at: Option<u32>,
    faults: Faults,
    /// A ConnectX-3 Pro: VXLAN frames get inner verdicts and tunnel bits.
    pro: bool,
}

/// What the driver sees once every frame is done with.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    cqes: Vec<Vec<u8>>,
    bufs: Vec<Vec<u8>>,
    counters: Vec<(&'static str, u64)>,
}

/// Loop `frames` back into an RQ set up as `case` says, `together` (one doorbell per frame,
/// the device run once they are all posted, receiving in stretches) or one frame at a time
/// (the device run until each is done with before the next is sent, every frame through the
/// general receive).
fn deliver(case: Case, frames: &[Vec<u8>], together: bool) -> Seen {
    assert!(frames.len() <= TXBBS as usize);
    let cfg = mlx4_hca::HcaConfig {
        pro: case.pro,
        ..step_cfg()
    };
    let (hca, mut txcq, mut sq) = sq_rig(cfg, TXBBS, 64);
    hca.set_wire(Wire::Loop).unwrap();
    // One frame at a time, every frame goes through the general receive: the reference.
    hca.set_rx_stretches(together);
    let mut rxcq = TestCq::new(&hca, case.cqes);
    let mut rq = TestRq::new(&hca, RX_WQES, 1, rxcq.cqn);
    let pkts = Pkts::new(&hca, 64 * 2048 + RX_WQES as usize * BUF as usize);
    let rx_buf = |i: u32| pkts.mem.addr() + 64 * 2048 + u64::from(i) * u64::from(BUF);
    for i in 0..case.posted {
        let lkey = if case.bad_lkey_at == Some(i) {
            pkts.lkey ^ 0x100
        } else {
            pkts.lkey
        };
        let len = if case.long_buf_at == Some(i) {
            1 << 30
        } else {
            BUF
        };
        rq.post(&[(len, lkey, rx_buf(i))]);
    }
    hca.set_faults(case.faults);
    let settle = |hca: &Hca, n: u64| {
        // A frame waiting for room in a full CQ is dropped after the device's patience.
        let deadline = Instant::now() + Duration::from_secs(10);
        while accounted(&hca.counters()) < n {
            assert!(Instant::now() < deadline, "{n} frames not done with");
            hca.step();
        }
    };
    for (i, f) in frames.iter().enumerate() {
        let off = i * 2048;
        pkts.mem.put(off, f);
        let mut t = ctrl_tail(2, UNSIGNALED);
        t.extend(dseg(
            f.len() as u32,
            pkts.lkey,
            pkts.mem.addr() + off as u64,
        ));
        sq.write(SEND, &t);
        sq.doorbell();
        if !together {
            settle(&hca, i as u64 + 1);
        }
    }
    settle(&hca, frames.len() as u64);
    hca.step();
    assert_eq!(txcq.drain().len(), 0, "unsignaled sends");
    let c = hca.counters();
    assert_eq!(
        accounted(&c),
        frames.len() as u64,
        "each frame counted once"
    );
    Seen {
        cqes: rxcq.drain(),
        bufs: (0..case.posted)
            .map(|i| pkts.mem.get((rx_buf(i) - pkts.mem.addr()) as usize, 128))
            .collect(),
        counters: rx_counters(&c),
    }
}

fn udp4(dst_last: u8, sport: u16, payload: usize, fill: u8) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, dst_last];
    f.extend([0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00, 0x45, 0x00]);
    f.extend(((20 + 8 + payload) as u16).to_be_bytes());
    f.extend(hex("00004000401100000102030405060708"));
    f.extend(sport.to_be_bytes());
    f.extend(hex("abcd"));
    f.extend(((8 + payload) as u16).to_be_bytes());
    f.extend([0, 0]);
    f.extend((0..payload).map(|i| fill.wrapping_add(i as u8)));
    f
}

/// Frames of a few flows, interleaved: runs of one flow of various lengths (UDP without a
/// checksum, TCP with a good one and with a broken payload under the same headers, one flow
/// at two lengths), broadcast, a non-IP frame (never remembered) and a tagged IPv6 one.
fn mixed() -> Vec<Vec<u8>> {
    let tcp = hex(TCP4);
    let mut tcp_bad = tcp.clone();
    *tcp_bad.last_mut().unwrap() ^= 0x40;
    let mut bcast = udp4(2, 7, 30, 3);
    bcast[..6].fill(0xff);
    let mut arp = hex("ffffffffffff0200000000010806");
    arp.extend([0x11; 46]);
    let v6 = hex(UDP6_VLAN);
    let a = |fill| udp4(2, 1000, 22, fill);
    let b = |fill| udp4(2, 2000, 22, fill);
    let d = |fill| udp4(2, 1000, 40, fill);
    vec![
        a(0),
        a(1),
        a(2),
        tcp.clone(),
        tcp_bad.clone(),
        tcp.clone(),
        a(3),
        b(4),
        a(5),
        b(6),
        b(7),
        d(8),
        d(9),
        a(10),
        bcast.clone(),
        bcast,
        arp.clone(),
        arp,
        v6.clone(),
        v6,
        tcp_bad,
        tcp,
        a(11),
        a(12),
        a(13),
        a(14),
        b(15),
        b(16),
        a(17),
        a(18),
    ]
}

fn same_both_ways(case: Case, frames: &[Vec<u8>]) -> Seen {
    let runs = deliver(case, frames, true);
    let single = deliver(case, frames, false);
    assert_eq!(runs, single, "runs against one frame at a time");
    runs
}

fn plain(cqes: u32, posted: u32) -> Case {
    Case {
        cqes,
        posted,
        bad_lkey_at: None,
        long_buf_at: None,
        faults: Faults::default(),
        pro: false,
    }
}

fn counter(s: &Seen, name: &str) -> u64 {
    s.counters.iter().find(|(n, _)| *n == name).unwrap().1
}

#[test]
fn interleaved_flows_are_delivered_alike() {
    let frames = mixed();
    let s = same_both_ways(plain(64, 64), &frames);
    assert_eq!(s.cqes.len(), frames.len());
    assert_eq!(counter(&s, "rx_frames"), frames.len() as u64);
    for (i, (c, f)) in s.cqes.iter().zip(&frames).enumerate() {
        assert_eq!(be16(c, 24), i as u16, "wqe_index");
        assert_eq!(be32(c, 20), f.len() as u32, "byte_cnt");
        let n = f.len().min(128);
        assert_eq!(s.bufs[i][..n], f[..n], "frame {i} in its buffer");
    }
    // The broken TCP payloads are the only frames without the L4 verdict.
    let l4_ok: Vec<bool> = s.cqes.iter().map(|c| be32(c, 16) & (1 << 2) != 0).collect();
    assert_eq!(l4_ok.iter().filter(|ok| !**ok).count(), 2 + 2, "{l4_ok:?}");
    assert_eq!(counter(&s, "rx_broadcast"), 2 + 2);
}

#[test]
fn a_full_cq_mid_run_waits_then_drops_alike() {
    let frames = mixed();
    let s = same_both_ways(plain(16, 64), &frames);
    assert_eq!(s.cqes.len(), 16);
    assert_eq!(counter(&s, "rx_frames"), 16);
    assert_eq!(counter(&s, "rx_drops_cq_full"), frames.len() as u64 - 16);
    assert_eq!(counter(&s, "cq_full_stalls"), 1);
}

#[test]
fn an_rq_out_of_wqes_mid_run_drops_alike() {
    let frames = mixed();
    let s = same_both_ways(plain(64, 9), &frames);
    assert_eq!(s.cqes.len(), 9);
    assert_eq!(counter(&s, "rx_drops_no_wqe"), frames.len() as u64 - 9);
}

/// `case` delivered both ways, with a WQE that errs at frame 1 (inside the first run): it gets
/// the error CQE, and the frames after it find the RQ in error.
fn errs_the_rq_at_frame_1(case: Case) -> Seen {
    let frames = mixed();
    let s = same_both_ways(case, &frames);
    assert_eq!(s.cqes.len(), 2);
    assert_eq!(s.cqes[1][31] & 0x1f, 0x1e, "error opcode");
    assert_eq!(counter(&s, "rx_frames"), 1);
    assert_eq!(counter(&s, "rx_drops_error"), frames.len() as u64 - 1);
    s
}

#[test]
fn a_bad_lkey_mid_run_errs_the_rq_alike() {
    errs_the_rq_at_frame_1(Case {
        bad_lkey_at: Some(1),
        ..plain(64, 64)
    });
}

#[test]
fn a_buffer_past_its_region_mid_run_errs_the_rq_alike() {
    // The whole buffer must lie inside its region, not only the part the frame fills.
    let s = errs_the_rq_at_frame_1(Case {
        long_buf_at: Some(1),
        ..plain(64, 64)
    });
    assert_eq!(s.cqes[1][27], 0x04, "local protection error");
    assert_eq!(s.bufs[1], vec![0; 128], "nothing written");
}

#[test]
fn an_injected_error_mid_run_errs_the_rq_alike() {
    let frames = mixed();
    let case = Case {
        faults: Faults {
            rx_error_every: 13,
            ..Faults::default()
        },
        ..plain(64, 64)
    };
    let s = same_both_ways(case, &frames);
    assert_eq!(s.cqes.len(), 13);
    assert_eq!(counter(&s, "inj_rx_errors"), 1);
    assert_eq!(counter(&s, "rx_frames"), 12);
}

/// On a ConnectX-3 Pro the plain frames' runs go through the stretch too (its check that a
/// run is not VXLAN looks at the next frame), and a VXLAN run is received frame by frame
/// with its inner verdicts and tunnel bits: both alike when delivered one at a time.
#[test]
fn a_pros_plain_and_vxlan_runs_are_delivered_alike() {
    let vx = vxlan_frame();
    let mut vx_bad = vx.clone();
    *vx_bad.last_mut().unwrap() ^= 0x10;
    let mut frames = mixed();
    for (at, f) in [
        (3, &vx),
        (4, &vx),
        (5, &vx_bad),
        (6, &vx),
        (20, &vx),
        (21, &vx),
    ] {
        frames.insert(at, f.clone());
    }
    frames.truncate(RX_WQES as usize);
    let pro = same_both_ways(
        Case {
            pro: true,
            ..plain(64, 64)
        },
        &frames,
    );
    assert_eq!(counter(&pro, "rx_frames"), frames.len() as u64);
    let tunnel = |c: &Vec<u8>| be32(c, 0) & (1 << 27) != 0;
    let tunnelled: Vec<usize> = (0..frames.len())
        .filter(|&i| tunnel(&pro.cqes[i]))
        .collect();
    assert_eq!(
        tunnelled,
        [3, 4, 5, 6, 20, 21],
        "the VXLAN frames' CQEs say so"
    );
    // The plain frames' CQEs are what a ConnectX-3 writes for them.
    let cx3 = same_both_ways(plain(64, 64), &frames);
    for i in (0..frames.len()).filter(|i| !tunnelled.contains(i)) {
        assert_eq!(pro.cqes[i], cx3.cqes[i], "frame {i}");
    }
}
