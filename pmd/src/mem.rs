//! Memory the driver shares with the device (rings, CQs, doorbell records) and with other
//! processes (ports and queues, as plain data).
//!
//! Under EAL it comes from `rte_zmalloc_socket` on the queue's NUMA node, as a real driver's
//! DMA memory would, and DPDK maps it at the same address in every process of the
//! application; without EAL (unit tests, the callgrind mode) from the Rust heap. Either way it
//! is zeroed, page-aligned, and freed only when the owner drops it, after the device was told
//! to forget it.
//!
//! State that another process may read or write is plain data: values, arrays, and pointers
//! into this memory, never a `Box`, `Arc`, `Vec`, `String`, trait object or function pointer
//! (the plugin may be loaded at another address, and the heap is not shared). [`DmaArray`],
//! [`DmaBox`] and [`FixedStr`] are the pieces such state is built from.

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
// SAFETY: a shared DmaBuf hands out only its address and length; what is done with the memory
// behind them is up to the protocols above, not to Rust references.
unsafe impl Sync for DmaBuf {}

const ALIGN: usize = 4096;

impl DmaBuf {
    /// `len` bytes (rounded up to whole 64-byte lines), zeroed and page-aligned; None when
    /// the memory cannot be had, or `len` rounded up does not fit a `usize` (it used to wrap
    /// to 0, and a zero-sized heap allocation is undefined behaviour).
    pub fn new(len: usize, source: MemSource) -> Option<DmaBuf> {
        let len = len.max(64).checked_next_multiple_of(64)?;
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

/// A fixed-length array of plain values in [`MemSource`] memory, initialised to one value: what
/// a queue keeps where another process may reach it (buffers in flight, completion marks,
/// registered regions). The handle is plain data too, two words like a `Box<[T]>`: how the
/// memory was allocated is kept in a header before the elements. `Default` is the empty
/// array, which owns nothing.
pub struct DmaArray<T: Copy> {
    ptr: NonNull<T>,
    len: usize,
}

/// What a [`DmaArray`] allocation needs to be freed, stored in front of its elements.
#[derive(Clone, Copy)]
struct ArrayHeader {
    bytes: usize,
    source: MemSource,
}

/// The header's room: a cache line, so that the elements stay 64-byte aligned.
const ARRAY_HEADER: usize = 64;

// SAFETY: the array owns its elements like a Box<[T]> does.
unsafe impl<T: Copy + Send> Send for DmaArray<T> {}

impl<T: Copy> DmaArray<T> {
    pub fn new(len: usize, value: T, source: MemSource) -> Option<DmaArray<T>> {
        if len == 0 {
            return Some(DmaArray::default());
        }
        assert!(std::mem::size_of::<T>() > 0 && std::mem::align_of::<T>() <= ARRAY_HEADER);
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())?
            .checked_add(ARRAY_HEADER)?;
        let buf = DmaBuf::new(bytes, source)?;
        let header = ArrayHeader {
            bytes: buf.len,
            source,
        };
        let base = buf.ptr;
        std::mem::forget(buf);
        // SAFETY: the header fits its 64 bytes at the start of the (page-aligned) allocation,
        // and `len` elements follow it inside the allocation, 64-byte aligned.
        let ptr = unsafe {
            base.cast::<ArrayHeader>().as_ptr().write(header);
            let ptr = base.add(ARRAY_HEADER).cast::<T>();
            for i in 0..len {
                ptr.as_ptr().add(i).write(value);
            }
            ptr
        };
        Some(DmaArray { ptr, len })
    }

    /// An array holding a copy of `values`.
    pub fn from_slice(values: &[T], source: MemSource) -> Option<DmaArray<T>> {
        let Some(&first) = values.first() else {
            return Some(DmaArray::default());
        };
        let mut a = DmaArray::new(values.len(), first, source)?;
        a.copy_from_slice(values);
        Some(a)
    }
}

impl<T: Copy> Default for DmaArray<T> {
    fn default() -> Self {
        DmaArray {
            ptr: NonNull::dangling(),
            len: 0,
        }
    }
}

impl<T: Copy> std::ops::Deref for DmaArray<T> {
    type Target = [T];
    #[inline(always)]
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised elements owned by this array (or none, dangling).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> std::ops::DerefMut for DmaArray<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> DmaArray<std::mem::MaybeUninit<T>> {
    /// The same array, its elements declared initialised.
    ///
    /// # Safety
    /// Every element must be initialised.
    pub unsafe fn assume_init(self) -> DmaArray<T> {
        let a = DmaArray {
            ptr: self.ptr.cast::<T>(),
            len: self.len,
        };
        // The allocation now belongs to `a` (same layout, same header).
        std::mem::forget(self);
        a
    }
}

impl<T: Copy> Drop for DmaArray<T> {
    #[inline]
    fn drop(&mut self) {
        if self.len > 0 {
            free_array(self.ptr.cast());
        }
    }
}

/// Frees the allocation whose elements start at `elems` (Copy elements need no drop).
#[cold]
fn free_array(elems: NonNull<u8>) {
    // SAFETY: DmaArray::new put the header ARRAY_HEADER bytes before the elements, at the
    // start of its allocation.
    let (base, header) = unsafe {
        let base = elems.sub(ARRAY_HEADER);
        (base, base.cast::<ArrayHeader>().as_ptr().read())
    };
    drop(DmaBuf {
        ptr: base,
        len: header.bytes,
        source: header.source,
    });
}

impl<T: Copy + std::fmt::Debug> std::fmt::Debug for DmaArray<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// One value in [`MemSource`] memory: how a port or a queue object is placed where every
/// process of the application finds it at the same address.
pub struct DmaBox<T> {
    ptr: NonNull<T>,
    source: MemSource,
}

// SAFETY: the box owns its value like a Box<T> does.
unsafe impl<T: Send> Send for DmaBox<T> {}

impl<T> DmaBox<T> {
    pub fn new(value: T, source: MemSource) -> Option<DmaBox<T>> {
        assert!(std::mem::align_of::<T>() <= ALIGN);
        let buf = DmaBuf::new(std::mem::size_of::<T>(), source)?;
        let ptr = buf.ptr.cast::<T>();
        std::mem::forget(buf);
        // SAFETY: a fresh allocation large and aligned enough for a T.
        unsafe { ptr.as_ptr().write(value) };
        Some(DmaBox { ptr, source })
    }

