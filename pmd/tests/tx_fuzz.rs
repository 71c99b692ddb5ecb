//! Seeded, bounded fuzzing of TX mbuf chains against the software HCA in step mode:
//! real `rte_mbuf` structs laid out by hand in registered memory, run through the
//! driver's own `Mbuf` code (the straight-line check, `TxBuf::check`, the cut of a refused
//! chain) and its TX queue; only the release is the test's, walking each chain through `next`
//! as `rte_pktmbuf_free_bulk` does, and counting every segment it frees.
//!
//! Chains vary in length, segment count and sizes (empty segments too), offload flags (IP and
//! L4 checksums, VLAN insertion, TSO), `l2_len`/`l3_len`/`l4_len` and `tso_segsz`, and one in
//! three is broken: `pkt_len` off, `nb_segs` above or below the chain (or 0), a cycle, data past
//! its buffer, `data_off` past it. Each chain's fate is worked out here from the rules alone
//! (the README's Safety section): it is sent exactly as the spec says (checksums, tag, TSO
//! segments), refused as a bad mbuf, or dropped as unsendable, and counted; every segment the
//! driver owns (the first `nb_segs` distinct ones) is freed once, the others never.
//!
//! `TX_FUZZ_ROUNDS` (default 300 per configuration, a few seconds) and `TX_FUZZ_SEED` run it
//! longer or elsewhere: `TX_FUZZ_ROUNDS=20000 cargo test --release -p mlx4rs --test tx_fuzz`.

mod traffic;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use dpdk_sys::{self as sys, bits};
use mlx4rs::mbuf::Mbuf;
use mlx4rs::prm::{lso_seg_len, DS_SIZE, LSO_MAX_HEADER};
use mlx4rs::txq::{TxBuf, TxPath, TxQueue};
use mlx4rs::wqe::{TxOffloads, MAX_GATHER_SEGS};
use traffic::*;

thread_local! {
    /// Segment address -> times freed.
    static FREES: RefCell<HashMap<usize, u32>> = RefCell::new(HashMap::new());
}

/// The driver's `Mbuf` in everything but the release.
#[derive(Clone, Copy)]
struct Fz(Mbuf);

impl TxBuf for Fz {
    fn pkt_len(&self) -> u32 {
        self.0.pkt_len()
    }
    fn segs(&self) -> impl Iterator<Item = &[u8]> {
        self.0.segs()
    }
    fn offloads(&self) -> TxOffloads {
        self.0.offloads()
    }
    fn plain(&self) -> Option<&[u8]> {
        self.0.plain()
    }
    fn check(&self) -> Option<u32> {
        self.0.check()
    }
    unsafe fn refuse(&self) {
        // SAFETY: the caller's contract is the same.
        unsafe { self.0.refuse() }
    }
    /// As `rte_pktmbuf_free_bulk`: each chain freed through `next` until NULL.
    unsafe fn free_bulk(bufs: &[Self]) {
        FREES.with(|f| {
            let mut f = f.borrow_mut();
            for b in bufs {
                let mut m = b.0.as_ptr();
                let mut n = 0;
                while !m.is_null() {
                    *f.entry(m as usize).or_insert(0) += 1;
                    n += 1;
                    assert!(n <= 1000, "the release walked a cycle the driver left");
                    // SAFETY: the test's own mbufs, alive until the end of the run.
                    m = unsafe { (*m).next };
                }
            }
        });
    }
}

/// What the rules say becomes of a chain.
#[derive(Debug)]
enum Fate {
    Sent(Vec<Vec<u8>>),
    Bad,
    Dropped,
}

/// One chain: its mbufs (the real segments, in link order, boxed so their addresses hold)
/// and what must happen to it.
struct Chain {
    mbufs: Box<[sys::rte_mbuf]>,
    fate: Fate,
    /// Segments the driver owns: freed exactly once.
    owned: Vec<usize>,
}

const TX_FLAGS: u64 = bits::RTE_MBUF_F_TX_IP_CKSUM
    | bits::RTE_MBUF_F_TX_L4_MASK
    | bits::RTE_MBUF_F_TX_VLAN
    | bits::RTE_MBUF_F_TX_TCP_SEG;

fn tx_offload(l2: u64, l3: u64, l4: u64, tso: u64) -> u64 {
    l2 | l3 << 7 | l4 << 16 | tso << 24
}

