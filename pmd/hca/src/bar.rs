//! The adapter's device memory, as a PCI BAR is for a card: UAR pages, BlueFlame pages, the
//! counters, and the port's receive buffer, carved from one region of plain data.
//!
//! The region is the heap by default; the opener may hand its own (DPDK shared memory), so that
//! other processes can ring the same doorbells and read the counters: a process with only the
//! region, and no `Hca`, reads the counters with [`Bar::counters`] after [`Bar::attach`]. The
//! layout is described in the region's first page, so the reader needs nothing else.
//!
//! ```text
//! page 0                header: magic, version, where everything below is
//! then, per UAR i       UAR page i (send doorbell at 0x14, CQ doorbell at 0x20), followed by
//!                       its BlueFlame page (`bf_regs_per_page` registers) when the device has
//!                       BlueFlame
//! next                  counter words: one u64 per `Counters` field, in `Counters::NAMES` order
//! next                  the port's receive buffer (a frame ring)
//! ```
//!
//! A UAR page's BlueFlame page follows it, as mlx4_ib maps them to user space (page offset 0
//! of the command fd the UAR, page offset 1 its BlueFlame page): whoever maps device memory
//! by offset finds a queue's BlueFlame page one page after the UAR page it was given.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use mlx4_prm::{CQ_DOORBELL_OFFSET, SEND_DOORBELL_OFFSET, UAR_PAGE_SIZE};

use crate::counters::Counters;
use crate::dma::{HostMem, Region};
use crate::error::HcaError;
use crate::inbox::{self, FrameRing};
use crate::types::{HcaConfig, MAX_FRAME};

const PAGE: usize = UAR_PAGE_SIZE;
const MAGIC: u64 = u64::from_le_bytes(*b"MLX4HBAR");
const VERSION: u32 = 2;

/// Header fields, as byte offsets into page 0.
mod hdr {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const UARS: usize = 12;
    pub const LEN: usize = 16;
    pub const BF_PAGES: usize = 24;
    pub const BF_REG_SIZE: usize = 28;
    pub const BF_REGS_PER_PAGE: usize = 32;
    pub const COUNTERS: usize = 36;
    pub const COUNTERS_OFF: usize = 40;
    pub const INBOX_OFF: usize = 48;
    pub const INBOX_LEN: usize = 56;
}

/// Where things are in a BAR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    uars: usize,
    bf_pages: usize,
    bf_reg_size: usize,
    bf_regs_per_page: usize,
    counters_off: usize,
    inbox_off: usize,
    inbox_len: usize,
    len: usize,
}

impl Layout {
    fn for_config(cfg: &HcaConfig) -> Layout {
        let uars = cfg.uars as usize;
        let (bf_reg_size, per_page) = if cfg.bf_reg_size == 0 {
            (0, 0)
        } else {
            (
                cfg.bf_reg_size as usize,
                cfg.bf_regs_per_page.max(1) as usize,
            )
        };
        let bf_pages = if per_page == 0 { 0 } else { uars };
        let counters_off = PAGE * (1 + uars + bf_pages);
        let counters_len = (Counters::NAMES.len() * 8).next_multiple_of(PAGE);
        let inbox_off = counters_off + counters_len;
        let frames = cfg.rx_inbox_frames as usize;
        let data = (frames * 2048).max(4 * (MAX_FRAME + 64));
        let inbox_len = inbox::region_len(data).next_multiple_of(PAGE);
        Layout {
            uars,
            bf_pages,
            bf_reg_size,
            bf_regs_per_page: per_page,
            counters_off,
            inbox_off,
            inbox_len,
            len: inbox_off + inbox_len,
        }
    }

    /// Pages per UAR: the UAR page and, with BlueFlame, its BlueFlame page.
    fn per_uar(&self) -> usize {
        1 + usize::from(self.bf_pages > 0)
    }

    fn uar_off(&self, i: usize) -> usize {
        PAGE * (1 + i * self.per_uar())
    }

    fn bf_page_off(&self, j: usize) -> usize {
        self.uar_off(j) + PAGE
    }
}

/// An adapter's device memory: a clonable handle to one region.
#[derive(Clone)]
pub struct Bar {
    region: Arc<Region>,
    layout: Layout,
}

impl std::fmt::Debug for Bar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bar")
            .field("base", &self.region.as_ptr())
            .field("len", &self.layout.len)
            .finish()
    }
}

impl Bar {
    /// Bytes of device memory an adapter opened with `cfg` needs (a multiple of 4 KiB).
    pub fn required_len(cfg: &HcaConfig) -> usize {
        Layout::for_config(cfg).len
    }

