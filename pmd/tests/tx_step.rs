//! The TX path against the software HCA in step mode, without EAL: random packets (sizes,
//! segment counts, offloads, burst sizes, many ring wraps) must reach the wire byte for byte,
//! in order, with every buffer freed exactly once, and the doorbell/BlueFlame choice per burst
//! must follow the rules; the same with the device losing or repeating send completions.

mod traffic;

use std::sync::atomic::Ordering;

use mlx4rs::devargs::BfMode;
use mlx4rs::hca::{Faults, Hca, HcaConfig};
use mlx4rs::hw::soft::Soft;
use mlx4rs::hw::{Device, QueueState};
use mlx4rs::mem::{DmaRange, MemSource};
use mlx4rs::mmio::Copy64;
use mlx4rs::txq::{TxPath, TxQueue};
use mlx4rs::wc;
use mlx4rs::wqe::{self, TxOffloads};
use traffic::*;

/// Rounds at the end of a run with `faults` that run without them, so that a completion the
/// device lost near the end is covered by a later one.
const CALM_ROUNDS: usize = 10;

fn run_random(path: TxPath, wc: bool, inline_max: u16, seed: u64, rounds: usize) {
    run_random_with(path, wc, inline_max, seed, rounds, Faults::default());
}

/// Random traffic as `run_random`, the device injecting `faults` in all rounds but the last
/// [`CALM_ROUNDS`].
fn run_random_with(
    path: TxPath,
    wc: bool,
    inline_max: u16,
    seed: u64,
    rounds: usize,
    faults: Faults,
) {
    FREED.with(|f| f.borrow_mut().clear());
    let mut r = rig(wc);
    r.hca.set_faults(faults);
    let mut rng = Rng(seed);
    let mut q: TxQueue<Pkt> =
        TxQueue::new(&r.dev, "tx_step", 0, 256, config(path, inline_max), &[r.mr]).unwrap();
    assert_eq!(q.path(), path);
    let mut expected = Vec::new();
    let mut segtab = Vec::new();
    let mut next_id = 0u32;
    let (mut bursts, mut bf_expected, mut db_expected) = (0u64, 0u64, 0u64);
    // Bursts of one plain packet the straight-line inline path takes: the queue's path for a
    // burst of one (`post_one`), which no counter tells apart.
    let mut single_straight = 0u64;
    let straight_max = usize::from(inline_max).min(wqe::PLAIN_INLINE_MAX);
    let half = (r.hca.caps().bf_reg_size / 2) as usize;
    let mut at = 0;
    // Segment tables of packets possibly still in flight.
    let mut keep: Vec<Vec<Vec<Seg>>> = Vec::new();
    // Calls in a row that took nothing, each after the device ran everything posted.
    let mut refused = 0;
    for round in 0..rounds {
        if round + CALM_ROUNDS == rounds && !faults.none() {
            r.hca.set_faults(Faults::default());
        }
        let n = 1 + rng.below(64) as usize;
        let cases: Vec<Case> = (0..n).map(|_| random_case(&mut rng)).collect();
        let mut arena = std::mem::take(&mut r.arena);
        if at + (2 << 20) > arena.len() {
            // Reusing arena memory: the device must have read everything posted so far.
            r.hca.step();
            q.complete();
            at = 0;
            keep.clear();
        }
        let pkts = build_at(&mut arena, &mut at, &cases, &mut segtab, next_id);
        keep.push(std::mem::take(&mut segtab));
        next_id += n as u32;
        let mut done = 0;
        // Now and then a round goes packet by packet, as a latency-bound application sends.
        let step = if rng.below(6) == 0 { 1 } else { n };
        while done < n {
            let end = (done + step).min(n);
            // SAFETY: test buffers; their release only records it.
            let taken = unsafe { q.burst(&pkts[done..end]) };
            if taken > 0 {
                bursts += 1;
                let c = &cases[done];
                if end - done == 1
                    && c.cuts.is_empty()
                    && c.off == TxOffloads::default()
                    && c.bytes.len() <= straight_max
                {
                    single_straight += 1;
                }
                let last = &cases[done + taken - 1];
                let eligible = last.off.vlan.is_none()
                    && wqe_bytes(last, inline_max).div_ceil(64) * 64 <= half;
                if path == TxPath::BlueFlame && eligible {
                    bf_expected += 1;
                } else {
                    db_expected += 1;
                }
            }
            for c in &cases[done..done + taken] {
                expected.push(expected_wire(&c.bytes, c.off));
            }
            done += taken;
            // A queue whose device has run everything has room again, unless its pairing of
            // completions to requests drifted.
            refused = if taken == 0 { refused + 1 } else { 0 };
            assert!(
                refused < 3,
                "stuck: the ring stays full though the device ran everything; {:?} {:?}",
                q.stats(),
                r.hca.counters()
            );
            // Let the device run, but often not at all, so that the ring fills.
            if taken == 0 || (end == n && rng.below(12) == 0) {
                r.hca.step();
            }
        }
        r.arena = arena;
    }
    r.hca.step();
    q.complete();
    let st = q.stats();
    q.destroy(&r.dev);
    let wire = r.wire.lock().unwrap().clone();
    if let Some(i) = wire.iter().zip(&expected).position(|(w, e)| w != e) {
        eprintln!(
            "first difference at frame {i}: wire {:?} expected {:?}; hca {:?}; stats {:?}",
            wire[i].len(),
            expected[i].len(),
            r.hca.counters(),
            st
        );
        let lens: Vec<usize> = expected[i.saturating_sub(3)..(i + 3).min(expected.len())]
            .iter()
            .map(|e| e.len())
            .collect();
        eprintln!("expected lens around: {lens:?}");
    }
    assert_eq!(wire.len(), expected.len(), "frames on the wire");
    for (i, (w, e)) in wire.iter().zip(&expected).enumerate() {
        assert!(
            w == e,
            "frame {i} differs: wire {} bytes, expected {} bytes",
            w.len(),
            e.len()
        );
    }
    FREED.with(|f| {
        let f = f.borrow();
        assert_eq!(f.len() as u32, next_id, "every buffer freed");
        assert!(f.values().all(|&c| c == 1), "no buffer freed twice");
    });
    assert_eq!(st.packets, u64::from(next_id));
    assert_eq!(st.errors, 0);
    assert_eq!(st.doorbells, db_expected, "one doorbell per non-BF burst");
    assert_eq!(st.bf_writes, bf_expected, "BF only for eligible last WQEs");
    assert_eq!(st.doorbells + st.bf_writes, bursts);
    let hc = r.hca.counters();
    // Doorbells (and BF writes to a half) that land before the device looks merge into one.
    assert!(hc.doorbells <= st.doorbells && (hc.doorbells > 0) == (st.doorbells > 0));
    assert!(hc.bf_bursts <= st.bf_writes && (hc.bf_bursts > 0) == (st.bf_writes > 0));
    assert_eq!(hc.tx_frames, st.packets);
    // Each completion lost was covered by a later one, each repeated one ignored.
    assert_eq!(
        st.cqe_mismatches,
        hc.inj_cqe_drops + hc.inj_cqe_dups,
        "{st:?} {hc:?}"
    );
    if !faults.none() {
        eprintln!(
            "{path:?} {faults}: {} packets, {} completions lost, {} repeated, {} mismatches, \
             {} ring full",
            st.packets, hc.inj_cqe_drops, hc.inj_cqe_dups, st.cqe_mismatches, st.ring_full
        );
    }
    assert_eq!(hc.inj_cqe_drops > 0, faults.cqe_drop_every > 0, "{hc:?}");
    assert_eq!(hc.inj_cqe_dups > 0, faults.cqe_dup_every > 0, "{hc:?}");
    if path == TxPath::BlueFlame && wc {
        assert_eq!(hc.bf_torn, 0, "step mode never tears a copy");
    }
    if inline_max == 0 {
        assert_eq!(st.inline_packets, 0);
    }
    assert_eq!(st.inline_packets + st.gather_packets, st.packets);
    assert!(
        st.ring_full > 0 || rounds < 50,
        "the ring filled at least once"
    );
    // Every path ran: the straight-line ones (plain packets: inline up to two TXBBs, gather
    // within the lkey cache's region) and the general one, for both WQE kinds.
    let straight_inline = st.inline_packets - st.general_inline;
    let straight_gather = st.gather_packets - st.general_gather;
    assert!(straight_gather > 0 && st.general_gather > 0, "{st:?}");
    if inline_max > 0 {
        assert!(straight_inline > 0 && st.general_inline > 0, "{st:?}");
        assert!(single_straight > 0, "no burst of one plain inline packet");
    }
}

