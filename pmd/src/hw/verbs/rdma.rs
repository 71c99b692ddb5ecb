//! rdma-core, loaded at run time: `libibverbs.so.1` and `libmlx4.so.1` by `dlopen`, their entry
//! points by `dlsym` (bindgen's tables in `rdma-sys`), and the `static inline` functions of
//! `verbs.h` that the driver needs (work queues, indirection tables, extended QPs, flows),
//! which call through the context's `verbs_context` ops exactly as the header's versions do.
//!
//! The libraries are found the way the dynamic loader finds them (`LD_LIBRARY_PATH`, then the
//! system's paths), or in the directory `MLX4RS_RDMA_CORE` names: tests point it at our
//! stand-in (`pmd/verbs`) or at an empty directory to see a machine without rdma-core.

use std::ffi::{c_int, CStr};
use std::sync::OnceLock;

use rdma_sys as sys;

/// Names the directory to load rdma-core's libraries from, instead of the loader's search.
pub const ENV_DIR: &str = "MLX4RS_RDMA_CORE";

pub const IBVERBS: &str = "libibverbs.so.1";
pub const MLX4: &str = "libmlx4.so.1";

/// rdma-core's two libraries, loaded once per process and kept until it exits (rdma-core
/// registers providers and atexit work that must not outlive its code).
pub struct Rdma {
    pub ibv: sys::Ibverbs,
    pub dv: sys::Mlx4,
}

fn path(lib: &str) -> String {
    match std::env::var_os(ENV_DIR) {
        Some(d) => std::path::Path::new(&d).join(lib).display().to_string(),
        None => lib.to_owned(),
    }
}

fn load() -> Result<Rdma, String> {
    let ibv_path = path(IBVERBS);
    // SAFETY: loading rdma-core runs its constructors, which only initialise the library.
    let ibv = unsafe { sys::Ibverbs::new(&ibv_path) }.map_err(|e| {
        format!(
            "rdma-core is not installed: {ibv_path} cannot be loaded ({e}); install it with \
             `apt-get install ibverbs-providers` (Debian; it brings libibverbs1 too)"
        )
    })?;
    let mlx4_path = path(MLX4);
    // SAFETY: as above.
    let dv = unsafe { sys::Mlx4::new(&mlx4_path) }.map_err(|e| {
        format!(
            "rdma-core's mlx4 provider is missing: {mlx4_path} cannot be loaded ({e}); install \
             it with `apt-get install ibverbs-providers`"
        )
    })?;
    let rdma = Rdma { ibv, dv };
    rdma.check()?;
    Ok(rdma)
}

impl Rdma {
    /// The process's rdma-core, loaded on first use; the error says what is missing and how to
    /// get it.
    pub fn get() -> Result<&'static Rdma, String> {
        static RDMA: OnceLock<Result<Rdma, String>> = OnceLock::new();
        RDMA.get_or_init(load).as_ref().map_err(Clone::clone)
    }

    /// Every entry point the backend calls resolved (`ibv_query_qp` may be absent: queue
    /// state is then taken from completions alone).
    fn check(&self) -> Result<(), String> {
        let missing: Vec<&str> = [
            ("ibv_get_device_list", self.ibv.ibv_get_device_list.is_err()),
            (
                "ibv_free_device_list",
                self.ibv.ibv_free_device_list.is_err(),
            ),
            ("ibv_get_device_name", self.ibv.ibv_get_device_name.is_err()),
            ("ibv_open_device", self.ibv.ibv_open_device.is_err()),
            ("ibv_close_device", self.ibv.ibv_close_device.is_err()),
            ("ibv_query_device", self.ibv.ibv_query_device.is_err()),
            ("ibv_query_port", self.ibv.ibv_query_port.is_err()),
            ("ibv_alloc_pd", self.ibv.ibv_alloc_pd.is_err()),
            ("ibv_dealloc_pd", self.ibv.ibv_dealloc_pd.is_err()),
            ("ibv_reg_mr", self.ibv.ibv_reg_mr.is_err()),
            ("ibv_dereg_mr", self.ibv.ibv_dereg_mr.is_err()),
            ("ibv_create_cq", self.ibv.ibv_create_cq.is_err()),
            ("ibv_destroy_cq", self.ibv.ibv_destroy_cq.is_err()),
            ("ibv_create_qp", self.ibv.ibv_create_qp.is_err()),
            ("ibv_modify_qp", self.ibv.ibv_modify_qp.is_err()),
            ("ibv_destroy_qp", self.ibv.ibv_destroy_qp.is_err()),
            ("mlx4dv_init_obj", self.dv.mlx4dv_init_obj.is_err()),
            (
                "mlx4dv_set_context_attr",
                self.dv.mlx4dv_set_context_attr.is_err(),
            ),
        ]
        .into_iter()
        .filter_map(|(n, gone)| gone.then_some(n))
        .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "rdma-core lacks {} (rdma-core 17 or later is needed; Debian bookworm has 44)",
                missing.join(", ")
            ))
        }
    }
}

