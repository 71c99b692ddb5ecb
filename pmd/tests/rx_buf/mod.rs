//! The RX tests' buffer: an index into a thread's arena, the pool a stack of free indexes, and
//! what an mbuf would record once handed up. One type for every RX test binary; each thread
//! has its own pool, so tests running in parallel do not share buffers. And the frames the
//! tests send: one inline TX packet each.
#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::mem::MaybeUninit;

use mlx4rs::rxq::{RxBuf, RxMeta};
use mlx4rs::txq::TxBuf;
use mlx4rs::wqe::TxOffloads;

/// Buffers in a thread's arena.
pub const NBUFS: usize = 4096;

/// What the "mbuf" records.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rec {
    pub len: u32,
    pub next: Option<u32>,
    pub pkt_len: u32,
    pub nb_segs: u16,
    pub port: u16,
    pub meta: RxMeta,
}

pub struct Pool {
    /// Bytes per buffer and the headroom before the data.
    pub buf: usize,
    pub headroom: usize,
    pub arena: Vec<u8>,
    pub free: Vec<u32>,
    pub rec: Vec<Rec>,
    /// Allocations fail while set.
    pub dry: bool,
}

thread_local! {
    static GEOMETRY: Cell<(usize, usize)> = const { Cell::new((512, 64)) };
    static POOL: RefCell<Option<Pool>> = const { RefCell::new(None) };
}

/// Sets this thread's buffer size and headroom (default 512 and 64): before its pool is first
/// used, or to what it has.
pub fn set_geometry(buf: usize, headroom: usize) {
    POOL.with(|p| {
        if let Some(p) = &*p.borrow() {
            assert_eq!(
                (p.buf, p.headroom),
                (buf, headroom),
                "the pool is in use already"
            );
        }
    });
    GEOMETRY.with(|g| g.set((buf, headroom)));
}

/// Runs `f` on this thread's pool, made on first use.
pub fn with_pool<R>(f: impl FnOnce(&mut Pool) -> R) -> R {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let p = p.get_or_insert_with(|| {
            let (buf, headroom) = GEOMETRY.with(Cell::get);
            Pool {
                buf,
                headroom,
                arena: vec![0; NBUFS * buf],
                free: (0..NBUFS as u32).rev().collect(),
                rec: vec![Rec::default(); NBUFS],
                dry: false,
            }
        });
        f(p)
    })
}

/// Buffers in the pool.
pub fn free_count() -> usize {
    with_pool(|p| p.free.len())
}

/// `[start, end)` of the first `n` buffers of the arena.
pub fn arena_range(n: usize) -> (usize, usize) {
    with_pool(|p| {
        let a = p.arena.as_ptr() as usize;
        (a, a + n * p.buf)
    })
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Buf(pub u32);

impl Buf {
    pub fn rec(self) -> Rec {
        with_pool(|p| p.rec[self.0 as usize])
    }

    /// The segment's bytes (`len` of them, from the headroom on).
    pub fn data(self) -> Vec<u8> {
        with_pool(|p| {
            let at = self.0 as usize * p.buf + p.headroom;
            p.arena[at..at + p.rec[self.0 as usize].len as usize].to_vec()
        })
    }
}

// SAFETY: alloc_bulk writes every entry when it returns true.
unsafe impl RxBuf for Buf {
    type Pool = ();
    fn alloc_bulk(_: (), out: &mut [MaybeUninit<Self>]) -> bool {
        with_pool(|p| {
            if p.dry || p.free.len() < out.len() {
                return false;
            }
            for o in out.iter_mut() {
                o.write(Buf(p.free.pop().unwrap()));
            }
            true
        })
    }
    unsafe fn free_bulk(bufs: &[Self]) {
        with_pool(|p| {
            for b in bufs {
                assert!(!p.free.contains(&b.0), "buffer {} freed twice", b.0);
                p.free.push(b.0);
            }
        })
    }
    fn data_area(&self) -> (usize, u32) {
        with_pool(|p| {
            let base = p.arena.as_ptr() as usize;
            (
                base + self.0 as usize * p.buf + p.headroom,
                (p.buf - p.headroom) as u32,
            )
        })
    }
    fn set_segment(&mut self, len: u32, next: Option<Self>) {
        with_pool(|p| {
            let r = &mut p.rec[self.0 as usize];
            r.len = len;
            r.next = next.map(|n| n.0);
        })
    }
    fn set_packet(&mut self, pkt_len: u32, nb_segs: u16, port: u16, meta: &RxMeta) {
        with_pool(|p| {
            let r = &mut p.rec[self.0 as usize];
            (r.pkt_len, r.nb_segs, r.port, r.meta) = (pkt_len, nb_segs, port, *meta);
        })
    }
    // set_single stays the default: the two calls above, which the tests record apart.
}

/// A one-segment inline TX packet: a frame's address and length.
#[derive(Clone, Copy)]
pub struct Pkt(pub *const u8, pub usize);

impl TxBuf for Pkt {
    fn pkt_len(&self) -> u32 {
        self.1 as u32
    }
    fn segs(&self) -> impl Iterator<Item = &[u8]> {
        // SAFETY: the tests keep the frames alive across the burst.
        std::iter::once(unsafe { std::slice::from_raw_parts(self.0, self.1) })
    }
    fn offloads(&self) -> TxOffloads {
        TxOffloads::default()
    }
    fn plain(&self) -> Option<&[u8]> {
        self.segs().next()
    }
    unsafe fn free_bulk(_: &[Self]) {}
}
