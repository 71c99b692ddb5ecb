//! Doorbell avoidance (`DbAvoid`, devarg `tx_db_avoid`) against the software HCA in step
//! mode: a burst that finds the last doorbell outstanding publishes its WQEs without ringing;
//! each of the later callers (a burst past the bounds, `tx_burst` with no packets, i.e.
//! `kick`, `tx_done_cleanup`, the drain at stop) rings for them; the packet and TSC bounds
//! fire; and random traffic reaches the wire byte for byte, each buffer freed once, the
//! counters conserved.
//!
//! "Outstanding" needs a completion that has not arrived. In step mode the device runs only
//! in `step`, and the completion of a rung burst is seen by the next call, so the tests that
//! need the device idle with a doorbell still outstanding make it lose every completion
//! (`cqe_drop_every: 1`): the device has run everything it was told about, the driver cannot
//! know, and WQEs published since wait for a doorbell.

mod traffic;

use mlx4rs::hca::Faults;
use mlx4rs::txq::{DbAvoid, TxPath, TxQueue};
use mlx4rs::wqe::TxOffloads;
use traffic::*;

/// Bounds that never fire within a test, unless the test lowers one.
const LOOSE: DbAvoid = DbAvoid {
    packets: 1 << 20,
    cycles: u64::MAX / 4,
};

struct Setup {
    r: Rig,
    q: TxQueue<Pkt>,
    pkts: Vec<Pkt>,
    frames: Vec<Vec<u8>>,
    next: usize,
}

/// A queue with avoidance `avoid`, the device losing every completion, and `n` plain
/// 60-byte packets (inline: the doorbell path's and BlueFlame's straight-line case).
fn setup(path: TxPath, avoid: DbAvoid, n: usize) -> Setup {
    FREED.with(|f| f.borrow_mut().clear());
    let mut r = rig(true);
    r.hca.set_faults(Faults {
        cqe_drop_every: 1,
        ..Faults::default()
    });
    let mut q: TxQueue<Pkt> =
        // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
        unsafe { TxQueue::new(&r.dev, "tx_db_avoid", 0, 256, tx_config(path, 104), &[r.mr]) }.unwrap();
    assert_eq!(q.path(), path);
    q.set_db_avoid(Some(avoid));
    let mut rng = Rng(7 + n as u64);
    let cases: Vec<Case> = (0..n)
        .map(|_| Case {
            bytes: (0..60).map(|_| rng.next() as u8).collect(),
            cuts: Vec::new(),
            off: TxOffloads::default(),
        })
        .collect();
    let mut arena = std::mem::take(&mut r.arena);
    let mut segtab = Vec::new();
    let pkts = build(&mut arena, &cases, &mut segtab, 0);
    // The segment tables must outlive the packets: leak them with the test.
    std::mem::forget(segtab);
    r.arena = arena;
    let frames = cases.into_iter().map(|c| c.bytes).collect();
    Setup {
        r,
        q,
        pkts,
        frames,
        next: 0,
    }
}

impl Setup {
    /// The next packet as a burst of one; it must be taken.
    fn send_one(&mut self) {
        let i = self.next;
        // SAFETY: test buffers; their release only records it.
        assert_eq!(unsafe { self.q.burst(&self.pkts[i..i + 1]) }, 1);
        self.next += 1;
    }

    /// Frames on the wire after the device ran everything it was told about.
    fn on_wire(&self) -> usize {
        self.r.hca.step();
        self.r.wire.lock().unwrap().len()
    }

    /// Rings (doorbells and BlueFlame copies) and skips so far.
    fn rings(&self) -> (u64, u64) {
        let st = self.q.stats();
        (st.doorbells + st.bf_writes, st.doorbells_avoided)
    }

    /// The wire holds exactly the packets sent, in order; each buffer is freed once when
    /// the queue goes.
    fn finish(self) {
        let Setup {
            r, q, frames, next, ..
        } = self;
        r.hca.step();
        let st = q.stats();
        q.destroy(&r.dev);
        let wire = r.wire.lock().unwrap().clone();
        assert_eq!(wire.len(), next, "{st:?}");
        assert!(
            wire.iter().zip(&frames).all(|(w, f)| w == f),
            "frames differ"
        );
        assert_eq!(st.packets, next as u64);
        assert_eq!(r.hca.counters().tx_frames, next as u64);
        FREED.with(|f| {
            let f = f.borrow();
            assert_eq!(f.len(), next, "every buffer freed");
            assert!(f.values().all(|&c| c == 1), "no buffer freed twice");
        });
    }
}

