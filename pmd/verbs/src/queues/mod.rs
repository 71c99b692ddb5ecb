//! Protection domains, memory regions, CQs, QPs (RAW_PACKET send QPs and RSS hash QPs), WQs,
//! indirection tables and flows, each backed by the model: a CQ, SQ or RQ of the `Hca` on memory
//! laid out as libmlx4 lays it out, or steering state the model is told about.
//!
//! Every object starts with its rdma-core struct (the pointer the application holds), followed
//! by [`MAGIC`] so a foreign pointer is refused instead of trusted.
//!
//! One file per kind of object: PDs and MRs here, then `cq`, `qp`, `wq` (with the RWQ
//! indirection tables) and `flow`.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_uint, c_void};
use std::ptr;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use mlx4_hca::{CqAttr, HcaError, QueueState, RqAttr, RqOptions, SqAttr, SqOptions};

use crate::context::{context, ctx_or, take_wqs_range, Buf, Context, DbKind, WqRange, MAGIC};
use crate::device::Adapter;
use crate::layout::{self, Ring};
use crate::queries::{device_attr, MAX_CQE, MAX_RWQ_IND_TABLE, MAX_SGE};
use crate::steer::{self, Flow, HashQp, Target};
use crate::{log, set_errno, sys};

/// An object of ours behind an rdma-core pointer, or `None` for null and foreign pointers.
///
/// # Safety
/// `p` is null or points to the rdma-core struct at the start of a live `T`-shaped object of
/// some provider (every object is at least the rdma-core struct plus 8 bytes in libmlx4 too).
unsafe fn ours<'a, T, R>(p: *mut R, magic: impl Fn(&T) -> u64) -> Option<&'a T> {
    if p.is_null() {
        return None;
    }
    // SAFETY: see above; the magic is read before anything else is trusted.
    let t = unsafe { &*p.cast::<T>() };
    (magic(t) == MAGIC).then_some(t)
}

fn hca_errno(what: &str, e: HcaError) -> c_int {
    log(format_args!("{what}: the model refused: {e}"));
    e.errno()
}

mod cq;
mod flow;
mod qp;
mod wq;

pub(crate) use cq::*;
pub(crate) use flow::*;
pub(crate) use qp::*;
pub(crate) use wq::*;

// ------------------------------------------------------------------------------ PD

#[repr(C)]
pub(crate) struct Pd {
    ibv: sys::ibv_pd,
    magic: u64,
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_alloc_pd(
    ctx: *mut sys::ibv_context,
) -> *mut sys::ibv_pd {
    let _c = ctx_or!(ctx, ptr::null_mut());
    Box::into_raw(Box::new(Pd {
        ibv: sys::ibv_pd {
            context: ctx,
            handle: 0,
        },
        magic: MAGIC,
    }))
    .cast()
}

/// # Safety
/// `p` is null or an application's PD pointer.
unsafe fn pd<'a>(p: *mut sys::ibv_pd) -> Option<&'a Pd> {
    // SAFETY: forwarded contract.
    unsafe { ours(p, |t: &Pd| t.magic) }
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_dealloc_pd(p: *mut sys::ibv_pd) -> c_int {
    // SAFETY: the application's PD pointer.
    let Some(pd) = (unsafe { pd(p) }) else {
        return libc::EINVAL;
    };
    // SAFETY: allocated with Box::into_raw, deallocated once.
    drop(unsafe { Box::from_raw((pd as *const Pd).cast_mut()) });
    0
}

// ------------------------------------------------------------------------------ MR

#[repr(C)]
pub(crate) struct Mr {
    ibv: sys::ibv_mr,
    magic: u64,
    adapter: Arc<Adapter>,
}

unsafe fn reg_mr(pdp: *mut sys::ibv_pd, addr: *mut c_void, len: usize) -> *mut sys::ibv_mr {
    // SAFETY: the application's PD pointer.
    let Some(pd) = (unsafe { pd(pdp) }) else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    let c = ctx_or!(pd.ibv.context, ptr::null_mut());
    // SAFETY: registering memory is the application's promise that it stays valid until
    // ibv_dereg_mr, exactly the model's contract.
    let lkey = match unsafe { c.adapter.hca.reg_mr(addr.cast(), len) } {
        Ok(k) => k,
        Err(e) => {
            set_errno(hca_errno("ibv_reg_mr", e));
            return ptr::null_mut();
        }
    };
    Box::into_raw(Box::new(Mr {
        ibv: sys::ibv_mr {
            context: pd.ibv.context,
            pd: pdp,
            addr,
            length: len,
            handle: 0,
            lkey,
            rkey: lkey,
        },
        magic: MAGIC,
        adapter: c.adapter.clone(),
    }))
    .cast()
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_reg_mr(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    len: usize,
    _access: c_int,
) -> *mut sys::ibv_mr {
    // SAFETY: forwarded.
    unsafe { reg_mr(pd, addr, len) }
}

/// Memory is named by process virtual address (`doc/design.md`: never by IOVA), so an `iova` other
/// than the address cannot be honoured.
#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_reg_mr_iova2(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    _access: c_uint,
) -> *mut sys::ibv_mr {
    if iova != addr as u64 {
        log(format_args!(
            "ibv_reg_mr_iova2: iova {iova:#x} differs from the address {addr:p}; the model \
             addresses memory by virtual address only"
        ));
        set_errno(libc::EOPNOTSUPP);
        return ptr::null_mut();
    }
    // SAFETY: forwarded.
    unsafe { reg_mr(pd, addr, len) }
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_dereg_mr(p: *mut sys::ibv_mr) -> c_int {
    // SAFETY: the application's MR pointer.
    let Some(mr) = (unsafe { ours(p, |t: &Mr| t.magic) }) else {
        return libc::EINVAL;
    };
    if let Err(e) = mr.adapter.hca.dereg_mr(mr.ibv.lkey) {
        return hca_errno("ibv_dereg_mr", e);
    }
    // SAFETY: allocated with Box::into_raw, deregistered once.
    drop(unsafe { Box::from_raw((mr as *const Mr).cast_mut()) });
    0
}
