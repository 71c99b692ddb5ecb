//! Soak (doc/faults.md): random TX traffic in step mode (the generator of `tx_step`:
//! random sizes, segment counts, offloads and burst sizes; the device run at random moments so
//! the ring fills and wraps) for `SOAK_PACKETS` packets (10^6 by default; `scripts/soak.sh`
//! runs 10^8). Every frame on the wire is checked byte for byte, in order, against what a NIC
//! must send for its packet, and every buffer is freed exactly once.
//!
//! With faults (`SOAK_FAULTS`, a `faults=` spec; by default error completions, lost doorbells
//! and link flaps), the wire must be the sent frames less some, in order; those missing are
//! exactly the ones counted lost: the driver's `flushed` (packets a failed queue took with it)
//! plus the device's `tx_drops_wire` (frames sent into a link that was down). The queue is
//! recovered as the ethdev glue does (after a burst that found it failed); a lost doorbell is
//! found again by the next burst, a full ring, or the final `kick`, so nothing is stranded.

mod traffic;

use std::collections::VecDeque;
use std::time::Instant;

use mlx4rs::hca::Faults;
use mlx4rs::txq::{TxPath, TxQueue};
use traffic::*;

/// A progress line every this many packets (a long run on a busy machine shows it lives).
const PROGRESS: u64 = 10_000_000;

/// What a soak run did.
#[derive(Debug, Default)]
struct Report {
    packets: u64,
    frames_checked: u64,
    /// Sent frames that never reached the wire, all counted (flushed + wire drops).
    lost: u64,
    flushed: u64,
    wire_drops: u64,
    freed_once: u64,
    secs: f64,
    tx_errors: u64,
    doorbells_lost: u64,
    link_downs: u64,
    rerings: u64,
    resets: u64,
}

/// Buffers freed so far are in `FREED` (id -> times); ids below `low` were each freed once
/// and are forgotten, so memory stays bounded over 10^8 packets. A second free of any id
/// shows as a count of 2, or as an id below `low` coming back.
fn settle_freed(low: &mut u32, total: &mut u64) {
    FREED.with(|f| {
        let mut f = f.borrow_mut();
        if let Some((&id, &n)) = f.iter().find(|(&id, &n)| n != 1 || id < *low) {
            panic!("buffer {id} freed {n} times (ids below {low} were freed already)");
        }
        while f.remove(low).is_some() {
            *low += 1;
            *total += 1;
        }
    });
}

/// The wire so far against the frames expected, in order: a frame may only be preceded by
/// frames lost and counted. Returns frames checked and skipped.
fn check_wire(r: &Rig, expected: &mut VecDeque<Vec<u8>>, checked: &mut u64, skipped: &mut u64) {
    let frames = std::mem::take(&mut *r.wire.lock().unwrap());
    for w in frames {
        loop {
            let e = expected
                .pop_front()
                .unwrap_or_else(|| panic!("a frame of {} bytes that was never sent", w.len()));
            if e == w {
                *checked += 1;
                break;
            }
            *skipped += 1;
        }
    }
}

