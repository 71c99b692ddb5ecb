//! A cable between two ports in any two places: two adapters of one process, two copies of this
//! library in one process (our PMD and DPDK's C mlx4 on the verbs stand-in), or two processes.
//! It is a file both ends map: a header page and two frame rings, one per direction, as plain
//! data. Each end claims a side with an open-file-description lock on one byte of the file,
//! which the kernel drops when the end closes the file or its process dies, so a side is free
//! again for whoever comes next.
//!
//! A frame one end sends counts as sent there; if the other end's ring is full or that end is
//! down, the ring refuses and counts it, and that end reports it as missed: the same counting
//! as on an in-process cable.
//!
//! The other end is another program, and it can shrink the file under us: a page of the mapping
//! past the new end of file raises SIGBUS when touched. A process-wide SIGBUS handler answers
//! such a fault inside a cable mapping by mapping zeroed anonymous memory over the whole of it,
//! so the access completes, and marks the cable cut; the port then sees the cable gone, as if
//! the file had been deleted. What the zeroed rings hold is read as a hostile peer's header
//! (`inbox.rs` checks every index it reads). A SIGBUS anywhere else goes to the handler that
//! was there before, or ends the process as it would have.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::dma::Region;
use crate::error::HcaError;
use crate::inbox::{self, FrameRing};

const PAGE: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"MLX4CABL");
/// Frames each direction holds.
const RING_FRAMES: u32 = 4096;
/// Bytes of records each direction holds.
const RING_DATA: usize = 8 << 20;
/// How long plugging in waits for the layout lock.
const INIT_LOCK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long plugging in waits for a side to come free.
const SIDE_DEADLINE: std::time::Duration = std::time::Duration::from_millis(500);

/// Byte of the file whose lock serialises laying the file out.
const INIT_LOCK: i64 = 2;

fn ring_len() -> usize {
    inbox::region_len(RING_DATA).next_multiple_of(PAGE)
}

fn file_len() -> usize {
    PAGE + 2 * ring_len()
}

/// Cable mappings the SIGBUS handler answers for: a slot is free while `len` is 0.
struct Guard {
    start: AtomicUsize,
    len: AtomicUsize,
    /// A fault hit this mapping: it is zeroed anonymous memory now, not the file.
    cut: AtomicBool,
}

/// Ports plugged into cables at one time in one process.
const GUARDS: usize = 64;
/// The `len` of a slot being claimed or released.
const BUSY: usize = usize::MAX;

static GUARD: [Guard; GUARDS] = [const {
    Guard {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        cut: AtomicBool::new(false),
    }
}; GUARDS];

