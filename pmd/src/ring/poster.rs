//! A burst's posting over the send ring: the contiguous run of TXBBs, the pad NOP where a
//! WQE would cross the ring's end, and the owner word stored when the next WQE is taken.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};

use mlx4_prm::{opcode, owner_opcode, TXBB_SHIFT};

use super::{SqRing, WqeMut};

impl SqRing {
    /// Starts posting a burst at counter `pos`, which must not pass `limit` (the room the
    /// queue's budget leaves, less than a whole ring). `sink` takes the store that would
    /// publish the WQE before the first one (there is none), so taking a WQE costs no branch.
    #[inline(always)]
    pub fn poster<'a>(&'a mut self, pos: u32, limit: u32, sink: &'a AtomicU32) -> Poster<'a> {
        let cnt = self.txbb_cnt();
        // Less than a whole ring: the run after a wrap stays inside it.
        let room = limit.wrapping_sub(pos).min(cnt - 1);
        let run = room.min(cnt - (pos & (cnt - 1)));
        let at = self.txbb(pos).as_ptr();
        Poster {
            at,
            // SAFETY: `run` TXBBs from `at` end at or before the ring's end.
            run_end: unsafe { at.add((run as usize) << TXBB_SHIFT) },
            pending: sink.as_ptr(),
            send_be: self.owner_word(pos, opcode::SEND).to_be(),
            run_start: at,
            run_pos: pos,
            limit: pos.wrapping_add(room),
            mask: cnt - 1,
            sink: sink.as_ptr(),
            last_be: None,
            _ring: PhantomData,
        }
    }
}

/// One burst's posting: hands out WQE writers over the contiguous TXBBs of the current run,
/// and publishes each WQE when the next is taken (see the module notes). Its hot state is two
/// cursors, the WQE waiting to be published and the run's owner word.
pub struct Poster<'a> {
    /// Where the next WQE goes.
    at: *mut u8,
    /// Where the current run ends: the ring's end, or the end of the burst's room.
    run_end: *mut u8,
    /// Dword 0 of the last WQE taken, not yet published; `sink` before the first.
    pending: *mut u32,
    /// The run's SEND owner word, big-endian, ready to store.
    send_be: u32,
    /// Where the current run started, and its counter.
    run_start: *mut u8,
    run_pos: u32,
    /// The counter the burst may not pass, and the ring's size less one: what a wrap needs
    /// (the rest is derived then, not on every burst).
    limit: u32,
    mask: u32,
    sink: *mut u32,
    /// The owner word of a last WQE that is not a plain SEND ([`Poster::take_last`]).
    last_be: Option<u32>,
    _ring: PhantomData<&'a mut SqRing>,
}

impl<'a> Poster<'a> {
    /// Counter of the next WQE.
    #[inline(always)]
    pub fn pos(&self) -> u32 {
        self.run_pos
            .wrapping_add(((self.at as usize - self.run_start as usize) >> TXBB_SHIFT) as u32)
    }

    #[inline(always)]
    fn publish_pending(&mut self) {
        // SAFETY: `pending` is the sink or dword 0 of a WQE this poster handed out: inside the
        // ring, 4-byte aligned and reached only atomically.
        unsafe { AtomicU32::from_ptr(self.pending) }.store(self.send_be, Ordering::Release);
    }

    /// Hands out `len` bytes at the cursor (which fit) and publishes the WQE before.
    #[inline(always)]
    fn advance(&mut self, len: usize) -> *mut u8 {
        self.publish_pending();
        let at = self.at;
        self.pending = at.cast();
        // SAFETY: `len` bytes fit before the run's end, inside the ring.
        self.at = unsafe { at.add(len) };
        at
    }

