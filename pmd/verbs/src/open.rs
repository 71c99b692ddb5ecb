//! `ibv_open_device`: a context whose ops table holds the entry points of [`queries`] and
//! [`queues`]. It sits above them and above [`context`], which holds what hangs off a context
//! and knows none of its ops.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::ptr;

use crate::device::Device;
use crate::{context, queries, queues, set_errno, sys};

unsafe extern "C" fn no_poll_cq(_: *mut sys::ibv_cq, _: c_int, _: *mut sys::ibv_wc) -> c_int {
    // The data path belongs to the application through mlx4dv; polling through verbs is not
    // provided.
    -1
}

unsafe extern "C" fn no_post_send(
    _: *mut sys::ibv_qp,
    _: *mut sys::ibv_send_wr,
    _: *mut *mut sys::ibv_send_wr,
) -> c_int {
    libc::EOPNOTSUPP
}

unsafe extern "C" fn no_post_recv(
    _: *mut sys::ibv_qp,
    _: *mut sys::ibv_recv_wr,
    _: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_open_device(
    dev: *mut sys::ibv_device,
) -> *mut sys::ibv_context {
    let Some(dev) = Device::from_ibv(dev) else {
        set_errno(libc::ENODEV);
        return ptr::null_mut();
    };
    let mut vctx = sys::verbs_context {
        query_port: Some(queries::query_port_ex),
        query_device_ex: Some(queries::query_device_ex),
        create_qp_ex: Some(queues::create_qp_ex),
        create_wq: Some(queues::create_wq),
        modify_wq: Some(queues::modify_wq),
        destroy_wq: Some(queues::destroy_wq),
        create_rwq_ind_table: Some(queues::create_rwq_ind_table),
        destroy_rwq_ind_table: Some(queues::destroy_rwq_ind_table),
        ibv_create_flow: Some(queues::create_flow),
        ibv_destroy_flow: Some(queues::destroy_flow),
        sz: std::mem::size_of::<sys::verbs_context>(),
        ..Default::default()
    };
    vctx.context.ops.poll_cq = Some(no_poll_cq);
    vctx.context.ops.req_notify_cq = Some(queues::req_notify_cq);
    vctx.context.ops.post_send = Some(no_post_send);
    vctx.context.ops.post_recv = Some(no_post_recv);
    match context::open(dev, vctx) {
        Ok(c) => {
            let c = Box::leak(c);
            c.ibv()
        }
        Err(e) => {
            set_errno(e);
            ptr::null_mut()
        }
    }
}
