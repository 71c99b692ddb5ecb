//! The device's only access to raw memory: host memory the driver handed over (rings, doorbell
//! records, registered regions) and the device pages the model owns (UAR and BlueFlame pages).
//!
//! Everything above this module works with offsets that these types bounds-check, so a bad
//! descriptor can at worst produce an error CQE, never an access outside memory the driver gave us.
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// A range of memory the device may read and write by DMA.
///
/// Invariant: `[base, base + len)` was declared valid for reads and writes, for as long as this
/// value exists, by the caller of [`HostMem::new`] (ultimately the driver, through the `unsafe`
/// control-path functions of [`crate::Hca`]).
///
/// Cloning copies the view, not the memory: crate code clones only views of device pages, which
/// live as long as the adapter.
#[derive(Debug, Clone)]
pub(crate) struct HostMem {
    base: usize,
    len: usize,
}

impl HostMem {
    /// # Safety
    /// `[base, base + len)` must stay valid for reads and writes for the lifetime of the value.
    /// Other threads may write it concurrently (that is what DMA memory is); the device tolerates
    /// torn data, never out-of-range access.
    pub(crate) unsafe fn new(base: *mut u8, len: usize) -> Self {
        HostMem {
            base: base as usize,
            len,
        }
    }

    pub(crate) fn base(&self) -> usize {
        self.base
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    fn check(&self, off: usize, n: usize) -> Option<*mut u8> {
        if off.checked_add(n)? <= self.len {
            Some((self.base + off) as *mut u8)
        } else {
            None
        }
    }

    /// Copy `dst.len()` bytes from offset `off`; false if out of range.
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) -> bool {
        let Some(p) = self.check(off, dst.len()) else {
            return false;
        };
        // SAFETY: the range is inside the region (checked above), which the invariant makes
        // valid for reads; `dst` is a distinct Rust buffer, so the two cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Copy `N` bytes from offset `off`, a copy of constant size the compiler turns into a few
    /// vector moves (a TXBB, a scatter entry); false if out of range.
    #[inline(always)]
    pub(crate) fn read_array<const N: usize>(&self, off: usize, dst: &mut [u8; N]) -> bool {
        let Some(p) = self.check(off, N) else {
            return false;
        };
        // SAFETY: as in `read`.
        unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), N) };
        true
    }

    /// The first of `n` bytes at offset `off`, valid for reads (the region's invariant), if
    /// they lie inside: for a copy out of ring memory that reads it in place. Other threads
    /// may write the bytes meanwhile (the driver's WQEs): read them with raw copies, never
    /// through a reference.
    #[inline(always)]
    pub(crate) fn range(&self, off: usize, n: usize) -> Option<*const u8> {
        self.check(off, n).map(|p| p.cast_const())
    }

    /// Copy `n` bytes from offset `off` to `dst`, memory that is not the region's (a frame
    /// ring's record); false, with nothing copied, if out of range.
    ///
    /// # Safety
    /// `dst` must be valid for `n` bytes of writes and not overlap the region.
    #[inline(always)]
    pub(crate) unsafe fn read_to(&self, off: usize, n: usize, dst: *mut u8) -> bool {
        let Some(p) = self.check(off, n) else {
            return false;
        };
        // SAFETY: the range is inside the region (checked above), valid for reads by the
        // invariant; the caller vouches for `dst`.
        unsafe { std::ptr::copy_nonoverlapping(p, dst, n) };
        true
    }

    /// Copy `src` to offset `off`; false if out of range.
    pub(crate) fn write(&self, off: usize, src: &[u8]) -> bool {
        let Some(p) = self.check(off, src.len()) else {
            return false;
        };
        // SAFETY: in range and valid for writes by the invariant; `src` is a distinct buffer.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
        true
    }

    /// Copy `src` to offset `off` of the buffer `[off, off + cap)`, checked whole (a scatter
    /// entry's buffer must lie inside its region, whatever part of it a frame fills); false,
    /// with nothing written, if the buffer is not inside or `src` is longer than `cap`. An
    /// offset past the end (an address below the region's base wraps to one) is outside.
    #[inline(always)]
    pub(crate) fn write_within(&self, off: u64, cap: u64, src: &[u8]) -> bool {
        let room = self.len as u64;
        if off > room || cap > room - off || src.len() as u64 > cap {
            return false;
        }
        // SAFETY: `[off, off + src.len())` lies inside `[off, off + cap)`, inside the range
        // the invariant makes valid for writes; `src` is a distinct buffer.
        unsafe {
            let p = (self.base + off as usize) as *mut u8;
            std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len());
        }
        true
    }

    /// This memory as a ring of `count` slots (a power of two) of `stride` bytes, checked
    /// once: `None` unless they all lie inside, 8-aligned with whole qwords.
    pub(crate) fn slots(&self, count: u32, stride: usize) -> Option<SlotRing<'_>> {
        let fits = count.is_power_of_two()
            && stride >= 16
            && stride % 8 == 0
            && self.base % 8 == 0
            && (count as usize).checked_mul(stride)? <= self.len;
        fits.then_some(SlotRing {
            mem: self,
            mask: count - 1,
            stride,
        })
    }

    /// Fill `n` bytes at `off` with `v`; false if out of range.
    pub(crate) fn fill(&self, off: usize, n: usize, v: u8) -> bool {
        let Some(p) = self.check(off, n) else {
            return false;
        };
        // SAFETY: in range and valid for writes by the invariant.
        unsafe { std::ptr::write_bytes(p, v, n) };
        true
    }

    /// Acquire-load the 4 bytes at `off` as a big-endian value: the driver publishes ownership
    /// and doorbells with a release store (or a barrier and a plain store) to this word, and what
    /// it wrote before must be visible once we see it. `None` if out of range or misaligned.
    pub(crate) fn load_be32(&self, off: usize) -> Option<u32> {
        let p = self.check(off, 4)?;
        if p as usize % 4 != 0 {
            return None;
        }
        // SAFETY: in range, 4-aligned, valid for reads; the driver accesses the word with plain or
        // atomic 32-bit stores, and an atomic view of memory shared with another thread is what
        // `AtomicU32::from_ptr` is for.
        let v = unsafe { AtomicU32::from_ptr(p as *mut u32) }.load(Ordering::Acquire);
        Some(u32::from_be(v))
    }

    /// The `N` bytes at `off`, the first 4 (an ownership word the driver stores last, with a
    /// release store or after a barrier) acquire-loaded before the rest is copied: one bounds
    /// check and one pass over the line where an owner load and a copy would be two. `None` if
    /// out of range, misaligned, or `N < 4`.
    #[inline(always)]
    pub(crate) fn load_guarded<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        let p = self.check(off, N)?;
        if N < 4 || p as usize % 4 != 0 {
            return None;
        }
        // SAFETY: as in `load_be32` (in range, 4-aligned, valid for reads).
        let w = unsafe { AtomicU32::from_ptr(p as *mut u32) }.load(Ordering::Acquire);
        let mut out = [0u8; N];
        // SAFETY: the range is inside the region (checked above); `out` is a distinct buffer.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), N) };
        // The word as the acquire load saw it, whatever the copy read after it.
        out[..4].copy_from_slice(&w.to_ne_bytes());
        Some(out)
    }

    /// Whether each `(at, word)` of `words` is what the 4 bytes at `off + at` hold (read in
    /// memory order, as a little-endian value), for offsets `at + 4 <= reach`: the span
    /// `[off, off + reach)` is checked once, not per word. An `at` past the span is read at
    /// the span's end instead, so a wrong caller gets a wrong answer, never an access outside
    /// the memory. False if the span is out of range or shorter than a word.
    #[inline(always)]
    pub(crate) fn words_match<const K: usize>(
        &self,
        off: usize,
        reach: usize,
        words: &[(u16, u32); K],
    ) -> bool {
        let Some(p) = self.check(off, reach) else {
            return false;
        };
        let Some(last) = reach.checked_sub(4) else {
            return false;
        };
        // All of them, without a branch per word: a fixed count the compiler unrolls.
        words.iter().fold(true, |ok, &(at, word)| {
            // SAFETY: `at.min(last) + 4 <= reach`, inside the span checked above, which the
            // invariant makes valid for reads; an unaligned read of plain bytes.
            let v =
                unsafe { std::ptr::read_unaligned(p.add(usize::from(at).min(last)).cast::<u32>()) };
            ok & (u32::from_le(v) == word)
        })
    }

    /// Acquire-load the 8 bytes at `off` in memory order (as a byte array).
    pub(crate) fn load_bytes8(&self, off: usize) -> Option<[u8; 8]> {
        let p = self.check(off, 8)?;
        if p as usize % 8 != 0 {
            return None;
        }
        // SAFETY: in range, 8-aligned, valid for reads; see `load_be32`.
        let v = unsafe { AtomicU64::from_ptr(p as *mut u64) }.load(Ordering::Acquire);
        Some(v.to_ne_bytes())
    }

    /// The 8 bytes at `off`, read as a little-endian word, at any alignment: a frame's first
    /// bytes, as the device reads them for its MAC counters (torn by a concurrent write, they
    /// only miscount one frame).
    pub(crate) fn load_bytes8_unaligned(&self, off: usize) -> Option<u64> {
        let p = self.check(off, 8)?;
        // SAFETY: in range and valid for reads by the invariant; a raw copy, no reference.
        Some(u64::from_le(unsafe { p.cast::<u64>().read_unaligned() }))
    }

    /// Replace the 8 bytes at `off` with zero if they still hold `expected`: consuming a
    /// BlueFlame arrival, so that a later copy with identical first bytes (the 16-bit counter
    /// wraps) is still seen as new. False if the bytes changed meanwhile or `off` is unusable.
    pub(crate) fn clear_bytes8_if(&self, off: usize, expected: [u8; 8]) -> bool {
        let Some(p) = self.check(off, 8) else {
            return false;
        };
        if p as usize % 8 != 0 {
            return false;
        }
        // SAFETY: in range, 8-aligned, valid for writes; see `load_be32`.
        unsafe { AtomicU64::from_ptr(p as *mut u64) }
            .compare_exchange(
                u64::from_ne_bytes(expected),
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// The `N` 8-byte words at `off` (8-aligned) in memory order, each loaded atomically: a
    /// BlueFlame half is written by the CPU in 8-byte or larger stores while the device reads
    /// it, and each 8-byte piece must be seen whole or not at all. One range check for all.
    #[inline(always)]
    pub(crate) fn load_qwords<const N: usize>(&self, off: usize) -> Option<[u64; N]> {
        let p = self.check(off, N * 8)?;
        if p as usize % 8 != 0 {
            return None;
        }
        let mut out = [0u64; N];
        for (i, w) in out.iter_mut().enumerate() {
            // SAFETY: `p + 8*i` is in range (the whole span was checked) and 8-aligned; see
            // `load_be32` for the atomic view.
            *w = unsafe { AtomicU64::from_ptr((p as *mut u64).add(i)) }.load(Ordering::Relaxed);
        }
        fence(Ordering::Acquire);
        Some(out)
    }

    /// Write `bytes` at `off`, publishing the last byte with a release store: a CQE's owner byte
    /// must not become visible before the rest of the entry.
    pub(crate) fn write_publish_last(&self, off: usize, bytes: &[u8]) -> bool {
        let Some((&last, body)) = bytes.split_last() else {
            return true;
        };
        let Some(p) = self.check(off, bytes.len()) else {
            return false;
        };
        // SAFETY: in range and valid for writes; `bytes` is a distinct buffer.
        unsafe { std::ptr::copy_nonoverlapping(body.as_ptr(), p, body.len()) };
        // SAFETY: the last byte is in range (checked with the whole span); u8 has no alignment.
        unsafe { AtomicU8::from_ptr(p.add(body.len())) }.store(last, Ordering::Release);
        true
    }

    /// Write two `N`-byte entries back to back at `off` (two CQEs of a cache line), each
    /// entry's last byte published with a release store after both bodies, the first entry's
    /// before the second's: the line is written in one go, and a reader that sees an entry's
    /// last byte sees the entry.
    pub(crate) fn write_pair_publish_last<const N: usize>(
        &self,
        off: usize,
        a: &[u8; N],
        b: &[u8; N],
    ) -> bool {
        if N == 0 {
            return true;
        }
        let Some(p) = self.check(off, 2 * N) else {
            return false;
        };
        // SAFETY: `[off, off + 2N)` is in range and valid for writes; `a` and `b` are distinct
        // buffers; each copy stays within its own half.
        unsafe {
            std::ptr::copy_nonoverlapping(a.as_ptr(), p, N - 1);
            std::ptr::copy_nonoverlapping(b.as_ptr(), p.add(N), N - 1);
        }
        // SAFETY: both last bytes are in range (checked with the whole span); u8 has no
        // alignment.
        unsafe {
            AtomicU8::from_ptr(p.add(N - 1)).store(a[N - 1], Ordering::Release);
            AtomicU8::from_ptr(p.add(2 * N - 1)).store(b[N - 1], Ordering::Release);
        }
        true
    }
}

/// A ring of slots in host memory ([`HostMem::slots`]): any index reaches a slot inside it,
/// so a slot's load needs no check of its own.
///
/// Invariant: `(mask + 1) * stride <= mem.len`, `stride >= 16` and both `stride` and the
/// base are multiples of 8.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlotRing<'a> {
    mem: &'a HostMem,
    mask: u32,
    stride: usize,
}

