//! Flow rules on hash QPs: steering state the model is told about.
#![allow(unsafe_code)]

use super::*;

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