/// The SIGBUS disposition before ours; set once, before ours is installed.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: an SA_SIGINFO handler is passed the fault's siginfo.
    let addr = unsafe { (*info).si_addr() } as usize;
    for g in &GUARD {
        let (start, len) = (
            g.start.load(Ordering::Acquire),
            g.len.load(Ordering::Acquire),
        );
        if len != 0 && len != BUSY && addr.wrapping_sub(start) < len {
            // SAFETY: [start, start + len) is a cable mapping of ours, still mapped (its slot
            // is cleared before it is unmapped); the fixed anonymous mapping replaces it in
            // place with zeroed memory of the same size and protection.
            let p = unsafe {
                libc::mmap(
                    start as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                g.cut.store(true, Ordering::Release);
                return;
            }
        }
    }
    match PREVIOUS.get() {
        Some(old) if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN => {
            if old.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: with SA_SIGINFO, sa_sigaction holds a three-argument handler.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(old.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: without SA_SIGINFO, sa_sigaction holds a one-argument handler.
                let f: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute(old.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // The default action: returning re-runs the access, which now ends the process
            // (ignoring a fault's SIGBUS would run it for ever).
            // SAFETY: a zeroed sigaction is SIG_DFL with an empty mask; sigaction reads it.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            }
        }
    }
}

/// Install the SIGBUS handler, once per process.
fn guard_faults() -> std::io::Result<()> {
    static INSTALLED: OnceLock<std::io::Result<()>> = OnceLock::new();
    let r = INSTALLED.get_or_init(|| {
        // SAFETY: zeroed sigactions are valid values for sigaction to read and fill.
        let (mut ours, mut old): (libc::sigaction, libc::sigaction) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        ours.sa_sigaction = on_sigbus as *const () as usize;
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: reads the current disposition into `old` without changing it.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let _ = PREVIOUS.set(old);
        // SAFETY: `ours` is a valid SA_SIGINFO handler whose previous disposition is saved.
        if unsafe { libc::sigaction(libc::SIGBUS, &ours, std::ptr::null_mut()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    });
    r.as_ref()
        .map(|_| ())
        .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))
}

/// Claim a guard slot for a mapping; `None` if all are taken.
fn guard(ptr: *mut u8, len: usize) -> Option<usize> {
    GUARD.iter().position(|g| {
        g.len
            .compare_exchange(0, BUSY, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
            .then(|| {
                g.cut.store(false, Ordering::Relaxed);
                g.start.store(ptr as usize, Ordering::Release);
                g.len.store(len, Ordering::Release);
            })
            .is_some()
    })
}

/// A mapping of the cable file.
struct Mapping {
    ptr: *mut u8,
    len: usize,
    guard: usize,
}

// SAFETY: the mapping is plain shared memory, unmapped once, when the last ring lets go.
unsafe impl Send for Mapping {}
// SAFETY: see `Send`; `&Mapping` gives nothing out.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        let g = &GUARD[self.guard];
        g.len.store(BUSY, Ordering::Release);
        g.start.store(0, Ordering::Release);
        g.len.store(0, Ordering::Release);
        // SAFETY: mapped in `Cable::open` with this length; nothing refers to it any more
        // (the rings hold the Region that holds this).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One end of a cable.
pub(crate) struct Cable {
    path: PathBuf,
    side: usize,
    /// The mapping's slot in [`GUARD`].
    guard: usize,
    /// The file's length as laid out.
    len: usize,
    /// Frames this end sends.
    pub(crate) tx: FrameRing,
    /// Frames this end receives.
    pub(crate) rx: FrameRing,
    /// Drops of `rx` already added to the port's counters.
    pub(crate) rx_dropped_seen: u64,
    /// Holds the side lock for as long as this end lives.
    _file: File,
    /// Keeps the mapping alive (after the rings, which point into it).
    _map: Arc<Region>,
}

impl std::fmt::Debug for Cable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cable")
            .field("path", &self.path)
            .field("side", &self.side)
            .finish()
    }
}

/// Lock `len` bytes at `start` of `file` for writing; false if another open file holds it
/// (`wait`: block until it is free).
fn ofd_lock(file: &File, start: i64, wait: bool) -> std::io::Result<bool> {
    // SAFETY: a zeroed flock is a valid value to fill in.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = start;
    fl.l_len = 1;
    let cmd = if wait {
        libc::F_OFD_SETLKW
    } else {
        libc::F_OFD_SETLK
    };
    // SAFETY: fcntl with an OFD lock command reads the flock we pass; the fd is open.
    if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) if !wait => Ok(false),
        _ => Err(e),
    }
}

/// Take side 0 or side 1 of the cable, whichever is free.
fn claim_side(file: &File) -> Option<usize> {
    (0..2).find(|&s| matches!(ofd_lock(file, s as i64, false), Ok(true)))
}

fn ofd_unlock(file: &File, start: i64) {
    // SAFETY: as in `ofd_lock`.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_UNLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = start;
    fl.l_len = 1;
    // SAFETY: as in `ofd_lock`.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
}

