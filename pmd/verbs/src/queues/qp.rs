//! QPs: RAW_PACKET send QPs on an SQ of the model, and RSS hash QPs over an indirection table.
#![allow(unsafe_code)]

use super::*;

// ------------------------------------------------------------------------------ QP

/// A RAW_PACKET QP with a send queue in the model.
pub(crate) struct SendQp {
    pub buf: Buf,
    pub sq: Ring,
    pub rq: Ring,
    /// What libmlx4 reports as `rq.wqe_cnt` after creation (the receive WR count it was forced
    /// to, 1).
    pub rq_dv_cnt: u32,
    pub rdb: *mut u32,
    pub uar: *mut u8,
    /// Where the UAR page is in the device memory the command fd maps.
    pub uar_offset: usize,
}

pub(crate) enum QpKind {
    Send(SendQp),
    /// An RSS hash QP: steering state only, its id in the adapter's steering.
    Hash {
        id: u32,
        table: *const IndTable,
    },
}

#[repr(C)]
pub(crate) struct Qp {
    ibv: sys::ibv_qp,
    magic: u64,
    pub(super) ctx: *const Context,
    pub kind: QpKind,
    pub(super) flows: AtomicU32,
}

/// Hash QPs get numbers of their own, above the model's QPNs (the model does not know them).
const HASH_QPN_BASE: u32 = 0x10_0000;

/// # Safety
/// `p` is null or an application's QP pointer.
pub(crate) unsafe fn qp<'a>(p: *mut sys::ibv_qp) -> Option<&'a Qp> {
    // SAFETY: forwarded contract.
    unsafe { ours(p, |t: &Qp| t.magic) }
}

impl Qp {
    pub(crate) fn qpn(&self) -> u32 {
        self.ibv.qp_num
    }
}

/// What both QP creation calls need.
struct QpRequest {
    pd: *mut sys::ibv_pd,
    send_cq: *mut sys::ibv_cq,
    recv_cq: *mut sys::ibv_cq,
    srq: *mut sys::ibv_srq,
    qp_type: sys::ibv_qp_type,
    qp_context: *mut c_void,
    max_tso_header: Option<u32>,
}

