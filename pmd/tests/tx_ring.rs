//! TX length classes and ring positions against the software HCA in step mode: every length
//! class boundary on every path, a burst from every ring position, and a full ring from every
//! position, each frame checked on the wire byte for byte.

mod bursts;
mod traffic;

use bursts::*;
use mlx4rs::txq::{TxPath, TxQueue};
use mlx4rs::wqe::{self, TxOffloads};
use traffic::*;

// ---- length classes, every ring position, a full ring ------------------------------------

/// Where a packet changes class: the smallest; 16/17 (one pair of 8-byte moves / of 16);
/// 44/45 (one TXBB / two); 60 and 64 (the second chunk's moves); 104/105 (the largest
/// straight-line inline packet / the next); 928/929 (the largest inline threshold / beyond).
const BOUNDARIES: [usize; 11] = [1, 16, 17, 44, 45, 60, 64, 104, 105, 928, 929];

#[test]
fn every_length_class_boundary_on_every_path() {
    let mut rng = Rng(0x5eed);
    for inline_max in [0u16, 104, 928] {
        for path in [TxPath::Doorbell, TxPath::BlueFlame] {
            FREED.with(|f| f.borrow_mut().clear());
            let mut r = rig(true);
            // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
            let mut q: TxQueue<Pkt> = unsafe {
                TxQueue::new(
                    &r.dev,
                    "tx_classes",
                    0,
                    256,
                    tx_config(path, inline_max),
                    &[r.mr],
                )
            }
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
            // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
            unsafe { TxQueue::new(&r.dev, "tx_wrap", 0, 64, tx_config(path, 928), &[r.mr]) }.unwrap();
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
        // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
        unsafe { TxQueue::new(&r.dev, "tx_full", 0, 64, tx_config(path, 104), &[r.mr]) }.unwrap();
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
