//! Stores to device pages: the UAR send doorbell and the BlueFlame register.
//!
//! On a card these are uncached (UAR) and write-combining (BF) mappings of PCI BAR 2; on the
//! software HCA they are pages the device polls. The driver cannot tell, which is the point:
//! it does exactly the stores it would do to hardware.

use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU8, Ordering};

use mlx4_prm::TXBB_SIZE;

/// Store fence: orders all earlier stores, including write-combining ones, before later ones
/// (x86 `sfence`, as `rte_wmb` and rdma-core's `mmio_flush_writes`).
#[inline(always)]
pub fn wmb() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    fence(Ordering::SeqCst);
}

/// Orders earlier stores to coherent (ring) memory before later ones: the owner word is
/// written after the rest of the WQE. A compiler barrier on x86, a `dmb` elsewhere.
#[inline(always)]
pub fn io_wmb() {
    fence(Ordering::Release);
}

/// The time-stamp counter: what doorbell avoidance checks its deadline against, once per
/// call (one instruction, no call into C).
#[inline(always)]
pub fn tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    #[allow(unused_unsafe)]
    // SAFETY: rdtsc has no preconditions.
    let t = unsafe { core::arch::x86_64::_rdtsc() };
    #[cfg(not(target_arch = "x86_64"))]
    let t = tsc_epoch().elapsed().as_nanos() as u64;
    t
}

#[cfg(not(target_arch = "x86_64"))]
fn tsc_epoch() -> &'static std::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(std::time::Instant::now)
}

/// [`tsc`] ticks per second, measured once per process against the monotonic clock (2 ms at
/// the first queue setup that asks; never on the data path).
pub fn tsc_hz() -> u64 {
    static HZ: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *HZ.get_or_init(|| {
        let (t0, c0) = (std::time::Instant::now(), tsc());
        while t0.elapsed() < std::time::Duration::from_millis(2) {
            std::hint::spin_loop();
        }
        let (ns, ticks) = (t0.elapsed().as_nanos().max(1), tsc().wrapping_sub(c0));
        ((u128::from(ticks) * 1_000_000_000 / ns) as u64).max(1)
    })
}

/// The send doorbell register of one UAR page.
pub struct SendDoorbell {
    reg: *mut u32,
    /// `BE32(qpn << 8)`, precomputed as mlx4 drivers do.
    value: u32,
    /// The polling device's count of writes ([`crate::hw::SqDesc::db_writes`]); `None` on a
    /// card.
    writes: Option<NonNull<AtomicU32>>,
}

// SAFETY: the register is a device page owned by the queue; ringing is a single store.
unsafe impl Send for SendDoorbell {}

impl SendDoorbell {
    /// # Safety
    /// `reg` must be a mapped, 4-byte aligned send doorbell register (UAR page + 0x14) that
    /// outlives this value; `writes`, if any, a 4-byte aligned word that outlives it too and
    /// that the device reaches only atomically.
    pub unsafe fn new(reg: *mut u32, writes: Option<NonNull<AtomicU32>>, qpn: u32) -> SendDoorbell {
        SendDoorbell {
            reg,
            value: mlx4_prm::doorbell_value(qpn).to_be(),
            writes,
        }
    }

    /// Rings: one plain 32-bit store, after a store fence so that every WQE is visible first.
    /// On a device that polls the register, the write count is bumped before the fence: an
    /// atomic add, because the device takes the count by swapping it out (a plain store of
    /// a running total would be counted again after every swap, and a load and store would
    /// lose the swap between them). The fence then orders it before the store, so the
    /// device never sees a doorbell without its write counted.
    #[inline(always)]
    pub fn ring(&self) {
        if let Some(w) = self.writes {
            // SAFETY: a live, aligned word the device reaches only atomically (`new`).
            unsafe { w.as_ref() }.fetch_add(1, Ordering::Relaxed);
        }
        wmb();
        // SAFETY: `reg` is a valid, aligned device register for the life of `self`.
        unsafe { self.reg.write_volatile(self.value) };
    }
}

/// How a 64-byte block reaches the BF register, chosen once at init from the CPU's features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copy64 {
    /// `movdir64b`: one 64-byte direct store.
    Movdir64b,
    /// One AVX-512 64-byte vector store.
    Avx512,
    /// Four 16-byte SSE2 stores (x86-64's baseline: every CPU without AVX-512 has them, and
    /// valgrind runs them), except that a copy's first 16 bytes go as two 64-bit stores, the
    /// head last, as with `Qwords`.
    Sse,
    /// Eight 64-bit stores, ascending as rdma-core's `mmio_memcpy_x64`, except that a copy's
    /// first qword (its head) goes last.
    Qwords,
}

