//! The rings the driver shares with the device: the send queue (64-byte TXBBs) and completion
//! queues (32-byte CQEs plus their consumer-index record).
//!
//! Protocol, not locks, keeps driver and device apart: the device reads a WQE only after it
//! sees the owner word the driver stores last (release), and the driver reads a CQE only after
//! it sees the owner bit the device stores last. Words both sides touch concurrently (owner
//! words, stamps, CQE owner bytes, doorbell records) are accessed atomically.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

use mlx4_prm::{Cqe, CQE_SIZE, STAMP_DWORD, TXBB_SHIFT, TXBB_SIZE};

use crate::mem::{DmaBuf, MemSource};

/// A send queue ring of `txbb_cnt` TXBBs addressed by free-running counters.
pub struct SqRing {
    mem: DmaBuf,
    txbb_cnt: u32,
}

impl SqRing {
    /// A ring whose every TXBB starts invalid for pass 0 (owner bit set, as rdma-core
    /// initialises SQ ownership), so the device never mistakes zeroed memory for a WQE.
    pub fn new(txbb_cnt: u32, source: MemSource) -> Option<SqRing> {
        debug_assert!(txbb_cnt.is_power_of_two());
        let mem = DmaBuf::new((txbb_cnt as usize) << TXBB_SHIFT, source)?;
        let ring = SqRing { mem, txbb_cnt };
        for i in 0..txbb_cnt {
            ring.first_dword(i).store(u32::MAX, Ordering::Relaxed);
        }
        Some(ring)
    }

    pub fn txbb_cnt(&self) -> u32 {
        self.txbb_cnt
    }

    pub fn buf(&self) -> &DmaBuf {
        &self.mem
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

/// A completion queue and its consumer-index record.
pub struct CqRing {
    mem: DmaBuf,
    cqe_cnt: u32,
    /// Consumer counter (free-running).
    ci: u32,
}

/// The consumer-index record sits after the CQEs, on a cache line of its own.
const DB_REC_SPACE: usize = 64;

impl CqRing {
    pub fn new(cqe_cnt: u32, source: MemSource) -> Option<CqRing> {
        debug_assert!(cqe_cnt.is_power_of_two());
        let mem = DmaBuf::new(cqe_cnt as usize * CQE_SIZE + DB_REC_SPACE, source)?;
        Some(CqRing {
            mem,
            cqe_cnt,
            ci: 0,
        })
    }

    pub fn cqe_cnt(&self) -> u32 {
        self.cqe_cnt
    }

    pub fn buf_ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }

    /// `set_ci_db`: big-endian consumer index, 24 bits.
    pub fn set_ci_db_ptr(&self) -> *mut u32 {
        // SAFETY: the record space was allocated after the CQEs.
        unsafe { self.mem.as_ptr().add(self.cqe_cnt as usize * CQE_SIZE) }.cast()
    }

    fn owner_byte(&self, n: u32) -> &AtomicU8 {
        let slot = (n & (self.cqe_cnt - 1)) as usize;
        // SAFETY: inside the CQE array; the device writes this byte last, atomically.
        unsafe {
            AtomicU8::from_ptr(
                self.mem
                    .as_ptr()
                    .add(slot * CQE_SIZE + Cqe::<&[u8]>::OWNER_OFFSET),
            )
        }
    }

    /// The next CQE if software owns it, copied out; advances the consumer counter.
    #[inline]
    pub fn poll(&mut self) -> Option<Cqe<[u8; CQE_SIZE]>> {
        let owner = self.owner_byte(self.ci).load(Ordering::Acquire);
        let sw_parity = self.ci & self.cqe_cnt != 0;
        if (owner & mlx4_prm::cqe_owner::OWNER != 0) != sw_parity {
            return None;
        }
        let slot = (self.ci & (self.cqe_cnt - 1)) as usize;
        let mut cqe = [0u8; CQE_SIZE];
        // SAFETY: the CQE is software-owned (owner byte seen with acquire), so the device has
        // finished writing it and will not touch it until the consumer index passes it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.mem.as_ptr().add(slot * CQE_SIZE),
                cqe.as_mut_ptr(),
                CQE_SIZE,
            )
        };
        self.ci = self.ci.wrapping_add(1);
        Some(Cqe::new_unchecked(cqe))
    }

    /// Starts over at entry 0, for a CQ being created anew on the same memory (the device
    /// initialises its entries at creation). The consumer record starts over too, as a
    /// driver zeroes it before creating a CQ: left at the old queue's index, it tells the
    /// device that the new CQ is full.
    pub fn rewind(&mut self) {
        self.ci = 0;
        self.update_ci();
    }

    /// Tells the device how far we consumed, once per batch of CQEs.
    #[inline]
    pub fn update_ci(&self) {
        // SAFETY: the record is inside our buffer, 4-byte aligned; the device reads it atomically.
        let rec = unsafe { AtomicU32::from_ptr(self.set_ci_db_ptr()) };
        rec.store((self.ci & 0x00ff_ffff).to_be(), Ordering::Release);
    }
}

/// TXBBs a WQE of `bytes` occupies.
pub const fn txbbs_for(bytes: usize) -> u32 {
    bytes.div_ceil(TXBB_SIZE) as u32
}

/// An atomic view of the 32-bit word at `off` in shared memory (doorbell records).
pub fn atomic_u32_at(buf: &DmaBuf, off: usize) -> &AtomicU32 {
    assert!(off.is_multiple_of(4) && off + 4 <= buf.len());
    // SAFETY: in bounds and aligned (asserted; the buffer is page-aligned); the device accesses
    // such words atomically too.
    unsafe { AtomicU32::from_ptr(buf.as_ptr().add(off).cast()) }
}

/// `len` bytes of shared memory at `off`, for entries the device does not own right now
/// (RQ scatter entries of slots whose completion was consumed, before the doorbell record
/// hands them back).
pub fn dma_bytes_mut(buf: &mut DmaBuf, off: usize, len: usize) -> &mut [u8] {
    assert!(off + len <= buf.len());
    // SAFETY: in bounds (asserted); exclusive to the driver by the queue protocol above.
    unsafe { std::slice::from_raw_parts_mut(buf.as_ptr().add(off), len) }
}
