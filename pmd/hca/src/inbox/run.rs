//! A run's frames into a receive buffer: the frames of a run of alike all-inline WQEs go
//! from the ring into their records in one batch, their spans laid out once.
#![allow(unsafe_code)]

use super::{record_step, Producer, REC_HDR};
use crate::dma::HostMem;

/// Spans of a run's frame that [`Producer::push_run`] lays out at once (a frame inline in
/// up to three TXBBs has at most three; more take the frame-by-frame copy).
const RUN_SPANS: usize = 4;

/// Copy `n` bytes from `src` to `dst` with at most two moves of a power-of-two size (the
/// second overlapping the first) for `n` up to 64, a call to `memcpy` above: a run's spans
/// are short and of one length, so the branches are predicted, and the call is not paid.
///
/// # Safety
/// As `ptr::copy_nonoverlapping(src, dst, n)`.
#[inline(always)]
unsafe fn copy_short(src: *const u8, dst: *mut u8, n: usize) {
    #[inline(always)]
    unsafe fn two<const W: usize>(src: *const u8, dst: *mut u8, n: usize) {
        // SAFETY: W <= n, so both moves lie inside the `n` bytes the caller vouches for.
        // Each move is loaded and stored before the next: the buffers do not overlap, and
        // holding both moves spills them to the stack.
        unsafe {
            let a = src.cast::<[u8; W]>().read_unaligned();
            dst.cast::<[u8; W]>().write_unaligned(a);
            let b = src.add(n - W).cast::<[u8; W]>().read_unaligned();
            dst.add(n - W).cast::<[u8; W]>().write_unaligned(b);
        }
    }
    // SAFETY: each branch moves bytes inside `[0, n)` only (the caller's contract).
    unsafe {
        match n {
            32..=64 => two::<32>(src, dst, n),
            16..=31 => two::<16>(src, dst, n),
            8..=15 => two::<8>(src, dst, n),
            4..=7 => two::<4>(src, dst, n),
            0..=3 => {
                for i in 0..n {
                    dst.add(i).write(src.add(i).read());
                }
            }
            _ => std::ptr::copy_nonoverlapping(src, dst, n),
        }
    }
}

impl Producer {
    /// [`Producer::push_spans`] for each frame of a run of alike WQEs, straight from the ring
    /// they lie in: frame `i` is `spans` of the WQE at the `i`th offset of `wqes` in `ring`,
    /// `len` bytes. A span outside `ring`, or past `len` bytes, is not copied.
    ///
    /// The spans are laid out once for the run; a frame then costs one bounds check of its
    /// WQE, its record's room, and a short copy per span. `head` is given each frame's first
    /// 8 bytes (memory order, as little-endian), refused or not, when the first span holds
    /// them: false when it does not, and `head` is not called.
    #[inline]
    pub(crate) fn push_run(
        &mut self,
        ring: &HostMem,
        wqes: impl Iterator<Item = usize>,
        spans: &[(u16, u16)],
        len: usize,
        mut head: impl FnMut(u64),
    ) -> bool {
        // (offset in the WQE, length, offset in the frame) of each span that fits, as
        // `push_spans` takes them, and how far into the WQE they reach.
        let mut plan = [(0usize, 0usize, 0usize); RUN_SPANS];
        let (mut k, mut off, mut reach) = (0, 0, 0);
        for &(from, n) in spans {
            let (from, n) = (usize::from(from), usize::from(n));
            if n > len - off {
                continue;
            }
            if k == RUN_SPANS {
                // A long frame of many inline chunks: the copy dominates, frame by frame.
                self.push_run_spans(ring, wqes, spans, len);
                return false;
            }
            plan[k] = (from, n, off);
            (k, off, reach) = (k + 1, off + n, reach.max(from + n));
        }
        let plan = &plan[..k];
        let head_at = match plan.first() {
            Some(&(from, n, 0)) if n >= 8 => from,
            _ => {
                self.push_run_spans(ring, wqes, spans, len);
                return false;
            }
        };
        let (need, cap, data) = (record_step(len), self.ring.cap, self.ring.data());
        // Records known to fit before the ring's end and in the consumer's last view.
        let mut fit = 0;
        for wqe in wqes {
            let Some(src) = ring.range(wqe, reach) else {
                // A WQE at the region's end with a span outside: the first span is inside
                // or not, as the frame-by-frame copy finds.
                head(ring.load_bytes8_unaligned(wqe + head_at).unwrap_or(0));
                if let Some(at) = self.reserve(len) {
                    self.copy_spans_from(ring, wqe, spans, len, data.wrapping_add(at));
                    self.commit(len);
                    fit = 0;
                }
                continue;
            };
            // SAFETY: `head_at + 8 <= reach`: the first span lies inside the range.
            head(u64::from_le(unsafe {
                src.add(head_at).cast::<u64>().read_unaligned()
            }));
            let at = if fit > 0 && self.pos + need <= cap {
                fit -= 1;
                // SAFETY: `pos + need <= cap`, and the room was checked for it (`fit`).
                unsafe { data.add(self.pos).cast::<u32>().write(len as u32) };
                self.pos + REC_HDR
            } else {
                let Some(at) = self.reserve(len) else {
                    continue;
                };
                fit = self.fit(need);
                at
            };
            let dst = data.wrapping_add(at);
            // SAFETY: `src` is valid for `reach >= from + n` bytes of reads (the region's
            // invariant); `[at, at + len)` is the reserved record's frame, inside the data
            // area and the producer's while it holds the lock, and `to + n <= len`; the two
            // are distinct memory.
            let copy = |&(from, n, to): &(usize, usize, usize)| unsafe {
                copy_short(src.add(from), dst.add(to), n)
            };
            // The two spans of every frame of 45 to 104 bytes without a loop.
            if let [a, b] = plan {
                copy(a);
                copy(b);
            } else {
                plan.iter().for_each(copy);
            }
            self.commit(len);
        }
        true
    }

    /// [`Producer::push_run`] frame by frame.
    #[cold]
    fn push_run_spans(
        &mut self,
        ring: &HostMem,
        wqes: impl Iterator<Item = usize>,
        spans: &[(u16, u16)],
        len: usize,
    ) {
        for wqe in wqes {
            let Some(at) = self.reserve(len) else {
                continue;
            };
            let dst = self.ring.data().wrapping_add(at);
            self.copy_spans_from(ring, wqe, spans, len, dst);
            self.commit(len);
        }
    }

    /// The spans of the WQE at `wqe` in `ring` that lie inside it and `len`, in order, to the
    /// reserved frame at `dst`.
    fn copy_spans_from(
        &self,
        ring: &HostMem,
        wqe: usize,
        spans: &[(u16, u16)],
        len: usize,
        dst: *mut u8,
    ) {
        let mut off = 0;
        for &(from, n) in spans {
            let n = usize::from(n);
            if n > len - off {
                continue;
            }
            // SAFETY: `dst` is a reserved record's frame of `len` bytes, the producer's while
            // it holds the lock, and `off + n <= len`; the ring is other memory.
            if unsafe { ring.read_to(wqe + usize::from(from), n, dst.wrapping_add(off)) } {
                off += n;
            }
        }
    }
}
