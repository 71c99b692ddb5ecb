//! The shape cache (a WQE whose control segment and headers match the last fully decoded one is
//! executed from those few words) changes no result. The same stream of WQEs, many alike and
//! some subtly different, runs on a null wire and on a sink wire, where the device uses the
//! cache (on the sink, a WQE of an all-inline shape is put on the wire from the places the
//! shape remembers), and on a sink wire with the cache off, where every WQE is decoded in
//! full; completions, counters and the frames on the wire must agree, whether a doorbell or a
//! BlueFlame copy of each round's last WQE announced the round.

mod common;

use common::*;
use mlx4_hca::{Counters, Hca, QueueState};

struct Side {
    hca: Hca,
    cq: TestCq,
    sq: TestSq,
    lkey: u32,
    /// The frames a sink wire took.
    frames: Option<Frames>,
}

const TXBBS: u32 = 256;

impl Side {
    fn new(null: bool, cache: bool, pkts: &Mem) -> Side {
        let hca = Hca::open(step_cfg()).unwrap();
        hca.set_shape_cache(cache);
        let frames = (!null).then(|| sink(&hca));
        let cq = TestCq::new(&hca, 256);
        let sq = TestSq::new(&hca, TXBBS, cq.cqn);
        // SAFETY: `pkts` outlives both adapters in the test.
        let lkey = unsafe { hca.reg_mr(pkts.ptr(), pkts.len()) }.unwrap();
        Side {
            hca,
            cq,
            sq,
            lkey,
            frames,
        }
    }

    fn recreate(&mut self) {
        self.hca.destroy_sq(self.sq.info.qpn).unwrap();
        let ring = std::mem::replace(&mut self.sq.ring, Mem::new(64));
        ring.fill(0);
        self.sq = TestSq::on(&self.hca, ring, TXBBS, self.cq.cqn);
    }
}

