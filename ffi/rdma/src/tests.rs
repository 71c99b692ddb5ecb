//! bindgen reads the headers through libclang, the C compiler through its own front end; the
//! two views of every struct the driver exchanges with libmlx4 must agree. The C side is the
//! table in `layout.c`, compiled by this crate's build script. It covers what the driver
//! gets back from libmlx4 and what the verbs stand-in hands to DPDK's C driver.
use std::collections::HashMap;
use std::ffi::{c_char, CStr};
use std::mem::{offset_of, size_of};

use super::*;

#[repr(C)]
struct Field {
    name: *const c_char,
    offset: usize,
    size: usize,
}

extern "C" {
    static mlx4rs_verbs_c_layout: [Field; 0];
}

/// `name -> (offset, size)` as the C compiler laid the structs out.
fn c_layout() -> HashMap<String, (usize, usize)> {
    let mut m = HashMap::new();
    // SAFETY: a NULL-terminated array of string literals defined in layout.c.
    unsafe {
        let mut p = mlx4rs_verbs_c_layout.as_ptr();
        while !(*p).name.is_null() {
            let n = CStr::from_ptr((*p).name).to_string_lossy().into_owned();
            m.insert(n, ((*p).offset, (*p).size));
            p = p.add(1);
        }
    }
    m
}

macro_rules! field {
    ($t:ident . $($f:ident).+) => {{
        let v = std::mem::MaybeUninit::<$t>::uninit();
        // SAFETY: only the field's address is taken, never read.
        let size = unsafe { size_of_val(&(*v.as_ptr()).$($f).+) };
        (
            concat!(stringify!($t), ".", stringify!($($f).+)).replace(' ', ""),
            (offset_of!($t, $($f).+), size),
        )
    }};
}

macro_rules! whole {
    ($t:ident) => {
        (stringify!($t).to_owned(), (0usize, size_of::<$t>()))
    };
}

