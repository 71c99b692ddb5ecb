//! Protection domains, memory regions, CQs, QPs (RAW_PACKET send QPs and RSS hash QPs), WQs,
//! indirection tables and flows, each backed by the model: a CQ, SQ or RQ of the `Hca` on memory
//! laid out as libmlx4 lays it out, or steering state the model is told about.
//!
//! Every object starts with its rdma-core struct (the pointer the application holds), followed
//! by [`MAGIC`] so a foreign pointer is refused instead of trusted.
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

// ------------------------------------------------------------------------------ CQ

#[repr(C)]
pub(crate) struct Cq {
    ibv: sys::ibv_cq,
    magic: u64,
    ctx: *const Context,
    pub buf: Buf,
    /// `set_ci_db`; the arm word follows it.
    pub db: *mut u32,
    pub cqn: u32,
    pub cnt: u32,
    /// libmlx4's arm sequence number: 2 bits carried by each arm, advanced per event.
    pub arm_sn: AtomicU32,
}

/// # Safety
/// `p` is null or an application's CQ pointer.
pub(crate) unsafe fn cq<'a>(p: *mut sys::ibv_cq) -> Option<&'a Cq> {
    // SAFETY: forwarded contract.
    unsafe { ours(p, |t: &Cq| t.magic) }
}

