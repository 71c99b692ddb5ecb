//! The completion ring: 32-byte CQEs (or the second half of 64-byte entries), their owner
//! bytes, and the consumer-index record.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

use mlx4_prm::{cqe_opcode, cqe_owner, Cqe, CQE_SIZE};

use crate::hw::CqDesc;

/// A view of a completion queue and its consumer-index record.
pub struct CqRing {
    desc: CqDesc,
    /// The first CQE: the first entry, or its second half for 64-byte entries.
    first: NonNull<u8>,
    /// log2 of the entry size.
    entry_shift: u32,
    cqe_cnt: u32,
    /// Consumer counter (free-running).
    ci: u32,
    /// The owner byte of CQE `ci`, and the value it has once software owns it: derived from
    /// `ci` whenever it moves, so that polling an empty CQ is one load of the device's byte
    /// and a compare (a pointer, not an offset from `first`: one load less per poll).
    next_owner: NonNull<u8>,
    sw_owner: u8,
}

impl CqRing {
    /// A view that starts consuming at entry 0, as a driver does on a CQ just created (the
    /// device initialises its entries at creation). The consumer record starts over too: left
    /// at an older queue's index, it would tell the device that the new CQ is full.
    ///
    /// # Safety
    /// The descriptor is one the device handed out for a live completion queue, and what it
    /// names (`cqe_cnt` entries of `cqe_size` bytes, the consumer-index record) stays mapped
    /// until this view is dropped or handed back ([`CqRing::into_desc`]): the device that owns
    /// that memory is not dropped and the queue not destroyed before. Nothing but this view
    /// and the device reaches it meanwhile: one view per descriptor.
    pub unsafe fn new(desc: CqDesc) -> CqRing {
        let size = desc.cqe_size() as usize;
        // SAFETY: a 32-byte CQE fits in each entry (32 or 64 bytes, the descriptor's promise).
        let first = unsafe { desc.buf().add(size - CQE_SIZE) };
        let mut ring = CqRing {
            first,
            entry_shift: size.trailing_zeros(),
            cqe_cnt: desc.cqe_cnt(),
            desc,
            ci: 0,
            next_owner: first,
            sw_owner: 0,
        };
        ring.seek(0);
        ring.update_ci();
        ring
    }

    /// Bytes from one entry to the next.
    #[inline(always)]
    fn stride(&self) -> usize {
        1 << self.entry_shift
    }

    /// Bytes the entries span, from `first`.
    #[inline(always)]
    fn span(&self) -> usize {
        (self.cqe_cnt as usize) << self.entry_shift
    }

    /// Where the owner byte of CQE `ci` is, from `first`.
    #[inline(always)]
    fn owner_offset(&self) -> usize {
        self.next_owner.as_ptr() as usize - self.first.as_ptr() as usize
    }

    /// Moves the consumer counter to `ci`.
    #[inline(always)]
    fn seek(&mut self, ci: u32) {
        self.ci = ci;
        let at = ((ci & (self.cqe_cnt - 1)) as usize) * self.stride() + Cqe::<&[u8]>::OWNER_OFFSET;
        // SAFETY: an owner byte inside the CQE array.
        self.next_owner = unsafe { self.first.add(at) };
        self.sw_owner = if ci & self.cqe_cnt != 0 {
            mlx4_prm::cqe_owner::OWNER
        } else {
            0
        };
    }

    pub fn cqe_cnt(&self) -> u32 {
        self.cqe_cnt
    }

    pub fn desc(&self) -> &CqDesc {
        &self.desc
    }

    /// Ends the view, for destroying the queue.
    pub fn into_desc(self) -> CqDesc {
        self.desc
    }

    /// Moves the consumer counter on by one CQE: the next owner byte is one entry on, and its
    /// expected value flips where the ring wraps.
    #[inline(always)]
    fn advance(&mut self) {
        self.ci = self.ci.wrapping_add(1);
        let at = self.owner_offset() + self.stride();
        if at >= self.span() {
            // SAFETY: the first entry's owner byte.
            self.next_owner = unsafe { self.first.add(Cqe::<&[u8]>::OWNER_OFFSET) };
            self.sw_owner ^= mlx4_prm::cqe_owner::OWNER;
        } else {
            // SAFETY: below the span, so inside the CQE array.
            self.next_owner = unsafe { self.first.add(at) };
        }
    }

