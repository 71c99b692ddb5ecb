//! The writer of one unpublished WQE's bytes, bounds-checked against its TXBBs.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};

use mlx4_prm::{fence_size, srcrb, CtrlSeg, MAX_WQE_DS, TXBB_SHIFT};

/// Exclusive access to the bytes of one unpublished WQE except dwords 0 and 1 of its first
/// TXBB, which are only ever stored atomically (the device polls them). Offsets count from the
/// WQE's start; every store is bounds-checked against the WQE's whole TXBBs, whose number is
/// `TXBBS` when known at compile time (the straight-line path: the checks fold away), or
/// given at run time with `TXBBS` 0.
pub struct WqeMut<'a, const TXBBS: usize = 0> {
    base: *mut u8,
    len: usize,
    _ring: PhantomData<&'a mut [u8]>,
}

/// First byte a [`WqeMut`] writes with plain stores.
const PLAIN_FROM: usize = 8;

impl<'a> WqeMut<'a> {
    /// This WQE as one of `T` TXBBs, known at compile time. Panics if it is not that size.
    pub fn fixed<const T: usize>(self) -> WqeMut<'a, T> {
        assert_eq!(self.len, T << TXBB_SHIFT);
        WqeMut::new(self.base, self.len)
    }
}

impl<const TXBBS: usize> WqeMut<'_, TXBBS> {
    /// `base`: a WQE's first TXBB, `len` bytes of whole TXBBs inside the ring.
    #[inline(always)]
    pub(super) fn new(base: *mut u8, len: usize) -> Self {
        WqeMut {
            base,
            len,
            _ring: PhantomData,
        }
    }

    /// Bytes in the WQE's TXBBs.
    #[inline(always)]
    pub fn len(&self) -> usize {
        if TXBBS == 0 {
            self.len
        } else {
            TXBBS << TXBB_SHIFT
        }
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline(always)]
    fn span(&self, off: usize, n: usize) -> *mut u8 {
        if !(off >= PLAIN_FROM && off <= self.len() && n <= self.len() - off) {
            wqe_overrun();
        }
        // SAFETY: inside the WQE (asserted).
        unsafe { self.base.add(off) }
    }

    /// Bytes 4-15 of the control segment from `ctrl` (its bytes 0-3, the owner word, are
    /// published on their own). Bytes 4-7 (VLAN, size) are stored atomically.
    #[inline(always)]
    pub fn put_ctrl(&mut self, ctrl: &[u8; 16]) {
        let dword1 = u32::from_ne_bytes([ctrl[4], ctrl[5], ctrl[6], ctrl[7]]);
        // SAFETY: bytes 4..8 of the WQE's first TXBB: 4-byte aligned, reached only atomically.
        unsafe { AtomicU32::from_ptr(self.base.add(4).cast()) }.store(dword1, Ordering::Relaxed);
        let rest: [u8; 8] = ctrl[8..16].try_into().expect("8 bytes");
        let p = self.span(8, 8);
        // SAFETY: 8 bytes inside the WQE (span); unaligned store of a plain array.
        unsafe { p.cast::<[u8; 8]>().write_unaligned(rest) };
    }

    /// Hands the WQE to the device: as [`crate::ring::SqRing::publish`], through the writer
    /// that made it, whose address the caller holds already (the ring's is not derived again
    /// behind the writer's barriers).
    #[inline(always)]
    pub fn publish(self, owner_opcode: u32) {
        // SAFETY: dword 0 of the WQE's first TXBB: 4-byte aligned, reached only atomically.
        unsafe { AtomicU32::from_ptr(self.base.cast()) }
            .store(owner_opcode.to_be(), Ordering::Release);
    }

    /// Bytes 4-7 of the control segment (VLAN fields and size), as stored: the word the
    /// device reads beside the owner word, stored atomically.
    #[inline(always)]
    pub fn put_dword1(&mut self, dword1: u32) {
        // SAFETY: bytes 4..8 of the WQE's first TXBB: 4-byte aligned, reached only atomically.
        unsafe { AtomicU32::from_ptr(self.base.add(4).cast()) }.store(dword1, Ordering::Relaxed);
    }

    /// Makes this a NOP covering `txbbs` TXBBs: ring padding up to the ring's end (the
    /// poster's wrap), or with `signaled` a completion request. Only the control segment's
    /// bytes 4-15 (its size, and the flags every send carries); the owner word with the NOP
    /// opcode is published apart, as for every WQE. Here rather than with the send WQE writers
    /// (`wqe`), which build on this module: padding is the ring's business.
    pub fn put_nop(&mut self, txbbs: u32, signaled: bool) {
        let ds = (txbbs * 4).min(u32::from(MAX_WQE_DS)) as u8;
        let mut b = [0u8; 16];
        let mut ctrl = CtrlSeg::new_unchecked(&mut b[..]);
        // As on every send of a RAW_PACKET QP: the solicit bit means "no ICRC".
        let mut flags = srcrb::SOLICIT;
        if signaled {
            flags |= srcrb::CQ_UPDATE;
        }
        ctrl.set_fence_size(ds & fence_size::DS_MASK);
        ctrl.set_srcrb_flags(flags);
        self.put_ctrl(&b);
    }

    /// `v` big-endian at `off`.
    #[inline(always)]
    pub fn put_be32(&mut self, off: usize, v: u32) {
        let p = self.span(off, 4);
        // SAFETY: 4 bytes inside the WQE (span).
        unsafe { p.cast::<[u8; 4]>().write_unaligned(v.to_be_bytes()) };
    }

    /// The big-endian word at `off`, as this writer left it.
    #[inline(always)]
    pub fn get_be32(&self, off: usize) -> u32 {
        let p = self.span(off, 4);
        // SAFETY: 4 bytes inside the WQE (span), which the device does not read before it is
        // published.
        u32::from_be_bytes(unsafe { p.cast::<[u8; 4]>().read_unaligned() })
    }

    /// `src` at `off`, any length.
    #[inline(always)]
    pub fn put_bytes(&mut self, off: usize, src: &[u8]) {
        let p = self.span(off, src.len());
        // SAFETY: inside the WQE (span); `src` is driver or packet memory, never the ring
        // range being written.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
    }

    /// `src`, a constant size, at `off`.
    #[inline(always)]
    pub fn put_array<const N: usize>(&mut self, off: usize, src: &[u8; N]) {
        let p = self.span(off, N);
        // SAFETY: N bytes inside the WQE (span).
        unsafe { p.cast::<[u8; N]>().write_unaligned(*src) };
    }

    /// `src` (at most 64 bytes) at `off`, by at most two fixed-size moves that may overlap:
    /// no loop and no library call, for the straight-line path. 16 to 32 bytes are tested
    /// first, with one compare: what follows the first chunk of a 60- or 64-byte frame.
    #[inline(always)]
    pub fn put_small(&mut self, off: usize, src: &[u8]) {
        let n = src.len();
        assert!(n <= 64);
        let d = self.span(off, n);
        let s = src.as_ptr();
        // SAFETY: every move below reads inside `src` and writes inside `[d, d + n)`, which
        // lies in the WQE (span): for n in [K, 2K] the moves of K bytes at 0 and n - K do.
        unsafe {
            if n.wrapping_sub(16) <= 16 {
                mov::<16>(d, s);
                mov::<16>(d.add(n - 16), s.add(n - 16));
                return;
            }
            // Out of the straight line, so that the case above falls through to what follows.
            std::hint::cold_path();
            if n >= 32 {
                mov::<32>(d, s);
                mov::<32>(d.add(n - 32), s.add(n - 32));
            } else if n >= 16 {
                mov::<16>(d, s);
                mov::<16>(d.add(n - 16), s.add(n - 16));
            } else if n >= 8 {
                mov::<8>(d, s);
                mov::<8>(d.add(n - 8), s.add(n - 8));
            } else if n >= 4 {
                mov::<4>(d, s);
                mov::<4>(d.add(n - 4), s.add(n - 4));
            } else if n >= 2 {
                mov::<2>(d, s);
                mov::<2>(d.add(n - 2), s.add(n - 2));
            } else if n == 1 {
                *d = *s;
            }
        }
    }
}