/// A routine preferred over the best one (0: none), for benchmarks that compare them.
static PREFERRED: AtomicU8 = AtomicU8::new(0);

impl Copy64 {
    /// Every routine, best first.
    pub const ALL: [Copy64; 4] = [
        Copy64::Movdir64b,
        Copy64::Avx512,
        Copy64::Sse,
        Copy64::Qwords,
    ];

    /// The routine queues set up from now on use: the one [`Copy64::prefer`] chose, else the
    /// best this CPU offers.
    pub fn best() -> Copy64 {
        match PREFERRED.load(Ordering::Relaxed) {
            1 => Copy64::Movdir64b,
            2 => Copy64::Avx512,
            3 => Copy64::Qwords,
            4 => Copy64::Sse,
            _ => Copy64::ALL
                .into_iter()
                .find(|c| c.available())
                .unwrap_or(Copy64::Qwords),
        }
    }

    /// The routine [`Copy64::prefer`] chose, if one was.
    pub fn preferred() -> Option<Copy64> {
        match PREFERRED.load(Ordering::Relaxed) {
            0 => None,
            _ => Some(Copy64::best()),
        }
    }

    /// Whether this CPU has the instructions the routine needs.
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Copy64::Movdir64b => cpu_has_movdir64b(),
            #[cfg(target_arch = "x86_64")]
            Copy64::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Copy64::Sse => true,
            Copy64::Qwords => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Makes queues set up from now on use `c` instead of the best routine (benchmarks compare
    /// them); an error if the CPU lacks it.
    pub fn prefer(c: Copy64) -> Result<(), String> {
        if !c.available() {
            return Err(format!("this CPU cannot run the {} copy", c.name()));
        }
        let v = match c {
            Copy64::Movdir64b => 1,
            Copy64::Avx512 => 2,
            Copy64::Qwords => 3,
            Copy64::Sse => 4,
        };
        PREFERRED.store(v, Ordering::Relaxed);
        Ok(())
    }

    /// The short name used on command lines (`movdir64b`, `avx512`, `sse`, `qwords`).
    pub fn key(self) -> &'static str {
        match self {
            Copy64::Movdir64b => "movdir64b",
            Copy64::Avx512 => "avx512",
            Copy64::Sse => "sse",
            Copy64::Qwords => "qwords",
        }
    }

    pub fn parse(s: &str) -> Result<Copy64, String> {
        Copy64::ALL
            .into_iter()
            .find(|c| c.key() == s)
            .ok_or_else(|| format!("unknown copy routine `{s}` (movdir64b, avx512, sse or qwords)"))
    }

    pub fn name(self) -> &'static str {
        match self {
            Copy64::Movdir64b => "movdir64b",
            Copy64::Avx512 => "avx512 64-byte store",
            Copy64::Sse => "4 x 16-byte stores",
            Copy64::Qwords => "8 x 64-bit stores",
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn cpuid_7_ecx() -> u32 {
    core::arch::x86_64::__cpuid_count(7, 0).ecx
}

#[cfg(target_arch = "x86_64")]
fn cpu_has_movdir64b() -> bool {
    cpuid_7_ecx() & (1 << 28) != 0
}

/// Whether the CPU has a Page Attribute Table, without which x86 cannot map a page
/// write-combining (the check the OFED-era mlx4 `wc.c` made before enabling BlueFlame).
pub fn cpu_has_pat() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        core::arch::x86_64::__cpuid(1).edx & (1 << 16) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    true
}

/// One BlueFlame register: two halves written alternately.
pub struct BfReg {
    base: *mut u8,
    half: usize,
    /// TXBBs one BF write can carry: `half / TXBB_SIZE`, for [`BfReg::reserve`]'s one compare.
    max_txbbs: u32,
    offset: usize,
    copy: Copy64,
}

// SAFETY: the register belongs to one queue, used by one lcore at a time.
unsafe impl Send for BfReg {}

impl BfReg {
    /// # Safety
    /// `base` must point to a mapped BF register of `2 * half` bytes, 64-byte aligned, that
    /// outlives this value. A `copy` this CPU cannot run falls back to 64-bit stores.
    pub unsafe fn new(base: *mut u8, half: usize, copy: Copy64) -> BfReg {
        BfReg {
            base,
            half,
            max_txbbs: (half / TXBB_SIZE).min(u32::MAX as usize) as u32,
            offset: 0,
            copy: if copy.available() {
                copy
            } else {
                Copy64::Qwords
            },
        }
    }