    /// Gives up ownership, for a pointer C keeps (an ethdev's private data or queue slot).
    pub fn into_raw(self) -> NonNull<T> {
        let p = self.ptr;
        std::mem::forget(self);
        p
    }

    /// Takes back what [`DmaBox::into_raw`] gave up.
    ///
    /// # Safety
    /// `ptr` must come from `into_raw` of a box of this `source` kind (any socket for
    /// `Dpdk`), not taken back before.
    pub unsafe fn from_raw(ptr: NonNull<T>, source: MemSource) -> DmaBox<T> {
        DmaBox { ptr, source }
    }

    /// Moves the value out and frees the memory.
    pub fn into_inner(self) -> T {
        // SAFETY: the value is initialised and owned; forgetting `self` after reading it
        // keeps it from being dropped twice.
        let value = unsafe { self.ptr.as_ptr().read() };
        let (ptr, source) = (self.ptr, self.source);
        std::mem::forget(self);
        free_box::<T>(ptr, source);
        value
    }
}

fn free_box<T>(ptr: NonNull<T>, source: MemSource) {
    // The allocation DmaBox::new made (DmaBuf rounds the size the same way).
    drop(DmaBuf {
        ptr: ptr.cast(),
        len: std::mem::size_of::<T>().max(64).next_multiple_of(64),
        source,
    });
}

impl<T> std::ops::Deref for DmaBox<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: initialised and owned by this box.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> std::ops::DerefMut for DmaBox<T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T> Drop for DmaBox<T> {
    fn drop(&mut self) {
        // SAFETY: initialised and owned; dropped once, then freed.
        unsafe { std::ptr::drop_in_place(self.ptr.as_ptr()) };
        free_box::<T>(self.ptr, self.source);
    }
}

/// A string of at most `N` bytes stored inline: names in shared state. Longer input is cut at
/// a character boundary.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FixedStr<const N: usize> {
    len: u16,
    bytes: [u8; N],
}

impl<const N: usize> FixedStr<N> {
    pub fn new(s: &str) -> FixedStr<N> {
        let mut n = s.len().min(N).min(usize::from(u16::MAX));
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        let mut bytes = [0; N];
        bytes[..n].copy_from_slice(&s.as_bytes()[..n]);
        FixedStr {
            len: n as u16,
            bytes,
        }
    }