impl SlotRing<'_> {
    /// The first two qwords of slot `i` (taken modulo the count), in memory order, each
    /// loaded atomically (the driver may be writing them).
    #[inline(always)]
    pub(crate) fn qwords2(&self, i: u32) -> [u64; 2] {
        let off = (i & self.mask) as usize * self.stride;
        let p = (self.mem.base + off) as *mut u64;
        // SAFETY: `off + 16 <= (mask + 1) * stride <= len` by the invariant, inside the
        // memory, 8-aligned; see `HostMem::load_be32` for the atomic view.
        unsafe {
            [
                AtomicU64::from_ptr(p).load(Ordering::Relaxed),
                AtomicU64::from_ptr(p.add(1)).load(Ordering::Relaxed),
            ]
        }
    }

    /// Write slot `i` (taken modulo the count), two 32-byte entries given as qwords (each
    /// entry's four in memory order: two CQEs of a line): six plain stores, then each
    /// entry's last qword, which holds its last byte, with a release store, the first
    /// entry's before the second's. A reader that sees an entry's last byte sees the entry.
    #[inline(always)]
    pub(crate) fn write_pair_publish_last(&self, i: u32, a: [u64; 4], b: [u64; 4]) {
        assert!(self.stride >= 64, "a ring of 64-byte lines");
        let off = (i & self.mask) as usize * self.stride;
        let p = (self.mem.base + off) as *mut u64;
        // SAFETY: with a stride of 64 bytes or more, `off + 64 <= (mask + 1) * stride <=
        // len` by the invariant, inside the memory, 8-aligned; each qword is a valid aligned
        // place, and the last of each entry is stored atomically so that the byte a reader
        // polls arrives with (after) the rest.
        unsafe {
            for k in 0..3 {
                p.add(k).write_volatile(a[k]);
                p.add(4 + k).write_volatile(b[k]);
            }
            AtomicU64::from_ptr(p.add(3)).store(a[3], Ordering::Release);
            AtomicU64::from_ptr(p.add(7)).store(b[3], Ordering::Release);
        }
    }
}

