//! A stretch of the send ring checked once and read word by word: the WQEs of one run lie
//! whole in it, so the run pays one bounds check, not one per load.
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::dma::HostMem;

/// `count` WQE slots of `stride` bytes of ring memory from a 4-aligned start, `stride` a
/// multiple of 4 and at least 16 (a control segment).
///
/// Invariant: `[p, p + count * stride)` lies inside the `HostMem` it was made from, which the
/// borrow keeps alive (the view's own invariant: valid for reads while it exists).
pub(super) struct Span<'a> {
    p: *const u8,
    stride: usize,
    count: usize,
    _mem: PhantomData<&'a HostMem>,
}

impl<'a> Span<'a> {
    /// `count` slots of `stride` bytes from `off` of `mem`; `None` if they do not lie inside
    /// it, `count` is 0, or the start or the stride is not as [`Span`] needs.
    #[inline(always)]
    pub(super) fn new(
        mem: &'a HostMem,
        off: usize,
        stride: usize,
        count: usize,
    ) -> Option<Span<'a>> {
        let len = stride.checked_mul(count)?;
        if count == 0
            || stride < 16
            || stride % 4 != 0
            || off.checked_add(len)? > mem.len()
            || (mem.base() + off) % 4 != 0
        {
            return None;
        }
        Some(Span {
            p: (mem.base() + off) as *const u8,
            stride,
            count,
            _mem: PhantomData,
        })
    }

    /// Slots of the span.
    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        self.count
    }

    /// Where slot `k` starts, `k` clamped to the last slot (in a loop over `0..count` the
    /// clamp folds away).
    #[inline(always)]
    fn slot(&self, k: usize) -> *const u8 {
        self.p.wrapping_add(k.min(self.count - 1) * self.stride)
    }

    /// Acquire-load the first 4 bytes of slot `k`, in memory order: an ownership word, which
    /// the driver stores last.
    #[inline(always)]
    pub(super) fn owner(&self, k: usize) -> [u8; 4] {
        // SAFETY: the first 4 bytes of a slot inside the span, hence inside the view, valid
        // for reads; 4-aligned (the start and the stride are). The driver writes the word with
        // plain or atomic 32-bit stores; an atomic view of memory another thread writes is
        // what `AtomicU32::from_ptr` is for.
        let v = unsafe { AtomicU32::from_ptr(self.slot(k) as *mut u32) }.load(Ordering::Acquire);
        v.to_ne_bytes()
    }

    /// The two qwords of slot `k`'s first 16 bytes, in memory order, as little-endian values.
    #[inline(always)]
    pub(super) fn ctrl(&self, k: usize) -> [u64; 2] {
        let p = self.slot(k).cast::<u64>();
        // SAFETY: 16 bytes at the start of a slot inside the span (`stride >= 16`), valid for
        // reads; unaligned reads of plain bytes, which the driver may be writing (torn data
        // is tolerated).
        unsafe {
            [
                u64::from_le(std::ptr::read_unaligned(p)),
                u64::from_le(std::ptr::read_unaligned(p.wrapping_add(1))),
            ]
        }
    }

    /// Bytes 4-7 of slot `k` (the control segment's second dword), in memory order, as a
    /// little-endian value: [`Span::word`] at an offset that needs no clamp.
    #[inline(always)]
    pub(super) fn dword1(&self, k: usize) -> u32 {
        let p = self.slot(k).wrapping_add(4);
        // SAFETY: bytes 4-7 of a slot inside the span (`stride >= 16`), valid for reads;
        // unaligned reads of plain bytes, as in `ctrl`.
        u32::from_le(unsafe { std::ptr::read_unaligned(p.cast::<u32>()) })
    }

    /// The 4 bytes at `at` of slot `k`, in memory order, as a little-endian value; `at` is
    /// clamped to the slot's last word (a wrong offset reads wrong bytes, never outside).
    #[inline(always)]
    pub(super) fn word(&self, k: usize, at: usize) -> u32 {
        let p = self.slot(k).wrapping_add(at.min(self.stride - 4));
        // SAFETY: 4 bytes inside the slot (clamped), valid for reads; unaligned.
        u32::from_le(unsafe { std::ptr::read_unaligned(p.cast::<u32>()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dma::DevPage;

    #[test]
    fn reads_stay_inside_the_span_whatever_the_offset() {
        let page = DevPage::new();
        let mem = page.view(0, 128);
        let bytes: Vec<u8> = (0..128).collect();
        mem.write(0, &bytes);
        let s = Span::new(&mem, 16, 32, 2).unwrap();
        let le = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
        assert_eq!(s.owner(0), [16, 17, 18, 19]);
        assert_eq!(s.owner(1), [48, 49, 50, 51]);
        assert_eq!(s.ctrl(1), [le(&bytes[48..56]), le(&bytes[56..64])]);
        assert_eq!(s.word(0, 20), u32::from_le_bytes([36, 37, 38, 39]));
        // Past a slot's end: its last word; past the last slot: the last slot.
        assert_eq!(s.word(0, 100), u32::from_le_bytes([44, 45, 46, 47]));
        assert_eq!(s.owner(7), [48, 49, 50, 51]);
        assert!(Span::new(&mem, 64, 32, 3).is_none(), "past the view");
        assert!(Span::new(&mem, 2, 32, 1).is_none(), "misaligned start");
        assert!(
            Span::new(&mem, 0, 8, 1).is_none(),
            "shorter than a control segment"
        );
        assert!(Span::new(&mem, 0, 18, 1).is_none(), "stride not of words");
        assert!(Span::new(&mem, 0, 32, 0).is_none(), "empty");
    }
}
