//! The rings the driver shares with the device: the send queue (64-byte TXBBs) and completion
//! queues (32-byte CQEs plus their consumer-index record).
//!
//! Protocol, not locks, keeps driver and device apart: the device reads a WQE only after it
//! sees the owner word the driver stores last (release), and the driver reads a CQE only after
//! it sees the owner bit the device stores last. Words both sides touch concurrently are only
//! ever reached atomically and never lie under a Rust reference to bytes: the owner word and
//! the size word of the TXBB the device polls (dwords 0 and 1 of a WQE's first TXBB, which
//! also carry the stamps), CQE owner bytes and doorbell records. A WQE's other bytes belong to
//! the driver from its completion until its owner word is published; [`WqeMut`] writes them
//! through raw pointers and never hands out a slice over dwords 0 and 1.
//!
//! Per burst, not per packet ([`Poster`]): the contiguous run of TXBBs up to the ring's end is
//! computed once, with at most one pad NOP where a WQE would cross it (a burst never uses a
//! whole ring, so it wraps at most once); the owner word is computed once per run; and each
//! WQE's owner word is stored when the next one is taken, so the last WQE of a burst stays
//! unpublished until the queue has decided its completion request and whether it goes out
//! through BlueFlame.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

use mlx4_prm::{
    opcode, owner_opcode, Cqe, CtrlSeg, DataSeg, CQE_SIZE, STAMP_DWORD, TXBB_SHIFT, TXBB_SIZE,
};

use crate::hw::{CqDesc, RqDesc, SqDesc};
use crate::mmio::{BfReg, Copy64, SendDoorbell, Txbb};

/// A view of a send queue ring of `txbb_cnt` TXBBs, addressed by free-running counters. It
/// holds the queue's descriptor, which [`SqRing::into_desc`] hands back for destroy.
/// A WQE's slot is written without being read first (write first): the device thread read
/// the line last, and `apps/lines` (`sq` rows) measures read-then-write at about 1.8x the
/// cycles per WQE.
pub struct SqRing {
    mem: NonNull<u8>,
    txbb_cnt: u32,
    desc: SqDesc,
}

impl SqRing {
    /// A view whose every TXBB starts invalid for pass 0 (owner bit set, as rdma-core
    /// initialises SQ ownership), so the device never mistakes stale memory for a WQE.
    pub fn new(desc: SqDesc) -> SqRing {
        let ring = SqRing {
            mem: desc.buf(),
            txbb_cnt: desc.txbb_cnt(),
            desc,
        };
        for i in 0..ring.txbb_cnt {
            ring.first_dword(i).store(u32::MAX, Ordering::Relaxed);
        }
        ring
    }

    #[inline(always)]
    pub fn txbb_cnt(&self) -> u32 {
        self.txbb_cnt
    }

    pub fn desc(&self) -> &SqDesc {
        &self.desc
    }

    /// Ends the view, for destroying the queue.
    pub fn into_desc(self) -> SqDesc {
        self.desc
    }

    /// The queue's send doorbell. The queue keeps it beside the ring and drops both before it
    /// destroys the SQ.
    pub fn doorbell(&self) -> SendDoorbell {
        // SAFETY: the descriptor names the SQ's doorbell register, mapped until the SQ is
        // destroyed, which the caller does only after dropping this value.
        unsafe { SendDoorbell::new(self.desc.doorbell().as_ptr(), self.desc.qpn()) }
    }

    /// The queue's BlueFlame register, if the device gave it one (kept as [`SqRing::doorbell`]).
    pub fn bf_reg(&self, copy: Copy64) -> Option<BfReg> {
        let bf = self.desc.bf()?;
        // SAFETY: the descriptor names a 64-byte aligned register of two halves, mapped until
        // the SQ is destroyed, which the caller does only after dropping this value.
        Some(unsafe { BfReg::new(bf.reg.as_ptr(), bf.half_size, copy) })
    }