#[test]
fn random_traffic_doorbell_path() {
    run_random(TxPath::Doorbell, true, 104, 0x1234_5678, 300);
}

#[test]
fn random_traffic_blueflame_path() {
    run_random(TxPath::BlueFlame, true, 104, 0x9abc_def1, 300);
}

#[test]
fn random_traffic_no_inline_and_max_inline() {
    run_random(TxPath::Doorbell, true, 0, 77, 150);
    run_random(TxPath::BlueFlame, true, 928, 78, 150);
}

#[test]
fn blueflame_without_wc_still_delivers() {
    // bf=on on a platform without WC: every copy is torn, the device falls back to the ring.
    run_random(TxPath::BlueFlame, false, 104, 99, 100);
}

/// Random traffic with the device injecting faults, one run per `(path, seed, faults)`.
fn random_with_faults(runs: &[(TxPath, u64, &str)]) {
    for &(path, seed, faults) in runs {
        run_random_with(path, true, 104, seed, 400, faults.parse().unwrap());
    }
}

#[test]
fn random_traffic_with_lost_completions() {
    random_with_faults(&[
        (TxPath::Doorbell, 0x10_57, "cqe_drop:2"),
        (TxPath::BlueFlame, 0x10_58, "cqe_drop:5"),
    ]);
}

