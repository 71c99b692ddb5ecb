//! Device list, contexts and what hangs off a context: queries, async events, completion
//! channels, and the memory rdma-core would allocate for queues (from the application's
//! allocator when it handed one over with `mlx4dv_set_context_attr`).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::device::{devices, Adapter, Device, EventQueue};
use crate::{log, netdev, set_errno, sys};

/// Tells our objects from foreign pointers (every object starts with its rdma-core struct, then
/// this).
pub(crate) const MAGIC: u64 = 0x6d6c_7834_7273_7662; // "mlx4rsvb"

/// The page size rdma-core rounds queue buffers to.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Queue memory: from the application's allocator if it gave one, else anonymous pages (what
/// libmlx4 does). Zeroed.
pub(crate) struct Buf {
    pub ptr: *mut u8,
    pub len: usize,
    free: Free,
}

enum Free {
    Munmap,
    Extern(sys::mlx4dv_ctx_allocators),
}

// SAFETY: a `Buf` owns its memory; the pointer is only an address other threads (the device)
// reach through their own synchronisation.
unsafe impl Send for Buf {}
// SAFETY: see `Send`; `&Buf` hands out nothing but the address.
unsafe impl Sync for Buf {}

impl Buf {
    fn alloc(alloc: Option<sys::mlx4dv_ctx_allocators>, len: usize) -> Result<Buf, c_int> {
        let ps = page_size();
        let len = len.div_ceil(ps).max(1) * ps;
        match alloc {
            Some(a) => {
                let f = a.alloc.expect("checked when set");
                // SAFETY: calling the allocator the application handed over, with its data.
                let p = unsafe { f(len, a.data) }.cast::<u8>();
                if p.is_null() {
                    return Err(libc::ENOMEM);
                }
                // SAFETY: the allocator returned `len` writable bytes.
                unsafe { ptr::write_bytes(p, 0, len) };
                Ok(Buf {
                    ptr: p,
                    len,
                    free: Free::Extern(a),
                })
            }
            None => {
                // SAFETY: an anonymous private mapping; the result is checked.
                let p = unsafe {
                    libc::mmap(
                        ptr::null_mut(),
                        len,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    )
                };
                if p == libc::MAP_FAILED {
                    return Err(libc::ENOMEM);
                }
                Ok(Buf {
                    ptr: p.cast(),
                    len,
                    free: Free::Munmap,
                })
            }
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        match &self.free {
            // SAFETY: the mapping made in `alloc`, unmapped once.
            Free::Munmap => unsafe {
                libc::munmap(self.ptr.cast(), self.len);
            },
            Free::Extern(a) => {
                if let Some(f) = a.free {
                    // SAFETY: returning the block to the allocator it came from.
                    unsafe { f(self.ptr.cast(), a.data) };
                }
            }
        }
    }
}

/// Doorbell records, several to a page as libmlx4 packs them: 8 bytes for a CQ (consumer index
/// and arm word), 4 for a receive queue.
struct DbPool {
    size: usize,
    pages: Vec<(Buf, Vec<bool>)>,
}

impl DbPool {
    const fn new(size: usize) -> DbPool {
        DbPool {
            size,
            pages: Vec::new(),
        }
    }

    fn alloc(&mut self, a: Option<sys::mlx4dv_ctx_allocators>) -> Result<*mut u32, c_int> {
        let per = page_size() / self.size;
        let pi = match self.pages.iter().position(|(_, u)| u.contains(&false)) {
            Some(i) => i,
            None => {
                self.pages
                    .push((Buf::alloc(a, page_size())?, vec![false; per]));
                self.pages.len() - 1
            }
        };
        let (buf, used) = &mut self.pages[pi];
        let slot = used.iter().position(|u| !u).expect("a free slot");
        used[slot] = true;
        let p = buf.ptr.wrapping_add(slot * self.size);
        // SAFETY: the slot lies in the page; records start zeroed as libmlx4 leaves them.
        unsafe { ptr::write_bytes(p, 0, self.size) };
        Ok(p.cast())
    }