    /// The next WQE, of `TXBBS` TXBBs (a SEND), if it fits before the current run's end (else
    /// see [`Poster::wrap`]). Publishes the WQE taken before it, which the caller has finished
    /// writing. No call and no branch but the room check: a loop of these keeps the poster in
    /// registers.
    #[inline(always)]
    pub fn take<const TXBBS: usize>(&mut self) -> Option<WqeMut<'a, TXBBS>> {
        const { assert!(TXBBS > 0) };
        let len = TXBBS << TXBB_SHIFT;
        if (self.run_end as usize - self.at as usize) < len {
            return None;
        }
        Some(WqeMut::new(self.advance(len), len))
    }

    /// The hot state in locals of its own, for a tight loop of [`Cursor::take`]: a loop of
    /// `take` on a poster whose address is known elsewhere keeps reloading it from memory.
    #[inline(always)]
    pub fn cursor(&mut self) -> Cursor<'_, 'a> {
        Cursor {
            at: self.at,
            run_end: self.run_end,
            pending: self.pending,
            send_be: self.send_be,
            poster: self,
        }
    }

    /// The next WQE of `txbbs` TXBBs, known only at run time, wrapping to the next pass if
    /// needed; None when the burst's room is used up.
    #[inline]
    pub fn take_dyn(&mut self, txbbs: u32) -> Option<WqeMut<'a>> {
        let len = (txbbs as usize) << TXBB_SHIFT;
        if txbbs == 0 || (self.run_end as usize - self.at as usize) < len && !self.wrap(txbbs) {
            return None;
        }
        Some(WqeMut::new(self.advance(len), len))
    }

    /// As [`Poster::take_dyn`], for a WQE whose owner word carries `bits` (the opcode and
    /// flags such as IIP/ILP) instead of SEND: it must be the burst's last, as the queue
    /// publishes the last WQE with the word [`Poster::finish`] hands back, while every other
    /// is published with the run's SEND word.
    pub fn take_last(&mut self, txbbs: u32, bits: u32) -> Option<WqeMut<'a>> {
        debug_assert!(self.last_be.is_none(), "nothing is taken after a last WQE");
        let w = self.take_dyn(txbbs)?;
        let owner = u32::from_be(self.send_be) & owner_opcode::OWNER;
        self.last_be = Some((owner | bits).to_be());
        Some(w)
    }

    /// The current run ends before a WQE of `txbbs`: if that is the ring's end and the
    /// burst's room continues after it for at least that WQE, pads up to the end with one NOP
    /// and starts the next pass's run at the ring's start (true); else the burst is full.
    #[cold]
    #[inline(never)]
    pub fn wrap(&mut self, txbbs: u32) -> bool {
        let run = ((self.run_end as usize - self.run_start as usize) >> TXBB_SHIFT) as u32;
        let run_end_pos = self.run_pos.wrapping_add(run);
        // The run ends at the ring's end (not at the room's) with room after it.
        let at_ring_end = run_end_pos & self.mask == 0;
        let beyond = self.limit.wrapping_sub(run_end_pos);
        if !at_ring_end || beyond < txbbs {
            return false;
        }
        self.publish_pending();
        self.pending = self.sink;
        let owner = u32::from_be(self.send_be) & owner_opcode::OWNER;
        let pad = (self.run_end as usize - self.at as usize) >> TXBB_SHIFT;
        if pad > 0 {
            let mut w: WqeMut<'_> = WqeMut::new(self.at, pad << TXBB_SHIFT);
            w.put_nop(pad as u32, false);
            // SAFETY: as in publish_pending, for the NOP just written.
            unsafe { AtomicU32::from_ptr(self.at.cast()) }
                .store((owner | u32::from(opcode::NOP)).to_be(), Ordering::Release);
        }
        // SAFETY: the run started `run_pos & mask` TXBBs into the ring.
        let ring = unsafe {
            self.run_start
                .sub(((self.run_pos & self.mask) as usize) << TXBB_SHIFT)
        };
        self.run_pos = run_end_pos;
        self.run_start = ring;
        self.at = ring;
        // SAFETY: the room after the ring's end is less than a whole ring.
        self.run_end = unsafe { ring.add((beyond as usize) << TXBB_SHIFT) };
        self.send_be = ((owner ^ owner_opcode::OWNER) | u32::from(opcode::SEND)).to_be();
        true
    }

    /// Ends the burst: the counter after everything posted, and the last WQE, still
    /// unpublished (None if nothing was taken).
    #[inline(always)]
    pub fn finish(self) -> Posted {
        let end = self.pos();
        if self.pending == self.sink {
            return Posted { end, last: None };
        }
        // The last WQE was taken in the current run and ends at the cursor.
        let txbbs = ((self.at as usize - self.pending as usize) >> TXBB_SHIFT) as u32;
        Posted {
            end,
            last: Some(LastWqe {
                start: end.wrapping_sub(txbbs),
                txbbs,
                send_be: self.last_be.unwrap_or(self.send_be),
            }),
        }
    }
}

/// What a burst posted: the counter after it, and its last WQE, written but not yet
/// published (the queue finishes it through [`SqRing::wqe_mut`], [`SqRing::ctrl_dword1`]
/// and [`SqRing::publish`]).
#[derive(Debug, Clone, Copy)]
pub struct Posted {
    pub end: u32,
    pub last: Option<LastWqe>,
}

/// Where a WQE is: its counter and size; and its SEND owner word (big-endian, as stored),
/// which the poster already had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastWqe {
    pub start: u32,
    pub txbbs: u32,
    pub send_be: u32,
}