/// A fresh, zeroed mbuf (a plain C struct: zero is a valid value of every field).
fn zeroed_mbuf() -> sys::rte_mbuf {
    // SAFETY: rte_mbuf is plain data (integers, pointers, unions of them).
    unsafe { std::mem::zeroed() }
}

/// TSO as the spec says (1.5) and a card does it: `mss`-byte pieces of the payload, each
/// behind the header with its IPv4 length and ID, TCP sequence and flags, and checksums.
fn tso_frames(frame: &[u8], hdr: usize, mss: usize) -> Vec<Vec<u8>> {
    let payload = &frame[hdr..];
    let n = payload.len().div_ceil(mss).max(1);
    let (l3, l4) = (14, 34);
    let id0 = u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]);
    let seq0 = u32::from_be_bytes(frame[l4 + 4..l4 + 8].try_into().unwrap());
    (0..n)
        .map(|i| {
            let chunk = &payload[(i * mss).min(payload.len())..((i + 1) * mss).min(payload.len())];
            let mut b = frame[..hdr].to_vec();
            b.extend_from_slice(chunk);
            let total = b.len();
            b[l3 + 2..l3 + 4].copy_from_slice(&((total - l3) as u16).to_be_bytes());
            b[l3 + 4..l3 + 6].copy_from_slice(&id0.wrapping_add(i as u16).to_be_bytes());
            b[l4 + 4..l4 + 8].copy_from_slice(&seq0.wrapping_add((i * mss) as u32).to_be_bytes());
            if i + 1 < n {
                b[l4 + 13] &= !0x09;
            }
            if i > 0 {
                b[l4 + 13] &= !0x80;
            }
            fill_checksums(&mut b, true, true);
            b
        })
        .collect()
}

/// The fate of the chain starting at `mbufs[0]`, from the rules (not from the driver's code),
/// and the segments the driver owns.
fn judge(mbufs: &[sys::rte_mbuf], inline_max: usize) -> (Fate, Vec<usize>) {
    let head = &mbufs[0];
    let nb = usize::from(head.nb_segs);
    // The first nb_segs distinct segments (at least the head) are the driver's.
    let mut walk: Vec<*const sys::rte_mbuf> = Vec::new();
    let mut seen = HashSet::new();
    let mut m: *const sys::rte_mbuf = head;
    let mut looped = false;
    while !m.is_null() && walk.len() < nb.max(1) {
        if !seen.insert(m as usize) {
            looped = true;
            break;
        }
        walk.push(m);
        // SAFETY: one of this chain's boxed mbufs.
        m = unsafe { (*m).next };
    }
    let owned: Vec<usize> = walk.iter().map(|&p| p as usize).collect();
    // SAFETY: as above.
    let segs: Vec<&sys::rte_mbuf> = walk.iter().map(|&p| unsafe { &*p }).collect();
    let flags = head.ol_flags;
    let plain = flags & TX_FLAGS == 0 && nb == 1;
    let in_bounds = segs
        .iter()
        .all(|s| u32::from(s.data_off) + u32::from(s.data_len) <= u32::from(s.buf_len));
    let sum: u32 = segs.iter().map(|s| u32::from(s.data_len)).sum();
    let shape = nb >= 1 && !looped && segs.len() == nb && m.is_null() && in_bounds;
    if !shape || (!plain && head.pkt_len != sum) {
        return (Fate::Bad, owned);
    }
    let data: Vec<Vec<u8>> = segs
        .iter()
        .map(|s| {
            // SAFETY: in bounds (checked above), inside the test's arena.
            unsafe {
                std::slice::from_raw_parts(
                    (s.buf_addr as *const u8).add(usize::from(s.data_off)),
                    usize::from(s.data_len),
                )
            }
            .to_vec()
        })
        .collect();
    let frame = data.concat();
    let len = frame.len();
    if flags & bits::RTE_MBUF_F_TX_TCP_SEG != 0 {
        let lens = head.tx_offload;
        let f = |shift: u32, n: u32| ((lens >> shift) & ((1 << n) - 1)) as usize;
        let (hdr, mss) = (f(0, 7) + f(7, 9) + f(16, 8), f(24, 16));
        if mss == 0 || hdr == 0 || hdr > LSO_MAX_HEADER || hdr > data[0].len() || hdr == len {
            return (Fate::Bad, owned);
        }
        let pieces = std::iter::once(&data[0][hdr..])
            .chain(data[1..].iter().map(|d| &d[..]))
            .filter(|d| !d.is_empty())
            .count();
        if pieces > MAX_GATHER_SEGS - lso_seg_len(hdr) / DS_SIZE {
            return (Fate::Dropped, owned);
        }
        return (Fate::Sent(tso_frames(&frame, hdr, mss)), owned);
    }
    let nonempty = data.iter().filter(|d| !d.is_empty()).count();
    if len == 0 || (len > inline_max && nonempty > MAX_GATHER_SEGS) {
        return (Fate::Dropped, owned);
    }
    let off = TxOffloads {
        ip_csum: flags & bits::RTE_MBUF_F_TX_IP_CKSUM != 0,
        l4_csum: flags & bits::RTE_MBUF_F_TX_L4_MASK != 0,
        vlan: (flags & bits::RTE_MBUF_F_TX_VLAN != 0).then_some(head.vlan_tci),
        ..TxOffloads::default()
    };
    (Fate::Sent(vec![expected_wire(&frame, off)]), owned)
}

