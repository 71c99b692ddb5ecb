//! The TX path against the software HCA in step mode, without EAL: random packets (sizes,
//! segment counts, offloads, burst sizes, many ring wraps) must reach the wire byte for byte,
//! in order, with every buffer freed exactly once, and the doorbell/BlueFlame choice per burst
//! must follow the rules; the same with the device losing or repeating send completions. The
//! capability check, against a threaded device. Error completions and recovery are in
//! `tx_recovery`, length classes and ring positions in `tx_ring`.

mod traffic;

use std::sync::atomic::Ordering;

use mlx4rs::devargs::BfMode;
use mlx4rs::hca::{Faults, Hca, HcaConfig};
use mlx4rs::hw::soft::Soft;
use mlx4rs::mem::MemSource;
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
    // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
    let mut q: TxQueue<Pkt> = unsafe {
        TxQueue::new(
            &r.dev,
            "tx_step",
            0,
            256,
            tx_config(path, inline_max),
            &[r.mr],
        )
    }
    .unwrap();
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

/// The device executes the self-test's BlueFlame copy whichever routine this CPU runs makes
/// it, the head stored last or not.
#[test]
fn every_copy_routine_passes_the_self_test() {
    let on = threaded_hca(true, 512);
    for copy in Copy64::ALL.into_iter().filter(|c| c.available()) {
        assert_eq!(
            wc::self_test(&on, -1, copy),
            Ok(wc::SelfTest::CopyExecuted),
            "{copy:?}"
        );
    }
    on.hca().stop();
}