/// The first burst rings; the second finds that doorbell outstanding and skips; the device,
/// idle, does not send it until `later` rings (once, unless `once` is false: the drain also
/// asks for a completion and rings again while none comes).
fn skipped_then(path: TxPath, once: bool, later: impl FnOnce(&mut Setup)) {
    let mut s = setup(path, LOOSE, 2);
    s.send_one();
    assert_eq!(s.rings(), (1, 0));
    assert_eq!(s.on_wire(), 1);
    s.send_one();
    assert_eq!(s.rings(), (1, 1), "the second burst skips its doorbell");
    assert_eq!(s.q.unrung(), 1);
    assert_eq!(s.on_wire(), 1, "nothing announced the second WQE");
    later(&mut s);
    assert_eq!(s.q.unrung(), 0);
    let rings = s.rings().0;
    assert!(
        rings == 2 || !once && rings > 2,
        "the later caller rang: {rings}"
    );
    assert_eq!(s.on_wire(), 2);
    s.finish();
}

#[test]
fn tx_burst_without_packets_rings_for_a_skipped_doorbell() {
    for path in [TxPath::Doorbell, TxPath::BlueFlame] {
        // What `tx_burst` with no packets calls.
        skipped_then(path, true, |s| assert!(s.q.kick()));
    }
}

#[test]
fn tx_done_cleanup_rings_for_a_skipped_doorbell() {
    for path in [TxPath::Doorbell, TxPath::BlueFlame] {
        skipped_then(path, true, |s| {
            s.q.done_cleanup(0);
        });
    }
}

#[test]
fn the_drain_at_stop_rings_for_a_skipped_doorbell() {
    for path in [TxPath::Doorbell, TxPath::BlueFlame] {
        skipped_then(path, false, |s| {
            // Every completion is lost, so the drain cannot see the end: it gives up after
            // its limit, having rung.
            let _ = s.q.drain(&s.r.dev, std::time::Duration::from_millis(5));
        });
    }
}

#[test]
fn the_packet_bound_fires() {
    for path in [TxPath::Doorbell, TxPath::BlueFlame] {
        let bound = 3;
        let mut s = setup(
            path,
            DbAvoid {
                packets: bound,
                ..LOOSE
            },
            1 + 2 * (bound as usize + 1),
        );
        s.send_one();
        for round in 1..=2u64 {
            for _ in 0..bound {
                s.send_one();
            }
            assert_eq!(s.rings(), (round, u64::from(bound) * round));
            assert_eq!(s.q.unrung(), bound);
            // One packet more than the bound: this burst rings for all of them.
            s.send_one();
            assert_eq!(s.rings(), (round + 1, u64::from(bound) * round));
            assert_eq!(s.q.unrung(), 0);
            assert_eq!(s.on_wire(), s.next);
        }
        s.finish();
    }
}