/// A random chain, its data in `arena` from `*at` on.
fn random_chain(rng: &mut Rng, arena: &mut [u8], at: &mut usize, inline_max: usize) -> Chain {
    let size = match rng.below(12) {
        0 => rng.below(4) as usize,
        1..=4 => 1 + rng.below(128) as usize,
        5..=7 => 60 + rng.below(1500) as usize,
        8..=9 => 100 + rng.below(300) as usize,
        _ => 1500 + rng.below(8000) as usize,
    };
    let ip = size >= 54 && rng.below(3) != 0;
    let tcp = ip && rng.below(2) == 0;
    let bytes: Vec<u8> = if ip {
        ipv4_frame(rng, size, tcp)
    } else {
        (0..size).map(|_| rng.next() as u8).collect()
    };
    let tso = tcp && bytes.len() > 54 && rng.below(3) == 0;
    let nsegs = match rng.below(8) {
        0..=3 => 1,
        4..=5 => 2 + rng.below(3) as usize,
        6 => 1 + rng.below(12) as usize,
        _ => 50 + rng.below(25) as usize,
    };
    // Cuts may repeat: empty segments. A TSO header mostly stays in the first segment.
    let mut cuts: Vec<usize> = (1..nsegs)
        .map(|_| rng.below(bytes.len() as u64 + 1) as usize)
        .collect();
    if tso && rng.below(4) != 0 {
        cuts.iter_mut().for_each(|c| *c = (*c).max(54));
    }
    cuts.sort();
    let mut mbufs: Vec<sys::rte_mbuf> = Vec::new();
    let mut prev = 0;
    for &cut in cuts.iter().chain(std::iter::once(&bytes.len())) {
        let piece = &bytes[prev..cut];
        prev = cut;
        let mut m = zeroed_mbuf();
        let headroom = if rng.below(4) == 0 {
            rng.below(200) as usize
        } else {
            128
        };
        let buf_len = (headroom + piece.len() + rng.below(64) as usize).max(64);
        let buf = &mut arena[*at..*at + buf_len];
        buf[headroom..headroom + piece.len()].copy_from_slice(piece);
        m.buf_addr = buf.as_mut_ptr().cast();
        m.buf_len = buf_len as u16;
        m.data_off = headroom as u16;
        m.data_len = piece.len() as u16;
        m.nb_segs = 1;
        *at += buf_len + 64;
        mbufs.push(m);
    }
    let n = mbufs.len();
    let head = &mut mbufs[0];
    head.nb_segs = n as u16;
    head.pkt_len = bytes.len() as u32;
    let mut flags = 0;
    let (mut l2, mut l3, mut l4) = (14, 20, if tcp { 20 } else { 8 });
    if ip {
        if rng.below(2) == 0 {
            flags |= bits::RTE_MBUF_F_TX_IPV4 | bits::RTE_MBUF_F_TX_IP_CKSUM;
        }
        if rng.below(2) == 0 {
            flags |= if rng.below(2) == 0 {
                bits::RTE_MBUF_F_TX_TCP_CKSUM
            } else {
                bits::RTE_MBUF_F_TX_UDP_CKSUM
            };
        }
    }
    if !tso && bytes.len() >= 14 && rng.below(5) == 0 {
        flags |= bits::RTE_MBUF_F_TX_VLAN;
        head.vlan_tci = rng.below(4096) as u16;
    }
    let mut mss = 0;
    if tso {
        flags |= bits::RTE_MBUF_F_TX_TCP_SEG | bits::RTE_MBUF_F_TX_IPV4;
        mss = match rng.below(10) {
            0 => 0,
            1 => 1 + rng.below(8),
            _ => 64 + rng.below(1400),
        };
        if rng.below(10) == 0 {
            (l2, l3, l4) = (0, 0, 0);
        }
    } else if rng.below(3) == 0 {
        // Lengths only TSO reads: anything goes.
        (l2, l3, l4) = (rng.below(128), rng.below(512), rng.below(256));
    }
    head.ol_flags = flags;
    head.tx_offload = tx_offload(l2, l3, l4, mss);
    let mut mbufs = mbufs.into_boxed_slice();
    // Link in order (the box holds the addresses).
    for i in 0..n - 1 {
        let next: *mut sys::rte_mbuf = &mut mbufs[i + 1];
        mbufs[i].next = next;
    }
    // One chain in three is broken, one way.
    if rng.below(3) == 0 {
        let head_only = n == 1;
        match rng.below(7) {
            0 => {
                let d = 1 + rng.below(100) as u32;
                let p = &mut mbufs[0].pkt_len;
                *p = if rng.below(2) == 0 {
                    *p + d
                } else {
                    p.wrapping_sub(d)
                };
            }
            1 => mbufs[0].nb_segs += 1 + rng.below(3) as u16,
            // Shorter than the chain; a plain one-segment packet's `next` is DPDK's to keep
            // NULL (assumed, not checked), so only with offloads.
            2 if !head_only && (n > 2 || flags != 0) => {
                mbufs[0].nb_segs -= 1 + rng.below(n as u64 - 1) as u16;
                mbufs[0].nb_segs = mbufs[0].nb_segs.max(if flags != 0 { 1 } else { 2 });
            }
            3 => mbufs[0].nb_segs = 0,
            4 => {
                // The last segment points back into the chain; nb_segs as long or longer.
                let j = rng.below(n as u64) as usize;
                let back: *mut sys::rte_mbuf = &mut mbufs[j];
                mbufs[n - 1].next = back;
                mbufs[0].nb_segs += rng.below(4) as u16;
                if mbufs[0].nb_segs == 1 && flags == 0 {
                    // A one-segment plain packet: as above.
                    mbufs[n - 1].next = std::ptr::null_mut();
                }
            }
            5 => {
                // Data past the buffer; pkt_len still the sum.
                let s = rng.below(n as u64) as usize;
                let m = &mut mbufs[s];
                let over = 1 + rng.below(3000) as u16;
                let new = (m.buf_len - m.data_off).saturating_add(over);
                mbufs[0].pkt_len = mbufs[0].pkt_len - u32::from(mbufs[s].data_len) + u32::from(new);
                mbufs[s].data_len = new;
            }
            _ => {
                let s = rng.below(n as u64) as usize;
                mbufs[s].data_off = mbufs[s].buf_len + 1 + rng.below(100) as u16;
            }
        }
    }
    let (fate, owned) = judge(&mbufs, inline_max);
    Chain { mbufs, fate, owned }
}