/// A span of memory shared with other threads or processes (rings, device pages, counters):
/// zeroed heap memory this value owns, or memory someone else provides and keeps alive.
///
/// Invariant: `[ptr, ptr + len)` is valid for reads and writes for the life of the value.
pub(crate) struct Region {
    ptr: *mut u8,
    len: usize,
    /// Heap memory to free with this layout on drop; `None` for memory owned elsewhere.
    heap: Option<Layout>,
    /// Whatever keeps foreign memory alive (a mapping), dropped with the region.
    _keep: Option<Box<dyn Send + Sync>>,
}

// SAFETY: the region is plain memory; everything that reads or writes it goes through atomics
// or a protocol that gives one party a span at a time.
unsafe impl Send for Region {}
// SAFETY: see `Send`.
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl Region {
    /// `len` zeroed bytes on the heap, 4 KiB aligned.
    pub(crate) fn heap(len: usize) -> Region {
        let layout = Layout::from_size_align(len.max(1), PAGE).expect("valid region layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            alloc::handle_alloc_error(layout);
        }
        Region {
            ptr,
            len,
            heap: Some(layout),
            _keep: None,
        }
    }

    /// Memory someone else owns.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must stay valid for reads and writes, and be touched by others only
    /// through the protocols of this crate, until the value is dropped.
    pub(crate) unsafe fn foreign(ptr: *mut u8, len: usize) -> Region {
        Region {
            ptr,
            len,
            heap: None,
            _keep: None,
        }
    }

    /// Memory that `keep` keeps valid (a mapping that unmaps when dropped).
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must stay valid for reads and writes until `keep` is dropped, and be
    /// touched by others only through the protocols of this crate.
    pub(crate) unsafe fn foreign_with(
        ptr: *mut u8,
        len: usize,
        keep: Box<dyn Send + Sync>,
    ) -> Region {
        Region {
            ptr,
            len,
            heap: None,
            _keep: Some(keep),
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(layout) = self.heap {
            // SAFETY: allocated in `heap` with this layout and not freed before.
            unsafe { alloc::dealloc(self.ptr, layout) };
        }
    }
}

/// A zeroed, 4 KiB-aligned page of memory, for tests of code that reads device pages.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct DevPage {
    ptr: *mut u8,
}