#[test]
fn random_traffic_with_repeated_completions() {
    random_with_faults(&[
        (TxPath::Doorbell, 0xd0_b1, "cqe_dup:5"),
        (TxPath::BlueFlame, 0xd0_b2, "cqe_drop:4/cqe_dup:3"),
    ]);
}

/// The completion of an idle queue's last request lost: a look without progress (here the
/// drain at port stop) asks for one more with a NOP, whose completion covers everything. With
/// only a doorbell rung again, the buffers stayed held and the drain timed out.
#[test]
fn an_idle_queue_recovers_from_losing_its_last_completion() {
    for path in [TxPath::Doorbell, TxPath::BlueFlame] {
        FREED.with(|f| f.borrow_mut().clear());
        let mut r = rig(true);
        let mut q: TxQueue<Pkt> =
            TxQueue::new(&r.dev, "tx_lost_last", 0, 256, config(path, 104), &[r.mr]).unwrap();
        let mut rng = Rng(0x1a57);
        // Gather packets, held until their completion: one burst of 64, which asks for a
        // completion at its last WQE (one per 64 packets on a ring of 256), and it is lost.
        let cases: Vec<Case> = (0..64).map(|_| plain_case(&mut rng, 300)).collect();
        r.hca.set_faults("cqe_drop:1".parse().unwrap());
        let pkts = send_all(&mut r, &mut q, &cases, cases.len(), 1);
        r.hca.set_faults(Faults::default());
        let lost = r.hca.counters().inj_cqe_drops;
        assert!(lost >= 1, "{path:?}: a completion was lost");
        FREED.with(|f| assert!(f.borrow().len() < pkts.len(), "{path:?}: buffers held"));
        assert!(
            q.drain(&r.dev, std::time::Duration::from_secs(5)),
            "{path:?}: drained"
        );
        FREED.with(|f| {
            let f = f.borrow();
            assert_eq!(f.len(), pkts.len(), "{path:?}: every buffer freed");
            assert!(f.values().all(|&c| c == 1), "{path:?}: once");
        });
        let st = q.stats();
        assert_eq!(st.cqe_mismatches, lost, "{path:?}: {st:?}");
        assert!(st.doorbell_rerings >= 1, "{path:?}: {st:?}");
        q.destroy(&r.dev);
    }
}

// ---- the capability check -------------------------------------------------------------

fn threaded_hca(wc: bool, bf_reg_size: u32) -> Soft {
    let hca = Hca::open(HcaConfig {
        wc,
        bf_reg_size,
        threaded: true,
        name: format!("tx_cap{}", NAME.fetch_add(1, Ordering::Relaxed)),
        ..HcaConfig::default()
    })
    .unwrap();
    hca.start().unwrap();
    Soft::new(hca, MemSource::Heap)
}