    /// The owner byte at offset `at` from the first CQE.
    #[inline(always)]
    fn owner_at(&self, at: usize) -> u8 {
        debug_assert!(at < self.span());
        // SAFETY: `at` lies inside the CQE array (kept there by `seek`/`advance` and the
        // wrap in `ready`); the device writes owner bytes last, atomically, and no Rust
        // reference to bytes covers them.
        unsafe { AtomicU8::from_ptr(self.first.as_ptr().add(at)) }.load(Ordering::Acquire)
    }

    /// How many CQEs from the consumer on software owns, counting at most `max`: a burst
    /// sizes its buffer allocation with it before taking them.
    #[inline]
    pub fn ready(&self, max: usize) -> usize {
        let stride = self.stride();
        let (mut at, mut sw) = (self.owner_offset(), self.sw_owner);
        let cnt = self.cqe_cnt;
        let mut to_end = (cnt - (self.ci & (cnt - 1))) as usize;
        let mut n = 0;
        loop {
            // The entries up to the ring's end, counted without a wrap test each; then, if
            // more may be ready, the next pass's from the ring's start.
            let stop = max.min(n + to_end);
            while n < stop {
                if self.owner_at(at) & mlx4_prm::cqe_owner::OWNER != sw {
                    return n;
                }
                n += 1;
                at += stride;
            }
            if n == max {
                return n;
            }
            at = Cqe::<&[u8]>::OWNER_OFFSET;
            sw ^= mlx4_prm::cqe_owner::OWNER;
            to_end = cnt as usize;
        }
    }

    /// Whether software owns CQE `ci + k` (false for `k` past the ring): one load, which lets
    /// a burst size a chunk's buffers before it takes the CQEs. Only a hint of how many are
    /// ready; whoever takes them still checks each owner byte.
    #[inline(always)]
    pub fn owns_ahead(&self, k: u32) -> bool {
        if k >= self.cqe_cnt {
            return false;
        }
        let at = self.ci.wrapping_add(k);
        let off = ((at & (self.cqe_cnt - 1)) as usize) * self.stride() + Cqe::<&[u8]>::OWNER_OFFSET;
        let sw = if at & self.cqe_cnt != 0 {
            mlx4_prm::cqe_owner::OWNER
        } else {
            0
        };
        self.owner_at(off) & mlx4_prm::cqe_owner::OWNER == sw
    }

    /// The next CQE, read in place, if software owns it; advances the consumer counter. The
    /// view lives until the next call on the ring, before which nothing hands the CQE back
    /// to the device (that is `update_ci`).
    #[inline(always)]
    pub fn next_view(&mut self) -> Option<Cqe<&[u8]>> {
        if !self.has_cqe() {
            return None;
        }
        let at = self.owner_offset() - Cqe::<&[u8]>::OWNER_OFFSET;
        self.advance();
        // SAFETY: a whole CQE inside the array; software owns it (owner byte seen with
        // acquire), so the device has finished writing it and does not write it again until
        // the consumer record passes it, which needs `&mut self`, ending this borrow.
        Some(Cqe::new_unchecked(unsafe {
            std::slice::from_raw_parts(self.first.as_ptr().add(at), CQE_SIZE)
        }))
    }

    /// Whether software owns the next CQE (one load and a compare).
    #[inline(always)]
    pub fn has_cqe(&self) -> bool {
        // SAFETY: `next_owner` is an owner byte inside the CQE array (`seek`, `advance`, the
        // pass), which the device writes last, atomically.
        let owner = unsafe { AtomicU8::from_ptr(self.next_owner.as_ptr()) }.load(Ordering::Acquire);
        owner & mlx4_prm::cqe_owner::OWNER == self.sw_owner
    }