    fn free(&mut self, rec: *mut u32) {
        let p = rec as usize;
        if let Some(pi) = self
            .pages
            .iter()
            .position(|(b, _)| (b.ptr as usize..b.ptr as usize + b.len).contains(&p))
        {
            let slot = (p - self.pages[pi].0.ptr as usize) / self.size;
            self.pages[pi].1[slot] = false;
            if !self.pages[pi].1.contains(&true) {
                self.pages.swap_remove(pi);
            }
        }
    }
}

struct Mem {
    alloc: Option<sys::mlx4dv_ctx_allocators>,
    cq_db: DbPool,
    rq_db: DbPool,
}

/// Which doorbell record.
#[derive(Clone, Copy)]
pub(crate) enum DbKind {
    Cq,
    Rq,
}

/// An open device: rdma-core's `verbs_context` (with the `ibv_context` the application holds at
/// its end) first.
#[repr(C)]
pub(crate) struct Context {
    vctx: sys::verbs_context,
    magic: u64,
    pub dev: &'static Device,
    pub adapter: Arc<Adapter>,
    pub events: Arc<EventQueue>,
    mem: Mutex<Mem>,
    /// `MLX4DV_SET_CTX_ATTR_LOG_WQS_RANGE_SZ` for the next WQ.
    pub log_wqs_range: AtomicU8,
    /// The WQN ranges of the context's WQs, the latest last, as mlx4_ib keeps them.
    pub wq_ranges: Mutex<Vec<WqRange>>,
    /// The context's UAR page (`mlx4dv_cq.cq_uar`): CQ arm doorbells land there.
    uar: mlx4_hca::Uar,
    /// The command fd: the adapter's device memory file, so `mmap(cmd_fd, uar_mmap_offset)`
    /// maps a QP's UAR page, as mlx4_ib maps it for a secondary process.
    _cmd_fd: OwnedFd,
}

/// A range of consecutive WQNs aligned to its size (mlx4_ib's `mlx4_wqn_range`): WQs take its
/// numbers in order until it is full or one of them was destroyed (dirty); it is given back
/// when its last WQ goes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WqRange {
    pub base: u32,
    pub size: u32,
    pub used: u32,
    pub live: u32,
    pub dirty: bool,
}

impl Context {
    pub(crate) fn ibv(&self) -> *mut sys::ibv_context {
        ptr::addr_of!(self.vctx.context).cast_mut()
    }

    pub(crate) fn buf(&self, len: usize) -> Result<Buf, c_int> {
        let a = self.mem.lock().alloc;
        Buf::alloc(a, len)
    }

    pub(crate) fn db(&self, kind: DbKind) -> Result<*mut u32, c_int> {
        let mut m = self.mem.lock();
        let a = m.alloc;
        match kind {
            DbKind::Cq => m.cq_db.alloc(a),
            DbKind::Rq => m.rq_db.alloc(a),
        }
    }

    pub(crate) fn free_db(&self, kind: DbKind, rec: *mut u32) {
        let mut m = self.mem.lock();
        match kind {
            DbKind::Cq => m.cq_db.free(rec),
            DbKind::Rq => m.rq_db.free(rec),
        }
    }

    pub(crate) fn set_allocators(&self, a: sys::mlx4dv_ctx_allocators) -> c_int {
        if a.alloc.is_none() || a.free.is_none() {
            return libc::EINVAL;
        }
        self.mem.lock().alloc = Some(a);
        0
    }

    pub(crate) fn cq_uar(&self) -> *mut c_void {
        self.uar.page.cast()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if let Err(e) = self.adapter.hca.free_uar(self.uar.index) {
            log(format_args!("closing a context: its UAR page: {e}"));
        }
    }
}

/// Our context behind an `ibv_context` pointer.
///
/// # Safety
/// `p` is null or a pointer the application got from `ibv_open_device` (of any provider).
pub(crate) unsafe fn context<'a>(p: *mut sys::ibv_context) -> Option<&'a Context> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a live ibv_context; reading its last field is fine for any
    // provider's context.
    if unsafe { (*p).abi_compat } != usize::MAX as *mut c_void {
        return None;
    }
    let off =
        std::mem::offset_of!(Context, vctx) + std::mem::offset_of!(sys::verbs_context, context);
    let c = p.cast::<u8>().wrapping_sub(off).cast::<Context>();
    // SAFETY: an extended context lives at the end of a verbs_context; if it is ours, the magic
    // follows it. A foreign verbs_context is at least as large as ours (same header), so the read
    // stays within memory of some provider's context object.
    if unsafe { ptr::addr_of!((*c).magic).read() } != MAGIC {
        return None;
    }
    // SAFETY: it is ours, and lives until ibv_close_device.
    Some(unsafe { &*c })
}

/// Interpret `ctx` or fail the entry point with `EINVAL`.
macro_rules! ctx_or {
    ($p:expr, $fail:expr) => {
        // SAFETY: entry points receive the application's context pointers.
        match unsafe { $crate::context::context($p) } {
            Some(c) => c,
            None => {
                $crate::set_errno(libc::EINVAL);
                return $fail;
            }
        }
    };
}
pub(crate) use ctx_or;