fn run(path: TxPath, inline_max: u16, seed: u64, rounds: usize) {
    FREES.with(|f| f.borrow_mut().clear());
    let mut r = rig(path == TxPath::BlueFlame);
    // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
    let mut q: TxQueue<Fz> = unsafe {
        TxQueue::new(
            &r.dev,
            "tx_fuzz",
            0,
            256,
            tx_config(path, inline_max),
            &[r.mr],
        )
    }
    .unwrap();
    let mut rng = Rng(seed);
    let mut arena = std::mem::take(&mut r.arena);
    let mut at = 0;
    let mut live: Vec<Chain> = Vec::new();
    let mut all_owned: Vec<usize> = Vec::new();
    let mut not_owned: Vec<usize> = Vec::new();
    let (mut expected, mut bad, mut dropped) = (Vec::new(), 0u64, 0u64);
    for _ in 0..rounds {
        if at + (1 << 20) > arena.len() {
            // Arena memory is reused: the device must be done with all of it.
            assert!(q.drain(&r.dev, Duration::from_secs(5)), "{:?}", q.stats());
            at = 0;
        }
        let n = 1 + rng.below(32) as usize;
        let chains: Vec<Chain> = (0..n)
            .map(|_| random_chain(&mut rng, &mut arena, &mut at, usize::from(inline_max)))
            .collect();
        let pkts: Vec<Fz> = chains
            .iter()
            // SAFETY: the chain's head, alive (in `live`) until the end of the run; the
            // driver owns it once taken and the test only counts its release.
            .map(|c| Fz(unsafe { Mbuf::from_raw(c.mbufs.as_ptr().cast_mut()) }))
            .collect();
        let mut done = 0;
        let mut refused = 0;
        while done < n {
            // SAFETY: the test's own mbufs, alive to the end of the run; their release only counts it.
            let taken = unsafe { q.burst(&pkts[done..]) };
            done += taken;
            refused = if taken == 0 { refused + 1 } else { 0 };
            assert!(refused < 5, "stuck: {:?}", q.stats());
            assert!(!q.failed(), "an error completion: {:?}", r.hca.counters());
            if taken == 0 || rng.below(4) == 0 {
                r.hca.step();
            }
        }
        for c in chains {
            match &c.fate {
                Fate::Sent(frames) => expected.extend(frames.iter().cloned()),
                Fate::Bad => bad += 1,
                Fate::Dropped => dropped += 1,
            }
            all_owned.extend(&c.owned);
            let owned: HashSet<usize> = c.owned.iter().copied().collect();
            not_owned.extend(
                c.mbufs
                    .iter()
                    .map(|m| m as *const _ as usize)
                    .filter(|a| !owned.contains(a)),
            );
            live.push(c);
        }
    }
    assert!(q.drain(&r.dev, Duration::from_secs(5)), "{:?}", q.stats());
    r.hca.step();
    q.complete();
    let st = q.stats();
    q.destroy(&r.dev);
    let wire = r.wire.lock().unwrap().clone();
    let first_diff = wire.iter().zip(&expected).position(|(w, e)| w != e);
    assert!(
        first_diff.is_none() && wire.len() == expected.len(),
        "seed {seed:#x} {path:?} inline {inline_max}: wire {} frames, expected {}; first \
         difference at {first_diff:?}; {st:?}",
        wire.len(),
        expected.len()
    );
    assert_eq!(
        st.bad_mbufs, bad,
        "seed {seed:#x}: bad mbufs counted: {st:?}"
    );
    assert_eq!(st.errors, bad + dropped, "seed {seed:#x}: oerrors: {st:?}");
    assert_eq!(st.error_cqes, 0);
    FREES.with(|f| {
        let f = f.borrow();
        for a in &all_owned {
            assert_eq!(
                f.get(a),
                Some(&1),
                "seed {seed:#x}: an owned segment freed once"
            );
        }
        for a in &not_owned {
            assert_eq!(
                f.get(a),
                None,
                "seed {seed:#x}: a segment past nb_segs freed"
            );
        }
        assert_eq!(f.len(), all_owned.len(), "nothing else freed");
    });
    eprintln!(
        "{path:?} inline {inline_max}: {rounds} rounds, {} chains sent ({} frames), {bad} \
         refused as bad, {dropped} dropped",
        st.packets,
        wire.len()
    );
    drop(live);
    r.arena = arena;
}

fn rounds() -> usize {
    std::env::var("TX_FUZZ_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

fn seed(base: u64) -> u64 {
    std::env::var("TX_FUZZ_SEED")
        .ok()
        .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok())
        .unwrap_or(base)
}

#[test]
fn fuzzed_chains_are_sent_as_specified_or_refused_doorbell() {
    run(TxPath::Doorbell, 104, seed(0x5afe_0001), rounds());
}

#[test]
fn fuzzed_chains_are_sent_as_specified_or_refused_blueflame() {
    run(TxPath::BlueFlame, 104, seed(0x5afe_0002), rounds());
}

#[test]
fn fuzzed_chains_without_inlining() {
    run(TxPath::Doorbell, 0, seed(0x5afe_0003), rounds());
}

#[test]
fn fuzzed_chains_with_long_inline_wqes() {
    run(TxPath::BlueFlame, 928, seed(0x5afe_0004), rounds());
}