#[test]
fn capability_check_follows_write_combining() {
    let copy = Copy64::best();
    let on = threaded_hca(true, 512);
    let c = wc::decide(&on, BfMode::Auto, -1, copy);
    assert_eq!(c.path, TxPath::BlueFlame, "{c:?}");
    assert!(!c.warning);
    assert_eq!(wc::self_test(&on, -1, copy), Ok(wc::SelfTest::CopyExecuted));
    let c = wc::decide(&on, BfMode::Off, -1, copy);
    assert_eq!((c.path, c.reason.as_str()), (TxPath::Doorbell, "bf=off"));

    let off = threaded_hca(false, 512);
    let c = wc::decide(&off, BfMode::Auto, -1, copy);
    assert_eq!(c.path, TxPath::Doorbell, "{c:?}");
    assert!(c.reason.contains("ignored"), "{c:?}");
    let c = wc::decide(&off, BfMode::On, -1, copy);
    assert_eq!(c.path, TxPath::BlueFlame);
    assert!(c.warning, "bf=on without WC is a warning");

    let none = threaded_hca(true, 0);
    let c = wc::decide(&none, BfMode::Auto, -1, copy);
    assert_eq!(c.path, TxPath::Doorbell);
    assert!(c.reason.contains("bf_reg_size 0"), "{c:?}");
    for h in [on, off, none] {
        h.hca().stop();
    }
}

// ---- errors and recovery --------------------------------------------------------------

#[test]
fn error_cqe_is_counted_and_the_queue_recovers() {
    FREED.with(|f| f.borrow_mut().clear());
    let mut r = rig(true);
    let mut q: TxQueue<Pkt> = TxQueue::new(
        &r.dev,
        "tx_err",
        0,
        64,
        config(TxPath::Doorbell, 0),
        &[r.mr],
    )
    .unwrap();
    let mut rng = Rng(5);
    let cases: Vec<Case> = (0..3)
        .map(|_| Case {
            bytes: (0..200).map(|_| rng.next() as u8).collect(),
            cuts: vec![],
            off: TxOffloads::default(),
        })
        .collect();
    let mut segtab = Vec::new();
    let mut arena = std::mem::take(&mut r.arena);
    let pkts = build(&mut arena, &cases, &mut segtab, 0);
    // SAFETY: test buffers; their release only records it.
    assert_eq!(unsafe { q.burst(&pkts[..1]) }, 1);
    r.hca.step();
    // The device forgets the memory the queue still believes registered: the next gather WQE
    // points at memory it may not touch.
    r.hca.dereg_mr(r.mr.lkey).unwrap();
    let qpn = q.qpn();
    // SAFETY: test buffers; their release only records it.
    assert_eq!(unsafe { q.burst(&pkts[1..2]) }, 1);
    r.hca.step();
    assert_eq!(r.dev.sq_state(qpn).unwrap(), QueueState::Error);
    // A call with nothing to send leaves at once, before even looking at completions.
    // SAFETY: test buffers; their release only records it.
    assert_eq!(unsafe { q.burst(&[]) }, 0);
    assert_eq!(q.stats().error_cqes, 0);
    // The next burst sees the error CQE and takes nothing; recovery (the control path's job,
    // with the device in hand) gives it a fresh queue.
    assert_eq!(
        // SAFETY: test buffers; their release only records it.
        unsafe { q.burst(&pkts[2..3]) },
        0,
        "a failed queue takes nothing"
    );
    assert!(q.failed());
    let st = q.stats();
    assert_eq!(st.error_cqes, 1, "{st:?}");
    let ring = q.sq_desc().buf();
    assert!(q.recover(&r.dev));
    assert!(!q.failed());
    assert_eq!(
        (q.qpn(), q.sq_desc().buf()),
        (qpn, ring),
        "the failed queue restarted in place, on its own ring"
    );
    assert_eq!(r.dev.sq_state(qpn).unwrap(), QueueState::Ready);
    assert_eq!(r.hca.counters().error_cqes, 1);
    // Memory back: traffic flows on the new queue.
    // SAFETY: the arena outlives the device (it is returned to the rig below).
    let range = unsafe {
        DmaRange::new(
            arena.as_ptr() as usize,
            arena.as_ptr() as usize + arena.len(),
        )
    };
    let mr = r.dev.reg_mr(range).unwrap();
    q.destroy(&r.dev);
    let mut q: TxQueue<Pkt> =
        TxQueue::new(&r.dev, "tx_err", 0, 64, config(TxPath::Doorbell, 0), &[mr]).unwrap();
    // SAFETY: test buffers; their release only records it.
    assert_eq!(unsafe { q.burst(&pkts[2..3]) }, 1);
    r.hca.step();
    let wire = r.wire.lock().unwrap().clone();
    assert_eq!(wire.first(), Some(&cases[0].bytes));
    assert_eq!(wire.last(), Some(&cases[2].bytes));
    assert_eq!(wire.len(), 2, "the failed packet never reached the wire");
    q.destroy(&r.dev);
    FREED.with(|f| {
        let f = f.borrow();
        assert_eq!(f.len(), 3);
        assert!(f.values().all(|&c| c == 1));
    });
    r.arena = arena;
}

