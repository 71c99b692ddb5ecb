//! A `libibverbs.so.1` / `libmlx4.so.1` stand-in backed by the software mlx4 HCA
//! (`mlx4_hca`): DPDK's own C mlx4 driver, unmodified, and our driver's rdma-core backend run on
//! the model through it, as they would run on a ConnectX-3 through rdma-core.
//!
//! It is a faithful subset of rdma-core 44's ABI: the exported entry points carry rdma-core's
//! symbol versions (`IBVERBS_1.0`, `IBVERBS_1.1`, `IBVERBS_1.8`, `MLX4_1.0`, ...), contexts are
//! `verbs_context`s whose ops serve the inline functions of `verbs.h` (extended queries,
//! extended QPs, WQs, indirection tables, flows), and queue memory is laid out as libmlx4 lays
//! it out and handed back by `mlx4dv_init_obj`. The same shared object also answers as
//! `libmlx5.so.1` with failing stubs, because Debian's `dpdk-testpmd` links the mlx5 stack.
//!
//! What backs what:
//! - a verbs device: an entry of `MLX4RS_VERBS` ([`config`]) and its sysfs tree (the C driver
//!   reads the PCI slot and the netdev from there), one `Hca` (one port) while a context is
//!   open, its wire, and the port's netdev, whose MTU and up/running state the model follows;
//! - CQ, RAW_PACKET send QP, WQ: the model's CQ, SQ and RQ, on memory from the application's
//!   allocator (`mlx4dv_set_context_attr`) or anonymous pages;
//! - RSS hash QP, indirection table, flows: the model's steering table, RSS key and fields and
//!   MAC filter ([`steer`]); what verbs can say and the model cannot is logged;
//! - memory regions: the model's lkeys, by virtual address.
//!
//! Diagnostics go to stderr, prefixed `mlx4rs-verbs:`.

#![deny(unsafe_op_in_unsafe_fn)]
#![allow(clippy::missing_safety_doc)]

mod config;
mod context;
mod device;
mod dv;
mod layout;
mod netdev;
mod queries;
mod queues;
mod steer;
mod sys;

/// One diagnostic line on stderr.
pub(crate) fn log(args: std::fmt::Arguments<'_>) {
    eprintln!("mlx4rs-verbs: {args}");
}

/// Set the calling thread's `errno` (verbs calls returning pointers report errors there).
pub(crate) fn set_errno(e: std::ffi::c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot.
    #[allow(unsafe_code)]
    unsafe {
        *libc::__errno_location() = e
    };
}

fn stub_failed() {
    set_errno(libc::EOPNOTSUPP);
}

include!(concat!(env!("OUT_DIR"), "/exports.rs"));

#[cfg(test)]
mod tests;