fn create_send_qp(
    c: &Context,
    r: &QpRequest,
    cap: &mut sys::ibv_qp_cap,
) -> Result<*mut sys::ibv_qp, c_int> {
    if r.qp_type != sys::IBV_QPT_RAW_PACKET {
        log(format_args!(
            "ibv_create_qp: QP type {} is not modelled (only RAW_PACKET)",
            r.qp_type
        ));
        return Err(libc::EOPNOTSUPP);
    }
    if !r.srq.is_null() || cap.max_recv_wr > 0 {
        log(format_args!(
            "ibv_create_qp: receive queues inside a QP are not modelled; receive through WQs \
             (ibv_create_wq) and an RSS QP, as DPDK's mlx4 does"
        ));
        return Err(libc::EOPNOTSUPP);
    }
    let attr = device_attr(c);
    if cap.max_send_wr > attr.max_qp_wr as u32
        || cap.max_send_sge > MAX_SGE
        || cap.max_recv_sge > MAX_SGE
        || cap.max_inline_data > 1024
    {
        return Err(libc::EINVAL);
    }
    // SAFETY: the application's CQ pointers.
    let Some(scq) = (unsafe { cq(r.send_cq) }) else {
        return Err(libc::EINVAL);
    };
    let l = layout::send_qp(
        cap.max_send_wr,
        cap.max_send_sge,
        cap.max_inline_data,
        r.max_tso_header,
    );
    let txbbs = l.sq.wqe_cnt << (l.sq.wqe_shift - mlx4_prm::TXBB_SHIFT);
    let buf = c.buf(l.buf_size as usize)?;
    let rdb = c.db(DbKind::Rq)?;
    let opts = SqOptions {
        stride_shift: l.sq.wqe_shift,
        ..SqOptions::default()
    };
    // SAFETY: the ring stays ours until destroy_qp, which destroys the model's SQ first.
    let info = match unsafe {
        c.adapter.hca.create_sq_with(
            &SqAttr {
                buf: buf.ptr,
                txbb_cnt: txbbs,
                cqn: scq.cqn,
            },
            &opts,
        )
    } {
        Ok(i) => i,
        Err(e) => {
            c.free_db(DbKind::Rq, rdb);
            return Err(hca_errno("ibv_create_qp", e));
        }
    };
    cap.max_send_wr = l.max_send_wr;
    cap.max_send_sge = l.max_send_sge;
    cap.max_inline_data = l.max_inline;
    cap.max_recv_wr = 1;
    cap.max_recv_sge = cap.max_recv_sge.max(1);
    let qp = Box::new(Qp {
        ibv: sys::ibv_qp {
            context: c.ibv(),
            qp_context: r.qp_context,
            pd: r.pd,
            send_cq: r.send_cq,
            recv_cq: r.recv_cq,
            qp_num: info.qpn,
            state: sys::IBV_QPS_RESET,
            qp_type: r.qp_type,
            ..Default::default()
        },
        magic: MAGIC,
        ctx: c,
        kind: QpKind::Send(SendQp {
            buf,
            sq: l.sq,
            rq: l.rq,
            rq_dv_cnt: 1,
            rdb,
            uar: info.uar,
            uar_offset: c.adapter.hca.bar().offset_of(info.uar).unwrap_or(0),
        }),
        flows: AtomicU32::new(0),
    });
    Ok(Box::into_raw(qp).cast())
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_create_qp(
    pdp: *mut sys::ibv_pd,
    attr: *mut sys::ibv_qp_init_attr,
) -> *mut sys::ibv_qp {
    // SAFETY: the application's PD pointer.
    let (Some(pd), false) = ((unsafe { pd(pdp) }), attr.is_null()) else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    let c = ctx_or!(pd.ibv.context, ptr::null_mut());
    // SAFETY: the caller's attribute struct, which rdma-core updates with the actual caps.
    let a = unsafe { &mut *attr };
    let r = QpRequest {
        pd: pdp,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        qp_type: a.qp_type,
        qp_context: a.qp_context,
        max_tso_header: None,
    };
    match create_send_qp(c, &r, &mut a.cap) {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            ptr::null_mut()
        }
    }
}

fn create_hash_qp(c: &Context, a: &sys::ibv_qp_init_attr_ex) -> Result<*mut sys::ibv_qp, c_int> {
    if a.qp_type != sys::IBV_QPT_RAW_PACKET {
        return Err(libc::EINVAL);
    }
    // SAFETY: the application's indirection table pointer.
    let Some(table) = (unsafe { ind_table(a.rwq_ind_tbl) }) else {
        return Err(libc::EINVAL);
    };
    let h = &a.rx_hash_conf;
    if u32::from(h.rx_hash_function) != sys::IBV_RX_HASH_FUNC_TOEPLITZ {
        log(format_args!(
            "ibv_create_qp_ex: RX hash function {} is not supported (Toeplitz only)",
            h.rx_hash_function
        ));
        return Err(libc::EOPNOTSUPP);
    }
    if usize::from(h.rx_hash_key_len) != mlx4_hca::RSS_KEY_LEN || h.rx_hash_key.is_null() {
        return Err(libc::EOPNOTSUPP);
    }
    let fields = steer::rss_fields(h.rx_hash_fields_mask).map_err(|e| {
        log(format_args!("ibv_create_qp_ex: {}", e.0));
        libc::EOPNOTSUPP
    })?;
    let mut key = [0u8; mlx4_hca::RSS_KEY_LEN];
    // SAFETY: the caller's key of `rx_hash_key_len` bytes.
    key.copy_from_slice(unsafe {
        std::slice::from_raw_parts(h.rx_hash_key, mlx4_hca::RSS_KEY_LEN)
    });
    let id = c.adapter.next_id() as u32;
    c.adapter.steer(|s| {
        s.hash_qps.push((
            id,
            HashQp {
                key,
                fields,
                rqs: table.rqs.clone(),
                ready: false,
            },
        ))
    });
    table.users.fetch_add(1, Ordering::Relaxed);
    let qp = Box::new(Qp {
        ibv: sys::ibv_qp {
            context: c.ibv(),
            qp_context: a.qp_context,
            pd: a.pd,
            qp_num: HASH_QPN_BASE + id,
            state: sys::IBV_QPS_RESET,
            qp_type: a.qp_type,
            ..Default::default()
        },
        magic: MAGIC,
        ctx: c,
        kind: QpKind::Hash { id, table },
        flows: AtomicU32::new(0),
    });
    Ok(Box::into_raw(qp).cast())
}

