//! Memory the driver shares with the device: rings, CQs and doorbell records.
//!
//! Under EAL it comes from `rte_zmalloc_socket` on the queue's NUMA node, as a real driver's
//! DMA memory would; without EAL (unit tests, the callgrind mode) from the Rust heap. Either
//! way it is zeroed, page-aligned, and freed only when the owner drops it, after the device was
//! told to forget it.

use std::alloc::Layout;
use std::ptr::NonNull;

use dpdk_sys as sys;

/// Where shared memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemSource {
    /// `rte_zmalloc_socket` on this socket (`SOCKET_ID_ANY` = -1 allowed).
    Dpdk { socket: i32 },
    /// The process heap (no EAL).
    Heap,
}

impl MemSource {
    /// The NUMA node to ask a device for memory on (-1: any).
    pub fn socket(self) -> i32 {
        match self {
            MemSource::Dpdk { socket } => socket,
            MemSource::Heap => -1,
        }
    }
}

/// A zeroed, 4 KiB-aligned block of shared memory.
pub struct DmaBuf {
    ptr: NonNull<u8>,
    len: usize,
    source: MemSource,
}

// SAFETY: the buffer is plain memory owned by this value; the device's concurrent access is
// governed by the queue protocols (ownership bits, doorbell records), not by Rust aliasing.
unsafe impl Send for DmaBuf {}

const ALIGN: usize = 4096;

impl DmaBuf {
    pub fn new(len: usize, source: MemSource) -> Option<DmaBuf> {
        let len = len.max(64).next_multiple_of(64);
        let ptr = match source {
            // SAFETY: plain allocation call; EAL is initialised whenever this source is used.
            MemSource::Dpdk { socket } => unsafe {
                sys::rte_zmalloc_socket(c"mlx4rs_dma".as_ptr(), len, ALIGN as u32, socket)
            }
            .cast::<u8>(),
            // SAFETY: the layout has a non-zero size.
            MemSource::Heap => unsafe {
                std::alloc::alloc_zeroed(Layout::from_size_align(len, ALIGN).ok()?)
            },
        };
        NonNull::new(ptr).map(|ptr| DmaBuf { ptr, len, source })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn non_null(&self) -> NonNull<u8> {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The range the device may DMA, for memory registration.
    pub fn range(&self) -> (usize, usize) {
        let a = self.ptr.as_ptr() as usize;
        (a, a + self.len)
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        match self.source {
            // SAFETY: allocated by rte_zmalloc_socket above and freed once.
            MemSource::Dpdk { .. } => unsafe { sys::rte_free(self.ptr.as_ptr().cast()) },
            // SAFETY: allocated by alloc_zeroed with this very layout.
            MemSource::Heap => unsafe {
                std::alloc::dealloc(
                    self.ptr.as_ptr(),
                    Layout::from_size_align_unchecked(self.len, ALIGN),
                )
            },
        }
    }
}

/// Memory the device may read and write for as long as it lives. Building one is the promise;
/// registering it with the device is then safe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaRange {
    start: usize,
    end: usize,
}

impl DmaRange {
    /// # Safety
    /// `[start, end)` must stay mapped, readable and writable, until every device it is
    /// registered with is closed (DPDK memseg lists, for instance, live as long as EAL).
    pub unsafe fn new(start: usize, end: usize) -> DmaRange {
        assert!(start <= end);
        DmaRange { start, end }
    }

    /// The range of a slice that is never freed.
    pub fn of_static(mem: &'static [u8]) -> DmaRange {
        let start = mem.as_ptr() as usize;
        DmaRange {
            start,
            end: start + mem.len(),
        }
    }

    pub fn start(&self) -> usize {
        self.start
    }

    pub fn end(&self) -> usize {
        self.end
    }
}

/// A registered memory region: `[start, end)` reachable by the device under `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mr {
    pub start: usize,
    pub end: usize,
    pub lkey: u32,
}

impl Mr {
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.start && addr.saturating_add(len) <= self.end
    }
}

/// The lkey of a buffer: the registered regions with a one-entry cache in front, so that the
/// common case on the data path is two compares.
#[derive(Debug, Clone, Default)]
pub struct Lkeys {
    regions: std::sync::Arc<[Mr]>,
    last: Option<Mr>,
}

impl Lkeys {
    pub fn new(regions: std::sync::Arc<[Mr]>) -> Lkeys {
        Lkeys {
            regions,
            last: None,
        }
    }

    /// The key covering `[addr, addr + len)`, or None if no registered region does.
    #[inline]
    pub fn lookup(&mut self, addr: usize, len: usize) -> Option<u32> {
        match self.last {
            Some(m) if m.contains(addr, len) => Some(m.lkey),
            _ => {
                let m = *self.regions.iter().find(|m| m.contains(addr, len))?;
                self.last = Some(m);
                Some(m.lkey)
            }
        }
    }
}
