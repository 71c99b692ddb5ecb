//! Calls on a full ring with the device held: each takes nothing and is counted in
//! `ring_full`, and the 64th in a row without progress rings again for a lost doorbell, then
//! twice as many calls later each time a ring again brought no progress, on
//! a healthy queue and with doorbell avoidance on (where the burst's front takes its detour
//! from the full ring's path). Once the device runs, every frame taken is on the wire, in
//! order, byte for byte. Empty bursts (`kick`) ring again on their first look without
//! progress, then after twice as many looks each time.

mod traffic;

use mlx4rs::txq::{DbAvoid, TxPath, TxQueue};
use traffic::*;

/// Calls on a full ring without progress between two rings again (the queue's patience).
const PATIENCE: u64 = 64;

fn full_ring_rings_again(path: TxPath, avoid: bool) {
    let mut r = rig(true);
    let mut rng = Rng(0xfa11 + avoid as u64);
    let mut q: TxQueue<Pkt> =
        // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
        unsafe { TxQueue::new(&r.dev, "tx_patience", 0, 64, tx_config(path, 104), &[r.mr]) }
            .unwrap();
    if avoid {
        // The deadline never fires here: the skips are bounded by the packet count.
        q.set_db_avoid(Some(DbAvoid {
            cycles: u64::MAX / 4,
            ..DbAvoid::default_bound()
        }));
    }
    // 64-byte packets take two TXBBs; the ring holds far fewer than these.
    let mut segtab = Vec::new();
    let (cases, pkts) = plain_packets(&mut r, &mut rng, (4096, 64), &mut segtab);
    let wire_before = r.wire.lock().unwrap().len();
    // Fill with the device held: bursts of 32 until one is cut short.
    let mut taken = 0;
    loop {
        // SAFETY: test buffers, each handed over once; their release only records it.
        let n = unsafe { q.burst(&pkts[taken..taken + 32]) };
        taken += n;
        if n < 32 {
            break;
        }
        assert!(taken + 32 <= pkts.len(), "{path:?}: the ring never filled");
    }
    let next = [pkts[taken]];
    let call = |q: &mut TxQueue<Pkt>| {
        // SAFETY: a packet the queue refuses stays the caller's, and is offered again.
        let n = unsafe { q.burst(&next) };
        assert_eq!(n, 0, "{path:?}: a full ring takes nothing");
    };
    // Up to the first ring again: the looks that filling made are not known here.
    let st = q.stats();
    let mut calls = 0;
    while q.stats().doorbell_rerings == st.doorbell_rerings {
        call(&mut q);
        calls += 1;
        assert!(
            calls <= PATIENCE,
            "{path:?} avoid {avoid}: no ring again in {calls} calls"
        );
    }
    // From there the patience to the next; then, as that ring again brought no progress,
    // twice it, then four times; each call counted.
    let st = q.stats();
    let rings_after = |i: u64| [1, 3, 7].iter().filter(|&&k| i >= k * PATIENCE).count() as u64;
    for i in 1..=7 * PATIENCE {
        call(&mut q);
        let now = q.stats();
        assert_eq!(now.ring_full, st.ring_full + i, "{path:?} avoid {avoid}");
        assert_eq!(
            now.doorbell_rerings,
            st.doorbell_rerings + rings_after(i),
            "{path:?} avoid {avoid}: call {i}"
        );
    }
    assert_eq!(q.stats().packets, taken as u64);
    // Whatever avoidance left unrung, a ring again covered: the device sends it all.
    r.hca.step();
    q.complete();
    let wire = r.wire.lock().unwrap()[wire_before..].to_vec();
    assert_eq!(
        wire.len(),
        taken,
        "{path:?} avoid {avoid}: frames on the wire"
    );
    for (i, (w, c)) in wire.iter().zip(&cases).enumerate() {
        assert!(*w == c.bytes, "{path:?} avoid {avoid}: frame {i} differs");
    }
    // Room again: the packet refused is taken now.
    // SAFETY: as above.
    assert_eq!(unsafe { q.burst(&next) }, 1, "{path:?} avoid {avoid}");
    r.hca.step();
    q.complete();
    assert_eq!(r.wire.lock().unwrap().last(), Some(&cases[taken].bytes));
    q.destroy(&r.dev);
}

#[test]
fn a_full_ring_rings_again_after_its_patience() {
    full_ring_rings_again(TxPath::Doorbell, false);
    full_ring_rings_again(TxPath::BlueFlame, false);
}

#[test]
fn a_full_ring_with_doorbell_avoidance_rings_again_after_its_patience() {
    full_ring_rings_again(TxPath::Doorbell, true);
    full_ring_rings_again(TxPath::BlueFlame, true);
}

/// Empty bursts against a held device: the first look without progress rings again, then the
/// 3rd, 7th, 15th ... (each ring again that brought no progress doubles the looks to the
/// next); once the device runs and completes, the next stall rings at its first look again.
fn empty_bursts_back_off(path: TxPath) {
    let mut r = rig(true);
    let mut rng = Rng(0xb0ff);
    let mut q: TxQueue<Pkt> =
        // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
        unsafe { TxQueue::new(&r.dev, "tx_kick", 0, 64, tx_config(path, 104), &[r.mr]) }
            .unwrap();
    let mut segtab = Vec::new();
    let (cases, pkts) = plain_packets(&mut r, &mut rng, (8, 64), &mut segtab);
    let looks = 1000u32;
    let want: Vec<u32> = (1..=looks).filter(|k| (k + 1).is_power_of_two()).collect();
    for half in pkts.chunks(4) {
        // SAFETY: test buffers, each handed over once; their release only records it.
        assert_eq!(unsafe { q.burst(half) }, 4, "{path:?}");
        let before = q.stats().doorbell_rerings;
        let rang: Vec<u32> = (1..=looks).filter(|_| q.kick()).collect();
        assert_eq!(rang, want, "{path:?}: the looks that rang again");
        assert_eq!(
            q.stats().doorbell_rerings - before,
            want.len() as u64,
            "{path:?}"
        );
        // The device runs: everything posted completes, and the next stall starts over.
        r.hca.step();
        q.complete();
        assert!(
            !q.kick(),
            "{path:?}: the device progressed, nothing to ring for"
        );
    }
    let wire = r.wire.lock().unwrap().clone();
    assert_eq!(wire.len(), cases.len(), "{path:?}: frames on the wire");
    for (i, (w, c)) in wire.iter().zip(&cases).enumerate() {
        assert!(*w == c.bytes, "{path:?}: frame {i} differs");
    }
    q.destroy(&r.dev);
}

#[test]
fn empty_bursts_ring_again_with_a_back_off() {
    empty_bursts_back_off(TxPath::Doorbell);
    empty_bursts_back_off(TxPath::BlueFlame);
}