    /// Device memory on the heap, for an adapter opened with `cfg`.
    pub(crate) fn on_heap(cfg: &HcaConfig) -> Bar {
        let layout = Layout::for_config(cfg);
        let region = Arc::new(Region::heap(layout.len));
        Bar::lay_out(region, layout)
    }

    /// Device memory in a memory file (`memfd`) of [`Bar::required_len`] bytes for `cfg`,
    /// mapped here, and the file: whoever holds the file (a verbs command fd, another process
    /// it was passed to) maps device pages with `mmap(fd, offset)`, `offset` being what
    /// [`Bar::offset_of`] says, and reaches the same doorbells and BlueFlame registers.
    pub fn in_memfd(cfg: &HcaConfig) -> Result<(Bar, std::os::fd::OwnedFd), HcaError> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let io = |what: &str| {
            HcaError::Io(format!(
                "device memory file: {what}: {}",
                std::io::Error::last_os_error()
            ))
        };
        let len = Bar::required_len(cfg);
        // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"mlx4-hca-bar".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io("memfd_create"));
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sizing our own file.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io("ftruncate"));
        }
        // SAFETY: maps the whole file shared; checked for failure below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io("mmap"));
        }
        struct Unmap(usize, usize);
        impl Drop for Unmap {
            fn drop(&mut self) {
                // SAFETY: the mapping made above, unmapped once, when the region lets go.
                unsafe { libc::munmap(self.0 as *mut libc::c_void, self.1) };
            }
        }
        // SAFETY: the mapping is valid for `len` bytes (page aligned) until `Unmap` drops,
        // which the region owns.
        let region =
            unsafe { Region::foreign_with(ptr.cast(), len, Box::new(Unmap(ptr as usize, len))) };
        let bar = Bar::lay_out(Arc::new(region), Layout::for_config(cfg));
        Ok((bar, fd))
    }

    /// Device memory the opener provides for a new adapter (for example DPDK shared memory,
    /// so that secondary processes can use it); [`crate::Hca::open_on`] lays it out for its
    /// configuration, zeroing it.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be valid for reads and writes, 4 KiB aligned, and stay so until
    /// the last handle to it (this `Bar`, its clones, the `Hca` opened on it and that adapter's
    /// runners) is dropped. Other threads and processes may access it meanwhile only as this
    /// crate does (the driver's stores to doorbells and BlueFlame registers, [`Bar::attach`]).
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Result<Bar, HcaError> {
        if ptr.is_null() || ptr as usize % PAGE != 0 {
            return Err(HcaError::InvalidArgument(format!(
                "device memory at {ptr:p} is not 4 KiB aligned"
            )));
        }
        // SAFETY: the caller's contract is Region::foreign's.
        let region = Arc::new(unsafe { Region::foreign(ptr, len) });
        Ok(Bar {
            region,
            layout: Layout {
                uars: 0,
                bf_pages: 0,
                bf_reg_size: 0,
                bf_regs_per_page: 0,
                counters_off: 0,
                inbox_off: 0,
                inbox_len: 0,
                len: 0,
            },
        })
    }

    /// The device memory of an adapter another process (or another copy of this library) laid
    /// out, to read its counters or find its pages; `Err` if it does not hold a BAR of this
    /// version.
    ///
    /// # Safety
    /// As [`Bar::from_raw`]; the memory must stay mapped as long as the returned value lives.
    pub unsafe fn attach(ptr: *const u8, len: usize) -> Result<Bar, HcaError> {
        // SAFETY: the caller's contract.
        let bar = unsafe { Bar::from_raw(ptr as *mut u8, len) }?;
        if len < PAGE || bar.word(hdr::MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(HcaError::InvalidArgument(
                "no mlx4-hca device memory there".into(),
            ));
        }
        if bar.half(hdr::VERSION).load(Ordering::Acquire) != VERSION
            || bar.half(hdr::COUNTERS).load(Ordering::Acquire) as usize != Counters::NAMES.len()
        {
            return Err(HcaError::InvalidArgument(
                "device memory of another mlx4-hca version".into(),
            ));
        }
        let w = |at| bar.word(at).load(Ordering::Acquire) as usize;
        let h = |at| bar.half(at).load(Ordering::Acquire) as usize;
        let layout = Layout {
            uars: h(hdr::UARS),
            bf_pages: h(hdr::BF_PAGES),
            bf_reg_size: h(hdr::BF_REG_SIZE),
            bf_regs_per_page: h(hdr::BF_REGS_PER_PAGE),
            counters_off: w(hdr::COUNTERS_OFF),
            inbox_off: w(hdr::INBOX_OFF),
            inbox_len: w(hdr::INBOX_LEN),
            len: w(hdr::LEN),
        };
        if layout.len > len || layout.inbox_off + layout.inbox_len > layout.len {
            return Err(HcaError::InvalidArgument(format!(
                "device memory of {len} bytes but laid out for {}",
                layout.len
            )));
        }
        Ok(Bar {
            region: bar.region,
            layout,
        })
    }

    /// Lay out `self` (memory from [`Bar::from_raw`]) for `cfg`.
    pub(crate) fn prepare(self, cfg: &HcaConfig) -> Result<Bar, HcaError> {
        let layout = Layout::for_config(cfg);
        if self.region.len() < layout.len {
            return Err(HcaError::InvalidArgument(format!(
                "device memory of {} bytes, {} needed",
                self.region.len(),
                layout.len
            )));
        }
        Ok(Bar::lay_out(self.region, layout))
    }

    fn lay_out(region: Arc<Region>, layout: Layout) -> Bar {
        let bar = Bar { region, layout };
        // SAFETY: the region holds `layout.len` bytes (checked by the callers).
        unsafe { std::ptr::write_bytes(bar.region.as_ptr(), 0, layout.len) };
        bar.half(hdr::VERSION).store(VERSION, Ordering::Relaxed);
        bar.half(hdr::UARS)
            .store(layout.uars as u32, Ordering::Relaxed);
        bar.word(hdr::LEN)
            .store(layout.len as u64, Ordering::Relaxed);
        bar.half(hdr::BF_PAGES)
            .store(layout.bf_pages as u32, Ordering::Relaxed);
        bar.half(hdr::BF_REG_SIZE)
            .store(layout.bf_reg_size as u32, Ordering::Relaxed);
        bar.half(hdr::BF_REGS_PER_PAGE)
            .store(layout.bf_regs_per_page as u32, Ordering::Relaxed);
        bar.half(hdr::COUNTERS)
            .store(Counters::NAMES.len() as u32, Ordering::Relaxed);
        bar.word(hdr::COUNTERS_OFF)
            .store(layout.counters_off as u64, Ordering::Relaxed);
        bar.word(hdr::INBOX_OFF)
            .store(layout.inbox_off as u64, Ordering::Relaxed);
        bar.word(hdr::INBOX_LEN)
            .store(layout.inbox_len as u64, Ordering::Relaxed);
        // Last: a reader that sees the magic sees the rest.
        bar.word(hdr::MAGIC).store(MAGIC, Ordering::Release);
        bar
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        debug_assert!(at % 8 == 0 && at + 8 <= PAGE);
        // SAFETY: inside the header page (the region is at least a page, checked before any
        // field is read), 8-aligned (the region is 4 KiB aligned); only accessed atomically.
        unsafe { AtomicU64::from_ptr(self.region.as_ptr().add(at).cast()) }
    }

    fn half(&self, at: usize) -> &AtomicU32 {
        debug_assert!(at % 4 == 0 && at + 4 <= PAGE);
        // SAFETY: as in `word`, 4-aligned.
        unsafe { AtomicU32::from_ptr(self.region.as_ptr().add(at).cast()) }
    }

    /// Start of the device memory.
    pub fn base(&self) -> *mut u8 {
        self.region.as_ptr()
    }

    /// Bytes laid out.
    pub fn len(&self) -> usize {
        self.layout.len
    }

    /// Whether nothing is laid out (memory from [`Bar::from_raw`] not yet opened on).
    pub fn is_empty(&self) -> bool {
        self.layout.len == 0
    }

    /// Where `ptr` (a UAR page or BlueFlame register the adapter handed out) lies in the device
    /// memory, to find it again in another process that maps the memory elsewhere.
    pub fn offset_of(&self, ptr: *const u8) -> Option<usize> {
        let off = (ptr as usize).checked_sub(self.base() as usize)?;
        (off < self.layout.len).then_some(off)
    }

    /// The address of byte `off` of the device memory in this process.
    pub fn at(&self, off: usize) -> Option<*mut u8> {
        (off < self.layout.len).then(|| self.base().wrapping_add(off))
    }

    /// UAR pages (hence send queues) the device memory has room for.
    pub fn uar_pages(&self) -> usize {
        self.layout.uars
    }

    /// The counters of the adapter this device memory belongs to, read from the memory alone:
    /// what `Hca::counters` returned last, or what the device loop published since (it does
    /// after 64 polls that changed them, or 64 quiet ones, so they may lag that much).
    pub fn counters(&self) -> Counters {
        let v: Vec<u64> = self
            .counter_words()
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect();
        let mut c = Counters::from_values(&v);
        if let Some(inbox) = self.inbox() {
            c.rx_drops_wire += inbox.dropped();
        }
        c
    }

    /// The counter words, one per `Counters` field.
    fn counter_words(&self) -> &[AtomicU64] {
        let n = Counters::NAMES.len();
        let at = self.layout.counters_off;
        assert!(at % 8 == 0 && at + 8 * n <= self.layout.len);
        // SAFETY: `n` u64 words inside the laid-out memory (asserted), 8-aligned; counter words
        // are only ever accessed atomically, and live as long as the region `self` holds.
        unsafe { std::slice::from_raw_parts(self.region.as_ptr().add(at).cast::<AtomicU64>(), n) }
    }

    /// Publish the device's counters (its own part: the receive buffer counts its drops
    /// itself) where they differ from `old`, what was published last (zero in a new layout).
    /// Called by whoever holds the adapter's lock, so there is one writer at a time. A word
    /// that did not change is not stored to: a reader on another core (the driver's xstats,
    /// a telemetry thread, a secondary process) keeps its copy of a line whose counters
    /// stood still, instead of the device taking every counter line at every poll.
    /// `old` is brought up to date.
    pub(crate) fn publish(&self, c: &Counters, old: &mut Counters) {
        // Most polls change nothing: one compare of the whole block (a memcmp) is cheaper
        // than the field-by-field pass, which the derived `==` would be too.
        if counter_bytes(c) == counter_bytes(old) {
            return;
        }
        let words = self.counter_words();
        c.update(old, |i, v| words[i].store(v, Ordering::Relaxed));
    }

    /// A view of `len` bytes at `off` in UAR page `i`.
    pub(crate) fn uar_view(&self, i: usize, off: usize, len: usize) -> HostMem {
        assert!(i < self.layout.uars && off + len <= PAGE);
        self.view(self.layout.uar_off(i) + off, len)
    }

    /// UAR page `i`'s doorbell words, as the device polls them.
    pub(crate) fn uar_words(&self, i: usize) -> UarWords {
        assert!(i < self.layout.uars);
        UarWords {
            page: self.base().wrapping_add(self.layout.uar_off(i)),
            _region: self.region.clone(),
        }
    }

    /// The address of UAR page `i`.
    pub(crate) fn uar_ptr(&self, i: usize) -> *mut u8 {
        assert!(i < self.layout.uars);
        self.base().wrapping_add(self.layout.uar_off(i))
    }

    /// BlueFlame register `reg` of BF page `page`: its halves and its address.
    pub(crate) fn bf_reg(&self, page: usize, reg: usize) -> ([HostMem; 2], *mut u8) {
        let size = self.layout.bf_reg_size;
        assert!(page < self.layout.bf_pages && reg < self.layout.bf_regs_per_page);
        let start = self.layout.bf_page_off(page) + reg * size;
        let half = size / 2;
        (
            [self.view(start, half), self.view(start + half, half)],
            self.base().wrapping_add(start),
        )
    }

    fn view(&self, off: usize, len: usize) -> HostMem {
        assert!(off + len <= self.layout.len);
        // SAFETY: inside the region, which lives as long as the adapter that holds both the
        // region (through this Bar) and the views.
        unsafe { HostMem::new(self.base().add(off), len) }
    }

    /// Zero a UAR page or BlueFlame register before it is handed out again, so a new queue
    /// never sees an old doorbell.
    pub(crate) fn clear(&self, view: &HostMem) {
        view.fill(0, view.len(), 0);
    }

    /// The port's receive buffer, laid out afresh with room for `frames` frames.
    pub(crate) fn new_inbox(&self, frames: u32) -> FrameRing {
        let data = self.layout.inbox_len - inbox::region_len(0);
        FrameRing::init(self.region.clone(), self.layout.inbox_off, data, frames)
    }

    /// The port's receive buffer as another process sees it.
    fn inbox(&self) -> Option<FrameRing> {
        FrameRing::attach(self.region.clone(), self.layout.inbox_off)
    }

    /// BlueFlame pages.
    pub(crate) fn bf_pages(&self) -> usize {
        self.layout.bf_pages
    }

    /// BlueFlame registers per page.
    pub(crate) fn bf_regs_per_page(&self) -> usize {
        self.layout.bf_regs_per_page
    }
}

