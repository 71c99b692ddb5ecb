//! Completion queues: a CQ of the model on a ring laid out as libmlx4 lays it out, armed through the UAR page.
#![allow(unsafe_code)]

use super::*;

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

/// The next completion event: the CQ that raised it and its context. Waits as the application
/// set the fd up (blocking by default, `EAGAIN` once it made the fd non-blocking), as
/// rdma-core's read of the channel fd would.
#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_get_cq_event(
    ch: *mut sys::ibv_comp_channel,
    cq: *mut *mut sys::ibv_cq,
    cq_ctx: *mut *mut c_void,
) -> c_int {
    // SAFETY: the application's channel pointer.
    let Some(c) = (unsafe { crate::context::channel(ch) }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    loop {
        match c.adapter().hca.next_cq_event(c.id) {
            Ok(Some(cqn)) => {
                let Some(&(_, p, ctx)) = c.cqs.lock().iter().find(|x| x.0 == cqn) else {
                    // A CQ destroyed since: its event goes with it.
                    continue;
                };
                // SAFETY: the caller's output pointers; the CQ is alive (destroying it
                // removes it from the list).
                unsafe {
                    if !cq.is_null() {
                        *cq = p as *mut sys::ibv_cq;
                    }
                    if !cq_ctx.is_null() {
                        *cq_ctx = ctx as *mut c_void;
                    }
                    cq_event(p as *mut sys::ibv_cq);
                }
                return 0;
            }
            Ok(None) => {}
            Err(e) => {
                set_errno(e.errno());
                return -1;
            }
        }
        // SAFETY: F_GETFL on the channel's descriptor.
        let fl = unsafe { libc::fcntl(c.fd(), libc::F_GETFL) };
        if fl >= 0 && fl & libc::O_NONBLOCK != 0 {
            set_errno(libc::EAGAIN);
            return -1;
        }
        let mut pfd = libc::pollfd {
            fd: c.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling one pollfd.
        unsafe { libc::poll(&mut pfd, 1, -1) };
    }
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_ack_cq_events(_cq: *mut sys::ibv_cq, _n: c_uint) {
    // Events hold nothing a destroy would have to wait for.
}