/// The calling thread's `errno`, for verbs calls that return NULL.
pub fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `strerror` of an errno value.
pub fn strerror(e: c_int) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

/// A C string of rdma-core (device names and paths), lossily.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
pub unsafe fn c_str(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The extended context behind an `ibv_context` (`verbs_get_ctx`), if the provider has one.
///
/// # Safety
/// `ctx` is a live context from `ibv_open_device`.
unsafe fn vctx<'a>(ctx: *mut sys::ibv_context) -> Option<&'a sys::verbs_context> {
    // SAFETY: the caller's live context.
    if unsafe { (*ctx).abi_compat } != usize::MAX as *mut std::ffi::c_void {
        return None;
    }
    let off = std::mem::offset_of!(sys::verbs_context, context);
    // SAFETY: an extended context is the tail of a `verbs_context` (rdma-core's ABI).
    Some(unsafe { &*ctx.cast::<u8>().sub(off).cast::<sys::verbs_context>() })
}

/// One op of the extended context, if the provider's `verbs_context` is recent enough to have
/// it (its `sz` covers the op) and fills it (`verbs_get_ctx_op`).
macro_rules! op {
    ($ctx:expr, $op:ident) => {{
        // SAFETY: the callers pass live contexts.
        match unsafe { vctx($ctx) } {
            Some(v)
                if v.sz
                    >= std::mem::size_of::<sys::verbs_context>()
                        - std::mem::offset_of!(sys::verbs_context, $op) =>
            {
                v.$op
            }
            _ => None,
        }
    }};
}

/// The `errno` the inline functions of `verbs.h` report when the provider lacks an op.
const NO_OP: c_int = libc::EOPNOTSUPP;

/// `ibv_create_wq`.
///
/// # Safety
/// `ctx` live, `attr` valid for the call.
pub unsafe fn create_wq(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_wq_init_attr,
) -> Result<*mut sys::ibv_wq, c_int> {
    let f = op!(ctx, create_wq).ok_or(NO_OP)?;
    // SAFETY: the provider's op with the caller's live arguments.
    let wq = unsafe { f(ctx, attr) };
    if wq.is_null() {
        return Err(errno());
    }
    // What the header's version sets up for completion events on the WQ (unused here, but
    // the provider's destroy expects it initialised).
    // SAFETY: a fresh WQ of ours.
    unsafe {
        (*wq).events_completed = 0;
        libc::pthread_mutex_init(std::ptr::addr_of_mut!((*wq).mutex).cast(), std::ptr::null());
        libc::pthread_cond_init(std::ptr::addr_of_mut!((*wq).cond).cast(), std::ptr::null());
    }
    Ok(wq)
}

/// `ibv_modify_wq`.
///
/// # Safety
/// `wq` live.
pub unsafe fn modify_wq(wq: *mut sys::ibv_wq, attr: *mut sys::ibv_wq_attr) -> Result<(), c_int> {
    // SAFETY: a live WQ knows its context.
    let ctx = unsafe { (*wq).context };
    let f = op!(ctx, modify_wq).ok_or(NO_OP)?;
    // SAFETY: the provider's op.
    match unsafe { f(wq, attr) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// `ibv_destroy_wq`.
///
/// # Safety
/// `wq` live, not used again.
pub unsafe fn destroy_wq(wq: *mut sys::ibv_wq) -> Result<(), c_int> {
    // SAFETY: a live WQ knows its context.
    let ctx = unsafe { (*wq).context };
    let f = op!(ctx, destroy_wq).ok_or(NO_OP)?;
    // SAFETY: the provider's op.
    match unsafe { f(wq) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// `ibv_create_rwq_ind_table`.
///
/// # Safety
/// `ctx` live, `attr` valid for the call.
pub unsafe fn create_rwq_ind_table(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_rwq_ind_table_init_attr,
) -> Result<*mut sys::ibv_rwq_ind_table, c_int> {
    let f = op!(ctx, create_rwq_ind_table).ok_or(NO_OP)?;
    // SAFETY: the provider's op.
    let t = unsafe { f(ctx, attr) };
    if t.is_null() {
        Err(errno())
    } else {
        Ok(t)
    }
}

/// `ibv_destroy_rwq_ind_table`.
///
/// # Safety
/// `t` live, not used again.
pub unsafe fn destroy_rwq_ind_table(t: *mut sys::ibv_rwq_ind_table) -> Result<(), c_int> {
    // SAFETY: a live table knows its context.
    let ctx = unsafe { (*t).context };
    let f = op!(ctx, destroy_rwq_ind_table).ok_or(NO_OP)?;
    // SAFETY: the provider's op.
    match unsafe { f(t) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// `ibv_create_qp_ex` for what the plain call cannot say (an RSS hash QP).
///
/// # Safety
/// `ctx` live, `attr` valid for the call.
pub unsafe fn create_qp_ex(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> Result<*mut sys::ibv_qp, c_int> {
    let f = op!(ctx, create_qp_ex).ok_or(NO_OP)?;
    // SAFETY: the provider's op.
    let qp = unsafe { f(ctx, attr) };
    if qp.is_null() {
        Err(errno())
    } else {
        Ok(qp)
    }
}

/// `ibv_create_flow`.
///
/// # Safety
/// `qp` live, `attr` followed by its specs.
pub unsafe fn create_flow(
    qp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_flow_attr,
) -> Result<*mut sys::ibv_flow, c_int> {
    // SAFETY: a live QP knows its context.
    let ctx = unsafe { (*qp).context };
    let f = op!(ctx, ibv_create_flow).ok_or(NO_OP)?;
    // SAFETY: the provider's op.
    let flow = unsafe { f(qp, attr) };
    if flow.is_null() {
        Err(errno())
    } else {
        Ok(flow)
    }
}

/// `ibv_destroy_flow`.
///
/// # Safety
/// `flow` live, not used again.
pub unsafe fn destroy_flow(flow: *mut sys::ibv_flow) -> Result<(), c_int> {
    // SAFETY: a live flow knows its context.
    let ctx = unsafe { (*flow).context };
    let f = op!(ctx, ibv_destroy_flow).ok_or(NO_OP)?;
    // SAFETY: the provider's op.
    match unsafe { f(flow) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// `ibv_query_port` as the header's inline version does it: the extended op when the provider
/// has one, else the exported call, which fills the same leading fields.
///
/// # Safety
/// `ctx` is a live context.
pub unsafe fn query_port(
    rdma: &Rdma,
    ctx: *mut sys::ibv_context,
    port: u8,
) -> Result<sys::ibv_port_attr, c_int> {
    let mut attr = sys::ibv_port_attr::default();
    let rc = match op!(ctx, query_port) {
        // SAFETY: the provider's op, writing at most the size we pass.
        Some(f) => unsafe {
            f(
                ctx,
                port,
                &mut attr,
                std::mem::size_of::<sys::ibv_port_attr>(),
            )
        },
        // SAFETY: the exported call writes the compat layout, a prefix of ibv_port_attr.
        None => unsafe {
            rdma.ibv
                .ibv_query_port(ctx, port, (&mut attr as *mut sys::ibv_port_attr).cast())
        },
    };
    match rc {
        0 => Ok(attr),
        e => Err(e),
    }
}