fn soak(packets: u64, faults: Faults, path: TxPath, seed: u64) -> Report {
    FREED.with(|f| f.borrow_mut().clear());
    let mut r = rig(true);
    r.hca.set_faults(faults);
    let mut q: TxQueue<Pkt> =
        // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
        unsafe { TxQueue::new(&r.dev, "soak", 0, 256, tx_config(path, 104), &[r.mr]) }.unwrap();
    let mut rng = Rng(seed);
    let mut expected: VecDeque<Vec<u8>> = VecDeque::new();
    let (mut checked, mut skipped) = (0u64, 0u64);
    let (mut next_id, mut low, mut freed) = (0u32, 0u32, 0u64);
    let mut segtab = Vec::new();
    // Segment tables of packets the device may still read.
    let mut keep: Vec<Vec<Vec<Seg>>> = Vec::new();
    let mut at = 0;
    let start = Instant::now();
    let lost_bound = |q: &TxQueue<Pkt>, r: &Rig| q.stats().flushed + r.hca.counters().tx_drops_wire;
    let mut round = 0u64;
    let mut next_report = PROGRESS;
    while u64::from(next_id) < packets {
        let n = (1 + rng.below(64)).min(packets - u64::from(next_id)) as usize;
        let cases: Vec<Case> = (0..n).map(|_| random_case(&mut rng)).collect();
        let mut arena = std::mem::take(&mut r.arena);
        if at + (2 << 20) > arena.len() {
            // The arena is reused: the device must have read every gather packet posted.
            for i in 0.. {
                r.hca.step();
                q.complete();
                if q.failed() {
                    assert!(q.recover(&r.dev));
                }
                if q.outstanding() == 0 {
                    break;
                }
                assert!(i < 1000, "gather packets stranded: {:?}", q.stats());
                q.kick();
            }
            at = 0;
            keep.clear();
        }
        let pkts = build_at(&mut arena, &mut at, &cases, &mut segtab, next_id);
        keep.push(std::mem::take(&mut segtab));
        next_id += n as u32;
        expected.extend(cases.iter().map(|c| expected_wire(&c.bytes, c.off)));
        let mut done = 0;
        while done < n {
            // SAFETY: test buffers; their release only records it.
            let taken = unsafe { q.burst(&pkts[done..]) };
            if q.failed() {
                // As the ethdev glue does after a burst.
                assert!(q.recover(&r.dev), "recovery");
            }
            done += taken;
            if rng.below(12) == 0 || taken == 0 {
                r.hca.step();
                check_wire(&r, &mut expected, &mut checked, &mut skipped);
            }
        }
        r.arena = arena;
        round += 1;
        if round.is_multiple_of(64) {
            settle_freed(&mut low, &mut freed);
            if u64::from(next_id) >= next_report {
                next_report += PROGRESS;
                eprintln!(
                    "soak: ... {next_id} packets, {checked} frames checked, {} lost and counted, \
                     {freed} buffers freed once, {:.0} s",
                    skipped,
                    start.elapsed().as_secs_f64()
                );
            }
            assert!(
                skipped <= lost_bound(&q, &r),
                "{skipped} frames missing from the wire, {} counted lost: {:?} {:?}",
                lost_bound(&q, &r),
                q.stats(),
                r.hca.counters()
            );
        }
    }
    // The end: whatever waits (a lost doorbell, an unsignaled tail) must go out.
    let mut idle = 0;
    while !expected.is_empty() && idle < 100 {
        let before = checked;
        r.hca.step();
        q.complete();
        if q.failed() {
            assert!(q.recover(&r.dev));
        }
        check_wire(&r, &mut expected, &mut checked, &mut skipped);
        q.kick();
        idle = if checked == before { idle + 1 } else { 0 };
    }
    let st = q.stats();
    q.destroy(&r.dev);
    settle_freed(&mut low, &mut freed);
    let hc = r.hca.counters();
    // Frames still expected never made it: lost with a failed queue at the very end, or into
    // a link that was down.
    let lost = skipped + expected.len() as u64;
    let rep = Report {
        packets: u64::from(next_id),
        frames_checked: checked,
        lost,
        flushed: st.flushed,
        wire_drops: hc.tx_drops_wire,
        freed_once: freed,
        secs: start.elapsed().as_secs_f64(),
        tx_errors: hc.inj_tx_errors,
        doorbells_lost: hc.inj_doorbells_dropped,
        link_downs: hc.inj_link_downs,
        rerings: st.doorbell_rerings,
        resets: st.queue_resets,
    };
    eprintln!(
        "soak: packets {}, frames checked {}, lost and counted {} (flushed {}, wire drops {}), \
         buffers freed once {}, time {:.1} s ({:.0} packets/s); faults {:?}: tx errors {}, \
         doorbells lost {}, link downs {}; queue resets {}, doorbell rerings {}",
        rep.packets,
        rep.frames_checked,
        rep.lost,
        rep.flushed,
        rep.wire_drops,
        rep.freed_once,
        rep.secs,
        rep.packets as f64 / rep.secs,
        faults.to_string(),
        rep.tx_errors,
        rep.doorbells_lost,
        rep.link_downs,
        rep.resets,
        rep.rerings
    );
    assert_eq!(rep.freed_once, rep.packets, "every buffer freed, once");
    assert_eq!(
        rep.frames_checked + rep.lost,
        rep.packets,
        "every packet on the wire or lost"
    );
    assert_eq!(
        rep.lost,
        rep.flushed + rep.wire_drops,
        "what is lost is what the counters say: {st:?} {hc:?}"
    );
    assert_eq!(hc.tx_frames, rep.frames_checked);
    assert_eq!(st.packets, rep.packets, "packets posted");
    assert_eq!(
        st.errors, st.flushed,
        "oerrors: only what failed queues took"
    );
    assert_eq!(st.error_cqes, hc.inj_tx_errors);
    rep
}

fn packets() -> u64 {
    std::env::var("SOAK_PACKETS")
        .ok()
        .map(|v| v.parse().expect("SOAK_PACKETS: a number of packets"))
        .unwrap_or(1_000_000)
}

#[test]
fn soak_random_traffic() {
    let rep = soak(packets(), Faults::default(), TxPath::BlueFlame, 0x50a4);
    assert_eq!(rep.lost, 0);
}

#[test]
fn soak_random_traffic_with_faults() {
    let spec = std::env::var("SOAK_FAULTS")
        .unwrap_or_else(|_| "tx_error:5000/db_drop:13/flap:40000+300".to_owned());
    let faults = Faults::parse(&spec).expect("SOAK_FAULTS: a faults= spec");
    // The doorbell path: BlueFlame writes carry their own doorbell, which is never lost.
    let rep = soak(packets(), faults, TxPath::Doorbell, 0xfa17);
    // Each fault fires once its count was reached (a short run may see none).
    let reached = |every: u32| every != 0 && rep.packets > 2 * u64::from(every);
    if reached(faults.tx_error_every) {
        assert!(rep.tx_errors > 0 && rep.resets == rep.tx_errors, "{rep:?}");
    }
    if reached(faults.doorbell_drop_every) {
        assert!(rep.doorbells_lost > 0, "{rep:?}");
    }
    if reached(faults.link_flap_every) {
        assert!(rep.link_downs > 0 && rep.wire_drops > 0, "{rep:?}");
    }
}