impl<const TXBBS: usize> WqeMut<'_, TXBBS> {
    /// `src` (16 to 32 bytes) at `off` by two 16-byte moves that may overlap: `put_small`'s
    /// first case alone, for a caller that knows the length's class (its test folds into
    /// the caller's).
    #[inline(always)]
    pub fn put_16_to_32(&mut self, off: usize, src: &[u8]) {
        let n = src.len();
        if n.wrapping_sub(16) > 16 {
            wqe_overrun();
        }
        let d = self.span(off, n);
        let s = src.as_ptr();
        // SAFETY: for n in [16, 32] (tested above) the moves of 16 bytes at 0 and n - 16 read
        // inside `src` and write inside `[d, d + n)`, which lies in the WQE (span).
        unsafe {
            mov::<16>(d, s);
            mov::<16>(d.add(n - 16), s.add(n - 16));
        }
    }
}

/// The one panic on the TX path: a write outside its WQE means the queue sized a WQE for a
/// length it did not check, a broken invariant of ours (lengths are checked once, before a
/// WQE is sized: `TxBuf::check`, `TxBuf::plain`), never a bad mbuf.
#[cold]
#[inline(never)]
fn wqe_overrun() -> ! {
    panic!("broken invariant: a write outside its WQE (a length the TX queue did not check)")
}

/// # Safety
/// `s` readable and `d` writable for `N` bytes.
#[inline(always)]
unsafe fn mov<const N: usize>(d: *mut u8, s: *const u8) {
    // SAFETY: the caller's contract; unaligned accesses of a byte array.
    unsafe {
        d.cast::<[u8; N]>()
            .write_unaligned(s.cast::<[u8; N]>().read_unaligned())
    }
}