impl Cable {
    /// Plug into the cable at `path`, creating and laying it out if it does not exist yet;
    /// fails if both sides are taken.
    pub(crate) fn open(path: &Path) -> Result<Cable, HcaError> {
        let io = |what: &str, e: std::io::Error| {
            HcaError::Io(format!("cable {}: {what}: {e}", path.display()))
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| io("open", e))?;
        // The layout lock is held only while a side is claimed and the file laid out, a few
        // system calls: one held for seconds belongs to a stuck or hostile process, and port
        // start fails rather than waits for ever.
        let start = std::time::Instant::now();
        loop {
            while !ofd_lock(&file, INIT_LOCK, false).map_err(|e| io("lock", e))? {
                if start.elapsed() >= INIT_LOCK_DEADLINE {
                    return Err(HcaError::Io(format!(
                        "cable {}: another process has held the layout lock for {:?}",
                        path.display(),
                        INIT_LOCK_DEADLINE
                    )));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            if let Some(side) = claim_side(&file) {
                return Cable::plug(path, file, side);
            }
            ofd_unlock(&file, INIT_LOCK);
            // A side lock lives as long as its open file description, and a child forked
            // between the far end's open and its close holds that description until it
            // execs: an end unplugged a moment ago can look taken for that long.
            if start.elapsed() >= SIDE_DEADLINE {
                return Err(HcaError::Io(format!(
                    "cable {}: both ends are plugged in",
                    path.display()
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// With the layout lock and the side `side` held (the layout lock released before
    /// returning): lay the file out if needed, map it.
    fn plug(path: &Path, file: File, side: usize) -> Result<Cable, HcaError> {
        let io = |what: &str, e: std::io::Error| {
            HcaError::Io(format!("cable {}: {what}: {e}", path.display()))
        };
        let done = |file: &File| ofd_unlock(file, INIT_LOCK);
        let len = file_len();
        let size = file.metadata().map_err(|e| io("stat", e))?.len() as usize;
        if size != 0 && size != len {
            done(&file);
            return Err(HcaError::Io(format!(
                "cable {}: a file of {size} bytes, not a cable of {len}",
                path.display()
            )));
        }
        if size == 0 {
            if let Err(e) = file.set_len(len as u64) {
                done(&file);
                return Err(io("size", e));
            }
        }
        // SAFETY: maps the whole file shared; checked for failure below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            done(&file);
            return Err(io("mmap", std::io::Error::last_os_error()));
        }
        let guarded = guard_faults()
            .map_err(|e| io("SIGBUS handler", e))
            .and_then(|()| {
                guard(ptr.cast(), len).ok_or_else(|| {
                    HcaError::Io(format!(
                        "cable {}: {GUARDS} cables are plugged in already",
                        path.display()
                    ))
                })
            });
        let guard = match guarded {
            Ok(g) => g,
            Err(e) => {
                // SAFETY: mapped just above, and nothing refers to it.
                unsafe { libc::munmap(ptr, len) };
                done(&file);
                return Err(e);
            }
        };
        let map = Mapping {
            ptr: ptr.cast(),
            len,
            guard,
        };
        // SAFETY: the mapping is valid for `len` bytes until `map` drops, which the Region
        // owns through its drop guard below; the file is shared only through this protocol.
        let region = Arc::new(unsafe { Region::foreign_with(map.ptr, len, Box::new(map)) });
        // SAFETY: the header's first word, 8-aligned at the page start; accessed atomically.
        let magic = unsafe { AtomicU64::from_ptr(region.as_ptr().cast()) };
        let at = |s: usize| PAGE + s * ring_len();
        let data = ring_len() - inbox::region_len(0);
        let rings = if magic.load(Ordering::Acquire) == MAGIC {
            FrameRing::attach(region.clone(), at(0)).zip(FrameRing::attach(region.clone(), at(1)))
        } else {
            let r0 = FrameRing::init(region.clone(), at(0), data, RING_FRAMES);
            let r1 = FrameRing::init(region.clone(), at(1), data, RING_FRAMES);
            magic.store(MAGIC, Ordering::Release);
            Some((r0, r1))
        };
        done(&file);
        let Some((r0, r1)) = rings else {
            return Err(HcaError::Io(format!(
                "cable {}: not a cable of this version",
                path.display()
            )));
        };
        // Side s sends on ring s and receives on the other.
        let (tx, mut rx) = if side == 0 { (r0, r1) } else { (r1, r0) };
        // The other end writes what this one receives: read it as a peer's.
        rx.guard_reads();
        // Only this end sends on `tx`: a lock a dead process left is ours to break.
        tx.break_lock();
        rx.set_up(true);
        let rx_dropped_seen = rx.dropped();
        Ok(Cable {
            path: path.to_owned(),
            side,
            guard,
            len,
            tx,
            rx,
            rx_dropped_seen,
            _file: file,
            _map: region,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the other end is plugged in: its side lock is held (by a live process; the
    /// kernel drops it when the process dies) and it takes frames (it is up).
    pub(crate) fn peer_present(&self) -> bool {
        // SAFETY: a zeroed flock is a valid value to fill in.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as _;
        fl.l_whence = libc::SEEK_SET as _;
        fl.l_start = (1 - self.side) as i64;
        fl.l_len = 1;
        // SAFETY: F_OFD_GETLK reads and fills the flock we pass; the fd is open.
        let rc = unsafe { libc::fcntl(self._file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
        rc == 0 && fl.l_type != libc::F_UNLCK as _ && self.tx.up()
    }

    /// Whether the cable file was deleted: the cable is gone for good.
    pub(crate) fn unlinked(&self) -> bool {
        self._file.metadata().is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            m.nlink() == 0
        })
    }

    /// Whether the file was cut short under the mapping: a fault past its end already replaced
    /// the mapping with zeroes, or the file is shorter than its layout.
    pub(crate) fn cut(&self) -> bool {
        GUARD[self.guard].cut.load(Ordering::Acquire)
            || self
                ._file
                .metadata()
                .is_ok_and(|m| m.len() < self.len as u64)
    }

    /// Frames the other end sent that this end's ring refused since the last call.
    pub(crate) fn new_rx_drops(&mut self) -> u64 {
        let d = self.rx.dropped();
        let new = d.wrapping_sub(self.rx_dropped_seen);
        self.rx_dropped_seen = d;
        new
    }
}

impl Drop for Cable {
    fn drop(&mut self) {
        // Unplugged: what the other end sends now goes nowhere, and is counted in the ring.
        self.rx.set_up(false);
    }
}
