//! The receive ring: scatter entries and the doorbell record.

use std::sync::atomic::AtomicU32;

use mlx4_prm::DataSeg;

use crate::hw::RqDesc;

/// A view of a receive queue: scatter entries and the doorbell record.
pub struct RqRing {
    desc: RqDesc,
}

impl RqRing {
    /// # Safety
    /// The descriptor is one the device handed out for a live receive queue, and what it
    /// names (`wqe_cnt * sges` scatter entries, the doorbell record) stays mapped until this
    /// view is dropped or handed back ([`RqRing::into_desc`]): the device that owns that
    /// memory is not dropped and the queue not destroyed before. Nothing but this view and the
    /// device reaches it meanwhile: one view per descriptor.
    pub unsafe fn new(desc: RqDesc) -> RqRing {
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

    /// Scatter entry `i` (WQE-major), to write.
    ///
    /// # Safety
    /// - The device does not own the entry now: its completion was consumed (or it was never
    ///   handed over), and the doorbell record does not yet hand it back.
    /// - What the caller writes there is what the device will write into once the doorbell
    ///   record passes it: an address and length inside a registered region under its lkey,
    ///   memory that may be written (a region's [`crate::mem::DmaRange`] promises that) and
    ///   that no Rust reference reaches until the entry's completion is consumed; or an entry
    ///   the device cannot use (no room, the invalid lkey). A safe function could point the
    ///   device's writes at any buffer of a registered region, one the application still
    ///   reads for instance.
    pub unsafe fn entry_mut(&mut self, i: usize) -> DataSeg<&mut [u8]> {
        const LEN: usize = DataSeg::<&[u8]>::LEN;
        assert!(i < (self.desc.wqe_cnt() * self.desc.sges()) as usize);
        // SAFETY: in bounds (asserted), inside the ring the descriptor names; exclusive to the
        // driver by the queue protocol above.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(self.desc.buf().as_ptr().add(i * LEN), LEN) };
        DataSeg::new_unchecked(bytes)
    }

    /// Scatter entry `i` (WQE-major) as raw bytes, for the burst's refill.
    ///
    /// # Safety
    /// As for [`RqRing::entry_mut`].
    #[inline(always)]
    pub unsafe fn scatter_entry(&mut self, i: usize) -> &mut [u8; mlx4_prm::DS_SIZE] {
        const N: usize = mlx4_prm::DS_SIZE;
        assert!(i < (self.desc.wqe_cnt() * self.desc.sges()) as usize);
        // SAFETY: in bounds (asserted), 16-byte entries inside the ring; exclusive to the
        // driver by the queue protocol above, and no other reference to these bytes exists
        // while `self` is borrowed.
        unsafe { &mut *self.desc.buf().as_ptr().add(i * N).cast::<[u8; N]>() }
    }

    /// Every scatter entry (WQE-major) as raw bytes, for a burst's refill: one view per burst
    /// rather than a bounds assertion per entry.
    ///
    /// # Safety
    /// The caller writes only entries that [`RqRing::entry_mut`]'s contract allows (those
    /// whose completions the burst consumed), and writes them as that contract says; the
    /// others it neither reads nor writes while the view lives.
    #[inline(always)]
    pub unsafe fn scatter_entries(&mut self) -> &mut [[u8; mlx4_prm::DS_SIZE]] {
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
