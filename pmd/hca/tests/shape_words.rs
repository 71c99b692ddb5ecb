//! Runs of inline WQEs of three, four and five inline segments (the shapes whose headers a
//! run compares as a fixed set of words, and the first one it compares head by head) execute
//! on a null wire, from the shape cache, exactly as a sink wire's full decodes of the same
//! stream: the same completions and counters, altered headers and stamps included.

mod common;

use common::*;
use mlx4_hca::{Counters, Hca, QueueState};

const TXBBS: u32 = 256;

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
        let cq = TestCq::new(&hca, 256);
        let sq = TestSq::new(&hca, TXBBS, cq.cqn);
        Side { hca, cq, sq }
    }

    fn recreate(&mut self) {
        self.hca.destroy_sq(self.sq.info.qpn).unwrap();
        let ring = std::mem::replace(&mut self.sq.ring, Mem::new(64));
        ring.fill(0);
        self.sq = TestSq::on(&self.hca, ring, TXBBS, self.cq.cqn);
    }
}

fn seen(c: &Counters) -> [u64; 8] {
    [
        c.wqe_fetched,
        c.tx_frames,
        c.tx_bytes,
        c.error_cqes,
        c.cqes,
        c.txbbs,
        c.wqe_stamp_seen,
        c.tx_drops_wire,
    ]
}

/// A send of `segs` inline segments, each ending at a 64-byte boundary but the last (of
/// `last` bytes), then perhaps altered as `rng` picks. Returns the tail (bytes 4.. of the WQE).
fn wqe(segs: usize, last: usize, signaled: bool, alter: u64) -> Vec<u8> {
    let mut body = Vec::new();
    let mut at = 16;
    let mut byte = 0u8;
    for i in 0..segs {
        let len = if i + 1 == segs {
            last
        } else {
            64 - at % 64 - 4
        };
        body.extend(inline_hdr(len));
        body.extend((0..len).map(|_| {
            byte = byte.wrapping_add(7);
            byte
        }));
        at += 4 + len;
    }
    let ds = at.div_ceil(16) as u8;
    let mut t = ctrl_tail(ds, if signaled { SIGNALED } else { UNSIGNALED });
    t.extend(body);
    t.resize(usize::from(ds) * 16 - 4, 0);
    // Offsets into the tail: byte i of the WQE is t[i - 4].
    let n = t.len();
    match alter {
        0 => t[3] = t[3].wrapping_add(1),             // DS
        1 => t[15] ^= 1,                              // first header's length
        2 if n > 64 => t[63] = t[63].wrapping_add(3), // the header at the second TXBB
        3 if n > 128 => t[127] ^= 0x10,               // the header at the third TXBB
        4 if n > 192 => t[188] ^= 0x80,               // the fourth header's inline flag
        5 if n > 128 => t[124..128].copy_from_slice(&[0x7f, 0xff, 0xff, 0xff]), // a stamp
        6 => t[7] ^= 0x10,                            // IP checksum flag
        _ => {}
    }
    t
}

#[test]
fn runs_of_three_to_five_inline_segments_execute_like_full_decodes() {
    let mut a = Side::new(true);
    let mut b = Side::new(false);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut below = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let (mut errors, mut frames) = (0, 0);
    for round in 0..1500 {
        let segs = 3 + (round / 100) % 3;
        let last = 1 + below(40) as usize;
        let mut posted = 0;
        for _ in 0..1 + below(16) {
            let t = wqe(segs, last, below(8) == 0, below(60));
            let txbbs = (u32::from(t[3] & 0x3f) * 16).div_ceil(64).max(1);
            if posted + txbbs + 16 > TXBBS {
                break;
            }
            posted += txbbs;
            a.sq.write(SEND, &t);
            b.sq.write(SEND, &t);
        }
        for s in [&mut a, &mut b] {
            s.sq.doorbell();
            s.hca.step();
        }
        assert_eq!(a.cq.drain(), b.cq.drain(), "completions of round {round}");
        let (ca, cb) = (a.hca.counters(), b.hca.counters());
        assert_eq!(seen(&ca), seen(&cb), "counters after round {round}");
        frames = ca.tx_frames;
        for s in [&mut a, &mut b] {
            s.cq.update_ci();
        }
        let state = a.hca.sq_state(a.sq.info.qpn).unwrap();
        assert_eq!(state, b.hca.sq_state(b.sq.info.qpn).unwrap());
        if state == QueueState::Error {
            errors += 1;
            a.recreate();
            b.recreate();
        }
    }
    assert!(errors > 10, "the stream exercised error paths ({errors})");
    assert!(frames > 5_000, "and plenty of good frames ({frames})");
}