    /// The first byte of the TXBB at counter `c`.
    #[inline(always)]
    fn txbb(&self, c: u32) -> NonNull<u8> {
        let slot = (c & (self.txbb_cnt - 1)) as usize;
        // SAFETY: slot < txbb_cnt, so the TXBB lies inside the ring's allocation.
        unsafe { NonNull::new_unchecked(self.mem.as_ptr().add(slot << TXBB_SHIFT)) }
    }

    fn first_dword(&self, counter: u32) -> &AtomicU32 {
        // SAFETY: inside the ring, 4-byte aligned (TXBBs are 64-byte aligned); the device
        // accesses this word only atomically as well, and no Rust reference to bytes covers it.
        unsafe { AtomicU32::from_ptr(self.txbb(counter).as_ptr().cast()) }
    }

    /// A writer for the unpublished WQE of `txbbs` TXBBs at counter `start`, which must not
    /// wrap. Outside a burst: the drain NOP and the capability check's NOPs.
    pub fn wqe_mut(&mut self, start: u32, txbbs: u32) -> WqeMut<'_> {
        let slot = start & (self.txbb_cnt - 1);
        assert!(
            txbbs >= 1 && slot + txbbs <= self.txbb_cnt,
            "WQE wraps the ring"
        );
        WqeMut::new(self.txbb(start).as_ptr(), (txbbs as usize) << TXBB_SHIFT)
    }

    /// As [`SqRing::wqe_mut`] for a WQE of `T` TXBBs, known at compile time (the straight-line
    /// path's writers take that).
    #[inline(always)]
    pub fn wqe_fixed<const T: usize>(&mut self, start: u32) -> WqeMut<'_, T> {
        const { assert!(T > 0 && T <= 16) };
        // In u32, as the callers' own room checks: theirs then decide this one.
        let slot = start & (self.txbb_cnt - 1);
        assert!(slot + T as u32 <= self.txbb_cnt, "WQE wraps the ring");
        WqeMut::new(self.txbb(start).as_ptr(), T << TXBB_SHIFT)
    }

    /// A published WQE as whole TXBBs, for the BlueFlame copy. The exclusive borrow keeps
    /// every driver store to the ring (owner words, stamps, WQE writers) away while the view
    /// lives; the device only ever reads the send queue.
    #[inline(always)]
    pub fn wqe_blocks(&mut self, start: u32, txbbs: u32) -> &[Txbb] {
        let slot = start & (self.txbb_cnt - 1);
        assert!(
            txbbs >= 1 && slot + txbbs <= self.txbb_cnt,
            "WQE wraps the ring"
        );
        // SAFETY: inside the ring (asserted); TXBBs are 64-byte aligned as `Txbb` requires (the
        // ring is page-aligned); nothing writes these bytes while the borrow of `self` lives.
        unsafe {
            std::slice::from_raw_parts(self.txbb(start).as_ptr().cast::<Txbb>(), txbbs as usize)
        }
    }

    /// [`SqRing::publish`] then [`SqRing::wqe_blocks`], the WQE located once: the BlueFlame
    /// path's ring copy, then the view its copy is made from.
    #[inline(always)]
    pub fn publish_blocks(&mut self, start: u32, txbbs: u32, owner_opcode: u32) -> &[Txbb] {
        let slot = start & (self.txbb_cnt - 1);
        assert!(
            txbbs >= 1 && slot + txbbs <= self.txbb_cnt,
            "WQE wraps the ring"
        );
        let p = self.txbb(start).as_ptr();
        // SAFETY: the WQE's first dword, inside the ring, reached only atomically.
        unsafe { AtomicU32::from_ptr(p.cast()) }.store(owner_opcode.to_be(), Ordering::Release);
        // SAFETY: as in wqe_blocks; the atomic store above is done before the view exists.
        unsafe { std::slice::from_raw_parts(p.cast::<Txbb>(), txbbs as usize) }
    }

    /// Dword 1 of the control segment of the WQE at `start`, as written (host order): VLAN
    /// tag, insert flags, size.
    #[inline(always)]
    pub fn ctrl_dword1(&self, start: u32) -> u32 {
        // SAFETY: inside the ring, 4-byte aligned; this word is reached only atomically.
        u32::from_be(
            unsafe { AtomicU32::from_ptr(self.txbb(start).as_ptr().add(4).cast()) }
                .load(Ordering::Relaxed),
        )
    }

    /// The first 8 bytes of the control segment of the published WQE at `start` (owner word
    /// and opcode, then VLAN fields and size), as the device reads them. For the error path,
    /// which counts what a failed queue will never send.
    pub fn ctrl_head(&self, start: u32) -> CtrlSeg<[u8; 8]> {
        let w0 = self
            .first_dword(start)
            .load(Ordering::Acquire)
            .to_ne_bytes();
        let w1 = self.ctrl_dword1(start).to_be_bytes();
        CtrlSeg::new_unchecked([w0[0], w0[1], w0[2], w0[3], w1[0], w1[1], w1[2], w1[3]])
    }

    /// Hands the WQE at `start` to the device: the owner word, big-endian, written last.
    #[inline(always)]
    pub fn publish(&self, start: u32, owner_opcode: u32) {
        self.first_dword(start)
            .store(owner_opcode.to_be(), Ordering::Release);
    }

    /// Owner bit value for a WQE at counter `c`: the parity of the pass.
    #[inline(always)]
    pub fn owner(&self, c: u32) -> bool {
        c & self.txbb_cnt != 0
    }

    /// The owner word of a WQE with `opcode` at counter `c` (host order, for `publish`).
    #[inline(always)]
    pub fn owner_word(&self, c: u32, opcode: u8) -> u32 {
        owner_bit(self.owner(c)) | u32::from(opcode)
    }

    /// Starts posting a burst at counter `pos`, which must not pass `limit` (the room the
    /// queue's budget leaves, less than a whole ring). `sink` takes the store that would
    /// publish the WQE before the first one (there is none), so taking a WQE costs no branch.
    #[inline(always)]
    pub fn poster<'a>(&'a mut self, pos: u32, limit: u32, sink: &'a AtomicU32) -> Poster<'a> {
        let cnt = self.txbb_cnt;
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

    /// Stamps the TXBBs in `[from, to)` (counters) after their completion: each first dword
    /// becomes `0x7fffffff` with bit 31 = the parity of the pass just consumed, so the slot is
    /// invalid for the next pass until a new WQE is published there. One value per run up to
    /// the ring's end, stored by a loop unrolled by 8.
    pub fn stamp(&self, from: u32, to: u32) {
        let mut c = from;
        while c != to {
            let slot = c & (self.txbb_cnt - 1);
            let run = (self.txbb_cnt - slot).min(to.wrapping_sub(c)) as usize;
            let value = (STAMP_DWORD | owner_bit(self.owner(c))).to_be();
            let mut p = self.txbb(c).as_ptr();
            // SAFETY: the run's TXBBs lie inside the ring, up to its end.
            let end = unsafe { p.add(run << TXBB_SHIFT) };
            let store = |p: *mut u8, i: usize| {
                // SAFETY: every call names a TXBB's first dword inside the run: 4-byte
                // aligned, reached only atomically (by the device as well).
                unsafe { AtomicU32::from_ptr(p.add(i << TXBB_SHIFT).cast()) }
                    .store(value, Ordering::Relaxed)
            };
            // SAFETY: whole groups of 8 TXBBs from `p`, inside the run.
            let end8 = unsafe { p.add((run & !7) << TXBB_SHIFT) };
            while p != end8 {
                for i in 0..8 {
                    store(p, i);
                }
                // SAFETY: at most `end8`, inside the run.
                p = unsafe { p.add(8 << TXBB_SHIFT) };
            }
            while p < end {
                store(p, 0);
                // SAFETY: inside the run, or its end.
                p = unsafe { p.add(1 << TXBB_SHIFT) };
            }
            c = c.wrapping_add(run as u32);
        }
    }
}