#[test]
fn a_restarted_queue_keeps_its_rings_and_sends_only_what_follows() {
    // Queue stop and start: the same SQ, ring and CQ come back from slot 0. WQEs the device
    // never reached before the stop, and completions nobody polled, belong to the run that
    // ended: neither may show after the restart (a doorbell walks until the first slot the
    // device does not own, so stale WQEs of pass 0 would go out again).
    for path in [TxPath::Doorbell, TxPath::BlueFlame] {
        FREED.with(|f| f.borrow_mut().clear());
        let mut r = rig(true);
        let mut q: TxQueue<Pkt> =
            TxQueue::new(&r.dev, "tx_restart", 0, 64, config(path, 0), &[r.mr]).unwrap();
        let mut rng = Rng(0x7e57);
        let cases: Vec<Case> = (0..20)
            .map(|_| Case {
                bytes: (0..60 + rng.below(400) as usize)
                    .map(|_| rng.next() as u8)
                    .collect(),
                cuts: vec![],
                off: TxOffloads::default(),
            })
            .collect();
        let mut segtab = Vec::new();
        let mut arena = std::mem::take(&mut r.arena);
        let pkts = build(&mut arena, &cases, &mut segtab, 0);
        let sq = q.sq_desc();
        let before = (q.qpn(), sq.buf(), sq.doorbell(), q.txbb_cnt());
        // Sent, their completions left in the CQ.
        // SAFETY: test buffers; their release only records it.
        assert_eq!(unsafe { q.burst(&pkts[..10]) }, 10);
        r.hca.step();
        // Posted, and the queue stops before the device reaches them.
        r.dev.set_sq_ready(before.0, false).unwrap();
        // SAFETY: test buffers; their release only records it.
        assert_eq!(unsafe { q.burst(&pkts[10..15]) }, 5);
        r.hca.step();
        assert_eq!(
            r.wire.lock().unwrap().len(),
            10,
            "{path:?}: a stopped SQ sends nothing"
        );
        q.reset(&r.dev).unwrap();
        let sq = q.sq_desc();
        assert_eq!(
            (q.qpn(), sq.buf(), sq.doorbell(), q.txbb_cnt()),
            before,
            "{path:?}: the same SQ and ring after the restart"
        );
        assert_eq!(r.dev.sq_state(before.0).unwrap(), QueueState::Ready);
        assert_eq!((q.producer(), q.outstanding()), (0, 0));
        FREED.with(|f| assert_eq!(f.borrow().len(), 15, "{path:?}: in flight, freed"));
        // SAFETY: test buffers; their release only records it.
        assert_eq!(unsafe { q.burst(&pkts[15..]) }, 5);
        r.hca.step();
        while q.outstanding() > 0 {
            assert!(
                q.drain(&r.dev, std::time::Duration::from_secs(5)),
                "{path:?}: drained"
            );
        }
        let wire = r.wire.lock().unwrap().clone();
        let want: Vec<&Vec<u8>> = cases[..10]
            .iter()
            .chain(&cases[15..])
            .map(|c| &c.bytes)
            .collect();
        assert_eq!(wire.len(), want.len(), "{path:?}: frames on the wire");
        for (i, (got, want)) in wire.iter().zip(&want).enumerate() {
            assert_eq!(got, *want, "{path:?}: frame {i}");
        }
        let st = q.stats();
        assert_eq!((st.errors, st.error_cqes), (0, 0), "{path:?}: {st:?}");
        q.destroy(&r.dev);
        FREED.with(|f| {
            let f = f.borrow();
            assert_eq!(f.len(), 20, "{path:?}: every packet freed");
            assert!(f.values().all(|&c| c == 1), "{path:?}: each once");
        });
        r.arena = arena;
    }
}

