//! A doorbell's run (the short path a doorbell takes when its WQEs are all of the remembered
//! shape on a wire that wants no frame bytes) executes exactly as full decodes do. The same
//! stream of short bursts, one doorbell each, runs on a null wire, where the device takes the
//! short path, and on a sink wire, where every WQE is decoded in full. Shapes of two and of
//! three inline headers alternate; the second takes three TXBBs, so that it sometimes
//! straddles the end of the small ring (which the short path leaves to the general walk); the
//! CQ is small and read only now and then, so that completions stall; the link goes down for
//! some bursts. Completions and every counter the two can share must agree after each burst.

mod common;

use common::*;
use mlx4_hca::{Counters, Hca, QueueState};

const TXBBS: u32 = 64;
const CQES: u32 = 16;

struct Side {
    hca: Hca,
    cq: TestCq,
    sq: TestSq,
}

impl Side {
    fn new(null: bool) -> Side {
        let hca = Hca::open(step_cfg()).unwrap();
        if !null {
            sink(&hca);
        }
        let cq = TestCq::new(&hca, CQES);
        let sq = TestSq::new(&hca, TXBBS, cq.cqn);
        Side { hca, cq, sq }
    }
}

/// What both sides must agree on: all but what only a wire that looks at the bytes can
/// count (broadcast and multicast frames).
fn seen(c: &Counters) -> Vec<u64> {
    vec![
        c.doorbells,
        c.wqe_fetched,
        c.wqe_fetch_bytes,
        c.wqe_from_bf,
        c.txbbs,
        c.tx_frames,
        c.tx_bytes,
        c.tx_drops_wire,
        c.dma_read_bytes,
        c.cqes,
        c.error_cqes,
        c.cq_full_stalls,
        c.cq_events,
        c.tx_size_64,
        c.tx_size_65_to_127,
        c.tx_size_128_to_255,
        c.tx_size_256_to_511,
    ]
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The tail (bytes 4..) of an inline SEND: a 64-byte frame in two headers (DS 6, 2 TXBBs),
/// or a 150-byte one in three (DS 12, 3 TXBBs), each TXBB starting with a header.
fn wqe(rng: &mut Rng, three: bool, srcrb: u8) -> Vec<u8> {
    let mut payload = |n: usize| -> Vec<u8> { (0..n).map(|_| rng.next() as u8).collect() };
    let (ds, segs): (u8, &[usize]) = if three {
        (12, &[44, 60, 46])
    } else {
        (6, &[44, 20])
    };
    let mut t = ctrl_tail(ds, srcrb);
    for &n in segs {
        t.extend(inline_hdr(n));
        t.extend(payload(n));
    }
    t.resize(usize::from(ds) * 16 - 4, 0);
    t
}

#[test]
fn short_bursts_run_exactly_like_full_decodes() {
    let mut a = Side::new(true);
    let mut b = Side::new(false);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut three = false;
    let (mut stalled_rounds, mut down_rounds) = (0, 0);
    let mut stamped = 0;
    let mut read = true;
    for round in 0..4000 {
        // Room for the burst: the ring holds what the device has not completed.
        let done = |s: &Side| s.hca.counters().txbbs as u32;
        let down = rng.below(16) == 0;
        if down {
            down_rounds += 1;
        }
        for s in [&a, &b] {
            s.hca.set_port_up(!down);
        }
        let n = 1 + rng.below(4);
        for _ in 0..n {
            if rng.below(6) == 0 {
                three = !three;
            }
            let srcrb = if rng.below(2) == 0 {
                SIGNALED
            } else {
                UNSIGNALED
            };
            let t = wqe(&mut rng, three, srcrb);
            let txbbs = (u32::from(t[3]) * 16).div_ceil(64);
            if a.sq.prod + txbbs - done(&a) > TXBBS {
                break;
            }
            a.sq.write(SEND, &t);
            b.sq.write(SEND, &t);
        }
        // The consumer reads in streaks and pauses in streaks, long enough to fill the CQ.
        if rng.below(12) == 0 {
            read = !read;
        }
        for s in [&mut a, &mut b] {
            s.sq.doorbell();
            s.hca.step();
            // As drivers do, every TXBB executed is stamped with its pass's owner bit: in the
            // next pass it is not the device's, whatever the WQE that covered it was (a later
            // TXBB of an inline WQE starts with a header, whose top bit is set).
            for c in stamped..done(s) {
                let stamp = 0x7fff_ffff | s.sq.owner(c);
                s.sq.ring.put32((c & (TXBBS - 1)) as usize * 64, stamp);
            }
        }
        stamped = done(&a);
        if read {
            let (ca, cb) = (a.cq.drain(), b.cq.drain());

            assert_eq!(ca, cb, "completions of round {round}");
            for s in [&a, &b] {
                s.cq.update_ci();
            }
        } else {
            stalled_rounds += 1;
        }
        assert_eq!(
            seen(&a.hca.counters()),
            seen(&b.hca.counters()),
            "counters after round {round}"
        );
        for s in [&a, &b] {
            assert_eq!(
                s.hca.sq_state(s.sq.info.qpn).unwrap(),
                QueueState::Ready,
                "round {round}: {:?}",
                s.hca.counters()
            );
        }
    }
    for s in [&a, &b] {
        s.hca.set_port_up(true);
    }
    let c = a.hca.counters();
    assert!(
        c.cq_full_stalls > 10 && stalled_rounds > 100,
        "completions stalled ({} stalls)",
        c.cq_full_stalls
    );
    assert!(
        c.tx_drops_wire > 0 && down_rounds > 100,
        "frames met a dead link"
    );
    assert!(
        c.tx_size_65_to_127 > 1_000 && c.tx_size_128_to_255 > 1_000,
        "both shapes ran: {c:?}"
    );
}
