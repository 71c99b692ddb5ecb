//! Receive work queues on RQs of the model, numbered as mlx4_ib numbers them, and the RWQ indirection tables over them.
#![allow(unsafe_code)]

use super::*;

// ------------------------------------------------------------------------------ WQ

#[repr(C)]
pub(crate) struct Wq {
    ibv: sys::ibv_wq,
    magic: u64,
    ctx: *const Context,
    pub buf: Buf,
    pub rq: Ring,
    /// libmlx4 reports the WR count asked for (not rounded) as `rq.wqe_cnt`.
    pub dv_wqe_cnt: u32,
    pub rdb: *mut u32,
    users: AtomicU32,
}

/// # Safety
/// `p` is null or an application's WQ pointer.
pub(crate) unsafe fn wq<'a>(p: *mut sys::ibv_wq) -> Option<&'a Wq> {
    // SAFETY: forwarded contract.
    unsafe { ours(p, |t: &Wq| t.magic) }
}

unsafe extern "C" fn no_post_wq_recv(
    _: *mut sys::ibv_wq,
    _: *mut sys::ibv_recv_wr,
    _: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    libc::EOPNOTSUPP
}

fn create_wq_in(c: &Context, a: &mut sys::ibv_wq_init_attr) -> Result<*mut sys::ibv_wq, c_int> {
    if a.wq_type != sys::IBV_WQT_RQ {
        return Err(libc::EOPNOTSUPP);
    }
    let attr = device_attr(c);
    if a.max_wr > attr.max_qp_wr as u32 || a.max_sge > MAX_SGE {
        return Err(libc::EINVAL);
    }
    if a.comp_mask & !sys::IBV_WQ_INIT_ATTR_FLAGS != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let flags = if a.comp_mask & sys::IBV_WQ_INIT_ATTR_FLAGS != 0 {
        a.create_flags
    } else {
        0
    };
    if flags & !sys::IBV_WQ_FLAGS_SCATTER_FCS != 0 {
        log(format_args!(
            "ibv_create_wq: create flags {:#x} not supported (SCATTER_FCS is)",
            flags
        ));
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: the application's CQ pointer.
    let Some(rcq) = (unsafe { cq(a.cq) }) else {
        return Err(libc::EINVAL);
    };
    a.max_sge = a.max_sge.max(1);
    a.max_wr = a.max_wr.max(1);
    let l = layout::wq(a.max_wr, a.max_sge);
    let buf = c.buf(l.buf_size as usize)?;
    init_sq_ownership(buf.ptr, &l.sq);
    let rdb = c.db(DbKind::Rq)?;
    let qpn = match next_wqn(c, take_wqs_range(c)) {
        Ok(q) => q,
        Err(e) => {
            c.free_db(DbKind::Rq, rdb);
            return Err(e);
        }
    };
    // SAFETY: the ring and the record stay ours until destroy_wq, which destroys the model's RQ
    // first.
    let rqn = match unsafe {
        c.adapter.hca.create_rq_with(
            &RqAttr {
                buf: buf.ptr.wrapping_add(l.rq.offset as usize),
                wqe_cnt: l.rq.wqe_cnt,
                sges: l.sges,
                cqn: rcq.cqn,
                db_rec: rdb,
            },
            &RqOptions {
                qpn: Some(qpn),
                scatter_fcs: flags & sys::IBV_WQ_FLAGS_SCATTER_FCS != 0,
            },
        )
    } {
        Ok(n) => n,
        Err(e) => {
            wqn_done(c, qpn);
            c.free_db(DbKind::Rq, rdb);
            return Err(hca_errno("ibv_create_wq", e));
        }
    };
    let w = Box::new(Wq {
        ibv: sys::ibv_wq {
            context: c.ibv(),
            wq_context: a.wq_context,
            pd: a.pd,
            cq: a.cq,
            wq_num: rqn,
            state: sys::IBV_WQS_RESET,
            wq_type: a.wq_type,
            post_recv: Some(no_post_wq_recv),
            ..Default::default()
        },
        magic: MAGIC,
        ctx: c,
        buf,
        rq: l.rq,
        dv_wqe_cnt: a.max_wr,
        rdb,
        users: AtomicU32::new(0),
    });
    Ok(Box::into_raw(w).cast())
}

/// The number of the next WQ, as mlx4_ib hands them out: from the context's latest range while
/// it has room and none of its WQs was destroyed, else from a new range of `1 << log_range`
/// numbers aligned to its size (a range of more than one while one is open is refused).
fn next_wqn(c: &Context, log_range: u8) -> Result<u32, c_int> {
    let mut ranges = c.wq_ranges.lock();
    if let Some(x) = ranges.last_mut().filter(|x| x.used < x.size && !x.dirty) {
        if log_range != 0 {
            log(format_args!(
                "ibv_create_wq: a WQ range of {} asked for while the last one is open",
                1u32 << log_range
            ));
            return Err(libc::EINVAL);
        }
        let q = x.base + x.used;
        x.used += 1;
        x.live += 1;
        return Ok(q);
    }
    let size = 1u32 << log_range.min(16);
    let base = c
        .adapter
        .hca
        .reserve_qpns(size)
        .map_err(|e| hca_errno("ibv_create_wq: WQN range", e))?;
    ranges.push(WqRange {
        base,
        size,
        used: 1,
        live: 1,
        dirty: false,
    });
    Ok(base)
}

/// A WQ numbered by [`next_wqn`] is gone: its range is dirty, and released once empty.
fn wqn_done(c: &Context, qpn: u32) {
    let mut ranges = c.wq_ranges.lock();
    if let Some(i) = ranges
        .iter()
        .position(|x| (x.base..x.base + x.size).contains(&qpn))
    {
        let x = &mut ranges[i];
        x.live -= 1;
        x.dirty = true;
        if x.live == 0 {
            if let Err(e) = c.adapter.hca.release_qpns(x.base) {
                hca_errno("releasing a WQN range", e);
            }
            ranges.remove(i);
        }
    }
}

/// `verbs_context::create_wq`.
pub(crate) unsafe extern "C" fn create_wq(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_wq_init_attr,
) -> *mut sys::ibv_wq {
    let c = ctx_or!(ctx, ptr::null_mut());
    if attr.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: the caller's attribute struct, which libmlx4 updates.
    match create_wq_in(c, unsafe { &mut *attr }) {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            ptr::null_mut()
        }
    }
}