    /// The copy routine in use.
    pub fn copy(&self) -> Copy64 {
        self.copy
    }

    /// Bytes one BF write can carry.
    pub fn half_size(&self) -> usize {
        self.half
    }

    /// Copies whole TXBBs, `first` then `rest`, to the current half, flushes, and flips
    /// halves. The copy is the doorbell: no UAR write follows. Panics if they do not fit a half.
    #[inline]
    pub fn write(&mut self, first: &Txbb, rest: &[Txbb]) {
        assert!((1 + rest.len()) * TXBB_SIZE <= self.half);
        self.write_blocks(first, rest);
    }

    /// The current half, for a WQE of `txbbs` TXBBs, if one BF write can carry it. Asked
    /// before the WQE is published, so that the copy's own bound check is a compare of two
    /// registers.
    #[inline(always)]
    pub fn reserve(&mut self, txbbs: u32) -> Option<BfHalf<'_>> {
        // `txbbs == 0` wraps past any size.
        if txbbs.wrapping_sub(1) >= self.max_txbbs {
            return None;
        }
        Some(BfHalf { reg: self, txbbs })
    }

    #[inline(always)]
    fn write_blocks(&mut self, first: &Txbb, rest: &[Txbb]) {
        // The ring copy (with the owner word) must be visible before the device can act on
        // the BF copy, and the BF copy must leave the write-combining buffer now.
        io_wmb();
        let head = first.0[..8].try_into().expect("a TXBB has 8 bytes");
        // SAFETY: `dst` stays inside the current half (the callers check that 64 bytes per
        // block fit it; `new`'s contract makes both halves ours and 64-byte aligned); every
        // source block is a 64-byte aligned `Txbb`.
        unsafe {
            let dst = self.base.add(self.offset);
            copy64_head(self.copy, dst, head, first);
            for (i, block) in rest.iter().enumerate() {
                copy64(self.copy, dst.add((i + 1) * TXBB_SIZE), block.0.as_ptr());
            }
        }
        wmb();
        self.offset ^= self.half;
    }
}

/// The current half of a [`BfReg`], reserved for a WQE of `txbbs` TXBBs, which fit it.
pub struct BfHalf<'r> {
    reg: &'r mut BfReg,
    txbbs: u32,
}

impl BfHalf<'_> {
    /// Copies a published WQE (`wqe`, its whole TXBBs straight from the ring) with its first
    /// 8 bytes replaced by `head` (the BF counter and the QPN, which the ring copy does not
    /// carry: a device that missed this write fetches a plain WQE), flushes, and flips
    /// halves. The copy is the doorbell: no UAR write follows. A WQE of one or two TXBBs (the
    /// straight-line path's) is copied without a loop. Panics if `wqe` is not the size
    /// reserved.
    #[inline(always)]
    pub fn write(self, head: [u8; 8], wqe: &[Txbb]) {
        // One dispatch on the routine for the whole WQE: each arm is its own straight copy.
        match self.reg.copy {
            Copy64::Movdir64b => self.write_by(Copy64::Movdir64b, head, wqe),
            Copy64::Avx512 => self.write_by(Copy64::Avx512, head, wqe),
            Copy64::Sse => self.write_by(Copy64::Sse, head, wqe),
            Copy64::Qwords => self.write_by(Copy64::Qwords, head, wqe),
        }
    }

    /// [`BfHalf::write`] by `how`, the register's routine ([`BfReg::copy`]), for a caller
    /// that chose its code for that routine ahead (a constant there): no dispatch.
    /// Panics if it is not the register's.
    #[inline(always)]
    pub fn write_as(self, how: Copy64, head: [u8; 8], wqe: &[Txbb]) {
        assert!(how == self.reg.copy, "not the register's copy routine");
        self.write_by(how, head, wqe)
    }

    /// The copy by `how`, which is the register's routine (`self.reg.copy`, which the CPU runs).
    #[inline(always)]
    fn write_by(self, how: Copy64, head: [u8; 8], wqe: &[Txbb]) {
        assert_eq!(wqe.len(), self.txbbs as usize);
        debug_assert_eq!(how, self.reg.copy);
        let BfHalf { reg, .. } = self;
        io_wmb();
        let dst = reg.base.wrapping_add(reg.offset);
        // SAFETY: every block lands inside the current half (`reserve` checked that the
        // reserved size fits it, and `wqe` is that size, at least one block; `new`'s contract
        // makes both halves ours and 64-byte aligned, and the CPU runs `reg.copy`, which is
        // `how`); every source block is a 64-byte aligned `Txbb`.
        unsafe { copy_wqe(how, dst, head, wqe) }
        wmb();
        reg.offset ^= reg.half;
    }
}

