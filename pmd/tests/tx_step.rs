//! The TX path against the software HCA in step mode, without EAL: random packets (sizes,
//! segment counts, offloads, burst sizes, many ring wraps) must reach the wire byte for byte,
//! in order, with every buffer freed exactly once, and the doorbell/BlueFlame choice per burst
//! must follow the rules.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use mlx4rs::devargs::BfMode;
use mlx4rs::hca::{Hca, HcaConfig, Wire};
use mlx4rs::hw::soft::Soft;
use mlx4rs::hw::{Device, QueueState};
use mlx4rs::mem::{DmaRange, MemSource, Mr};
use mlx4rs::mmio::Copy64;
use mlx4rs::txq::{TxBuf, TxConfig, TxPath, TxQueue};
use mlx4rs::wc;
use mlx4rs::wqe::{self, TxOffloads};

// ---- test packet buffers -------------------------------------------------------------

#[derive(Clone, Copy)]
struct Seg {
    ptr: *const u8,
    len: usize,
}

/// A packet: segments inside the registered arena. Copy + Default as the queue needs.
#[derive(Clone, Copy)]
struct Pkt {
    id: u32,
    segs: *const Seg,
    nsegs: usize,
    len: u32,
    off: TxOffloads,
}

impl Default for Pkt {
    fn default() -> Self {
        Pkt {
            id: u32::MAX,
            segs: std::ptr::null(),
            nsegs: 0,
            len: 0,
            off: TxOffloads::default(),
        }
    }
}

thread_local! {
    static FREED: RefCell<HashMap<u32, u32>> = RefCell::new(HashMap::new());
}

