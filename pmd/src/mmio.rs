//! Stores to device pages: the UAR send doorbell and the BlueFlame register.
//!
//! On a card these are uncached (UAR) and write-combining (BF) mappings of PCI BAR 2; on the
//! software HCA they are pages the device polls. The driver cannot tell, which is the point:
//! it does exactly the stores it would do to hardware.

use std::sync::atomic::{fence, AtomicU8, Ordering};

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

/// The send doorbell register of one UAR page.
pub struct SendDoorbell {
    reg: *mut u32,
    /// `BE32(qpn << 8)`, precomputed as mlx4 drivers do.
    value: u32,
}

// SAFETY: the register is a device page owned by the queue; ringing is a single store.
unsafe impl Send for SendDoorbell {}

impl SendDoorbell {
    /// # Safety
    /// `reg` must be a mapped, 4-byte aligned send doorbell register (UAR page + 0x14) that
    /// outlives this value.
    pub unsafe fn new(reg: *mut u32, qpn: u32) -> SendDoorbell {
        SendDoorbell {
            reg,
            value: mlx4_prm::doorbell_value(qpn).to_be(),
        }
    }

    /// Rings: one plain 32-bit store, after a store fence so that every WQE is visible first.
    #[inline(always)]
    pub fn ring(&self) {
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
    /// Eight 64-bit stores, ascending, as rdma-core's `mmio_memcpy_x64`.
    Qwords,
}

/// A routine preferred over the best one (0: none), for benchmarks that compare them.
static PREFERRED: AtomicU8 = AtomicU8::new(0);

impl Copy64 {
    /// Every routine, best first.
    pub const ALL: [Copy64; 3] = [Copy64::Movdir64b, Copy64::Avx512, Copy64::Qwords];

    /// The routine queues set up from now on use: the one [`Copy64::prefer`] chose, else the
    /// best this CPU offers.
    pub fn best() -> Copy64 {
        match PREFERRED.load(Ordering::Relaxed) {
            1 => Copy64::Movdir64b,
            2 => Copy64::Avx512,
            3 => Copy64::Qwords,
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
        };
        PREFERRED.store(v, Ordering::Relaxed);
        Ok(())
    }

    /// The short name used on command lines (`movdir64b`, `avx512`, `qwords`).
    pub fn key(self) -> &'static str {
        match self {
            Copy64::Movdir64b => "movdir64b",
            Copy64::Avx512 => "avx512",
            Copy64::Qwords => "qwords",
        }
    }

    pub fn parse(s: &str) -> Result<Copy64, String> {
        Copy64::ALL
            .into_iter()
            .find(|c| c.key() == s)
            .ok_or_else(|| format!("unknown copy routine `{s}` (movdir64b, avx512 or qwords)"))
    }

    pub fn name(self) -> &'static str {
        match self {
            Copy64::Movdir64b => "movdir64b",
            Copy64::Avx512 => "avx512 64-byte store",
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

    /// Copies a published WQE (`wqe`, whole TXBBs straight from the ring) with its first 8
    /// bytes replaced by `head` (the BF counter and QPN), as [`BfReg::write`]. With 64-bit
    /// stores the head goes straight from the register; the 64-byte forms copy the first
    /// block through an aligned staging block, out of line so that the caller's frame need
    /// not be 64-byte aligned.
    #[inline(always)]
    pub fn write_wqe(&mut self, head: [u8; 8], wqe: &[Txbb]) {
        assert!(!wqe.is_empty() && wqe.len() * TXBB_SIZE <= self.half);
        if self.copy != Copy64::Qwords {
            return self.write_wqe_staged(head, wqe);
        }
        io_wmb();
        let src = wqe.as_ptr().cast::<u64>();
        // SAFETY: the first block's 8 qwords stay inside the current half (asserted: the whole
        // WQE fits it); `src` is the WQE, 8-byte aligned, at least one block long.
        unsafe {
            let dst = self.base.add(self.offset).cast::<u64>();
            dst.write_volatile(u64::from_ne_bytes(head));
            for i in 1..8 {
                dst.add(i).write_volatile(src.add(i).read());
            }
            let dst = dst.cast::<u8>();
            // Two TXBBs, the straight-line path's longest WQE, without a loop.
            if let [second] = &wqe[1..] {
                copy64(Copy64::Qwords, dst.add(TXBB_SIZE), second.0.as_ptr());
            } else {
                for (i, block) in wqe[1..].iter().enumerate() {
                    copy64(
                        Copy64::Qwords,
                        dst.add((i + 1) * TXBB_SIZE),
                        block.0.as_ptr(),
                    );
                }
            }
        }
        wmb();
        self.offset ^= self.half;
    }

    #[inline(never)]
    fn write_wqe_staged(&mut self, head: [u8; 8], wqe: &[Txbb]) {
        let mut first = Txbb(wqe[0].0);
        first.0[..8].copy_from_slice(&head);
        self.write_blocks(&first, &wqe[1..]);
    }

    #[inline(always)]
    fn write_blocks(&mut self, first: &Txbb, rest: &[Txbb]) {
        // The ring copy (with the owner word) must be visible before the device can act on
        // the BF copy, and the BF copy must leave the write-combining buffer now.
        io_wmb();
        // SAFETY: `dst` stays inside the current half (the callers check that 64 bytes per
        // block fit it; `new`'s contract makes both halves ours and 64-byte aligned); every
        // source block is a 64-byte aligned `Txbb`.
        unsafe {
            let dst = self.base.add(self.offset);
            copy64(self.copy, dst, first.0.as_ptr());
            for (i, block) in rest.iter().enumerate() {
                copy64(self.copy, dst.add((i + 1) * TXBB_SIZE), block.0.as_ptr());
            }
        }
        wmb();
        self.offset ^= self.half;
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