#[test]
fn bindgen_agrees_with_the_c_compiler_on_what_mlx4dv_hands_back() {
    let rust = [
        whole!(mlx4dv_qp),
        field!(mlx4dv_qp.rdb),
        field!(mlx4dv_qp.sdb),
        field!(mlx4dv_qp.doorbell_qpn),
        field!(mlx4dv_qp.sq.wqe_cnt),
        field!(mlx4dv_qp.sq.wqe_shift),
        field!(mlx4dv_qp.sq.offset),
        field!(mlx4dv_qp.rq.wqe_cnt),
        field!(mlx4dv_qp.rq.wqe_shift),
        field!(mlx4dv_qp.rq.offset),
        field!(mlx4dv_qp.buf.buf),
        field!(mlx4dv_qp.buf.length),
        field!(mlx4dv_qp.comp_mask),
        field!(mlx4dv_qp.uar_mmap_offset),
        whole!(mlx4dv_cq),
        field!(mlx4dv_cq.buf.buf),
        field!(mlx4dv_cq.buf.length),
        field!(mlx4dv_cq.cqe_cnt),
        field!(mlx4dv_cq.cqn),
        field!(mlx4dv_cq.set_ci_db),
        field!(mlx4dv_cq.arm_db),
        field!(mlx4dv_cq.arm_sn),
        field!(mlx4dv_cq.cqe_size),
        field!(mlx4dv_cq.comp_mask),
        field!(mlx4dv_cq.cq_uar),
        whole!(mlx4dv_rwq),
        field!(mlx4dv_rwq.rdb),
        field!(mlx4dv_rwq.rq.wqe_cnt),
        field!(mlx4dv_rwq.rq.wqe_shift),
        field!(mlx4dv_rwq.rq.offset),
        field!(mlx4dv_rwq.buf.buf),
        field!(mlx4dv_rwq.buf.length),
        field!(mlx4dv_rwq.comp_mask),
        whole!(mlx4dv_obj),
        field!(mlx4dv_obj.qp.in_),
        field!(mlx4dv_obj.qp.out),
        field!(mlx4dv_obj.cq.in_),
        field!(mlx4dv_obj.cq.out),
        field!(mlx4dv_obj.srq.in_),
        field!(mlx4dv_obj.rwq.in_),
        field!(mlx4dv_obj.rwq.out),
        whole!(mlx4dv_ctx_allocators),
        field!(mlx4dv_ctx_allocators.alloc),
        field!(mlx4dv_ctx_allocators.free),
        field!(mlx4dv_ctx_allocators.data),
        whole!(verbs_context),
        field!(verbs_context.query_port),
        field!(verbs_context.create_rwq_ind_table),
        field!(verbs_context.destroy_rwq_ind_table),
        field!(verbs_context.create_wq),
        field!(verbs_context.modify_wq),
        field!(verbs_context.destroy_wq),
        field!(verbs_context.query_device_ex),
        field!(verbs_context.ibv_create_flow),
        field!(verbs_context.ibv_destroy_flow),
        field!(verbs_context.create_qp_ex),
        field!(verbs_context.sz),
        field!(verbs_context.context),
        whole!(ibv_context),
        field!(ibv_context.device),
        field!(ibv_context.ops),
        field!(ibv_context.cmd_fd),
        field!(ibv_context.async_fd),
        field!(ibv_context.num_comp_vectors),
        field!(ibv_context.abi_compat),
        whole!(ibv_device),
        field!(ibv_device.name),
        field!(ibv_device.ibdev_path),
        whole!(ibv_device_attr_ex),
        field!(ibv_device_attr_ex.tso_caps),
        field!(ibv_device_attr_ex.rss_caps),
        field!(ibv_device_attr_ex.raw_packet_caps),
        whole!(ibv_qp_init_attr_ex),
        field!(ibv_qp_init_attr_ex.rwq_ind_tbl),
        field!(ibv_qp_init_attr_ex.rx_hash_conf),
        whole!(ibv_flow_attr),
        whole!(ibv_flow_spec_eth),
    ];
    let c = c_layout();
    let mut names = Vec::new();
    for (name, (off, size)) in rust {
        // layout.c names the union members `in`, a Rust keyword bindgen renames `in_`.
        let c_name = name.replace(".in_", ".in");
        let Some(&(c_off, c_size)) = c.get(&c_name) else {
            panic!("{c_name} is not in ffi/rdma/layout.c");
        };
        assert_eq!(
            (off, size),
            (c_off, c_size),
            "{name}: bindgen says offset {off} size {size}, the C compiler {c_off} {c_size}"
        );
        names.push(c_name);
    }
    let mut missing: Vec<_> = c.keys().filter(|n| !names.contains(n)).collect();
    missing.sort();
    assert!(
        missing.is_empty(),
        "layout.c lists fields this test does not compare: {missing:?}"
    );
    // The two a wrong view would hurt most: they hand over the rings.
    assert_eq!(size_of::<mlx4dv_qp>(), 80);
    assert_eq!(size_of::<mlx4dv_cq>(), 64);
}

#[test]
fn a_missing_library_is_an_error_not_a_crash() {
    // SAFETY: loading a library that does not exist runs no code.
    let r = unsafe { Ibverbs::new("/nonexistent/libibverbs.so.1") };
    let e = r.err().expect("no such file").to_string();
    assert!(e.contains("/nonexistent/libibverbs.so.1"), "{e}");
}

#[test]
fn the_installed_rdma_core_has_every_entry_point() {
    // Debian's libibverbs1 and ibverbs-providers (scripts/setup.sh installs them).
    // SAFETY: loading rdma-core runs only its own initialisation.
    let ibv = unsafe { Ibverbs::new("libibverbs.so.1") }
        .expect("libibverbs.so.1: install ibverbs-providers (scripts/setup.sh)");
    assert!(ibv.ibv_open_device.is_ok() && ibv.ibv_create_qp.is_ok());
    assert!(ibv.ibv_query_qp.is_ok() && ibv.ibv_reg_mr.is_ok());
    // SAFETY: as above.
    let dv = unsafe { Mlx4::new("libmlx4.so.1") }
        .expect("libmlx4.so.1: install ibverbs-providers (scripts/setup.sh)");
    assert!(dv.mlx4dv_init_obj.is_ok() && dv.mlx4dv_set_context_attr.is_ok());
}