impl TxBuf for Pkt {
    fn pkt_len(&self) -> u32 {
        self.len
    }
    fn segs(&self) -> impl Iterator<Item = &[u8]> {
        // SAFETY: test packets point into buffers that outlive the queue.
        let segs = unsafe { std::slice::from_raw_parts(self.segs, self.nsegs) };
        segs.iter()
            // SAFETY: as above, each segment lies in a buffer that outlives the queue.
            .map(|s| unsafe { std::slice::from_raw_parts(s.ptr, s.len) })
    }
    fn offloads(&self) -> TxOffloads {
        self.off
    }
    fn free_bulk(bufs: &[Self]) {
        FREED.with(|f| {
            let mut f = f.borrow_mut();
            for b in bufs {
                assert_ne!(b.id, u32::MAX, "freed an empty slot");
                *f.entry(b.id).or_insert(0) += 1;
            }
        });
    }
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

// ---- expected frames: what a NIC puts on the wire --------------------------------------

fn csum(data: &[u8], init: u32) -> u16 {
    let mut s = init;
    for c in data.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// Ethernet + IPv4 + UDP/TCP frame of `total` bytes, checksums zeroed.
fn ipv4_frame(rng: &mut Rng, total: usize, tcp: bool) -> Vec<u8> {
    let l4 = if tcp { 20 } else { 8 };
    let total = total.max(14 + 20 + l4);
    let mut f: Vec<u8> = (0..total).map(|_| rng.next() as u8).collect();
    f[0] &= 0xfe;
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip_len = (total - 14) as u16;
    f[14] = 0x45;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[20..22].copy_from_slice(&[0, 0]); // no fragmentation
    f[22] = 64;
    f[23] = if tcp { 6 } else { 17 };
    f[24..26].copy_from_slice(&[0, 0]);
    if tcp {
        f[46] = 0x50; // data offset 5
        f[50..52].copy_from_slice(&[0, 0]);
    } else {
        f[38..40].copy_from_slice(&((total - 34) as u16).to_be_bytes());
        f[40..42].copy_from_slice(&[0, 0]);
    }
    f
}

fn fill_checksums(f: &mut [u8], ip: bool, l4: bool) {
    if ip {
        let c = csum(&f[14..34], 0);
        f[24..26].copy_from_slice(&c.to_be_bytes());
    }
    if l4 {
        let proto = f[23];
        let seg_len = f.len() - 34;
        let mut pseudo = 0u32;
        for c in f[26..34].chunks(2) {
            pseudo += u32::from(u16::from_be_bytes([c[0], c[1]]));
        }
        pseudo += u32::from(proto) + seg_len as u32;
        let at = if proto == 6 { 34 + 16 } else { 34 + 6 };
        f[at..at + 2].copy_from_slice(&[0, 0]);
        let mut c = csum(&f[34..], pseudo);
        if proto == 17 && c == 0 {
            c = 0xffff;
        }
        f[at..at + 2].copy_from_slice(&c.to_be_bytes());
    }
}

fn expected_wire(pkt: &[u8], off: TxOffloads) -> Vec<u8> {
    let mut f = pkt.to_vec();
    fill_checksums(&mut f, off.ip_csum, off.l4_csum);
    if let Some(tci) = off.vlan {
        let mut t = f[..12].to_vec();
        t.extend_from_slice(&[0x81, 0x00]);
        t.extend_from_slice(&tci.to_be_bytes());
        t.extend_from_slice(&f[12..]);
        f = t;
    }
    f
}

// ---- harness ---------------------------------------------------------------------------

static NAME: AtomicU32 = AtomicU32::new(0);

struct Rig {
    hca: Hca,
    /// The driver's view of `hca`: it owns the queues' memory.
    dev: Soft,
    wire: Arc<Mutex<Vec<Vec<u8>>>>,
    arena: Vec<u8>,
    mr: Mr,
}

fn rig(wc: bool) -> Rig {
    let hca = Hca::open(HcaConfig {
        wc,
        threaded: false,
        name: format!("tx_step{}", NAME.fetch_add(1, Ordering::Relaxed)),
        ..HcaConfig::default()
    })
    .unwrap();
    let wire = Arc::new(Mutex::new(Vec::new()));
    let w = wire.clone();
    hca.set_wire(Wire::Sink(Box::new(move |f: &[u8]| {
        w.lock().unwrap().push(f.to_vec())
    })))
    .unwrap();
    hca.start().unwrap();
    hca.set_port_up(true);
    let arena = vec![0u8; 8 << 20];
    let (s, e) = (
        arena.as_ptr() as usize,
        arena.as_ptr() as usize + arena.len(),
    );
    let dev = Soft::new(hca.clone(), MemSource::Heap);
    // SAFETY: the arena lives in the rig next to the device, and the rig keeps it (moving a
    // Vec does not move its heap buffer) until both are dropped.
    let mr = dev.reg_mr(unsafe { DmaRange::new(s, e) }).unwrap();
    Rig {
        hca,
        dev,
        wire,
        arena,
        mr,
    }
}

fn config(path: TxPath, inline_max: u16) -> TxConfig {
    TxConfig {
        inline_max,
        path,
        copy: Copy64::best(),
        fast_free: false,
        source: MemSource::Heap,
    }
}

/// A packet description: bytes split into segments, offloads, and the expected frame.
struct Case {
    bytes: Vec<u8>,
    cuts: Vec<usize>,
    off: TxOffloads,
}

fn random_case(rng: &mut Rng) -> Case {
    let size = match rng.below(10) {
        0..=3 => 1 + rng.below(128) as usize,
        4..=6 => 60 + rng.below(1500) as usize,
        7..=8 => 100 + rng.below(300) as usize,
        _ => 1500 + rng.below(8000) as usize,
    };
    let mut off = TxOffloads::default();
    let bytes = if size >= 54 && rng.below(2) == 0 {
        let tcp = rng.below(2) == 0;
        off.ip_csum = rng.below(2) == 0;
        off.l4_csum = rng.below(2) == 0;
        ipv4_frame(rng, size, tcp)
    } else {
        (0..size).map(|_| rng.next() as u8).collect()
    };
    if bytes.len() >= 14 && rng.below(4) == 0 {
        off.vlan = Some(rng.below(4096) as u16);
    }
    let nsegs = match rng.below(4) {
        0 | 1 => 1,
        2 => 1 + rng.below(4) as usize,
        _ => 1 + rng.below(40) as usize,
    }
    .min(bytes.len());
    let mut cuts: Vec<usize> = (1..nsegs)
        .map(|_| 1 + rng.below(bytes.len() as u64 - 1) as usize)
        .collect();
    cuts.sort();
    cuts.dedup();
    Case { bytes, cuts, off }
}

/// Lays out cases in the arena and builds the packets (segment tables live in `segtab`).
fn build(arena: &mut [u8], cases: &[Case], segtab: &mut Vec<Vec<Seg>>, first_id: u32) -> Vec<Pkt> {
    build_at(arena, &mut 0, cases, segtab, first_id)
}

/// As `build`, from arena offset `*at` on (advanced past what was written).
fn build_at(
    arena: &mut [u8],
    at: &mut usize,
    cases: &[Case],
    segtab: &mut Vec<Vec<Seg>>,
    first_id: u32,
) -> Vec<Pkt> {
    let mut pkts = Vec::new();
    segtab.clear();
    for c in cases {
        let mut segs = Vec::new();
        let mut prev = 0;
        for &cut in c.cuts.iter().chain(std::iter::once(&c.bytes.len())) {
            let piece = &c.bytes[prev..cut];
            arena[*at..*at + piece.len()].copy_from_slice(piece);
            segs.push(Seg {
                ptr: arena[*at..].as_ptr(),
                len: piece.len(),
            });
            *at += piece.len() + 64; // a gap: segments are not contiguous
            prev = cut;
        }
        segtab.push(segs);
    }
    for (i, c) in cases.iter().enumerate() {
        pkts.push(Pkt {
            id: first_id + i as u32,
            segs: segtab[i].as_ptr(),
            nsegs: segtab[i].len(),
            len: c.bytes.len() as u32,
            off: c.off,
        });
    }
    pkts
}

fn wqe_bytes(c: &Case, inline_max: u16) -> usize {
    if c.bytes.len() <= usize::from(inline_max) {
        wqe::inline_wqe_bytes(c.bytes.len())
    } else {
        wqe::gather_wqe_bytes(c.cuts.len() + 1)
    }
}

fn run_random(path: TxPath, wc: bool, inline_max: u16, seed: u64, rounds: usize) {
    FREED.with(|f| f.borrow_mut().clear());
    let mut r = rig(wc);
    let mut rng = Rng(seed);
    let mut q: TxQueue<Pkt> =
        TxQueue::new(&r.dev, "tx_step", 0, 256, config(path, inline_max), &[r.mr]).unwrap();
    assert_eq!(q.path(), path);
    let mut expected = Vec::new();
    let mut segtab = Vec::new();
    let mut next_id = 0u32;
    let (mut bursts, mut bf_expected, mut db_expected) = (0u64, 0u64, 0u64);
    let half = (r.hca.caps().bf_reg_size / 2) as usize;
    let mut at = 0;
    // Segment tables of packets possibly still in flight.
    let mut keep: Vec<Vec<Vec<Seg>>> = Vec::new();
    for _ in 0..rounds {
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
        while done < n {
            let taken = q.burst(&pkts[done..]);
            if taken > 0 {
                bursts += 1;
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
            // Let the device run, but often not at all, so that the ring fills.
            if rng.below(12) == 0 || taken == 0 {
                r.hca.step();
            }
        }
        r.arena = arena;
    }
    r.hca.step();
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
    assert_eq!(q.burst(&pkts[..1]), 1);
    r.hca.step();
    // The device forgets the memory the queue still believes registered: the next gather WQE
    // points at memory it may not touch.
    r.hca.dereg_mr(r.mr.lkey).unwrap();
    let qpn = q.qpn();
    assert_eq!(q.burst(&pkts[1..2]), 1);
    r.hca.step();
    assert_eq!(r.dev.sq_state(qpn).unwrap(), QueueState::Error);
    // The next burst sees the error CQE and takes nothing; recovery (the control path's job,
    // with the device in hand) gives it a fresh queue.
    assert_eq!(q.burst(&pkts[2..3]), 0, "a failed queue takes nothing");
    assert!(q.failed());
    let st = q.stats();
    assert_eq!(st.error_cqes, 1, "{st:?}");
    assert!(q.recover(&r.dev));
    assert!(!q.failed());
    assert_eq!(
        r.dev.sq_state(q.qpn()).unwrap(),
        QueueState::Ready,
        "a fresh queue replaced the failed one"
    );
    assert_eq!(
        r.dev.sq_state(qpn).map_err(|_| ()),
        Err(()),
        "the failed queue is gone"
    );
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
    assert_eq!(q.burst(&pkts[2..3]), 1);
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
    assert_eq!(q.burst(&[p]), 1, "taken: it can never be sent");
    let st = q.stats();
    assert_eq!((st.errors, st.packets, st.doorbells), (1, 0, 0));
    FREED.with(|f| assert_eq!(f.borrow().get(&1), Some(&1)));
}