/// `verbs_context::modify_wq`.
pub(crate) unsafe extern "C" fn modify_wq(
    p: *mut sys::ibv_wq,
    attr: *mut sys::ibv_wq_attr,
) -> c_int {
    // SAFETY: the application's WQ pointer.
    let (Some(w), false) = ((unsafe { wq(p) }), attr.is_null()) else {
        return libc::EINVAL;
    };
    // SAFETY: the caller's attribute struct.
    let a = unsafe { &*attr };
    if a.attr_mask
        & !(sys::IBV_WQ_ATTR_STATE | sys::IBV_WQ_ATTR_CURR_STATE | sys::IBV_WQ_ATTR_FLAGS)
        != 0
    {
        return libc::EOPNOTSUPP;
    }
    if a.attr_mask & sys::IBV_WQ_ATTR_FLAGS != 0
        && a.flags_mask & sys::IBV_WQ_FLAGS_SCATTER_FCS != 0
    {
        // SAFETY: the context outlives its objects.
        let c = unsafe { &*w.ctx };
        let on = a.flags & sys::IBV_WQ_FLAGS_SCATTER_FCS != 0;
        if let Err(e) = c.adapter.hca.set_rq_scatter_fcs(w.ibv.wq_num, on) {
            return hca_errno("ibv_modify_wq", e);
        }
    }
    let cur = w.ibv.state;
    if a.attr_mask & sys::IBV_WQ_ATTR_CURR_STATE != 0 && a.curr_wq_state != cur {
        return libc::EINVAL;
    }
    if a.attr_mask & sys::IBV_WQ_ATTR_STATE == 0 {
        return 0;
    }
    let model = match (cur, a.wq_state) {
        (sys::IBV_WQS_RESET | sys::IBV_WQS_RDY, sys::IBV_WQS_RDY) => QueueState::Ready,
        (_, sys::IBV_WQS_RESET) => QueueState::Reset,
        (_, sys::IBV_WQS_ERR) => QueueState::Error,
        _ => return libc::EINVAL,
    };
    // SAFETY: the context outlives its objects.
    let c = unsafe { &*w.ctx };
    if let Err(e) = c.adapter.hca.set_rq_state(w.ibv.wq_num, model) {
        return hca_errno("ibv_modify_wq", e);
    }
    // SAFETY: the state word of our own WQ.
    unsafe { ptr::addr_of!(w.ibv.state).cast_mut().write(a.wq_state) };
    0
}

