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

    /// Slot `k`, clamped to the last slot.
    #[inline(always)]
    pub(super) fn at(&self, k: usize) -> Slot<'a> {
        Slot {
            p: self.p.wrapping_add(k.min(self.count - 1) * self.stride),
            stride: self.stride,
            _mem: PhantomData,
        }
    }

    /// The index of the slot at `m` (the span's length for its end).
    #[inline(always)]
    pub(super) fn index(&self, m: Mark) -> usize {
        self.offset(m) / self.stride
    }

    /// Where `m` is, in bytes from the span's start.
    #[inline(always)]
    pub(super) fn offset(&self, m: Mark) -> usize {
        m.0.wrapping_sub(self.p as usize)
    }

    /// Hand the slots from `from` on to `step`, in order, until it returns `Some`: where the
    /// slot it stopped at is and what it returned, or the span's end and `None`. One pointer
    /// addresses the slot and ends the loop; the slot's index is left to whoever needs it.
    #[inline(always)]
    pub(super) fn pass<S: Step>(&self, from: usize, step: &mut S) -> (Mark, Option<S::Out>) {
        let end = self.p.wrapping_add(self.count * self.stride);
        let from = from.min(self.count);
        let mut p = self.p.wrapping_add(from * self.stride);
        let slot = |p| Slot {
            p,
            stride: self.stride,
            _mem: PhantomData,
        };
        // Two slots a turn, so that a turn pays one test of the end; an odd slot first.
        if (self.count - from) % 2 == 1 {
            // `from`'s slot, one of the span's.
            if let Some(v) = step.step(slot(p)) {
                return (slot(p).mark(), Some(v));
            }
            p = p.wrapping_add(self.stride);
        }
        while p != end {
            // `p` and `q` are slots of the span: a whole number of pairs of them lies from
            // `p` to the end.
            if let Some(v) = step.step(slot(p)) {
                return (slot(p).mark(), Some(v));
            }
            let q = p.wrapping_add(self.stride);
            if let Some(v) = step.step(slot(q)) {
                return (slot(q).mark(), Some(v));
            }
            p = opaque(q.wrapping_add(self.stride));
        }
        (Mark(end as usize), None)
    }
}

/// What [`Span::pass`] does with each slot: `Some` stops it there. A trait, not a closure,
/// so that its one method can be asked in line at each of the pass's three call sites.
pub(super) trait Step {
    type Out;
    fn step(&mut self, slot: Slot<'_>) -> Option<Self::Out>;
}

/// `p`, unknown to the optimizer: a pass's pointer is then the loop's one induction variable.
/// Left to itself, loop strength reduction keeps two or three (an offset, a count down, a copy
/// for the marks), an instruction or two a WQE.
#[inline(always)]
// The template neither reads nor writes memory: the pointer only goes through a register.
#[allow(clippy::pointers_in_nomem_asm_block)]
fn opaque(p: *const u8) -> *const u8 {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let mut p = p;
        // SAFETY: an empty template: no instruction, no memory touched, the register
        // unchanged.
        unsafe {
            std::arch::asm!("/* {0} */", inout(reg) p, options(pure, nomem, nostack, preserves_flags));
        }
        p
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    p
}

/// Where a slot of a span is, as a pass has it at hand (its address); [`Span::index`] makes
/// it the slot's index.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub(super) struct Mark(usize);

/// One slot of a [`Span`], from its start.
///
/// Invariant: `[p, p + stride)` is one of the span's slots (hence inside its `HostMem`).
#[derive(Clone, Copy)]
pub(super) struct Slot<'a> {
    p: *const u8,
    stride: usize,
    _mem: PhantomData<&'a HostMem>,
}