    /// The next CQE if software owns it, copied out; advances the consumer counter. With
    /// none waiting (the common case on the TX side) this is one load of the device's byte
    /// and a compare.
    #[inline(always)]
    pub fn poll(&mut self) -> Option<Cqe<[u8; CQE_SIZE]>> {
        if !self.has_cqe() {
            return None;
        }
        let at = self.owner_offset() - Cqe::<&[u8]>::OWNER_OFFSET;
        let mut cqe = [0u8; CQE_SIZE];
        // SAFETY: the CQE is software-owned (owner byte seen with acquire), so the device has
        // finished writing it and will not touch it until the consumer index passes it.
        unsafe {
            std::ptr::copy_nonoverlapping(self.first.as_ptr().add(at), cqe.as_mut_ptr(), CQE_SIZE)
        };
        self.advance();
        Some(Cqe::new_unchecked(cqe))
    }

    /// A pass over the CQEs software owns from the consumer on ([`Owned`]): each owner byte
    /// is loaded once, as its CQE is taken, and the consumer counter moves past what was
    /// taken when the pass ends. The caller bounds the pass; it cannot take more than the
    /// ring holds, since past a whole ring the owner bits it expects are the other parity.
    #[inline(always)]
    pub fn owned(&mut self) -> Owned<'_> {
        let cqe = self
            .next_owner
            .as_ptr()
            .wrapping_sub(Cqe::<&[u8]>::OWNER_OFFSET);
        Owned {
            cqe,
            end: self.first.as_ptr().wrapping_add(self.span()),
            shift: self.entry_shift,
            sw: self.sw_owner,
            wrapped: false,
            ring: self,
        }
    }

    /// CQEs from the consumer's to the ring's end (at least 1): how far a pass goes without
    /// a wrap.
    #[inline(always)]
    pub fn to_end(&self) -> u32 {
        self.cqe_cnt - (self.ci & (self.cqe_cnt - 1))
    }

    /// The consumer counter (free-running): what a CQ arm doorbell carries.
    pub fn ci(&self) -> u32 {
        self.ci
    }

    /// Tells the device how far we consumed, once per batch of CQEs.
    #[inline]
    pub fn update_ci(&self) {
        // SAFETY: the record is the CQ's (descriptor), 4-byte aligned; the device reads it
        // atomically.
        let rec = unsafe { AtomicU32::from_ptr(self.desc.set_ci_db().as_ptr()) };
        rec.store((self.ci & 0x00ff_ffff).to_be(), Ordering::Release);
    }
}

/// See [`CqRing::owned`].
pub struct Owned<'r> {
    /// The next entry.
    cqe: *mut u8,
    /// The ring's end.
    end: *mut u8,
    /// log2 of the entry size.
    shift: u32,
    /// The owner bit of a software-owned entry from `cqe` to the ring's end.
    sw: u8,
    /// `cqe` went past the ring's end and on from its start.
    wrapped: bool,
    ring: &'r mut CqRing,
}

impl<'r> Owned<'r> {
    /// The next CQE, with the `owner_sr_opcode` byte its ownership was read from, if software
    /// owns it.
    #[inline(always)]
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<(u8, Cqe<&'r [u8]>)> {
        self.take(|_| true)
    }