#[test]
fn the_tsc_deadline_fires() {
    for path in [TxPath::Doorbell, TxPath::BlueFlame] {
        // A deadline already past when the next call looks: the second skip never happens.
        let mut s = setup(path, DbAvoid { cycles: 0, ..LOOSE }, 4);
        s.send_one();
        s.send_one();
        assert_eq!(s.rings(), (1, 1));
        s.send_one();
        assert_eq!(
            s.rings(),
            (2, 1),
            "the deadline passed: the third burst rings"
        );
        assert_eq!(s.on_wire(), 3);
        s.send_one();
        assert_eq!(s.rings(), (2, 2), "a new stretch of skips starts");
        assert!(s.q.kick());
        s.finish();
        // A deadline of 200 us: skips until the TSC passes it, waited for with a limit.
        let cycles = mlx4rs::mmio::tsc_hz() / 5000;
        let mut s = setup(path, DbAvoid { cycles, ..LOOSE }, 64);
        s.send_one();
        let start = std::time::Instant::now();
        let mut skipped = 0;
        while s.rings().0 == 1 {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(5),
                "the deadline never fired: {:?}",
                s.q.stats()
            );
            assert!(s.next < s.pkts.len(), "{:?}", s.q.stats());
            s.send_one();
            skipped += 1;
            if s.rings().0 == 1 {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
        assert!(skipped >= 2, "skips until the deadline: {skipped}");
        assert_eq!(s.rings().1, skipped - 1);
        assert_eq!(s.on_wire(), s.next);
        s.finish();
    }
}

#[test]
fn off_by_default_and_off_rings_for_what_waits() {
    let mut s = setup(TxPath::Doorbell, LOOSE, 4);
    s.send_one();
    s.send_one();
    assert_eq!(s.rings(), (1, 1));
    s.q.set_db_avoid(None);
    assert_eq!(s.q.db_avoid(), None);
    assert_eq!(s.rings(), (2, 1), "turning it off rang");
    s.send_one();
    s.send_one();
    assert_eq!(s.rings(), (4, 1), "a doorbell per burst");
    assert_eq!(s.on_wire(), 4);
    s.finish();
    let r = rig(true);
    // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
    let q: TxQueue<Pkt> = unsafe {
        TxQueue::new(
            &r.dev,
            "tx_db_avoid",
            0,
            256,
            tx_config(TxPath::Doorbell, 104),
            &[r.mr],
        )
    }
    .unwrap();
    assert_eq!(q.db_avoid(), None);
    q.destroy(&r.dev);
}

/// Random traffic (sizes, segments, offloads, bursts of 1 to 8) with avoidance on, the
/// device stepped after a random number of calls, completions lost now and then: every
/// packet on the wire in order, every buffer freed once, every burst that posted either rang
/// or counted its skip, and the skips happened.
fn random_traffic(path: TxPath, cqe_drop_every: u32, seed: u64) {
    FREED.with(|f| f.borrow_mut().clear());
    let mut r = rig(true);
    r.hca.set_faults(Faults {
        cqe_drop_every,
        ..Faults::default()
    });
    let mut q: TxQueue<Pkt> =
        // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
        unsafe { TxQueue::new(&r.dev, "tx_db_avoid", 0, 256, tx_config(path, 104), &[r.mr]) }.unwrap();
    q.set_db_avoid(Some(DbAvoid {
        packets: 16,
        ..LOOSE
    }));
    let mut rng = Rng(seed);
    let mut expected = Vec::new();
    let mut keep = Vec::new();
    let (mut next_id, mut at, mut posting_bursts, mut kicks_rang) = (0u32, 0usize, 0u64, 0u64);
    let mut refused = 0;
    for _ in 0..400 {
        let n = 1 + rng.below(24) as usize;
        let cases: Vec<Case> = (0..n).map(|_| random_case(&mut rng)).collect();
        let mut arena = std::mem::take(&mut r.arena);
        if at + (2 << 20) > arena.len() {
            // Reusing arena memory: everything posted must have been sent.
            if q.kick() {
                kicks_rang += 1;
            }
            r.hca.step();
            at = 0;
            keep.clear();
        }
        let mut segtab = Vec::new();
        let pkts = build_at(&mut arena, &mut at, &cases, &mut segtab, next_id);
        keep.push(segtab);
        r.arena = arena;
        next_id += n as u32;
        let mut done = 0;
        while done < n {
            let end = (done + 1 + rng.below(8) as usize).min(n);
            // SAFETY: test buffers; their release only records it.
            let taken = unsafe { q.burst(&pkts[done..end]) };
            posting_bursts += u64::from(taken > 0);
            for c in &cases[done..done + taken] {
                expected.push(expected_wire(&c.bytes, c.off));
            }
            done += taken;
            refused = if taken == 0 { refused + 1 } else { 0 };
            assert!(
                refused < 80,
                "stuck: {:?} {:?}",
                q.stats(),
                r.hca.counters()
            );
            if taken == 0 || rng.below(3) == 0 {
                r.hca.step();
            }
            // Now and then the application goes quiet and polls with no packets.
            if rng.below(20) == 0 && q.kick() {
                kicks_rang += 1;
            }
        }
    }
    let drained = q.drain(&r.dev, std::time::Duration::from_millis(50));
    assert!(drained || cqe_drop_every > 0, "{:?}", q.stats());
    r.hca.step();
    let st = q.stats();
    q.destroy(&r.dev);
    let wire = r.wire.lock().unwrap().clone();
    assert_eq!(wire.len(), expected.len(), "frames on the wire: {st:?}");
    assert!(
        wire.iter().zip(&expected).all(|(w, e)| w == e),
        "a frame differs"
    );
    FREED.with(|f| {
        let f = f.borrow();
        assert_eq!(f.len() as u32, next_id, "every buffer freed");
        assert!(f.values().all(|&c| c == 1), "no buffer freed twice");
    });
    assert_eq!(st.errors, 0);
    assert_eq!(st.packets, u64::from(next_id));
    assert_eq!(r.hca.counters().tx_frames, st.packets);
    assert!(st.doorbells_avoided > 0, "no skip: {st:?}");
    // A burst that posted rang (doorbell or BlueFlame) or skipped; the other doorbells are
    // the later callers' (kick, drain, rerings), which never ring for nothing.
    let burst_rings = st.doorbells + st.bf_writes - kicks_rang - st.doorbell_rerings;
    assert!(
        burst_rings + st.doorbells_avoided >= posting_bursts
            && st.doorbells_avoided <= posting_bursts,
        "{posting_bursts} bursts, {kicks_rang} kicks rang: {st:?}"
    );
    assert!(
        burst_rings < posting_bursts,
        "fewer doorbells than bursts: {st:?}"
    );
}

#[test]
fn random_traffic_reaches_the_wire_doorbell() {
    random_traffic(TxPath::Doorbell, 0, 11);
    random_traffic(TxPath::Doorbell, 7, 12);
}

#[test]
fn random_traffic_reaches_the_wire_blueflame() {
    random_traffic(TxPath::BlueFlame, 0, 21);
    random_traffic(TxPath::BlueFlame, 7, 22);
}