#[inline(always)]
fn owner_bit(set: bool) -> u32 {
    if set {
        owner_opcode::OWNER
    } else {
        0
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
            let mut w = WqeMut::new(self.at, pad << TXBB_SHIFT);
            crate::wqe::write_nop(&mut w, pad as u32, false);
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

impl Drop for Cursor<'_, '_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.poster.at = self.at;
        self.poster.pending = self.pending;
    }
}

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
    fn new(base: *mut u8, len: usize) -> Self {
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

    /// Bytes 4-7 of the control segment (VLAN fields and size), as stored: the word the
    /// device reads beside the owner word, stored atomically.
    #[inline(always)]
    pub fn put_dword1(&mut self, dword1: u32) {
        // SAFETY: bytes 4..8 of the WQE's first TXBB: 4-byte aligned, reached only atomically.
        unsafe { AtomicU32::from_ptr(self.base.add(4).cast()) }.store(dword1, Ordering::Relaxed);
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
    /// no loop and no library call, for the straight-line path.
    #[inline(always)]
    pub fn put_small(&mut self, off: usize, src: &[u8]) {
        let n = src.len();
        assert!(n <= 64);
        let d = self.span(off, n);
        let s = src.as_ptr();
        // SAFETY: every move below reads inside `src` and writes inside `[d, d + n)`, which
        // lies in the WQE (span): for n in [K, 2K] the moves of K bytes at 0 and n - K do.
        unsafe {
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

// SAFETY: the ring is memory shared with the device, used by one thread at a time (the
// queue's); the view has no thread affinity.
unsafe impl Send for SqRing {}

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
    pub fn new(desc: CqDesc) -> CqRing {
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
        // SAFETY: `next_owner` is an owner byte inside the CQE array (`seek`, `advance`,
        // `take_ready`), which the device writes last, atomically.
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

    /// [`CqRing::ready`] as a claim that [`CqRing::take_ready`] honours without reading the
    /// owner bytes again: a burst counts its CQEs once, sizes its allocation with the count,
    /// then walks them.
    #[inline(always)]
    pub fn ready_run(&self, max: usize) -> Ready {
        Ready {
            ring: self.first.as_ptr() as usize,
            ci: self.ci,
            // A burst of one asks for the one owner byte only.
            n: if max == 1 {
                u32::from(self.has_cqe())
            } else {
                self.ready(max) as u32
            },
        }
    }

    /// Hands the CQEs `r` counted to `f` in order, read in place, and moves the consumer
    /// counter past them once: one run to the ring's end and one from its start, with no
    /// owner load or wrap test per CQE.
    #[inline(always)]
    pub fn take_ready(&mut self, r: Ready, mut f: impl FnMut(Cqe<&[u8]>)) {
        assert!(
            r.ring == self.first.as_ptr() as usize && r.ci == self.ci,
            "a Ready of another CQ, or of an older consumer counter"
        );
        let (cnt, shift) = (self.cqe_cnt, self.entry_shift);
        let idx = self.ci & (cnt - 1);
        let head = r.n.min(cnt - idx);
        let mut at = (idx as usize) << shift;
        for i in 0..r.n {
            if i == head {
                at = 0;
            }
            // SAFETY: `at` is an entry inside the array (`idx + i` below `cnt` in the first
            // run, `i - head` below `n - head` in the second, and `ready` never counts more
            // than `cnt`); software owns it, since `ready` saw its owner byte with acquire
            // for this very consumer counter (asserted), and the device writes it again only
            // after the consumer record passes it, which `update_ci` does after this call.
            let cqe = unsafe { std::slice::from_raw_parts(self.first.as_ptr().add(at), CQE_SIZE) };
            f(Cqe::new_unchecked(cqe));
            at += 1 << shift;
        }
        // As `advance`, by n at once: `ready` never counts past one wrap.
        self.ci = self.ci.wrapping_add(r.n);
        let mut at = self.owner_offset() + ((r.n as usize) << shift);
        if at >= self.span() {
            at -= self.span();
            self.sw_owner ^= mlx4_prm::cqe_owner::OWNER;
        }
        // SAFETY: reduced below the span: an owner byte inside the CQE array.
        self.next_owner = unsafe { self.first.add(at) };
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

/// CQEs software owns from a given consumer counter of one CQ ([`CqRing::ready_run`]).
#[must_use]
#[derive(Debug)]
pub struct Ready {
    ring: usize,
    ci: u32,
    n: u32,
}

impl Ready {
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.n as usize
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// TXBBs a WQE of `bytes` occupies.
pub const fn txbbs_for(bytes: usize) -> u32 {
    bytes.div_ceil(TXBB_SIZE) as u32
}

// SAFETY: as for SqRing.
unsafe impl Send for CqRing {}

/// A view of a receive queue: scatter entries and the doorbell record.
pub struct RqRing {
    desc: RqDesc,
}

impl RqRing {
    pub fn new(desc: RqDesc) -> RqRing {
        RqRing { desc }
    }

    pub fn wqe_cnt(&self) -> u32 {
        self.desc.wqe_cnt()
    }

    pub fn sges(&self) -> u32 {
        self.desc.sges()
    }

    pub fn desc(&self) -> &RqDesc {
        &self.desc
    }

    /// Ends the view, for destroying the queue.
    pub fn into_desc(self) -> RqDesc {
        self.desc
    }

    /// Scatter entry `i` (WQE-major), for an entry the device does not own right now: one whose
    /// completion was consumed, before the doorbell record hands it back.
    pub fn entry_mut(&mut self, i: usize) -> DataSeg<&mut [u8]> {
        const LEN: usize = DataSeg::<&[u8]>::LEN;
        assert!(i < (self.desc.wqe_cnt() * self.desc.sges()) as usize);
        // SAFETY: in bounds (asserted), inside the ring the descriptor names; exclusive to the
        // driver by the queue protocol above.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(self.desc.buf().as_ptr().add(i * LEN), LEN) };
        DataSeg::new_unchecked(bytes)
    }

    /// Scatter entry `i` (WQE-major) as raw bytes, for the burst's refill (same contract as
    /// [`RqRing::entry_mut`]).
    #[inline(always)]
    pub fn scatter_entry(&mut self, i: usize) -> &mut [u8; mlx4_prm::DS_SIZE] {
        const N: usize = mlx4_prm::DS_SIZE;
        assert!(i < (self.desc.wqe_cnt() * self.desc.sges()) as usize);
        // SAFETY: in bounds (asserted), 16-byte entries inside the ring; exclusive to the
        // driver by the queue protocol above, and no other reference to these bytes exists
        // while `self` is borrowed.
        unsafe { &mut *self.desc.buf().as_ptr().add(i * N).cast::<[u8; N]>() }
    }

    /// Every scatter entry (WQE-major) as raw bytes, for a burst's refill: one view per burst
    /// rather than a bounds assertion per entry (same contract as [`RqRing::entry_mut`], for
    /// the entries whose completions the burst consumed).
    #[inline(always)]
    pub fn scatter_entries(&mut self) -> &mut [[u8; mlx4_prm::DS_SIZE]] {
        let n = (self.desc.wqe_cnt() * self.desc.sges()) as usize;
        // SAFETY: `n` 16-byte entries inside the ring the descriptor names; exclusive to the
        // driver by the queue protocol above, and no other reference to these bytes exists
        // while `self` is borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.desc.buf().as_ptr().cast(), n) }
    }

    /// The doorbell record: the producer count, written after the entries it covers.
    pub fn db_rec(&self) -> &AtomicU32 {
        // SAFETY: the RQ's record (descriptor), 4-byte aligned; the device reads it atomically.
        unsafe { AtomicU32::from_ptr(self.desc.db_rec().as_ptr()) }
    }
}

// SAFETY: as for SqRing.
unsafe impl Send for RqRing {}