/// `verbs_context::create_qp_ex`.
pub(crate) unsafe extern "C" fn create_qp_ex(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> *mut sys::ibv_qp {
    let c = ctx_or!(ctx, ptr::null_mut());
    if attr.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: the caller's attribute struct.
    let a = unsafe { &mut *attr };
    let hash = sys::IBV_QP_INIT_ATTR_RX_HASH | sys::IBV_QP_INIT_ATTR_IND_TABLE;
    let known = sys::IBV_QP_INIT_ATTR_PD | sys::IBV_QP_INIT_ATTR_MAX_TSO_HEADER | hash;
    let r = if a.comp_mask & !known != 0 || a.comp_mask & sys::IBV_QP_INIT_ATTR_PD == 0 {
        log(format_args!(
            "ibv_create_qp_ex: comp_mask {:#x} not supported (PD, MAX_TSO_HEADER, RX_HASH, \
             IND_TABLE)",
            a.comp_mask
        ));
        Err(libc::EOPNOTSUPP)
    } else if a.comp_mask & hash != 0 {
        if a.comp_mask & hash != hash {
            Err(libc::EINVAL)
        } else {
            create_hash_qp(c, a)
        }
    } else {
        let r = QpRequest {
            pd: a.pd,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            qp_type: a.qp_type,
            qp_context: a.qp_context,
            max_tso_header: (a.comp_mask & sys::IBV_QP_INIT_ATTR_MAX_TSO_HEADER != 0)
                .then_some(u32::from(a.max_tso_header)),
        };
        create_send_qp(c, &r, &mut a.cap)
    };
    match r {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            ptr::null_mut()
        }
    }
}

/// RESET->INIT: libmlx4 marks every SQ slot invalid for the device's first pass (owner bit set,
/// size of a whole slot) and stamps the later 64-byte blocks of bigger slots.
pub(super) fn init_sq_ownership(base: *mut u8, sq: &Ring) {
    let stride = 1usize << sq.wqe_shift;
    for i in 0..sq.wqe_cnt as usize {
        let wqe = base.wrapping_add(sq.offset as usize + i * stride);
        // SAFETY: every slot lies inside the QP buffer the layout sized; the device does not
        // read the ring before a doorbell, which cannot come before the QP is initialised.
        unsafe {
            ptr::write_volatile(wqe.cast::<u32>(), (1u32 << 31).to_be());
            ptr::write_volatile(wqe.add(7), (1u8) << (sq.wqe_shift - 4));
            for blk in (64..stride).step_by(64) {
                ptr::write_volatile(wqe.add(blk).cast::<u32>(), u32::MAX);
            }
        }
    }
}

