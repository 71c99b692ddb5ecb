//! The send ring: TXBB slots addressed by free-running counters, their owner words and
//! stamps, and the registers that go with them.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use mlx4_prm::{owner_opcode, CtrlSeg, STAMP_DWORD, TXBB_SHIFT};

use super::WqeMut;
use crate::hw::SqDesc;
use crate::mmio::{BfReg, Copy64, SendDoorbell, Txbb};

/// A view of a send queue ring of `txbb_cnt` TXBBs, addressed by free-running counters. It
/// holds the queue's descriptor, which [`SqRing::into_desc`] hands back for destroy.
/// A WQE's slot is written without being read first (write first): the device thread read
/// the line last, and `apps/lines` (`sq` rows) measures read-then-write at about 1.8x the
/// cycles per WQE.
pub struct SqRing {
    desc: SqDesc,
}

impl SqRing {
    /// A view whose every TXBB starts invalid for pass 0 (owner bit set, as rdma-core
    /// initialises SQ ownership), so the device never mistakes stale memory for a WQE.
    ///
    /// # Safety
    /// The descriptor is one the device handed out for a live send queue, and what it names
    /// (the ring's `txbb_cnt` TXBBs, page-aligned; the doorbell register; the BlueFlame
    /// register, if any) stays mapped until this view is dropped or handed back
    /// ([`SqRing::into_desc`]): the device that owns that memory (`Soft`, `Handles`) is not
    /// dropped and the queue not destroyed before. Nothing but this view and the device
    /// reaches the ring meanwhile: one view per descriptor.
    pub unsafe fn new(desc: SqDesc) -> SqRing {
        let ring = SqRing { desc };
        for i in 0..ring.txbb_cnt() {
            ring.first_dword(i).store(u32::MAX, Ordering::Relaxed);
        }
        ring
    }

    #[inline(always)]
    pub fn txbb_cnt(&self) -> u32 {
        self.desc.txbb_cnt()
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
        unsafe {
            SendDoorbell::new(
                self.desc.doorbell().as_ptr(),
                self.desc.db_writes(),
                self.desc.qpn(),
            )
        }
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
    pub(super) fn txbb(&self, c: u32) -> NonNull<u8> {
        let slot = (c & (self.txbb_cnt() - 1)) as usize;
        // SAFETY: slot < txbb_cnt, so the TXBB lies inside the ring's allocation.
        unsafe { NonNull::new_unchecked(self.desc.buf().as_ptr().add(slot << TXBB_SHIFT)) }
    }

    fn first_dword(&self, counter: u32) -> &AtomicU32 {
        // SAFETY: inside the ring, 4-byte aligned (TXBBs are 64-byte aligned); the device
        // accesses this word only atomically as well, and no Rust reference to bytes covers it.
        unsafe { AtomicU32::from_ptr(self.txbb(counter).as_ptr().cast()) }
    }

    /// A writer for the unpublished WQE of `txbbs` TXBBs at counter `start`, which must not
    /// wrap. Outside a burst: the drain NOP and the capability check's NOPs.
    pub fn wqe_mut(&mut self, start: u32, txbbs: u32) -> WqeMut<'_> {
        let slot = start & (self.txbb_cnt() - 1);
        assert!(
            txbbs >= 1 && slot + txbbs <= self.txbb_cnt(),
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
        let slot = start & (self.txbb_cnt() - 1);
        assert!(slot + T as u32 <= self.txbb_cnt(), "WQE wraps the ring");
        WqeMut::new(self.txbb(start).as_ptr(), T << TXBB_SHIFT)
    }

    /// A published WQE as whole TXBBs, for the BlueFlame copy. The exclusive borrow keeps
    /// every driver store to the ring (owner words, stamps, WQE writers) away while the view
    /// lives; the device only ever reads the send queue.
    #[inline(always)]
    pub fn wqe_blocks(&mut self, start: u32, txbbs: u32) -> &[Txbb] {
        let slot = start & (self.txbb_cnt() - 1);
        assert!(
            txbbs >= 1 && slot + txbbs <= self.txbb_cnt(),
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
        let slot = start & (self.txbb_cnt() - 1);
        assert!(
            txbbs >= 1 && slot + txbbs <= self.txbb_cnt(),
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
        c & self.txbb_cnt() != 0
    }

    /// The owner word of a WQE with `opcode` at counter `c` (host order, for `publish`).
    #[inline(always)]
    pub fn owner_word(&self, c: u32, opcode: u8) -> u32 {
        owner_bit(self.owner(c)) | u32::from(opcode)
    }

    /// Stamps the TXBBs in `[from, to)` (counters) after their completion: each first dword
    /// becomes `0x7fffffff` with bit 31 = the parity of the pass just consumed, so the slot is
    /// invalid for the next pass until a new WQE is published there. One value per run up to
    /// the ring's end, stored by loops unrolled by 32, then 8.
    pub fn stamp(&self, from: u32, to: u32) {
        let mut c = from;
        while c != to {
            let slot = c & (self.txbb_cnt() - 1);
            let run = (self.txbb_cnt() - slot).min(to.wrapping_sub(c)) as usize;
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
            // SAFETY: whole groups of 32 TXBBs from `p`, inside the run.
            let end32 = unsafe { p.add((run & !31) << TXBB_SHIFT) };
            while p != end32 {
                for i in 0..32 {
                    store(p, i);
                }
                // SAFETY: at most `end32`, inside the run.
                p = unsafe { p.add(32 << TXBB_SHIFT) };
            }
            // What is left, by 8 while 8 fit.
            // SAFETY: whole groups of 8 TXBBs from `p`, inside the run.
            let end8 = unsafe { p.add((run & 31 & !7) << TXBB_SHIFT) };
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

// SAFETY: the ring is memory shared with the device, used by one thread at a time (the
// queue's); the view has no thread affinity.
unsafe impl Send for SqRing {}