/// What both sides must agree on.
fn seen(c: &Counters) -> [u64; 10] {
    [
        c.wqe_fetched,
        c.wqe_from_bf,
        c.tx_frames,
        c.tx_bytes,
        c.dma_read_bytes,
        c.error_cqes,
        c.cqes,
        c.txbbs,
        c.wqe_stamp_seen,
        c.tx_drops_wire,
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

/// A WQE tail (bytes 4.. of the WQE) of one of a few shapes, then perhaps mutated.
fn wqe(rng: &mut Rng, base: u64, lkey: u32, shape: u64) -> (u8, Vec<u8>) {
    let srcrb = if rng.below(8) == 0 {
        SIGNALED
    } else {
        UNSIGNALED
    };
    let payload =
        |rng: &mut Rng, n: usize| -> Vec<u8> { (0..n).map(|_| rng.next() as u8).collect() };
    let (op, mut t) = match shape {
        // 64-byte frame inline, split at the 64-byte boundary (DS 6).
        0 => {
            let mut t = ctrl_tail(6, srcrb);
            t.extend(inline_hdr(44));
            t.extend(payload(rng, 44));
            t.extend(inline_hdr(20));
            t.extend(payload(rng, 20));
            t.resize(92, 0);
            (SEND, t)
        }
        // 40-byte frame inline in one TXBB (DS 4).
        1 => {
            let mut t = ctrl_tail(4, srcrb);
            t.extend(inline_hdr(40));
            t.extend(payload(rng, 40));
            t.resize(60, 0);
            (SEND, t)
        }
        // One gather entry anywhere in the first 3 KiB (DS 2).
        2 => {
            let mut t = ctrl_tail(2, srcrb);
            t.extend(dseg(
                60 + rng.below(40) as u32,
                lkey,
                base + rng.below(3072),
            ));
            (SEND, t)
        }
        // Inline header then two gather entries (DS 5, 2 TXBBs).
        3 => {
            let mut t = ctrl_tail(5, srcrb);
            t.extend(inline_hdr(12));
            t.extend(payload(rng, 12));
            t.extend(dseg(100, lkey, base + 64 * rng.below(32)));
            t.extend(dseg(100, lkey, base + 64 * rng.below(32)));
            t.resize(76, 0);
            (SEND, t)
        }
        _ => (NOP, ctrl_tail(1, srcrb)),
    };
    // Now and then, a change the cache must notice (offsets are into the tail: byte i of the
    // WQE is t[i - 4]).
    match rng.below(40) {
        0 => t[3] = t[3].wrapping_add(1),                   // DS
        1 => t[2] = 0x40,                                   // VLAN insert
        2 => t[2] = 0x33,                                   // bad ins_vlan
        3 if t.len() > 16 => t[15] ^= 1,                    // first header's length
        4 if t.len() > 16 => t[12] ^= 0x80,                 // inline flag
        5 if t.len() > 64 => t[63] = t[63].wrapping_add(3), // header at the second TXBB
        6 if t.len() > 64 => t[60..64].copy_from_slice(&[0x7f, 0xff, 0xff, 0xff]), // a stamp
        7 if shape == 2 => t[24..28].copy_from_slice(&[0, 0, 0x7f, 0]), // address past the region
        8 if shape == 2 => t[16..20].copy_from_slice(&0x1234u32.to_be_bytes()), // another lkey
        9 => t[7] ^= 0x10,                                  // IP checksum flag
        _ => {}
    }
    (op, t)
}

#[test]
fn cached_shapes_execute_exactly_like_full_decodes() {
    let c = run_stream(false);
    assert_eq!(c.wqe_from_bf, 0);
}

/// The BlueFlame-announced WQE (whose bytes 4-6 are the QPN, and whose copy's `srcrb_flags`
/// rule) runs from the cache too, with the same results as a full decode.
#[test]
fn cached_shapes_execute_blueflame_bursts_exactly_like_full_decodes() {
    let c = run_stream(true);
    assert!(
        c.wqe_from_bf > 1_000 && c.bf_torn == 0,
        "BlueFlame copies were taken: {c:?}"
    );
}

/// Run the same random stream through the three sides: rounds announced by a doorbell, or
/// with `bf` by a BlueFlame copy of their last WQE (every third asking for a completion its
/// ring copy does not). Returns the cached null side's counters.
fn run_stream(bf: bool) -> Counters {
    let pkts = Mem::new(1 << 16);
    // The null wire and the sink with the cache, and the sink decoding every WQE in full.
    let mut sides = [
        Side::new(true, true, &pkts),
        Side::new(false, true, &pkts),
        Side::new(false, false, &pkts),
    ];
    let lkey = sides[0].lkey;
    assert!(sides.iter().all(|s| s.lkey == lkey));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut shape = 0;
    let mut errors = 0;
    let mut frames = 0;
    for round in 0..3000 {
        if rng.below(20) == 0 {
            shape = rng.below(5);
        }
        if round == 1500 {
            // New regions (and a deregistration) must make the device re-check gather entries.
            for s in &mut sides {
                s.hca.dereg_mr(s.lkey).unwrap();
                // SAFETY: as in `Side::new`.
                s.lkey = unsafe { s.hca.reg_mr(pkts.ptr(), 4096) }.unwrap();
            }
            assert!(sides.iter().all(|s| s.lkey == sides[0].lkey));
        }
        // Each round runs everything it posts (or stops at an error, after which the queue is
        // recreated), so a round has the whole ring.
        let n = 1 + rng.below(24);
        let room = TXBBS;
        let mut posted = 0;
        let mut last = None;
        for _ in 0..n {
            let (op, t) = wqe(&mut rng, pkts.addr(), sides[0].lkey, shape);
            let txbbs = (u32::from(t[3] & 0x3f) * 16).div_ceil(64).max(1);
            if posted + txbbs + 16 > room {
                break;
            }
            posted += txbbs;
            for s in &mut sides {
                last = Some(s.sq.write(op, &t));
            }
        }
        let signal_copy = rng.below(3) == 0;
        for s in &mut sides {
            match last {
                Some(c) if bf => {
                    let mut copy = s.sq.wqe_bytes(c);
                    if signal_copy {
                        copy[11] |= SIGNALED;
                    }
                    s.sq.bf_copy(c, copy);
                }
                _ => s.sq.doorbell(),
            }
            s.hca.step();
        }
        let cqes: Vec<_> = sides.iter_mut().map(|s| s.cq.drain()).collect();
        assert_eq!(cqes[0], cqes[2], "completions of round {round}, null wire");
        assert_eq!(cqes[1], cqes[2], "completions of round {round}, sink");
        let seen: Vec<_> = sides.iter().map(|s| seen(&s.hca.counters())).collect();
        assert_eq!(seen[0], seen[2], "counters after round {round}, null wire");
        assert_eq!(seen[1], seen[2], "counters after round {round}, sink");
        let [cached, full] = [&sides[1], &sides[2]]
            .map(|s| std::mem::take(&mut *s.frames.as_ref().expect("a sink").lock()));
        assert_eq!(cached, full, "frames of round {round}");
        frames += full.len();
        for s in &mut sides {
            s.cq.update_ci();
        }
        let state = sides[0].hca.sq_state(sides[0].sq.info.qpn).unwrap();
        for s in &sides {
            assert_eq!(state, s.hca.sq_state(s.sq.info.qpn).unwrap());
        }
        if state == QueueState::Error {
            errors += 1;
            for s in &mut sides {
                s.recreate();
            }
        }
    }
    assert!(frames > 5_000, "frames compared ({frames})");
    let a = &sides[0];
    let c = a.hca.counters();
    assert!(errors > 20, "the stream exercised error paths ({errors})");
    assert!(
        c.tx_frames > 5_000,
        "and plenty of good frames ({})",
        c.tx_frames
    );
    c
}

/// WQEs of the remembered shape whose frames are all inline go from the WQE straight into a
/// looped port's receive buffer (a plain shape) or through the assembly (a VLAN tag to insert,
/// checksums asked for): every frame arrives in its RX buffer as it was sent, byte for byte,
/// while the shapes change with the frame's length and flags and the payloads differ.
#[test]
fn recalled_inline_frames_arrive_on_a_looped_port_as_sent() {
    const RX: u32 = 64;
    const BUF: u32 = 2048;
    let (hca, mut txcq, mut sq) = sq_rig(step_cfg(), TXBBS, 256);
    hca.set_wire(mlx4_hca::Wire::Loop).unwrap();
    let mut rxcq = TestCq::new(&hca, 256);
    let mut rq = TestRq::new(&hca, RX, 1, rxcq.cqn);
    let bufs = Pkts::new(&hca, (RX * BUF) as usize);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let (mut frames, mut tagged) = (0, 0);
    for round in 0..1500 {
        // Every WQE takes two TXBBs, so that the slot after the last posted one always starts
        // a WQE of the ring's last pass, which the device sees as not posted (the test does
        // not stamp the TXBBs it gets back, as a driver would).
        let len = [48usize, 60, 64, 80, 104][rng.below(5) as usize];
        // Mostly plain; now and then a VLAN tag to insert, or checksums asked for (the frames
        // are not IP, so the assembly leaves them as they are).
        let kind = rng.below(8);
        let n = 1 + rng.below(24);
        let mut sent = Vec::new();
        for _ in 0..n {
            let mut f: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
            let srcrb = if kind == 1 {
                UNSIGNALED | IP_CSUM | L4_CSUM
            } else {
                UNSIGNALED
            };
            let mut t = inline_wqe(&f, srcrb);
            if kind == 0 {
                let tci = 0x0123u16;
                t[..3].copy_from_slice(&[(tci >> 8) as u8, tci as u8, 0x40]);
                f.splice(12..12, [0x81, 0x00, (tci >> 8) as u8, tci as u8]);
                tagged += 1;
            }
            rq.post(&[(
                BUF,
                bufs.lkey,
                bufs.mem.addr() + u64::from(rq.prod % RX * BUF),
            )]);
            sq.write(SEND, &t);
            sent.push(f);
        }
        sq.doorbell();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut got = Vec::new();
        while got.len() < sent.len() {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: frames missing"
            );
            hca.step();
            got.extend(rxcq.drain());
            rxcq.update_ci();
        }
        let tx = txcq.drain();
        assert!(tx.is_empty(), "round {round}: unsignaled sends: {tx:02x?}");
        for (cqe, f) in got.iter().zip(&sent) {
            let op = cqe[31] & mlx4_prm::cqe_owner::OPCODE_MASK;
            assert_eq!(
                op,
                mlx4_prm::cqe_opcode::RX_SEND,
                "round {round}: a receive completion"
            );
            assert_eq!(be32(cqe, 20) as usize, f.len(), "round {round}: byte count");
            let slot = u32::from(be16(cqe, 24)) % RX;
            let at = (slot * BUF) as usize;
            assert_eq!(&bufs.mem.get(at, f.len()), f, "round {round}: frame bytes");
            frames += 1;
        }
    }
    assert!(
        frames > 10_000 && tagged > 1_000,
        "{frames} frames, {tagged} tagged"
    );
}