// SAFETY: the page is plain memory owned by this value; all device-side access goes through
// `HostMem`-style atomic loads, and the pointer is only handed to the driver as an address.
#[cfg(test)]
unsafe impl Send for DevPage {}
// SAFETY: see `Send`; `&DevPage` only gives out the address and bounds-checked views.
#[cfg(test)]
unsafe impl Sync for DevPage {}

const PAGE: usize = mlx4_prm::UAR_PAGE_SIZE;

#[cfg(test)]
impl DevPage {
    pub(crate) fn new() -> Self {
        let layout = Layout::from_size_align(PAGE, PAGE).expect("valid page layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            alloc::handle_alloc_error(layout);
        }
        DevPage { ptr }
    }

    /// A bounds-checked view of part of the page.
    pub(crate) fn view(&self, off: usize, len: usize) -> HostMem {
        assert!(off + len <= PAGE);
        // SAFETY: the range is inside this page, which lives as long as the device state that
        // holds both the page and the views (pages are freed only when the device is dropped).
        unsafe { HostMem::new(self.ptr.add(off), len) }
    }

    /// Zero the page before it is handed out again, so a new queue never sees an old doorbell.
    pub(crate) fn clear(&self) {
        self.view(0, PAGE).fill(0, PAGE, 0);
    }
}