fn create_cq(
    c: &Context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut sys::ibv_comp_channel,
) -> Result<*mut sys::ibv_cq, c_int> {
    if cqe < 0 || cqe as u32 > MAX_CQE {
        return Err(libc::EINVAL);
    }
    // libmlx4: one more than asked, rounded up to a power of two.
    let cnt = layout::roundup_pow2(cqe as u32 + 1).max(2);
    let buf = c.buf(cnt as usize * mlx4_prm::CQE_SIZE)?;
    let db = c.db(DbKind::Cq)?;
    // SAFETY: the ring and the record stay ours until destroy_cq, which destroys the model's CQ
    // first.
    let cqn = match unsafe {
        c.adapter.hca.create_cq(&CqAttr {
            buf: buf.ptr,
            cqe_cnt: cnt,
            set_ci_db: db,
        })
    } {
        Ok(n) => n,
        Err(e) => {
            c.free_db(DbKind::Cq, db);
            return Err(hca_errno("ibv_create_cq", e));
        }
    };
    // SAFETY: the application's channel pointer, if any.
    let ch = unsafe { crate::context::channel(channel) };
    if !channel.is_null() && ch.is_none() {
        let _ = c.adapter.hca.destroy_cq(cqn);
        c.free_db(DbKind::Cq, db);
        return Err(libc::EINVAL);
    }
    if let Some(ch) = ch {
        if let Err(e) = c.adapter.hca.set_cq_channel(cqn, Some(ch.id)) {
            let _ = c.adapter.hca.destroy_cq(cqn);
            c.free_db(DbKind::Cq, db);
            return Err(hca_errno("ibv_create_cq", e));
        }
        // SAFETY: the application's channel; rdma-core counts the CQs using it.
        unsafe { (*channel).refcnt += 1 };
    }
    let cq = Box::new(Cq {
        ibv: sys::ibv_cq {
            context: c.ibv(),
            channel,
            cq_context,
            cqe: cnt as c_int - 1,
            ..Default::default()
        },
        magic: MAGIC,
        ctx: c,
        buf,
        db,
        cqn,
        cnt,
        arm_sn: AtomicU32::new(1),
    });
    let p = Box::into_raw(cq);
    if let Some(ch) = ch {
        ch.cqs.lock().push((cqn, p as usize, cq_context as usize));
    }
    Ok(p.cast())
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_create_cq(
    ctx: *mut sys::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut sys::ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut sys::ibv_cq {
    let c = ctx_or!(ctx, ptr::null_mut());
    match create_cq(c, cqe, cq_context, channel) {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            ptr::null_mut()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_destroy_cq(p: *mut sys::ibv_cq) -> c_int {
    // SAFETY: the application's CQ pointer.
    let Some(cq) = (unsafe { cq(p) }) else {
        return libc::EINVAL;
    };
    // SAFETY: the context outlives its objects.
    let c = unsafe { &*cq.ctx };
    if let Err(e) = c.adapter.hca.destroy_cq(cq.cqn) {
        return hca_errno("ibv_destroy_cq", e);
    }
    if !cq.ibv.channel.is_null() {
        // SAFETY: the channel outlives the CQs using it (its destroy checks refcnt).
        unsafe { (*cq.ibv.channel).refcnt -= 1 };
        // SAFETY: as above.
        if let Some(ch) = unsafe { crate::context::channel(cq.ibv.channel) } {
            ch.cqs.lock().retain(|x| x.0 != cq.cqn);
        }
    }
    c.free_db(DbKind::Cq, cq.db);
    // SAFETY: allocated with Box::into_raw, destroyed once; the model no longer writes the ring.
    drop(unsafe { Box::from_raw((cq as *const Cq).cast_mut()) });
    0
}

/// CQ doorbell commands (doc/prm.md 5.3): the next solicited completion, or the next one.
const ARM_SOLICITED: u32 = 1 << 24;
const ARM_NEXT: u32 = 2 << 24;

/// `ibv_req_notify_cq` (the context op verbs.h calls): arm the CQ as libmlx4's `mlx4_arm_cq`
/// does, through the hardware: the arm record after `set_ci_db`, then the 64-bit CQ doorbell
/// at offset 0x20 of the context's UAR page, carrying the sequence number, the command, the
/// CQN and the consumer index (read from `set_ci_db`, which the mlx4dv user keeps).
pub(crate) unsafe extern "C" fn req_notify_cq(p: *mut sys::ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: the application's CQ pointer.
    let Some(cq) = (unsafe { cq(p) }) else {
        return libc::EINVAL;
    };
    // SAFETY: the context outlives its objects.
    let c = unsafe { &*cq.ctx };
    let sn = cq.arm_sn.load(Ordering::Relaxed) & 3;
    let cmd = if solicited_only != 0 {
        ARM_SOLICITED
    } else {
        ARM_NEXT
    };
    // SAFETY: the CQ's doorbell record pair (set_ci_db, arm_db), ours until destroy_cq.
    let ci =
        u32::from_be(unsafe { AtomicU32::from_ptr(cq.db) }.load(Ordering::Acquire)) & 0xff_ffff;
    // SAFETY: as above; the arm word follows set_ci_db.
    unsafe { AtomicU32::from_ptr(cq.db.add(1)) }
        .store((sn << 28 | cmd | ci).to_be(), Ordering::Relaxed);
    fence(Ordering::SeqCst);
    let v = (u64::from(sn << 28 | cmd | cq.cqn) << 32) | u64::from(ci);
    let reg = c
        .cq_uar()
        .cast::<u8>()
        .wrapping_add(mlx4_prm::CQ_DOORBELL_OFFSET);
    // SAFETY: the CQ doorbell of the context's UAR page (device memory valid while the context
    // is open), 8-aligned; one 64-bit store, as on a card.
    unsafe { AtomicU64::from_ptr(reg.cast()) }.store(v.to_be(), Ordering::Release);
    0
}

/// An event of this CQ was taken (`ibv_get_cq_event`): the next arm carries the next sequence
/// number, as libmlx4's `cq_event` op keeps it.
///
/// # Safety
/// `p` is a CQ pointer of ours.
pub(crate) unsafe fn cq_event(p: *mut sys::ibv_cq) {
    // SAFETY: forwarded contract.
    if let Some(cq) = unsafe { cq(p) } {
        cq.arm_sn.fetch_add(1, Ordering::Relaxed);
    }
}

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
    ctx: *const Context,
    pub kind: QpKind,
    flows: AtomicU32,
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
fn init_sq_ownership(base: *mut u8, sq: &Ring) {
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
    users: AtomicU32,
}

/// # Safety
/// `p` is null or an application's indirection table pointer.
unsafe fn ind_table<'a>(p: *mut sys::ibv_rwq_ind_table) -> Option<&'a IndTable> {
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

// ------------------------------------------------------------------------------ flows

#[repr(C)]
pub(crate) struct FlowObj {
    ibv: sys::ibv_flow,
    magic: u64,
    id: u64,
    qp: *const Qp,
}

/// Largest flow spec verbs defines is well below this; a larger size is garbage.
const MAX_FLOW_SPEC: usize = 256;

/// `verbs_context::ibv_create_flow`.
pub(crate) unsafe extern "C" fn create_flow(
    qpp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_flow_attr,
) -> *mut sys::ibv_flow {
    // SAFETY: the application's QP pointer.
    let (Some(q), false) = ((unsafe { qp(qpp) }), attr.is_null()) else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    // SAFETY: the context outlives its objects; the caller's attribute header.
    let (c, hdr) = unsafe { (&*q.ctx, &*attr) };
    if hdr.port != 1 {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // rdma-core walks the specs by `num_of_specs` and each spec's own size; `attr.size` is not
    // trusted (DPDK's mlx4 leaves it at the header's size).
    let mut size = std::mem::size_of::<sys::ibv_flow_attr>();
    for _ in 0..hdr.num_of_specs {
        // SAFETY: the caller's spec headers follow one another after the attribute.
        let spec = unsafe { &*attr.cast::<u8>().add(size).cast::<sys::ibv_flow_spec_eth>() };
        let n = usize::from(spec.size);
        if !(8..=MAX_FLOW_SPEC).contains(&n) {
            log(format_args!("ibv_create_flow: flow spec of {n} bytes"));
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        size += n;
    }
    // SAFETY: the attribute and its specs span `size` bytes, as just walked.
    let bytes = unsafe { std::slice::from_raw_parts(attr.cast::<u8>(), size) };
    let matches = match steer::parse_flow(bytes) {
        Ok(m) => m,
        Err(e) => {
            log(format_args!("ibv_create_flow: {}", e.0));
            set_errno(libc::EOPNOTSUPP);
            return ptr::null_mut();
        }
    };
    let target = match q.kind {
        QpKind::Hash { id, .. } => Target::Hash(id),
        QpKind::Send(_) => Target::Nowhere,
    };
    let id = c.adapter.next_id();
    c.adapter.steer(|s| {
        s.flows.push(Flow {
            id,
            target,
            matches,
        })
    });
    q.flows.fetch_add(1, Ordering::Relaxed);
    Box::into_raw(Box::new(FlowObj {
        ibv: sys::ibv_flow {
            comp_mask: 0,
            context: c.ibv(),
            handle: 0,
        },
        magic: MAGIC,
        id,
        qp: q,
    }))
    .cast()
}

/// `verbs_context::ibv_destroy_flow`.
pub(crate) unsafe extern "C" fn destroy_flow(p: *mut sys::ibv_flow) -> c_int {
    // SAFETY: the application's flow pointer.
    let Some(f) = (unsafe { ours(p, |t: &FlowObj| t.magic) }) else {
        return libc::EINVAL;
    };
    // SAFETY: the flow's context and QP outlive it (a QP with flows cannot be destroyed).
    let Some(c) = (unsafe { context(f.ibv.context) }) else {
        return libc::EINVAL;
    };
    c.adapter.steer(|s| s.flows.retain(|x| x.id != f.id));
    // SAFETY: as above.
    unsafe { (*f.qp).flows.fetch_sub(1, Ordering::Relaxed) };
    // SAFETY: allocated with Box::into_raw, destroyed once.
    drop(unsafe { Box::from_raw((f as *const FlowObj).cast_mut()) });
    0
}
