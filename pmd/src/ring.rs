//! The rings the driver shares with the device: the send queue (64-byte TXBBs), completion
//! queues (32-byte CQEs plus their consumer-index record) and the receive queue (scatter
//! entries plus its doorbell record). Each is a view over the memory a device handed over in a
//! descriptor ([`crate::hw`]); the view keeps the descriptor and gives it back for destroy.
//!
//! Protocol, not locks, keeps driver and device apart: the device reads a WQE only after it
//! sees the owner word the driver stores last (release), and the driver reads a CQE only after
//! it sees the owner bit the device stores last. Words both sides touch concurrently (owner
//! words, stamps, CQE owner bytes, doorbell records) are accessed atomically.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

use std::ptr::NonNull;

use mlx4_prm::{Cqe, DataSeg, CQE_SIZE, STAMP_DWORD, TXBB_SHIFT, TXBB_SIZE};

use crate::hw::{CqDesc, RqDesc, SqDesc};
use crate::mmio::{BfReg, Copy64, SendDoorbell};

/// A view of a send queue ring of `txbb_cnt` TXBBs, addressed by free-running counters. It
/// holds the queue's descriptor, which [`SqRing::into_desc`] hands back for destroy.
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

    fn first_dword(&self, counter: u32) -> &AtomicU32 {
        let slot = (counter & (self.txbb_cnt - 1)) as usize;
        // SAFETY: slot < txbb_cnt, so the 4 bytes lie inside the ring; TXBBs are 64-byte
        // aligned; the device accesses this word only atomically as well.
        unsafe { AtomicU32::from_ptr(self.mem.as_ptr().add(slot << TXBB_SHIFT).cast()) }
    }

    /// The bytes of `txbbs` TXBBs starting at counter `start`, which must not wrap.
    ///
    /// The first dword (the owner word) must not be written through this slice: it is
    /// published with [`SqRing::publish`].
    pub fn wqe_mut(&mut self, start: u32, txbbs: u32) -> &mut [u8] {
        let slot = (start & (self.txbb_cnt - 1)) as usize;
        assert!(
            slot + txbbs as usize <= self.txbb_cnt as usize,
            "WQE wraps the ring"
        );
        // SAFETY: the range lies inside the ring (asserted). The device reads these TXBBs only
        // after the owner word of this WQE is published, and only the owner word (atomically)
        // before that; the driver owns them until then, having seen their completion.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.mem.as_ptr().add(slot << TXBB_SHIFT),
                (txbbs as usize) << TXBB_SHIFT,
            )
        }
    }

    /// The bytes of a published WQE, for the BlueFlame copy.
    pub fn wqe(&self, start: u32, txbbs: u32) -> &[u8] {
        let slot = (start & (self.txbb_cnt - 1)) as usize;
        assert!(
            slot + txbbs as usize <= self.txbb_cnt as usize,
            "WQE wraps the ring"
        );
        // SAFETY: inside the ring; the device only reads a published WQE, as we do here.
        unsafe {
            std::slice::from_raw_parts(
                self.mem.as_ptr().add(slot << TXBB_SHIFT),
                (txbbs as usize) << TXBB_SHIFT,
            )
        }
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
        let owner = if self.owner(c) {
            mlx4_prm::owner_opcode::OWNER
        } else {
            0
        };
        u32::from(opcode) | owner
    }

    /// Stamps the TXBBs in `[from, to)` (counters) after their completion: each first dword
    /// becomes `0x7fffffff` with bit 31 = the parity of the pass just consumed, so the slot is
    /// invalid for the next pass until a new WQE is published there.
    pub fn stamp(&self, from: u32, to: u32) {
        let mut c = from;
        while c != to {
            // TXBBs up to the ring's end share one pass, hence one stamp value.
            let slot = c & (self.txbb_cnt - 1);
            let run = (self.txbb_cnt - slot).min(to.wrapping_sub(c));
            let value = (STAMP_DWORD | (u32::from(self.owner(c)) << 31)).to_be();
            for i in 0..run {
                self.first_dword(c.wrapping_add(i))
                    .store(value, Ordering::Relaxed);
            }
            c = c.wrapping_add(run);
        }
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
}

impl CqRing {
    /// A view that starts consuming at entry 0, as a driver does on a CQ just created (the
    /// device initialises its entries at creation). The consumer record starts over too: left
    /// at an older queue's index, it would tell the device that the new CQ is full.
    pub fn new(desc: CqDesc) -> CqRing {
        let size = desc.cqe_size() as usize;
        // SAFETY: a 32-byte CQE fits in each entry (32 or 64 bytes, the descriptor's promise).
        let first = unsafe { desc.buf().add(size - CQE_SIZE) };
        let ring = CqRing {
            first,
            entry_shift: size.trailing_zeros(),
            cqe_cnt: desc.cqe_cnt(),
            desc,
            ci: 0,
        };
        ring.update_ci();
        ring
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

    fn cqe_ptr(&self, n: u32) -> *mut u8 {
        let slot = (n & (self.cqe_cnt - 1)) as usize;
        // SAFETY: slot < cqe_cnt, so the CQE lies inside the ring.
        unsafe { self.first.as_ptr().add(slot << self.entry_shift) }
    }

    fn owner_byte(&self, n: u32) -> &AtomicU8 {
        // SAFETY: inside the CQE; the device writes this byte last, atomically.
        unsafe { AtomicU8::from_ptr(self.cqe_ptr(n).add(Cqe::<&[u8]>::OWNER_OFFSET)) }
    }

    /// The next CQE if software owns it, copied out; advances the consumer counter.
    #[inline]
    pub fn poll(&mut self) -> Option<Cqe<[u8; CQE_SIZE]>> {
        let owner = self.owner_byte(self.ci).load(Ordering::Acquire);
        let sw_parity = self.ci & self.cqe_cnt != 0;
        if (owner & mlx4_prm::cqe_owner::OWNER != 0) != sw_parity {
            return None;
        }
        let mut cqe = [0u8; CQE_SIZE];
        // SAFETY: the CQE is software-owned (owner byte seen with acquire), so the device has
        // finished writing it and will not touch it until the consumer index passes it.
        unsafe { std::ptr::copy_nonoverlapping(self.cqe_ptr(self.ci), cqe.as_mut_ptr(), CQE_SIZE) };
        self.ci = self.ci.wrapping_add(1);
        Some(Cqe::new_unchecked(cqe))
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

    /// The doorbell record: the producer count, written after the entries it covers.
    pub fn db_rec(&self) -> &AtomicU32 {
        // SAFETY: the RQ's record (descriptor), 4-byte aligned; the device reads it atomically.
        unsafe { AtomicU32::from_ptr(self.desc.db_rec().as_ptr()) }
    }
}

// SAFETY: as for SqRing.
unsafe impl Send for RqRing {}
