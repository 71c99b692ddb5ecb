//! A run of alike all-inline WQEs on a wire into a receive buffer (here the loop) goes from the
//! ring into the buffer's records in one batch, not WQE by WQE, and is received in stretches.
//! The same stream on an adapter that decodes every WQE in full and receives every frame the
//! general way must give the same frames and counters: the bytes each RX
//! buffer gets, the MAC's broadcast, multicast and size counts on both sides, the filter's
//! drops, and the frames a receive buffer too small for a round refuses.

mod common;

use common::*;
use mlx4_hca::{Counters, Hca};

const TXBBS: u32 = 256;
const RX: u32 = 64;
const BUF: u32 = 256;
/// Records the receive buffer holds: fewer than a long round sends.
const INBOX: u32 = 24;
const OURS: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];

struct Side {
    hca: Hca,
    txcq: TestCq,
    sq: TestSq,
    rxcq: TestCq,
    rq: TestRq,
    bufs: Pkts,
}

impl Side {
    fn new(cache: bool) -> Side {
        let cfg = mlx4_hca::HcaConfig {
            rx_inbox_frames: INBOX,
            ..step_cfg()
        };
        let (hca, txcq, sq) = sq_rig(cfg, TXBBS, 256);
        hca.set_shape_cache(cache);
        // The reference receives every frame the general way too.
        hca.set_rx_stretches(cache);
        hca.set_wire(mlx4_hca::Wire::Loop).unwrap();
        // Unicast to another address is filtered; broadcast and every multicast pass.
        hca.set_rx_filter(OURS, false, true);
        let rxcq = TestCq::new(&hca, 256);
        let rq = TestRq::new(&hca, RX, 1, rxcq.cqn);
        let bufs = Pkts::new(&hca, (RX * BUF) as usize);
        Side {
            hca,
            txcq,
            sq,
            rxcq,
            rq,
            bufs,
        }
    }

    /// Steps until every frame sent is received or counted as dropped; the received ones'
    /// bytes, in order.
    fn settle(&mut self, round: u32) -> Vec<Vec<u8>> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut got = Vec::new();
        loop {
            self.hca.step();
            for cqe in self.rxcq.drain() {
                let slot = u32::from(be16(&cqe, 24)) % RX;
                let len = be32(&cqe, 20) as usize;
                got.push(self.bufs.mem.get((slot * BUF) as usize, len));
            }
            self.rxcq.update_ci();
            self.txcq.drain();
            self.txcq.update_ci();
            let c = self.hca.counters();
            let outcomes = c.rx_frames
                + c.rx_drops_no_wqe
                + c.rx_drops_wire
                + c.rx_drops_filter
                + c.rx_drops_too_long;
            if outcomes == c.tx_frames {
                return got;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: frames unaccounted for: {c:?}"
            );
        }
    }

    /// Stamps the TXBBs from `from` to the producer, as a driver does once they complete: a
    /// WQE of one TXBB must not find the second half of an old one of two posted after it.
    fn stamp_from(&self, from: u32) {
        for c in from..self.sq.prod {
            self.sq.write_at(c, 0x7fff_ffff | self.sq.owner(c), &[]);
        }
    }
}

/// What both sides must agree on.
fn seen(c: &Counters) -> Vec<u64> {
    vec![
        c.wqe_fetched,
        c.tx_frames,
        c.tx_bytes,
        c.tx_drops_wire,
        c.tx_broadcast,
        c.tx_multicast,
        c.tx_size_64,
        c.tx_size_65_to_127,
        c.rx_frames,
        c.rx_bytes,
        c.rx_drops_no_wqe,
        c.rx_drops_wire,
        c.rx_drops_filter,
        c.rx_broadcast,
        c.rx_multicast,
        c.rx_size_64,
        c.rx_size_65_to_127,
        c.cqes,
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

#[test]
fn runs_into_a_receive_buffer_agree_with_full_decodes() {
    let mut sides = [Side::new(true), Side::new(false)];
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut received = 0;
    for round in 0..600 {
        // One length a round, so that the round is a run of one shape: two inline chunks
        // (45 to 104 bytes), or one (a runt of one TXBB, or a frame of under 8 bytes).
        let len = [60usize, 64, 80, 104, 45, 40, 7][rng.below(7) as usize];
        let n = 1 + rng.below(40) as u32;
        // RX buffers for some of the frames only, and never more than the queue holds.
        let rx_bufs = rng.below(u64::from(n) + 1).min(u64::from(RX) - 1) as u32;
        let frames: Vec<Vec<u8>> = (0..n)
            .map(|_| {
                let mut f: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                let dst: [u8; 6] = match rng.below(4) {
                    0 => [0xff; 6],
                    1 => [0x01, 0x00, 0x5e, 0, 0, rng.next() as u8],
                    2 => OURS,
                    _ => [0x02, 0, 0, 0, 0, 0x99],
                };
                let k = len.min(6);
                f[..k].copy_from_slice(&dst[..k]);
                f
            })
            .collect();
        let mut got = Vec::new();
        for s in &mut sides {
            let start = s.sq.prod;
            for _ in 0..rx_bufs {
                let at = s.bufs.mem.addr() + u64::from(s.rq.prod % RX * BUF);
                s.rq.post(&[(BUF, s.bufs.lkey, at)]);
            }
            for f in &frames {
                s.sq.write(SEND, &inline_wqe(f, UNSIGNALED));
            }
            s.sq.doorbell();
            got.push(s.settle(round));
            // RX WQEs that no frame used stay posted: drain them with frames of our own
            // address, so that every round starts with an empty RQ.
            loop {
                let c = s.hca.counters();
                if c.rx_frames >= u64::from(s.rq.prod) {
                    break;
                }
                let mut f = vec![0u8; 64];
                f[..6].copy_from_slice(&OURS);
                s.sq.write(SEND, &inline_wqe(&f, UNSIGNALED));
                s.sq.doorbell();
                s.settle(round);
            }
            s.stamp_from(start);
        }
        assert_eq!(got[0], got[1], "frames of round {round}");
        let [a, b] = [&sides[0], &sides[1]].map(|s| seen(&s.hca.counters()));
        assert_eq!(a, b, "counters after round {round}");
        received += got[0].len();
    }
    let c = sides[0].hca.counters();
    // The stream reached every outcome the batch has to count like a full decode.
    assert!(received > 2_000, "{received} frames received");
    assert!(c.tx_broadcast > 500 && c.tx_multicast > 500, "{c:?}");
    assert!(c.rx_drops_wire > 100, "the buffer refused frames: {c:?}");
    assert!(c.rx_drops_filter > 100 && c.rx_drops_no_wqe > 100, "{c:?}");
}