#[test]
fn unregistered_memory_is_dropped_not_posted() {
    FREED.with(|f| f.borrow_mut().clear());
    let r = rig(true);
    let mut q: TxQueue<Pkt> =
        TxQueue::new(&r.dev, "tx_unreg", 0, 64, config(TxPath::Doorbell, 0), &[]).unwrap();
    let data = vec![7u8; 300];
    let seg = [Seg {
        ptr: data.as_ptr(),
        len: data.len(),
    }];
    let p = Pkt {
        id: 1,
        segs: seg.as_ptr(),
        nsegs: 1,
        len: 300,
        off: TxOffloads::default(),
    };
    // SAFETY: test buffers; their release only records it.
    assert_eq!(unsafe { q.burst(&[p]) }, 1, "taken: it can never be sent");
    let st = q.stats();
    assert_eq!((st.errors, st.packets, st.doorbells), (1, 0, 0));
    FREED.with(|f| assert_eq!(f.borrow().get(&1), Some(&1)));
}

// ---- length classes, every ring position, a full ring ------------------------------------

/// Where a packet changes class: the smallest; 16/17 (one pair of 8-byte moves / of 16);
/// 44/45 (one TXBB / two); 60 and 64 (the second chunk's moves); 104/105 (the largest
/// straight-line inline packet / the next); 928/929 (the largest inline threshold / beyond).
const BOUNDARIES: [usize; 11] = [1, 16, 17, 44, 45, 60, 64, 104, 105, 928, 929];

/// Sends `cases` in bursts of `burst`, letting the device run between bursts; returns the
/// packets built (ids from `first_id`) and checks the wire, in order, byte for byte.
fn send_all(
    r: &mut Rig,
    q: &mut TxQueue<Pkt>,
    cases: &[Case],
    burst: usize,
    first_id: u32,
) -> Vec<Pkt> {
    let mut segtab = Vec::new();
    let mut arena = std::mem::take(&mut r.arena);
    let pkts = build(&mut arena, cases, &mut segtab, first_id);
    let wire_before = r.wire.lock().unwrap().len();
    let mut done = 0;
    while done < pkts.len() {
        let end = (done + burst).min(pkts.len());
        // SAFETY: test buffers; their release only records it.
        let taken = unsafe { q.burst(&pkts[done..end]) };
        done += taken;
        r.hca.step();
        q.complete();
    }
    r.hca.step();
    q.complete();
    let wire = r.wire.lock().unwrap()[wire_before..].to_vec();
    assert_eq!(wire.len(), cases.len(), "frames on the wire");
    for (i, (w, c)) in wire.iter().zip(cases).enumerate() {
        let e = expected_wire(&c.bytes, c.off);
        assert!(
            *w == e,
            "frame {i} ({} bytes, {} segments, {:?}) differs",
            c.bytes.len(),
            c.cuts.len() + 1,
            c.off
        );
    }
    r.arena = arena;
    drop(segtab);
    pkts
}

fn plain_case(rng: &mut Rng, len: usize) -> Case {
    Case {
        bytes: (0..len).map(|_| rng.next() as u8).collect(),
        cuts: vec![],
        off: TxOffloads::default(),
    }
}

#[test]
fn every_length_class_boundary_on_every_path() {
    let mut rng = Rng(0x5eed);
    for inline_max in [0u16, 104, 928] {
        for path in [TxPath::Doorbell, TxPath::BlueFlame] {
            FREED.with(|f| f.borrow_mut().clear());
            let mut r = rig(true);
            let mut q: TxQueue<Pkt> = TxQueue::new(
                &r.dev,
                "tx_classes",
                0,
                256,
                config(path, inline_max),
                &[r.mr],
            )
            .unwrap();
            // A gather packet of three segments first: the general path fills the lkey
            // cache, so every plain gather packet after it takes the straight-line path.
            let mut cases = vec![Case {
                cuts: vec![300, 600],
                ..plain_case(&mut rng, 1000)
            }];
            for &len in &BOUNDARIES {
                // Plain, in three segments, with a VLAN tag, with checksum offloads.
                cases.push(plain_case(&mut rng, len));
                if len >= 3 {
                    cases.push(Case {
                        cuts: vec![len / 3, 2 * len / 3],
                        ..plain_case(&mut rng, len)
                    });
                }
                if len >= 14 {
                    cases.push(Case {
                        off: TxOffloads {
                            vlan: Some(0x0abc),
                            ..TxOffloads::default()
                        },
                        ..plain_case(&mut rng, len)
                    });
                }
                if len >= 54 {
                    cases.push(Case {
                        bytes: ipv4_frame(&mut rng, len, len % 2 == 0),
                        cuts: vec![],
                        off: TxOffloads {
                            ip_csum: true,
                            l4_csum: true,
                            vlan: None,
                            ..TxOffloads::default()
                        },
                    });
                }
            }
            let n = cases.len() as u64;
            let inline = |c: &Case| c.bytes.len() <= usize::from(inline_max);
            let plain = |c: &Case| c.cuts.is_empty() && c.off == TxOffloads::default();
            let straight_max = usize::from(inline_max).min(wqe::PLAIN_INLINE_MAX);
            let count = |f: &dyn Fn(&Case) -> bool| cases.iter().filter(|c| f(c)).count() as u64;
            let inline_n = count(&|c| inline(c));
            let straight_inline = count(&|c| plain(c) && c.bytes.len() <= straight_max);
            let straight_gather = count(&|c| plain(c) && !inline(c));
            // Several burst sizes, so that packets of every class start and end bursts.
            for (i, burst) in [1usize, 3, 32].into_iter().enumerate() {
                send_all(&mut r, &mut q, &cases, burst, i as u32 * 1000);
            }
            let st = q.stats();
            let what = format!("inline {inline_max} {path:?}: {st:?}");
            assert_eq!(st.packets, 3 * n, "{what}");
            assert_eq!(st.errors, 0, "{what}");
            assert_eq!(st.inline_packets, 3 * inline_n, "{what}");
            assert_eq!(
                st.inline_packets - st.general_inline,
                3 * straight_inline,
                "{what}"
            );
            assert_eq!(
                st.gather_packets - st.general_gather,
                3 * straight_gather,
                "{what}"
            );
            q.destroy(&r.dev);
            FREED.with(|f| {
                let f = f.borrow();
                assert_eq!(f.len() as u64, 3 * n, "{what}: every buffer freed");
                assert!(f.values().all(|&c| c == 1), "{what}: none twice");
            });
        }
    }
}