    /// As [`Owned::next`], but a CQE whose `owner_sr_opcode` byte fails `take` is left in
    /// place, for a later pass.
    #[inline(always)]
    pub fn next_if(&mut self, take: impl FnOnce(u8) -> bool) -> Option<Cqe<&'r [u8]>> {
        self.take(take).map(|(_, c)| c)
    }

    /// As [`Owned::next_if`] taking what is not an error CQE, for a run that stops short of
    /// the ring's end: no test for the end, and one compare for both the owner bit and the
    /// opcode.
    ///
    /// # Safety
    /// The pass has not reached the ring's end: since it began, it took fewer CQEs than
    /// [`CqRing::to_end`] said then.
    #[inline(always)]
    pub unsafe fn next_frame_before_end(&mut self) -> Option<Cqe<&'r [u8]>> {
        debug_assert!(self.cqe != self.end);
        // SAFETY: `cqe` is an entry inside the array, short of its end by the caller's
        // contract; otherwise as in `take`.
        let (op, bytes) = unsafe {
            let op = AtomicU8::from_ptr(self.cqe.add(Cqe::<&[u8]>::OWNER_OFFSET))
                .load(Ordering::Acquire);
            (
                op,
                std::slice::from_raw_parts(self.cqe.cast_const(), CQE_SIZE),
            )
        };
        if !is_frame(op, self.sw) {
            return None;
        }
        self.cqe = self.cqe.wrapping_add(1 << self.shift);
        Some(Cqe::new_unchecked(bytes))
    }

    #[inline(always)]
    fn take(&mut self, take: impl FnOnce(u8) -> bool) -> Option<(u8, Cqe<&'r [u8]>)> {
        if self.cqe == self.end {
            self.wrap();
        }
        // SAFETY: `cqe` is an entry inside the array: it starts at the consumer's, moves one
        // entry at a time, and goes back to the first at the ring's end. The device writes the
        // owner byte last, atomically; once it reads as software's (with acquire), the entry
        // stays as the device wrote it until the consumer record passes it, which takes
        // `&mut CqRing`, borrowed by this pass for `'r`.
        let (op, bytes) = unsafe {
            let op = AtomicU8::from_ptr(self.cqe.add(Cqe::<&[u8]>::OWNER_OFFSET))
                .load(Ordering::Acquire);
            (
                op,
                std::slice::from_raw_parts(self.cqe.cast_const(), CQE_SIZE),
            )
        };
        if op & mlx4_prm::cqe_owner::OWNER != self.sw || !take(op) {
            return None;
        }
        self.cqe = self.cqe.wrapping_add(1 << self.shift);
        Some((op, Cqe::new_unchecked(bytes)))
    }

    /// At the ring's end: on from its start, where software's entries have the other owner
    /// bit.
    #[cold]
    fn wrap(&mut self) {
        self.cqe = self.ring.first.as_ptr();
        self.sw ^= mlx4_prm::cqe_owner::OWNER;
        self.wrapped = true;
    }
}

/// Whether an `owner_sr_opcode` byte says software owns its CQE (owner bit `sw`) and the CQE
/// is not an error one, in one compare: with the owner bit and the opcode turned against the
/// values software owns and the error opcode, an owned non-error CQE leaves a value from 1 to
/// the opcode mask (a hardware-owned one has bit 7 set, an error one is 0).
#[inline(always)]
fn is_frame(op: u8, sw: u8) -> bool {
    let turned = (op & (cqe_owner::OWNER | cqe_owner::OPCODE_MASK)) ^ (sw ^ cqe_opcode::ERROR);
    u32::from(turned).wrapping_sub(1) < u32::from(cqe_owner::OPCODE_MASK)
}

impl Drop for Owned<'_> {
    /// Moves the consumer counter past the CQEs taken.
    #[inline(always)]
    fn drop(&mut self) {
        let r = &mut *self.ring;
        let cnt = r.cqe_cnt;
        let from = r.ci & (cnt - 1);
        let to = ((self.cqe as usize - r.first.as_ptr() as usize) >> self.shift) as u32;
        let n = to + if self.wrapped { cnt } else { 0 } - from;
        r.ci = r.ci.wrapping_add(n);
        // SAFETY: `cqe` is an entry inside the array or the ring's end; either way its owner
        // byte is then the first entry's, as `seek` would set it.
        r.next_owner = unsafe {
            NonNull::new_unchecked(if self.cqe == self.end {
                r.first.as_ptr()
            } else {
                self.cqe
            })
            .add(Cqe::<&[u8]>::OWNER_OFFSET)
        };
        r.sw_owner = if self.cqe == self.end {
            self.sw ^ mlx4_prm::cqe_owner::OWNER
        } else {
            self.sw
        };
    }
}

// SAFETY: as for SqRing.
unsafe impl Send for CqRing {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_frame_is_owned_and_not_an_error() {
        for sw in [0, cqe_owner::OWNER] {
            for op in 0..=u8::MAX {
                let owned = op & cqe_owner::OWNER == sw;
                let error = op & cqe_owner::OPCODE_MASK == cqe_opcode::ERROR;
                assert_eq!(
                    is_frame(op, sw),
                    owned && !error,
                    "op {op:#04x} sw {sw:#04x}"
                );
            }
        }
    }
}