/// `verbs_context::destroy_wq`.
pub(crate) unsafe extern "C" fn destroy_wq(p: *mut sys::ibv_wq) -> c_int {
    // SAFETY: the application's WQ pointer.
    let Some(w) = (unsafe { wq(p) }) else {
        return libc::EINVAL;
    };
    if w.users.load(Ordering::Relaxed) != 0 {
        return libc::EBUSY;
    }
    // SAFETY: the context outlives its objects.
    let c = unsafe { &*w.ctx };
    if let Err(e) = c.adapter.hca.destroy_rq(w.ibv.wq_num) {
        return hca_errno("ibv_destroy_wq", e);
    }
    wqn_done(c, w.ibv.wq_num);
    c.free_db(DbKind::Rq, w.rdb);
    // SAFETY: allocated with Box::into_raw, destroyed once; the model no longer uses the ring.
    drop(unsafe { Box::from_raw((w as *const Wq).cast_mut()) });
    0
}

// ------------------------------------------------------------------------------ RWQ indirection table

#[repr(C)]
pub(crate) struct IndTable {
    ibv: sys::ibv_rwq_ind_table,
    magic: u64,
    wqs: Vec<*const Wq>,
    pub rqs: Vec<u32>,
    pub(super) users: AtomicU32,
}

/// # Safety
/// `p` is null or an application's indirection table pointer.
pub(super) unsafe fn ind_table<'a>(p: *mut sys::ibv_rwq_ind_table) -> Option<&'a IndTable> {
    // SAFETY: forwarded contract.
    unsafe { ours(p, |t: &IndTable| t.magic) }
}

/// `verbs_context::create_rwq_ind_table`.
pub(crate) unsafe extern "C" fn create_rwq_ind_table(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_rwq_ind_table_init_attr,
) -> *mut sys::ibv_rwq_ind_table {
    let c = ctx_or!(ctx, ptr::null_mut());
    // SAFETY: the caller's attribute struct, if any.
    let Some(a) = (unsafe { attr.as_ref() }) else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    if a.comp_mask != 0 || (1u64 << a.log_ind_tbl_size.min(63)) > u64::from(MAX_RWQ_IND_TABLE) {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    let n = 1usize << a.log_ind_tbl_size;
    let mut wqs = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: the caller's table of `1 << log_ind_tbl_size` WQ pointers.
        let p = unsafe { *a.ind_tbl.add(i) };
        // SAFETY: each is an application's WQ pointer.
        match unsafe { wq(p) } {
            Some(w) => wqs.push(w as *const Wq),
            None => {
                set_errno(libc::EINVAL);
                return ptr::null_mut();
            }
        }
    }
    // SAFETY: just checked to be our live WQs.
    let rqs: Vec<u32> = wqs.iter().map(|&w| unsafe { (*w).ibv.wq_num }).collect();
    // mlx4_ib's rule (an RSS context is a base QPN and a power-of-two range): consecutive WQNs
    // from a base aligned to the table size, which WQs created after LOG_WQS_RANGE_SZ get.
    if rqs.windows(2).any(|p| p[1] != p[0].wrapping_add(1)) || rqs[0] % n as u32 != 0 {
        log(format_args!(
            "ibv_create_rwq_ind_table: WQNs {rqs:#x?} are not consecutive from a base aligned \
             to the table size (mlx4 RSS takes a base QPN and a range; set \
             MLX4DV_SET_CTX_ATTR_LOG_WQS_RANGE_SZ before creating the WQs)"
        ));
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    for &w in &wqs {
        // SAFETY: as above.
        unsafe { (*w).users.fetch_add(1, Ordering::Relaxed) };
    }
    Box::into_raw(Box::new(IndTable {
        ibv: sys::ibv_rwq_ind_table {
            context: ctx,
            ind_tbl_handle: 0,
            ind_tbl_num: c.adapter.next_id() as c_int,
            comp_mask: 0,
        },
        magic: MAGIC,
        wqs,
        rqs,
        users: AtomicU32::new(0),
    }))
    .cast()
}

/// `verbs_context::destroy_rwq_ind_table`.
pub(crate) unsafe extern "C" fn destroy_rwq_ind_table(p: *mut sys::ibv_rwq_ind_table) -> c_int {
    // SAFETY: the application's table pointer.
    let Some(t) = (unsafe { ind_table(p) }) else {
        return libc::EINVAL;
    };
    if t.users.load(Ordering::Relaxed) != 0 {
        return libc::EBUSY;
    }
    for &w in &t.wqs {
        // SAFETY: a WQ in a live table cannot be destroyed, so it is still there.
        unsafe { (*w).users.fetch_sub(1, Ordering::Relaxed) };
    }
    // SAFETY: allocated with Box::into_raw, destroyed once.
    drop(unsafe { Box::from_raw((t as *const IndTable).cast_mut()) });
    0
}