impl Slot<'_> {
    /// Where the slot is.
    #[inline(always)]
    pub(super) fn mark(&self) -> Mark {
        Mark(self.p as usize)
    }

    /// Acquire-load the slot's first 4 bytes, in memory order: an ownership word, which the
    /// driver stores last.
    #[inline(always)]
    pub(super) fn owner(&self) -> [u8; 4] {
        // SAFETY: the first 4 bytes of a slot of the span, hence inside the view, valid for
        // reads; 4-aligned (the span's start and its stride are). The driver writes the word with
        // plain or atomic 32-bit stores; an atomic view of memory another thread writes is
        // what `AtomicU32::from_ptr` is for.
        let v = unsafe { AtomicU32::from_ptr(self.p as *mut u32) }.load(Ordering::Acquire);
        v.to_ne_bytes()
    }

    /// The two qwords of the slot's first 16 bytes, in memory order, as little-endian values.
    #[inline(always)]
    pub(super) fn ctrl(&self) -> [u64; 2] {
        let p = self.p.cast::<u64>();
        // SAFETY: 16 bytes at the start of a slot of the span (`stride >= 16`), valid for
        // reads; unaligned reads of plain bytes, which the driver may be writing (torn data
        // is tolerated).
        unsafe {
            [
                u64::from_le(std::ptr::read_unaligned(p)),
                u64::from_le(std::ptr::read_unaligned(p.wrapping_add(1))),
            ]
        }
    }

    /// [`Slot::ctrl`]'s second qword, read again: volatile, so that the compiler keeps it
    /// apart from an earlier read, which then stays one compare with its load folded in.
    #[inline(always)]
    pub(super) fn ctrl_hi_again(&self) -> u64 {
        let p = self.p.wrapping_add(8).cast::<u32>();
        // SAFETY: bytes 8-15 of a slot of the span (`stride >= 16`), valid for reads; two
        // 4-aligned dwords (the span's start and its stride are 4-aligned).
        let [a, b] = unsafe {
            [
                std::ptr::read_volatile(p),
                std::ptr::read_volatile(p.wrapping_add(1)),
            ]
        };
        u64::from(u32::from_le(a)) | u64::from(u32::from_le(b)) << 32
    }

    /// Bytes 4-7 of the slot (the control segment's second dword), in memory order, as a
    /// little-endian value: [`Slot::word`] at an offset that needs no clamp.
    #[inline(always)]
    pub(super) fn dword1(&self) -> u32 {
        let p = self.p.wrapping_add(4);
        // SAFETY: bytes 4-7 of a slot of the span (`stride >= 16`), valid for reads;
        // unaligned reads of plain bytes, as in `ctrl`.
        u32::from_le(unsafe { std::ptr::read_unaligned(p.cast::<u32>()) })
    }

    /// The 4 bytes at `at` of the slot, in memory order, as a little-endian value; `at` is
    /// clamped to the slot's last word (a wrong offset reads wrong bytes, never outside).
    #[inline(always)]
    pub(super) fn word(&self, at: usize) -> u32 {
        let p = self.p.wrapping_add(at.min(self.stride - 4));
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
        assert_eq!(s.at(0).owner(), [16, 17, 18, 19]);
        assert_eq!(s.at(1).owner(), [48, 49, 50, 51]);
        assert_eq!(s.at(1).ctrl(), [le(&bytes[48..56]), le(&bytes[56..64])]);
        assert_eq!(s.at(1).dword1(), u32::from_le_bytes([52, 53, 54, 55]));
        assert_eq!(s.at(1).ctrl_hi_again(), s.at(1).ctrl()[1]);
        assert_eq!(s.at(0).word(20), u32::from_le_bytes([36, 37, 38, 39]));
        // Past a slot's end: its last word; past the last slot: the last slot.
        assert_eq!(s.at(0).word(100), u32::from_le_bytes([44, 45, 46, 47]));
        assert_eq!(s.at(7).owner(), [48, 49, 50, 51]);
        assert_eq!((s.index(s.at(7).mark()), s.offset(s.at(1).mark())), (1, 32));
        // A pass sees every slot from where it starts, and stops where it is told.
        struct Seen<'s>(&'s Span<'s>, Vec<usize>, u8);
        impl Step for Seen<'_> {
            type Out = u8;
            fn step(&mut self, slot: Slot<'_>) -> Option<u8> {
                self.1.push(self.0.index(slot.mark()));
                (slot.owner()[0] == self.2).then_some(self.2)
            }
        }
        let mut all = Seen(&s, Vec::new(), 0);
        let (end, none) = s.pass(0, &mut all);
        assert_eq!((s.index(end), none, all.1), (2, None, vec![0, 1]));
        let mut one = Seen(&s, Vec::new(), 48);
        let (at, v) = s.pass(1, &mut one);
        assert_eq!((s.index(at), v, one.1), (1, Some(48), vec![1]));
        let (at, v) = s.pass(2, &mut Seen(&s, Vec::new(), 16));
        assert_eq!((s.index(at), v), (2, None));
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