/// The blocks of `wqe` to `dst` by `how`, the first with `head` for its first 8 bytes.
///
/// # Safety
/// `dst` valid for `wqe.len()` 64-byte writes, 64-byte aligned; `wqe` not empty; the CPU
/// runs `how`.
#[inline(always)]
unsafe fn copy_wqe(how: Copy64, dst: *mut u8, head: [u8; 8], wqe: &[Txbb]) {
    // SAFETY: the caller's contract, block by block.
    unsafe {
        copy64_head(how, dst, head, &wqe[0]);
        match wqe {
            [_] => {}
            [_, b] => copy64(how, dst.add(TXBB_SIZE), b.0.as_ptr()),
            _ => {
                for (i, block) in wqe.iter().enumerate().skip(1) {
                    copy64(how, dst.add(i * TXBB_SIZE), block.0.as_ptr());
                }
            }
        }
    }
}

/// A block's copy with its first 8 bytes replaced by `head`: from a register for 64-bit
/// stores and the AVX-512 form (one blend), through an aligned staging block for
/// `movdir64b`, whose source is memory.
///
/// # Safety
/// As [`copy64`] for `dst`.
#[inline(always)]
unsafe fn copy64_head(how: Copy64, dst: *mut u8, head: [u8; 8], block: &Txbb) {
    match how {
        #[cfg(target_arch = "x86_64")]
        Copy64::Movdir64b => {
            // SAFETY: the caller's contract.
            unsafe { movdir64b_head(dst, head, block) }
        }
        #[cfg(target_arch = "x86_64")]
        Copy64::Avx512 => {
            // SAFETY: selected only when the CPU reports AVX-512F; the caller's contract.
            unsafe { copy64_avx512_head(dst, u64::from_ne_bytes(head), block.0.as_ptr()) }
        }
        #[cfg(target_arch = "x86_64")]
        Copy64::Sse => {
            use core::arch::x86_64::{__m128i, _mm_load_si128, _mm_store_si128};
            let s = block.0.as_ptr();
            // The three later 16-byte quarters, then bytes 8-15 and the head last, as below.
            // SAFETY: SSE2 is x86-64's baseline; both blocks are 64 bytes, 64-byte aligned
            // (the caller's contract, and `Txbb`'s alignment), so every quarter is aligned.
            unsafe {
                for i in 1..4 {
                    let v = _mm_load_si128(s.add(16 * i).cast::<__m128i>());
                    _mm_store_si128(dst.add(16 * i).cast::<__m128i>(), v);
                }
                let d = dst.cast::<u64>();
                d.add(1).write_volatile(s.cast::<u64>().add(1).read());
                io_wmb();
                d.write_volatile(u64::from_ne_bytes(head));
            }
        }
        _ => {
            let s = block.0.as_ptr().cast::<u64>();
            let d = dst.cast::<u64>();
            // The head last: it is what makes the copy a doorbell, and a device that watches
            // the half (the software HCA's cached page) checks the rest against the ring when
            // it sees it, except `srcrb_flags`, which would still be the half's older copy's.
            // A WC page delivers the block whole either way.
            // SAFETY: 8 qwords inside the 64-byte block on each side.
            unsafe {
                for i in 1..8 {
                    d.add(i).write_volatile(s.add(i).read());
                }
                io_wmb();
                d.write_volatile(u64::from_ne_bytes(head));
            }
        }
    }
}

