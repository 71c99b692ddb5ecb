//! The mlx4 direct verbs (libmlx4's `MLX4_1.0`): handing the application the rings, doorbell
//! records and doorbell register of its queues, and taking its buffer allocator.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};

use crate::context::ctx_or;
use crate::queues::{cq, qp, wq, QpKind};
use crate::{log, sys};

fn qp_out(p: *mut sys::ibv_qp, out: &mut sys::mlx4dv_qp) -> c_int {
    // SAFETY: the application's QP pointer.
    let Some(q) = (unsafe { qp(p) }) else {
        return libc::EINVAL;
    };
    let QpKind::Send(s) = &q.kind else {
        log(format_args!(
            "mlx4dv_init_obj: QP {:#x} is an RSS QP, it has no rings",
            q.qpn()
        ));
        return libc::EINVAL;
    };
    out.buf.buf = s.buf.ptr.cast();
    out.buf.length = s.buf.len;
    out.rdb = s.rdb;
    out.sdb = s.uar.wrapping_add(mlx4_prm::SEND_DOORBELL_OFFSET).cast();
    out.doorbell_qpn = (q.qpn() << 8).to_be();
    out.sq.wqe_cnt = s.sq.wqe_cnt;
    out.sq.wqe_shift = s.sq.wqe_shift as c_int;
    out.sq.offset = s.sq.offset as c_int;
    out.rq.wqe_cnt = s.rq_dv_cnt;
    out.rq.wqe_shift = s.rq.wqe_shift as c_int;
    out.rq.offset = s.rq.offset as c_int;
    // The command fd is the device memory file: the QP's UAR page maps at this offset (and its
    // BlueFlame page one page later), as from mlx4_ib's command fd.
    let asked = out.comp_mask;
    out.comp_mask = 0;
    if asked & u64::from(sys::MLX4DV_QP_MASK_UAR_MMAP_OFFSET) != 0 {
        out.uar_mmap_offset = s.uar_offset as libc::off_t;
        out.comp_mask |= u64::from(sys::MLX4DV_QP_MASK_UAR_MMAP_OFFSET);
    }
    0
}

fn cq_out(p: *mut sys::ibv_cq, out: &mut sys::mlx4dv_cq) -> c_int {
    // SAFETY: the application's CQ pointer.
    let Some(c) = (unsafe { cq(p) }) else {
        return libc::EINVAL;
    };
    out.buf.buf = c.buf.ptr.cast();
    out.buf.length = c.buf.len;
    out.cqe_cnt = c.cnt;
    out.cqn = c.cqn;
    out.set_ci_db = c.db;
    out.arm_db = c.db.wrapping_add(1);
    out.arm_sn = c.arm_sn.load(std::sync::atomic::Ordering::Relaxed) as c_int;
    out.cqe_size = mlx4_prm::CQE_SIZE as c_int;
    let mut mask = 0;
    if out.comp_mask & u64::from(sys::MLX4DV_CQ_MASK_UAR) != 0 {
        // SAFETY: the CQ's context outlives it.
        let ctx = ctx_or!(c_ctx(c), libc::EINVAL);
        out.cq_uar = ctx.cq_uar();
        mask |= u64::from(sys::MLX4DV_CQ_MASK_UAR);
    }
    out.comp_mask = mask;
    0
}

fn c_ctx(c: &crate::queues::Cq) -> *mut sys::ibv_context {
    // SAFETY: reading the context pointer of our own CQ's rdma-core struct.
    unsafe { (*(c as *const crate::queues::Cq).cast::<sys::ibv_cq>()).context }
}

fn rwq_out(p: *mut sys::ibv_wq, out: &mut sys::mlx4dv_rwq) -> c_int {
    // SAFETY: the application's WQ pointer.
    let Some(w) = (unsafe { wq(p) }) else {
        return libc::EINVAL;
    };
    out.comp_mask = 0;
    out.buf.buf = w.buf.ptr.cast();
    out.buf.length = w.buf.len;
    out.rdb = w.rdb;
    out.rq.wqe_cnt = w.dv_wqe_cnt;
    out.rq.wqe_shift = w.rq.wqe_shift as c_int;
    out.rq.offset = w.rq.offset as c_int;
    0
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__mlx4dv_init_obj(
    obj: *mut sys::mlx4dv_obj,
    obj_type: u64,
) -> c_int {
    // SAFETY: the caller's object descriptor, if any.
    let Some(o) = (unsafe { obj.as_mut() }) else {
        return libc::EINVAL;
    };
    let want = |t: sys::mlx4dv_obj_type| obj_type & u64::from(t) != 0;
    let mut ret = 0;
    if want(sys::MLX4DV_OBJ_QP) {
        // SAFETY: the caller's output struct.
        ret = match unsafe { o.qp.out.as_mut() } {
            Some(out) => qp_out(o.qp.in_, out),
            None => libc::EINVAL,
        };
    }
    if ret == 0 && want(sys::MLX4DV_OBJ_CQ) {
        // SAFETY: the caller's output struct.
        ret = match unsafe { o.cq.out.as_mut() } {
            Some(out) => cq_out(o.cq.in_, out),
            None => libc::EINVAL,
        };
    }
    if ret == 0 && want(sys::MLX4DV_OBJ_SRQ) {
        log(format_args!("mlx4dv_init_obj: SRQs are not modelled"));
        ret = libc::EOPNOTSUPP;
    }
    if ret == 0 && want(sys::MLX4DV_OBJ_RWQ) {
        // SAFETY: the caller's output struct.
        ret = match unsafe { o.rwq.out.as_mut() } {
            Some(out) => rwq_out(o.rwq.in_, out),
            None => libc::EINVAL,
        };
    }
    ret
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__mlx4dv_set_context_attr(
    ctx: *mut sys::ibv_context,
    attr_type: sys::mlx4dv_set_ctx_attr_type,
    attr: *mut c_void,
) -> c_int {
    let c = ctx_or!(ctx, libc::EINVAL);
    if attr.is_null() {
        return libc::EINVAL;
    }
    match attr_type {
        sys::MLX4DV_SET_CTX_ATTR_LOG_WQS_RANGE_SZ => {
            // SAFETY: this attribute is one byte.
            let v = unsafe { *attr.cast::<u8>() };
            c.log_wqs_range
                .store(v, std::sync::atomic::Ordering::Relaxed);
            0
        }
        sys::MLX4DV_SET_CTX_ATTR_BUF_ALLOCATORS => {
            // SAFETY: this attribute is an allocator triple.
            let a = unsafe { *attr.cast::<sys::mlx4dv_ctx_allocators>() };
            c.set_allocators(a)
        }
        _ => libc::EOPNOTSUPP,
    }
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__mlx4dv_query_device(
    ctx: *mut sys::ibv_context,
    out: *mut sys::mlx4dv_context,
) -> c_int {
    let _c = ctx_or!(ctx, libc::EINVAL);
    // SAFETY: the caller's output struct, if any.
    let Some(o) = (unsafe { out.as_mut() }) else {
        return libc::EINVAL;
    };
    o.version = 0;
    o.comp_mask = 0;
    // Inline receive (scatter into the WQE) is not modelled.
    o.max_inl_recv_sz = 0;
    0
}