/// Posts `lens` (plain packets) as one burst from wherever the producer is; returns the
/// producer counter it started at.
fn burst_at(r: &mut Rig, q: &mut TxQueue<Pkt>, rng: &mut Rng, lens: &[usize], id: &mut u32) -> u32 {
    let at = q.producer();
    let cases: Vec<Case> = lens.iter().map(|&l| plain_case(rng, l)).collect();
    let pkts = send_all(r, q, &cases, lens.len(), *id);
    *id += pkts.len() as u32;
    at
}

/// Moves the producer to the next ring position not yet `seen` (from where it is, going
/// round) with one-TXBB packets, which never need a pad; returns that position.
fn advance_to_unseen(
    r: &mut Rig,
    q: &mut TxQueue<Pkt>,
    rng: &mut Rng,
    seen: &[bool],
    id: &mut u32,
) -> usize {
    let size = seen.len();
    let at = q.producer() as usize % size;
    let gap = (0..size)
        .find(|d| !seen[(at + d) % size])
        .expect("a position left to visit");
    if gap > 0 {
        let cases: Vec<Case> = (0..gap).map(|_| plain_case(rng, 20)).collect();
        *id += send_all(r, q, &cases, 32, *id).len() as u32;
    }
    let now = q.producer() as usize % size;
    assert_eq!(now, (at + gap) % size);
    now
}

#[test]
fn every_ring_wrap_position() {
    for path in [TxPath::Doorbell, TxPath::BlueFlame] {
        FREED.with(|f| f.borrow_mut().clear());
        let mut r = rig(true);
        let mut rng = Rng(0xa11);
        // Inline up to 928 bytes: WQEs of 1, 2, 3 and 16 TXBBs meet the ring's end at every
        // offset, so pad NOPs of every size from 1 to 15 TXBBs occur.
        let mut q: TxQueue<Pkt> =
            TxQueue::new(&r.dev, "tx_wrap", 0, 64, config(path, 928), &[r.mr]).unwrap();
        let size = q.txbb_cnt() as usize;
        let mut id = 0;
        // From every position of the ring: a burst of WQEs of 2, 3, 16 and 1 TXBBs; bursts
        // of one packet of 2 and of 1 TXBB (the path of a burst of one, which leaves the
        // ring's last slot to the general burst and its pad); the longest straight-line one.
        for lens in [&[64, 110, 928, 20][..], &[64], &[20], &[104], &[45]] {
            let mut seen = vec![false; size];
            while seen.iter().any(|s| !s) {
                let at = advance_to_unseen(&mut r, &mut q, &mut rng, &seen, &mut id);
                burst_at(&mut r, &mut q, &mut rng, lens, &mut id);
                seen[at] = true;
            }
        }
        let st = q.stats();
        assert_eq!(st.packets, u64::from(id));
        assert_eq!(st.errors, 0);
        // Pad NOPs went to the device too: more WQEs executed than frames sent.
        let hc = r.hca.counters();
        assert!(hc.wqe_fetched + hc.wqe_from_bf > hc.tx_frames, "{hc:?}");
        q.destroy(&r.dev);
        FREED.with(|f| {
            let f = f.borrow();
            assert_eq!(f.len() as u32, id);
            assert!(f.values().all(|&c| c == 1));
        });
    }
}

