//! The random TX traffic of `tx_step` and the soak: packets of random sizes, segment counts
//! and offloads laid out in a registered arena, the frames a NIC must put on the wire for
//! them, and a software HCA in step mode whose wire is a sink to compare against. Every test
//! binary that uses it takes what it needs.
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

use mlx4rs::hca::{HcaConfig, Wire};
use mlx4rs::hw::Device;
use mlx4rs::mem::{DmaRange, Mr};
use mlx4rs::txq::TxBuf;
use mlx4rs::wqe::{self, TxOffloads};
pub use testkit::{tx_config, Scratch};

/// `mlx4rs-testkit`, compiled into these tests as a module of theirs: the driver's own tests
/// cannot depend on a package that depends on the driver (cargo refuses the cycle).
#[path = "../../testkit/src/lib.rs"]
pub mod testkit;

// ---- test packet buffers -------------------------------------------------------------

#[derive(Clone, Copy)]
pub struct Seg {
    pub ptr: *const u8,
    pub len: usize,
}

/// A packet: segments inside the registered arena. Copy + Default as the queue needs.
#[derive(Clone, Copy)]
pub struct Pkt {
    pub id: u32,
    pub segs: *const Seg,
    pub nsegs: usize,
    pub len: u32,
    pub off: TxOffloads,
}

thread_local! {
    pub static FREED: RefCell<HashMap<u32, u32>> = RefCell::new(HashMap::new());
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
    fn plain(&self) -> Option<&[u8]> {
        (self.nsegs == 1 && self.off == TxOffloads::default()).then(|| self.segs().next().unwrap())
    }
    unsafe fn free_bulk(bufs: &[Self]) {
        FREED.with(|f| {
            let mut f = f.borrow_mut();
            for b in bufs {
                assert_ne!(b.id, u32::MAX, "freed an empty slot");
                *f.entry(b.id).or_insert(0) += 1;
            }
        });
    }
}

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// ---- expected frames: what a NIC puts on the wire --------------------------------------

pub fn csum(data: &[u8], init: u32) -> u16 {
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
pub fn ipv4_frame(rng: &mut Rng, total: usize, tcp: bool) -> Vec<u8> {
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

pub fn fill_checksums(f: &mut [u8], ip: bool, l4: bool) {
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

pub fn expected_wire(pkt: &[u8], off: TxOffloads) -> Vec<u8> {
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

pub static NAME: AtomicU32 = AtomicU32::new(0);

pub struct Rig {
    /// The software HCA in step mode on a sink wire, and the driver's view of it.
    pub scratch: Scratch,
    pub wire: Arc<Mutex<Vec<Vec<u8>>>>,
    pub arena: Vec<u8>,
    pub mr: Mr,
}

impl std::ops::Deref for Rig {
    type Target = Scratch;
    fn deref(&self) -> &Scratch {
        &self.scratch
    }
}

pub fn rig(wc: bool) -> Rig {
    let wire = Arc::new(Mutex::new(Vec::new()));
    let w = wire.clone();
    let sink = Wire::Sink(Box::new(move |f: &[u8]| w.lock().unwrap().push(f.to_vec())));
    let cfg = HcaConfig {
        wc,
        ..HcaConfig::default()
    };
    let scratch = Scratch::open("tx_step", cfg, sink).unwrap();
    let arena = vec![0u8; 8 << 20];
    let (s, e) = (
        arena.as_ptr() as usize,
        arena.as_ptr() as usize + arena.len(),
    );
    // SAFETY: the arena lives in the rig next to the device, and the rig keeps it (moving a
    // Vec does not move its heap buffer) until both are dropped.
    let mr = scratch.dev.reg_mr(unsafe { DmaRange::new(s, e) }).unwrap();
    Rig {
        scratch,
        wire,
        arena,
        mr,
    }
}

/// A packet description: bytes split into segments, offloads, and the expected frame.
pub struct Case {
    pub bytes: Vec<u8>,
    pub cuts: Vec<usize>,
    pub off: TxOffloads,
}

pub fn random_case(rng: &mut Rng) -> Case {
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

/// `n` plain packets of `len` random bytes (one segment, no offload) laid out in the rig's
/// arena: their cases, and the packets (segment tables live in `segtab`).
pub fn plain_packets(
    r: &mut Rig,
    rng: &mut Rng,
    (n, len): (usize, usize),
    segtab: &mut Vec<Vec<Seg>>,
) -> (Vec<Case>, Vec<Pkt>) {
    let cases: Vec<Case> = (0..n)
        .map(|_| Case {
            bytes: (0..len).map(|_| rng.next() as u8).collect(),
            cuts: vec![],
            off: TxOffloads::default(),
        })
        .collect();
    let mut arena = std::mem::take(&mut r.arena);
    let pkts = build(&mut arena, &cases, segtab, 0);
    r.arena = arena;
    (cases, pkts)
}

/// Lays out cases in the arena and builds the packets (segment tables live in `segtab`).
pub fn build(
    arena: &mut [u8],
    cases: &[Case],
    segtab: &mut Vec<Vec<Seg>>,
    first_id: u32,
) -> Vec<Pkt> {
    build_at(arena, &mut 0, cases, segtab, first_id)
}

/// As `build`, from arena offset `*at` on (advanced past what was written).
pub fn build_at(
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

pub fn wqe_bytes(c: &Case, inline_max: u16) -> usize {
    if c.bytes.len() <= usize::from(inline_max) {
        wqe::inline_wqe_bytes(c.bytes.len())
    } else {
        wqe::gather_wqe_bytes(c.cuts.len() + 1)
    }
}
