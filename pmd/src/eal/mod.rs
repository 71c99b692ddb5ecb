//! Safe entries to the EAL services the ethdev layer uses beside its callbacks: the process
//! type, DPDK's memory map and mempool chunks, `rte_flow` errors, the interrupt handle
//! ([`intr`]) and multi-process IPC ([`mp`]).
//!
//! Each wrapper checks one C function's contract once, here, so that its callers are safe
//! code: a safe function below is sound for every input it can be given (the pointers it
//! takes are only compared, or typed references); where a contract rests on what the caller
//! knows, the function is `unsafe fn` and its `# Safety` section says what that is.

use std::ffi::{c_int, c_uint, c_void, CStr};

use dpdk_sys as sys;

use crate::mbuf::Pool;
use crate::mem::DmaRange;

pub(crate) mod intr;
pub(crate) mod mp;

/// Whether this process is a DPDK secondary process.
pub(crate) fn secondary() -> bool {
    // SAFETY: reads EAL's configuration record, which is a static (before `rte_eal_init` it
    // says primary); no argument.
    unsafe { sys::rte_eal_process_type() == sys::rte_proc_type_t_RTE_PROC_SECONDARY }
}

/// Whether `p` lies in DPDK memory (mapped at the same address in every process).
pub(crate) fn in_dpdk_memory(p: *const c_void) -> bool {
    // SAFETY: a lookup by address in EAL's memseg lists (a static record before
    // `rte_eal_init`, with none); `p` is only compared with their bounds, never followed.
    !unsafe { sys::rte_mem_virt2memseg_list(p) }.is_null()
}

/// Every memseg list's virtual range: where mbufs can live. A memseg list's address range is
/// reserved, and its pages stay mapped, until EAL cleans up, after every port is closed.
pub(crate) fn memseg_ranges() -> Vec<DmaRange> {
    unsafe extern "C" fn each(msl: *const sys::rte_memseg_list, arg: *mut c_void) -> c_int {
        // SAFETY: EAL passes a live list and the `arg` given below, our Vec, which nothing
        // else references during the walk.
        unsafe {
            let v = &mut *arg.cast::<Vec<DmaRange>>();
            let base = (*msl).__bindgen_anon_1.base_va as usize;
            if base != 0 && (*msl).len > 0 {
                v.push(DmaRange::new(base, base + (*msl).len));
            }
        }
        0
    }
    let mut v: Vec<DmaRange> = Vec::new();
    // SAFETY: the callback only appends to `v`, which outlives the walk.
    unsafe { sys::rte_memseg_list_walk(Some(each), (&mut v as *mut Vec<DmaRange>).cast()) };
    v
}

/// The memory chunks of `pool`, or of every mempool of the process when `None`; empty ones
/// left out.
///
/// # Safety
/// Each pool walked (`pool`, or every mempool that exists now) stays mapped until every
/// device its ranges are registered with is closed ([`DmaRange::new`]'s contract): DPDK's
/// rule that an application frees a pool only once no port uses its mbufs, for pools whose
/// mbufs reach a port.
pub(crate) unsafe fn pool_ranges(pool: Option<Pool>) -> Vec<DmaRange> {
    unsafe extern "C" fn chunk(
        _mp: *mut sys::rte_mempool,
        arg: *mut c_void,
        hdr: *mut sys::rte_mempool_memhdr,
        _idx: c_uint,
    ) {
        // SAFETY: `arg` is our Vec (below), which nothing else references during the walk;
        // `hdr` a live chunk header of the pool being walked, whose memory stays mapped as
        // long as the caller promised.
        unsafe {
            let v = &mut *arg.cast::<Vec<DmaRange>>();
            let start = (*hdr).addr as usize;
            v.push(DmaRange::new(start, start + (*hdr).len));
        }
    }
    unsafe extern "C" fn pool_chunks(mp: *mut sys::rte_mempool, arg: *mut c_void) {
        // SAFETY: a live pool of the walk; `arg` is our Vec, handed on.
        unsafe { sys::rte_mempool_mem_iter(mp, Some(chunk), arg) };
    }
    let mut v: Vec<DmaRange> = Vec::new();
    let arg = (&mut v as *mut Vec<DmaRange>).cast();
    // SAFETY: `pool` names a live mempool (`Pool`'s contract); the callbacks only append to
    // `v`, which outlives the walks.
    unsafe {
        match pool {
            Some(mp) => {
                sys::rte_mempool_mem_iter(mp.as_ptr(), Some(chunk), arg);
            }
            None => sys::rte_mempool_walk(Some(pool_chunks), arg),
        }
    }
    v.retain(|r| r.end() > r.start());
    v
}
/// Why an `rte_flow` call failed, as `rte_flow_error_set` records it: `error` (if the
/// application passed one) gets the type, cause and message, `rte_errno` the errno; the answer
/// is `-errno`. `cause` is only stored for the application, never followed.
pub(crate) fn flow_error_set(
    error: Option<&mut sys::rte_flow_error>,
    errno: c_int,
    etype: sys::rte_flow_error_type,
    cause: *const c_void,
    msg: &'static CStr,
) -> c_int {
    let error = error.map_or(std::ptr::null_mut(), std::ptr::from_mut);
    // SAFETY: `error` is NULL or a writable record (a reference); the function stores `cause`
    // and `msg` in it without reading them, and `msg` is static, as the application may read it
    // at any time later.
    unsafe { sys::rte_flow_error_set(error, errno, etype, cause, msg.as_ptr()) }
}