/// `Counters` is only `u64` fields: no padding, so every byte of it is initialised.
const _: () = assert!(std::mem::size_of::<Counters>() == 8 * Counters::NAMES.len());

/// The bytes of `c`, to compare two snapshots in one pass.
#[inline]
fn counter_bytes(c: &Counters) -> &[u8] {
    // SAFETY: `c` is a valid reference to a struct of `u64` fields without padding (asserted
    // above), so its `size_of` bytes are initialised and live as long as the borrow.
    unsafe {
        std::slice::from_raw_parts(
            (c as *const Counters).cast::<u8>(),
            std::mem::size_of::<Counters>(),
        )
    }
}

/// A UAR page's doorbell words as the device polls them: the send doorbell (0x14), the
/// doorbell write count ([`crate::UAR_DB_WRITES_OFFSET`]) and the CQ doorbell (0x20). The
/// page is a page of the region, which this value keeps alive, so each poll is one atomic
/// access per word, with no range or alignment check.
pub(crate) struct UarWords {
    page: *mut u8,
    _region: Arc<Region>,
}

// SAFETY: the words are reached only through atomics, and the region they lie in lives as long
// as this value (it holds a reference).
unsafe impl Send for UarWords {}
// SAFETY: as for `Send`: shared access is atomic access.
unsafe impl Sync for UarWords {}