#[cfg(test)]
impl Drop for DevPage {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(PAGE, PAGE).expect("valid page layout");
        // SAFETY: allocated in `new` with the same layout and not freed before.
        unsafe { alloc::dealloc(self.ptr, layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_match_in_the_span_only() {
        let page = DevPage::new();
        let m = page.view(0, 64);
        assert!(m.write(8, &[1, 2, 3, 4, 5, 6, 7, 8]));
        let w = |b: [u8; 4]| u32::from_le_bytes(b);
        assert!(m.words_match(8, 8, &[(0, w([1, 2, 3, 4])), (4, w([5, 6, 7, 8]))]));
        assert!(!m.words_match(8, 8, &[(0, w([1, 2, 3, 4])), (4, w([5, 6, 7, 9]))]));
        assert!(!m.words_match(8, 8, &[(0, w([0, 2, 3, 4])), (4, w([5, 6, 7, 8]))]));
        assert!(m.words_match(8, 8, &[]));
        // Past the span: the span's last word is read instead.
        assert!(m.words_match(8, 8, &[(40, w([5, 6, 7, 8]))]));
        assert!(!m.words_match(60, 8, &[(0, 0)]), "span out of range");
        assert!(!m.words_match(8, 3, &[(0, 0)]), "span shorter than a word");
    }

    #[test]
    fn a_pair_fills_its_line_and_stays_in_range() {
        let page = DevPage::new();
        let m = page.view(64, 128);
        let (a, b): ([u8; 32], [u8; 32]) = (
            std::array::from_fn(|i| i as u8),
            std::array::from_fn(|i| 0x80 | i as u8),
        );
        assert!(m.write_pair_publish_last(64, &a, &b));
        let mut line = [0u8; 64];
        assert!(m.read(64, &mut line));
        assert_eq!((&line[..32], &line[32..]), (&a[..], &b[..]));
        assert!(!m.write_pair_publish_last(65, &a, &b));
        assert!(m.read(64, &mut line));
        assert_eq!(&line[..32], &a[..], "a refused pair writes nothing");
    }

    #[test]
    fn bounds_are_checked() {
        let page = DevPage::new();
        let m = page.view(64, 64);
        let mut b = [0u8; 8];
        assert!(m.read(56, &mut b));
        assert!(!m.read(57, &mut b));
        assert!(!m.read(usize::MAX, &mut b));
        assert!(m.write(0, &[1, 2, 3, 4]));
        assert_eq!(m.load_be32(0), Some(0x0102_0304));
        assert_eq!(m.load_be32(2), None);
        assert!(m.write_publish_last(32, &[9; 32]));
        assert!(!m.write_publish_last(33, &[9; 32]));
        assert_eq!(m.load_bytes8(40), Some([9; 8]));
        assert_eq!(m.load_bytes8(60), None);
        assert_eq!(
            m.load_qwords::<4>(32),
            Some([u64::from_ne_bytes([9; 8]); 4])
        );
        assert_eq!(m.load_qwords::<4>(40), None);
        assert_eq!(m.load_qwords::<1>(36), None);
        page.clear();
        assert_eq!(m.load_bytes8(32), Some([0; 8]));
    }
}
