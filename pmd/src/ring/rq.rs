//! The receive ring: scatter entries and the doorbell record.

use std::sync::atomic::AtomicU32;

use mlx4_prm::DataSeg;

use crate::hw::RqDesc;

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