const _: () = assert!(
    SEND_DOORBELL_OFFSET % 4 == 0
        && crate::types::UAR_DB_WRITES_OFFSET % 4 == 0
        && CQ_DOORBELL_OFFSET % 8 == 0
        && CQ_DOORBELL_OFFSET + 8 <= PAGE
);

impl UarWords {
    #[inline(always)]
    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: `off` is one of the 4-aligned word offsets asserted above, inside the page,
        // which is 4 KiB aligned (the region is, and pages are whole pages of it) and lives as
        // long as `self`; the driver's stores to it are atomic 32-bit stores.
        unsafe { AtomicU32::from_ptr(self.page.add(off).cast()) }
    }

    #[inline(always)]
    fn cq_word(&self) -> &AtomicU64 {
        // SAFETY: as in `u32_at`, at the 8-aligned CQ doorbell.
        unsafe { AtomicU64::from_ptr(self.page.add(CQ_DOORBELL_OFFSET).cast()) }
    }

    /// Whether a send doorbell waits: a load, so that the driver's line is not taken while
    /// none is there.
    #[inline(always)]
    pub(crate) fn send_pending(&self) -> bool {
        self.u32_at(SEND_DOORBELL_OFFSET).load(Ordering::Acquire) != 0
    }

    /// Take the send doorbell (its four bytes as stored), leaving zero.
    #[inline(always)]
    pub(crate) fn take_send(&self) -> [u8; 4] {
        self.u32_at(SEND_DOORBELL_OFFSET)
            .swap(0, Ordering::AcqRel)
            .to_ne_bytes()
    }

    /// Take the doorbell write count (native-endian), leaving zero.
    #[inline(always)]
    pub(crate) fn take_writes(&self) -> u32 {
        self.u32_at(crate::types::UAR_DB_WRITES_OFFSET)
            .swap(0, Ordering::AcqRel)
    }

    /// The CQ doorbell's eight bytes in memory order (zero: none).
    #[inline(always)]
    pub(crate) fn cq(&self) -> [u8; 8] {
        self.cq_word().load(Ordering::Acquire).to_ne_bytes()
    }

    /// Clear the CQ doorbell if it still holds `q`; false if another store came meanwhile.
    #[inline(always)]
    pub(crate) fn clear_cq_if(&self, q: [u8; 8]) -> bool {
        self.cq_word()
            .compare_exchange(
                u64::from_ne_bytes(q),
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_counters_that_changed_are_stored() {
        let bar = Bar::on_heap(&HcaConfig::default());
        let mut c = Counters {
            doorbells: 3,
            rx_frames: 7,
            ..Counters::default()
        };
        let mut old = Counters::default();
        bar.publish(&c, &mut old);
        assert_eq!(bar.counters(), c);
        assert_eq!(old, c);
        c.rx_frames = 8;
        // A store to the unchanged word would overwrite this mark.
        let at = Counters::NAMES
            .iter()
            .position(|&n| n == "doorbells")
            .unwrap();
        bar.counter_words()[at].store(u64::MAX, Ordering::Relaxed);
        bar.publish(&c, &mut old);
        assert_eq!(old, c);
        let seen = bar.counters();
        assert_eq!(seen.rx_frames, 8);
        assert_eq!(seen.doorbells, u64::MAX, "an unchanged word was stored to");
        bar.counter_words()[at].store(3, Ordering::Relaxed);
        assert_eq!(bar.counters(), c);
    }
}