/// Out of line, so that the caller's frame need not be 64-byte aligned for the staging
/// block (which would cost the whole burst a register).
///
/// # Safety
/// As [`copy64`] for `dst`, and the CPU has `movdir64b`.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
unsafe fn movdir64b_head(dst: *mut u8, head: [u8; 8], block: &Txbb) {
    let mut first = Txbb(block.0);
    first.0[..8].copy_from_slice(&head);
    // SAFETY: the caller's contract; `first` is 64-byte aligned.
    unsafe { copy64(Copy64::Movdir64b, dst, first.0.as_ptr()) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn copy64_avx512_head(dst: *mut u8, head: u64, src: *const u8) {
    use core::arch::x86_64::{_mm512_loadu_si512, _mm512_mask_set1_epi64, _mm512_storeu_si512};
    // SAFETY: both pointers valid for 64 bytes (caller); lane 0 of the block becomes `head`.
    unsafe {
        let v = _mm512_loadu_si512(src.cast());
        let v = _mm512_mask_set1_epi64(v, 1, head as i64);
        _mm512_storeu_si512(dst.cast(), v)
    }
}

/// One 64-byte block, aligned as the vector copy forms need.
#[repr(C, align(64))]
pub struct Txbb(pub [u8; TXBB_SIZE]);

/// # Safety
/// `dst` must be valid for a 64-byte write, `src` for a 64-byte read, both 64-byte aligned
/// for the vector forms (8-byte aligned suffices for `Qwords`).
#[inline(always)]
unsafe fn copy64(how: Copy64, dst: *mut u8, src: *const u8) {
    match how {
        #[cfg(target_arch = "x86_64")]
        Copy64::Movdir64b => {
            // SAFETY: the CPU reported MOVDIR64B; dst is 64-byte aligned as the instruction
            // requires; src is readable for 64 bytes.
            unsafe {
                core::arch::asm!(
                    "movdir64b {dst}, [{src}]",
                    dst = in(reg) dst,
                    src = in(reg) src,
                    options(nostack, preserves_flags)
                )
            };
        }
        #[cfg(target_arch = "x86_64")]
        Copy64::Avx512 => {
            // SAFETY: selected only when the CPU reports AVX-512F; pointers valid for 64 bytes.
            unsafe { copy64_avx512(dst, src) };
        }
        #[cfg(target_arch = "x86_64")]
        Copy64::Sse => {
            use core::arch::x86_64::{__m128i, _mm_load_si128, _mm_store_si128};
            // SAFETY: SSE2 is x86-64's baseline; both pointers valid for 64 bytes and 64-byte
            // aligned (the contract for the vector forms), so every quarter is aligned.
            unsafe {
                for i in 0..4 {
                    let v = _mm_load_si128(src.add(16 * i).cast::<__m128i>());
                    _mm_store_si128(dst.add(16 * i).cast::<__m128i>(), v);
                }
            }
        }
        _ => {
            let s = src.cast::<u64>();
            let d = dst.cast::<u64>();
            for i in 0..8 {
                // SAFETY: 8 qwords inside the 64-byte block on each side.
                unsafe { d.add(i).write_volatile(s.add(i).read()) };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn copy64_avx512(dst: *mut u8, src: *const u8) {
    use core::arch::x86_64::{_mm512_loadu_si512, _mm512_storeu_si512};
    // SAFETY: both pointers valid for 64 bytes (caller).
    unsafe { _mm512_storeu_si512(dst.cast(), _mm512_loadu_si512(src.cast())) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BF register of two 128-byte halves in plain memory.
    #[repr(C, align(64))]
    struct Reg([u8; 256]);

    /// Whatever the order of its stores (the 8-byte routine stores the head last), every
    /// routine lands the head, the rest of the first block and the later blocks, in alternate
    /// halves; `write` (the self-test's) and `reserve`/`BfHalf::write` (the queue's) alike.
    #[test]
    fn every_routine_lands_the_whole_copy_in_alternate_halves() {
        for copy in Copy64::ALL.into_iter().filter(|c| c.available()) {
            let mut reg = Reg([0; 256]);
            // SAFETY: `reg` is 256 bytes, 64-byte aligned, and outlives `bf`.
            let mut bf = unsafe { BfReg::new(reg.0.as_mut_ptr(), 128, copy) };
            let blocks = [Txbb([0x11; TXBB_SIZE]), Txbb([0x22; TXBB_SIZE])];
            let head = [1, 2, 3, 4, 5, 6, 7, 8];
            bf.reserve(2)
                .expect("two TXBBs fit a half")
                .write(head, &blocks);
            let mut single = Txbb([0x33; TXBB_SIZE]);
            single.0[..8].copy_from_slice(&[9; 8]);
            bf.write(&single, &[]);
            let mut want = [0u8; 256];
            want[..8].copy_from_slice(&head);
            want[8..64].fill(0x11);
            want[64..128].fill(0x22);
            want[128..136].fill(9);
            want[136..192].fill(0x33);
            assert_eq!(reg.0, want, "{copy:?}");
        }
    }
}