    pub fn as_str(&self) -> &str {
        // Only ever filled from a &str, cut at a character boundary.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl<const N: usize> std::fmt::Display for FixedStr<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<const N: usize> std::fmt::Debug for FixedStr<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
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
    /// registered with is closed (DPDK memseg lists, for instance, live as long as EAL); and
    /// while the device may write some of it (a receive buffer posted), no Rust reference to
    /// those bytes may be in use.
    pub unsafe fn new(start: usize, end: usize) -> DmaRange {
        assert!(start <= end);
        DmaRange { start, end }
    }

    /// The range of a slice that is never freed, and that the device alone may now write:
    /// taking it `mut` keeps read-only memory (a literal, a `static`) out, which a receive
    /// queue's scatter entries ([`crate::ring::RqRing::entry_mut`]) could otherwise point the
    /// device's writes into.
    ///
    /// ```compile_fail
    /// static FRAME: [u8; 64] = [0; 64];
    /// let _ = mlx4rs::mem::DmaRange::of_static(&FRAME);
    /// ```
    pub fn of_static(mem: &'static mut [u8]) -> DmaRange {
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
/// common case on the data path is two compares. Each queue keeps its own copy of the port's
/// regions (a handful), as plain data.
#[derive(Debug, Default)]
pub struct Lkeys {
    regions: DmaArray<Mr>,
    last: Option<Mr>,
}

impl Lkeys {
    pub fn new(regions: &[Mr], source: MemSource) -> Option<Lkeys> {
        Some(Lkeys {
            regions: DmaArray::from_slice(regions, source)?,
            last: None,
        })
    }

    /// The region the one-entry cache holds, if any (the TX straight-line path checks
    /// buffers against it from registers).
    #[inline]
    pub fn cached(&self) -> Option<Mr> {
        self.last
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dma_buf_sizes_that_do_not_round_are_refused() {
        for len in [usize::MAX, usize::MAX - 62] {
            assert!(DmaBuf::new(len, MemSource::Heap).is_none(), "{len}");
        }
        let b = DmaBuf::new(1, MemSource::Heap).unwrap();
        assert_eq!((b.len(), b.as_ptr() as usize % ALIGN), (64, 0));
    }

    #[test]
    fn arrays_boxes_and_names_in_heap_memory() {
        let mut a = DmaArray::new(5, 7u32, MemSource::Heap).unwrap();
        assert_eq!(&a[..], &[7; 5]);
        a[4] = 9;
        assert_eq!(a.iter().sum::<u32>(), 37);
        assert!((a.as_ptr() as usize).is_multiple_of(64));
        let e: DmaArray<u64> = DmaArray::from_slice(&[], MemSource::Heap).unwrap();
        assert!(e.is_empty());
        let c = DmaArray::from_slice(&[1u8, 2, 3], MemSource::Heap).unwrap();
        assert_eq!(&c[..], &[1, 2, 3]);

        let b = DmaBox::new(String::from("moved through"), MemSource::Heap).unwrap();
        let raw = b.into_raw();
        // SAFETY: from into_raw of a heap box, taken back once.
        let b = unsafe { DmaBox::from_raw(raw, MemSource::Heap) };
        assert_eq!(b.into_inner(), "moved through");

        let n = FixedStr::<8>::new("net_mlx4rs0");
        assert_eq!(n.as_str(), "net_mlx4");
        assert_eq!(FixedStr::<4>::new("aé").as_str(), "aé");
        assert_eq!(
            FixedStr::<2>::new("aé").as_str(),
            "a",
            "cut at a character boundary"
        );
        assert_eq!(format!("{}", FixedStr::<16>::new("x")), "x");
    }
}