// ------------------------------------------------------------------------------ device list

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_get_device_list(
    num: *mut c_int,
) -> *mut *mut sys::ibv_device {
    let devs = devices();
    // SAFETY: calloc for a NULL-terminated array the caller frees with ibv_free_device_list.
    let list = unsafe { libc::calloc(devs.len() + 1, std::mem::size_of::<*mut sys::ibv_device>()) }
        .cast::<*mut sys::ibv_device>();
    if list.is_null() {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    }
    for (i, d) in devs.iter().enumerate() {
        // SAFETY: `list` has room for every device and the terminator.
        unsafe { *list.add(i) = ptr::addr_of!(d.ibv).cast_mut() };
    }
    if !num.is_null() {
        // SAFETY: the caller passed a valid int pointer.
        unsafe { *num = devs.len() as c_int };
    }
    list
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_free_device_list(list: *mut *mut sys::ibv_device) {
    // SAFETY: the array came from calloc in ibv_get_device_list; devices live forever.
    unsafe { libc::free(list.cast()) };
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_get_device_name(
    dev: *mut sys::ibv_device,
) -> *const c_char {
    match Device::from_ibv(dev) {
        Some(d) => d.ibv.name.as_ptr(),
        None => ptr::null(),
    }
}

// ------------------------------------------------------------------------------ contexts

/// Opens a context of `dev` whose ops are `vctx`'s (the entry points above this module fill
/// them); the rest of the verbs context is filled here.
pub(crate) fn open(
    dev: &'static Device,
    mut vctx: sys::verbs_context,
) -> Result<Box<Context>, c_int> {
    let adapter = dev.acquire().map_err(|e| {
        log(format_args!("ibv_open_device: {e}"));
        libc::ENODEV
    })?;
    let guard = Release(dev);
    let events = Arc::new(EventQueue::new().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?);
    adapter.subscribe(&events);
    // The command fd maps device memory by offset, as the uverbs fd maps UAR pages.
    let cmd_fd = adapter.bar_fd.try_clone().map_err(|e| {
        log(format_args!("ibv_open_device: command fd: {e}"));
        libc::EIO
    })?;
    let uar = adapter.hca.alloc_uar().map_err(|e| {
        log(format_args!("ibv_open_device: the context's UAR page: {e}"));
        e.errno()
    })?;
    vctx.context.device = ptr::addr_of!(dev.ibv).cast_mut();
    vctx.context.cmd_fd = cmd_fd.as_raw_fd();
    vctx.context.async_fd = events.fd.as_raw_fd();
    vctx.context.num_comp_vectors = 1;
    vctx.context.abi_compat = usize::MAX as *mut c_void;
    std::mem::forget(guard);
    Ok(Box::new(Context {
        vctx,
        magic: MAGIC,
        dev,
        adapter,
        events,
        mem: Mutex::new(Mem {
            alloc: None,
            cq_db: DbPool::new(8),
            rq_db: DbPool::new(4),
        }),
        log_wqs_range: AtomicU8::new(0),
        wq_ranges: Mutex::new(Vec::new()),
        uar,
        _cmd_fd: cmd_fd,
    }))
}

/// Releases the device again if opening a context fails half-way.
struct Release(&'static Device);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.release();
    }
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_close_device(ctx: *mut sys::ibv_context) -> c_int {
    let c = ctx_or!(ctx, libc::EINVAL);
    let dev = c.dev;
    // SAFETY: the context came from Box::leak in ibv_open_device and is closed once.
    drop(unsafe { Box::from_raw((c as *const Context).cast_mut()) });
    dev.release();
    0
}

// ------------------------------------------------------------------------------ async events

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_get_async_event(
    ctx: *mut sys::ibv_context,
    ev: *mut sys::ibv_async_event,
) -> c_int {
    let c = ctx_or!(ctx, -1);
    if ev.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    match c.events.pop() {
        Ok(e) => {
            let mut out = sys::ibv_async_event {
                event_type: e.event_type,
                ..Default::default()
            };
            out.element.port_num = e.port as c_int;
            // SAFETY: the caller passed an event to fill.
            unsafe { ev.write(out) };
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_ack_async_event(_ev: *mut sys::ibv_async_event) {
    // Port events hold no object that a destroy would have to wait for.
}

// ------------------------------------------------------------------------------ completion channels

/// A completion channel: the model's, whose eventfd is the channel's fd. CQs created on it
/// report their events there once armed (`ibv_req_notify_cq`, or the CQ doorbell an mlx4dv
/// user writes itself).
#[repr(C)]
pub(crate) struct CompChannel {
    ibv: sys::ibv_comp_channel,
    magic: u64,
    adapter: Arc<Adapter>,
    /// The model's channel.
    pub id: u32,
    /// The CQs on it: (CQN, the application's CQ pointer, its `cq_context`).
    pub cqs: Mutex<Vec<(u32, usize, usize)>>,
}

impl CompChannel {
    /// The channel's fd: the model's eventfd.
    pub(crate) fn fd(&self) -> c_int {
        self.ibv.fd
    }

    /// The adapter whose model made the channel.
    pub(crate) fn adapter(&self) -> &Adapter {
        &self.adapter
    }
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_create_comp_channel(
    ctx: *mut sys::ibv_context,
) -> *mut sys::ibv_comp_channel {
    let c = ctx_or!(ctx, ptr::null_mut());
    let hca = &c.adapter.hca;
    let (id, fd) = match hca
        .create_comp_channel()
        .and_then(|id| Ok((id, hca.comp_channel_fd(id)?)))
    {
        Ok(x) => x,
        Err(e) => {
            log(format_args!("ibv_create_comp_channel: {e}"));
            set_errno(e.errno());
            return ptr::null_mut();
        }
    };
    let ch = Box::new(CompChannel {
        ibv: sys::ibv_comp_channel {
            context: ctx,
            fd,
            refcnt: 0,
        },
        magic: MAGIC,
        adapter: c.adapter.clone(),
        id,
        cqs: Mutex::new(Vec::new()),
    });
    Box::into_raw(ch).cast()
}

/// # Safety
/// `p` is null or a channel pointer the application got from some provider.
pub(crate) unsafe fn channel<'a>(p: *mut sys::ibv_comp_channel) -> Option<&'a CompChannel> {
    if p.is_null() {
        return None;
    }
    let c = p.cast::<CompChannel>();
    // SAFETY: the application's channel; ours carry the magic right after the rdma-core struct.
    (unsafe { ptr::addr_of!((*c).magic).read() } == MAGIC).then(|| unsafe { &*c })
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_destroy_comp_channel(
    ch: *mut sys::ibv_comp_channel,
) -> c_int {
    // SAFETY: the application's channel pointer.
    let Some(c) = (unsafe { channel(ch) }) else {
        return libc::EINVAL;
    };
    if c.ibv.refcnt != 0 {
        return libc::EBUSY;
    }
    if let Err(e) = c.adapter.hca.destroy_comp_channel(c.id) {
        log(format_args!("ibv_destroy_comp_channel: {e}"));
        return e.errno();
    }
    // SAFETY: the channel came from Box::into_raw and is destroyed once.
    drop(unsafe { Box::from_raw((c as *const CompChannel).cast_mut()) });
    0
}

// ------------------------------------------------------------------------------ misc

#[no_mangle]
pub extern "C" fn mlx4rs_verbs__ibv_fork_init() -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn mlx4rs_verbs__ibv_is_fork_initialized() -> sys::ibv_fork_status {
    sys::IBV_FORK_UNNEEDED
}

#[no_mangle]
pub extern "C" fn mlx4rs_verbs__ibv_port_state_str(state: sys::ibv_port_state) -> *const c_char {
    let s: &CStr = match state {
        sys::IBV_PORT_NOP => c"PORT_NOP",
        sys::IBV_PORT_DOWN => c"PORT_DOWN",
        sys::IBV_PORT_INIT => c"PORT_INIT",
        sys::IBV_PORT_ARMED => c"PORT_ARMED",
        sys::IBV_PORT_ACTIVE => c"PORT_ACTIVE",
        sys::IBV_PORT_ACTIVE_DEFER => c"PORT_ACTIVE_DEFER",
        _ => c"invalid state",
    };
    s.as_ptr()
}

/// The netdev's state now (the port is down if it cannot be read).
pub(crate) fn port_up(c: &Context) -> (bool, u32) {
    match netdev::state(&c.dev.sysfs.netdev) {
        Ok(s) => (s.up, s.mtu),
        Err(_) => (false, 1500),
    }
}

/// The log2 range size set for the next WQ, consumed.
pub(crate) fn take_wqs_range(c: &Context) -> u8 {
    c.log_wqs_range.swap(0, Ordering::Relaxed)
}