fn modify_send(c: &Context, q: &Qp, s: &SendQp, a: &sys::ibv_qp_attr, mask: c_int) -> c_int {
    let mask = mask as u32;
    if mask & sys::IBV_QP_STATE == 0 {
        return 0;
    }
    let (cur, next) = (q.ibv.state, a.qp_state);
    if mask & sys::IBV_QP_CUR_STATE != 0 && a.cur_qp_state != cur {
        return libc::EINVAL;
    }
    // The model's SQ runs in RTS (Ready), drops doorbells before (Reset), and stops in ERR.
    let model = match (cur, next) {
        (sys::IBV_QPS_RESET, sys::IBV_QPS_INIT) => {
            if mask & sys::IBV_QP_PORT == 0 || a.port_num != 1 {
                return libc::EINVAL;
            }
            init_sq_ownership(s.buf.ptr, &s.sq);
            None
        }
        (sys::IBV_QPS_INIT, sys::IBV_QPS_INIT | sys::IBV_QPS_RTR) => None,
        (sys::IBV_QPS_RTR, sys::IBV_QPS_RTS) => Some(QueueState::Ready),
        (sys::IBV_QPS_RTS, sys::IBV_QPS_RTS) => None,
        (_, sys::IBV_QPS_RESET) => Some(QueueState::Reset),
        (_, sys::IBV_QPS_ERR) => Some(QueueState::Error),
        _ => return libc::EINVAL,
    };
    if let Some(st) = model {
        if let Err(e) = c.adapter.hca.set_sq_state(q.qpn(), st) {
            return hca_errno("ibv_modify_qp", e);
        }
    }
    set_state(q, next);
    0
}

fn set_state(q: &Qp, s: sys::ibv_qp_state) {
    // SAFETY: the state word of our own QP; verbs callers serialise modify on one QP.
    unsafe { ptr::addr_of!(q.ibv.state).cast_mut().write(s) };
}

fn modify_hash(c: &Context, q: &Qp, id: u32, a: &sys::ibv_qp_attr, mask: c_int) -> c_int {
    let mask = mask as u32;
    if mask & !(sys::IBV_QP_STATE | sys::IBV_QP_PORT) != 0 || a.qp_state > sys::IBV_QPS_RTR {
        return libc::EOPNOTSUPP;
    }
    if mask & sys::IBV_QP_STATE == 0 {
        return 0;
    }
    let (cur, next) = (q.ibv.state, a.qp_state);
    match (cur, next) {
        (sys::IBV_QPS_RESET, sys::IBV_QPS_INIT) => {
            if mask & sys::IBV_QP_PORT == 0 || a.port_num != 1 {
                return libc::EINVAL;
            }
        }
        (sys::IBV_QPS_INIT, sys::IBV_QPS_INIT | sys::IBV_QPS_RTR) | (_, sys::IBV_QPS_RESET) => {}
        _ => return libc::EINVAL,
    }
    set_state(q, next);
    c.adapter.steer(|s| {
        if let Some((_, h)) = s.hash_qps.iter_mut().find(|(i, _)| *i == id) {
            h.ready = next == sys::IBV_QPS_RTR;
        }
    });
    0
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_modify_qp(
    p: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: the application's QP pointer.
    let (Some(q), false) = ((unsafe { qp(p) }), attr.is_null()) else {
        return libc::EINVAL;
    };
    // SAFETY: the context outlives its objects; the caller's attribute struct.
    let (c, a) = unsafe { (&*q.ctx, &*attr) };
    match &q.kind {
        QpKind::Send(s) => modify_send(c, q, s, a, mask),
        QpKind::Hash { id, .. } => modify_hash(c, q, *id, a, mask),
    }
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_destroy_qp(p: *mut sys::ibv_qp) -> c_int {
    // SAFETY: the application's QP pointer.
    let Some(q) = (unsafe { qp(p) }) else {
        return libc::EINVAL;
    };
    if q.flows.load(Ordering::Relaxed) != 0 {
        return libc::EBUSY;
    }
    // SAFETY: the context outlives its objects.
    let c = unsafe { &*q.ctx };
    match &q.kind {
        QpKind::Send(s) => {
            if let Err(e) = c.adapter.hca.destroy_sq(q.qpn()) {
                return hca_errno("ibv_destroy_qp", e);
            }
            c.free_db(DbKind::Rq, s.rdb);
        }
        QpKind::Hash { id, table } => {
            c.adapter.steer(|s| s.hash_qps.retain(|(i, _)| i != id));
            // SAFETY: a table with users cannot be destroyed, so it is still there.
            unsafe { &**table }.users.fetch_sub(1, Ordering::Relaxed);
        }
    }
    // SAFETY: allocated with Box::into_raw, destroyed once; the model no longer reads the ring.
    drop(unsafe { Box::from_raw((q as *const Qp).cast_mut()) });
    0
}