/// A [`Poster`]'s cursor in locals (see [`Poster::cursor`]); written back when dropped.
pub struct Cursor<'p, 'a> {
    at: *mut u8,
    run_end: *mut u8,
    pending: *mut u32,
    send_be: u32,
    poster: &'p mut Poster<'a>,
}

impl<'a> Cursor<'_, 'a> {
    /// As [`Poster::take`].
    #[inline(always)]
    pub fn take<const TXBBS: usize>(&mut self) -> Option<WqeMut<'a, TXBBS>> {
        const { assert!(TXBBS > 0) };
        let len = TXBBS << TXBB_SHIFT;
        let at = self.at;
        let next = at.wrapping_add(len);
        if next > self.run_end {
            return None;
        }
        // SAFETY: as in Poster::publish_pending.
        unsafe { AtomicU32::from_ptr(self.pending) }.store(self.send_be, Ordering::Release);
        self.pending = at.cast();
        // `len` bytes fit before the run's end, inside the ring.
        self.at = next;
        Some(WqeMut::new(at, len))
    }
}

impl<'a> Cursor<'_, 'a> {
    /// TXBBs left before the current run's end.
    #[inline(always)]
    pub fn room(&self) -> usize {
        (self.run_end as usize - self.at as usize) >> TXBB_SHIFT
    }

    /// As [`Cursor::take`] without the room check, for a loop that made it once for all the
    /// WQEs it takes ([`Cursor::room`]).
    ///
    /// # Safety
    /// `TXBBS` TXBBs fit before the run's end: [`Cursor::room`] counted at least as many TXBBs
    /// as this and the takes since then ask for.
    #[inline(always)]
    pub unsafe fn take_unchecked<const TXBBS: usize>(&mut self) -> WqeMut<'a, TXBBS> {
        const { assert!(TXBBS > 0) };
        let len = TXBBS << TXBB_SHIFT;
        debug_assert!(self.room() >= TXBBS);
        let at = self.at;
        // SAFETY: as in Poster::publish_pending.
        unsafe { AtomicU32::from_ptr(self.pending) }.store(self.send_be, Ordering::Release);
        self.pending = at.cast();
        // SAFETY: `len` bytes fit before the run's end (the caller's contract).
        self.at = unsafe { at.add(len) };
        WqeMut::new(at, len)
    }
}

impl<'a> Cursor<'_, 'a> {
    /// The next WQE of `TXBBS` TXBBs in a run of WQEs of that size, publishing the one before
    /// it where it is, the `TXBBS` TXBBs before the cursor: the store and a pointer's step per
    /// WQE, no WQE kept pending. The WQE before stays the cursor's pending one, already
    /// published, until [`Cursor::last_is_pending`] ends the run.
    ///
    /// # Safety
    /// `TXBBS` TXBBs fit before the run's end (as for [`Cursor::take_unchecked`]), and the
    /// `TXBBS` TXBBs before the cursor are a WQE this cursor handed out (by
    /// [`Cursor::take_unchecked`] or this), finished and not yet published.
    #[inline(always)]
    pub unsafe fn take_after_unchecked<const TXBBS: usize>(&mut self) -> WqeMut<'a, TXBBS> {
        const { assert!(TXBBS > 0) };
        let len = TXBBS << TXBB_SHIFT;
        debug_assert!(self.room() >= TXBBS);
        let at = self.at;
        // SAFETY: the WQE before `at` is one of this run (the caller's contract): inside the
        // ring, 4-byte aligned, reached only atomically.
        unsafe { AtomicU32::from_ptr(at.sub(len).cast()) }.store(self.send_be, Ordering::Release);
        // SAFETY: `len` bytes fit before the run's end (the caller's contract).
        self.at = unsafe { at.add(len) };
        WqeMut::new(at, len)
    }

    /// Ends a run of [`Cursor::take_after_unchecked`]: the WQE before the cursor, of
    /// `TXBBS` TXBBs, is the pending one again (the last, still unpublished).
    ///
    /// # Safety
    /// The run took at least one WQE, each of `TXBBS` TXBBs, the first by
    /// [`Cursor::take_unchecked`].
    #[inline(always)]
    pub unsafe fn last_is_pending<const TXBBS: usize>(&mut self) {
        // SAFETY: the last WQE taken is the `TXBBS` TXBBs before the cursor (the caller's
        // contract).
        self.pending = unsafe { self.at.sub(TXBBS << TXBB_SHIFT) }.cast();
    }
}

impl Drop for Cursor<'_, '_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.poster.at = self.at;
        self.poster.pending = self.pending;
    }
}