#[test]
fn ring_full_at_every_position() {
    ring_full_from_every_position(TxPath::Doorbell, 32);
    ring_full_from_every_position(TxPath::BlueFlame, 32);
}

/// Bursts of one fill the ring too (their own path, which hands a WQE that does not fit the
/// room to the general burst).
#[test]
fn ring_full_at_every_position_by_bursts_of_one() {
    ring_full_from_every_position(TxPath::Doorbell, 1);
    ring_full_from_every_position(TxPath::BlueFlame, 1);
}

/// From every ring position, fills the ring with the device held by bursts of `fill`
/// packets of two TXBBs until one is cut short, then checks a further call takes nothing
/// and everything taken reaches the wire.
fn ring_full_from_every_position(path: TxPath, fill: usize) {
    FREED.with(|f| f.borrow_mut().clear());
    let mut r = rig(true);
    let mut rng = Rng(0xf011);
    let mut q: TxQueue<Pkt> =
        TxQueue::new(&r.dev, "tx_full", 0, 64, config(path, 104), &[r.mr]).unwrap();
    let size = q.txbb_cnt();
    // 64-byte packets take two TXBBs: the room runs out, and the ring's end falls, at both
    // parities of every position.
    let template: Vec<Case> = (0..32).map(|_| plain_case(&mut rng, 64)).collect();
    let mut segtab = Vec::new();
    let mut arena = std::mem::take(&mut r.arena);
    // Far from where `send_all` lays out its packets (from the arena's start).
    let base = build_at(&mut arena, &mut (4 << 20), &template, &mut segtab, 0);
    r.arena = arena;
    let mut id = 1u32 << 20;
    let mut seen = vec![false; size as usize];
    while seen.iter().any(|s| !s) {
        let at = advance_to_unseen(&mut r, &mut q, &mut rng, &seen, &mut id);
        seen[at] = true;
        let wire_before = r.wire.lock().unwrap().len();
        let mut expected = Vec::new();
        // Fill with the device held: bursts of `fill` until one is cut short.
        let full_before = q.stats().ring_full;
        loop {
            let pkts: Vec<Pkt> = base[..fill]
                .iter()
                .map(|p| Pkt {
                    id: id + p.id,
                    ..*p
                })
                .collect();
            // SAFETY: test buffers; their release only records it.
            let taken = unsafe { q.burst(&pkts) };
            for c in &template[..taken] {
                expected.push(c.bytes.clone());
            }
            id += fill as u32;
            // Ids of packets not taken are never freed: skip them for good.
            if taken < pkts.len() {
                for p in &pkts[taken..] {
                    FREED.with(|f| *f.borrow_mut().entry(p.id).or_insert(0) += 1);
                }
                break;
            }
        }
        // Full: a further call takes nothing and says so.
        let one = [Pkt { id, ..base[0] }];
        id += 1;
        // SAFETY: test buffers; their release only records it.
        assert_eq!(unsafe { q.burst(&one) }, 0, "a full ring takes nothing");
        FREED.with(|f| *f.borrow_mut().entry(one[0].id).or_insert(0) += 1);
        assert_eq!(q.stats().ring_full, full_before + 2);
        r.hca.step();
        q.complete();
        let wire = r.wire.lock().unwrap()[wire_before..].to_vec();
        if wire != expected {
            let first = wire.iter().zip(&expected).position(|(w, e)| w != e);
            panic!(
                "from {at}: {} frames on the wire, {} taken, first difference at {first:?}; {:?} {:?}",
                wire.len(),
                expected.len(),
                q.stats(),
                r.hca.counters()
            );
        }
    }
    let st = q.stats();
    assert_eq!(st.errors, 0);
    q.destroy(&r.dev);
    FREED.with(|f| {
        let f = f.borrow();
        assert_eq!(
            f.len(),
            id as usize - (1 << 20),
            "every buffer freed or never taken"
        );
        assert!(f.values().all(|&c| c == 1), "none twice");
    });
}
