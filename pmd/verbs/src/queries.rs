//! `ibv_query_device`, `ibv_query_device_ex` and `ibv_query_port`: what mlx4_ib would report for
//! a ConnectX-3 port backed by the model, limited to what the model really does.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::ptr;

use crate::context::{ctx_or, port_up, Context};
use crate::sys;

/// rdma-core keeps this many spare WQEs in every SQ (2 KB of prefetch headroom plus one WQE at
/// the 64-byte stride); mlx4_ib subtracts them from `max_qp_wr`.
pub(crate) const SQ_SPARE_64: u32 = (2048 >> 6) + 1;
/// Scatter/gather entries per WQE (DPDK's mlx4 asserts at least 32).
pub(crate) const MAX_SGE: u32 = 32;
/// Largest CQ libmlx4 accepts (`cqe > 0x3fffff` is refused).
pub(crate) const MAX_CQE: u32 = 0x3f_ffff;
/// Largest indirection table of a hash QP.
pub(crate) const MAX_RWQ_IND_TABLE: u32 = 256;
/// Largest LSO payload.
pub(crate) const MAX_TSO: u32 = 65536;
/// Mellanox's IEEE OUI, the vendor ID verbs reports.
const VENDOR_ID: u32 = 0x02c9;

pub(crate) fn device_attr(c: &Context) -> sys::ibv_device_attr {
    let caps = c.adapter.hca.caps();
    let mut a = sys::ibv_device_attr {
        node_guid: u64::to_be(0x0002_c903_0000_0000 | u64::from(c.adapter.part_id)),
        sys_image_guid: u64::to_be(0x0002_c903_0000_0000 | u64::from(c.adapter.part_id)),
        max_mr_size: u64::MAX,
        page_size_cap: 0xffff_f000,
        vendor_id: VENDOR_ID,
        vendor_part_id: c.adapter.part_id,
        hw_ver: 1,
        max_qp: caps.max_qps as c_int,
        max_qp_wr: (caps.max_sq_wqes.min(caps.max_rq_wqes) - SQ_SPARE_64) as c_int,
        device_cap_flags: sys::IBV_DEVICE_RAW_IP_CSUM,
        max_sge: MAX_SGE.min(caps.max_rq_sges) as c_int,
        max_sge_rd: 0,
        max_cq: caps.max_cqs as c_int,
        max_cqe: MAX_CQE.min(caps.max_cqes - 1) as c_int,
        max_mr: 1 << 20,
        max_pd: 1 << 15,
        max_raw_ethy_qp: caps.max_qps as c_int,
        max_pkeys: 128,
        phys_port_cnt: caps.num_ports,
        ..Default::default()
    };
    // mlx4_ib formats the firmware version as major.minor.subminor.
    let fw = caps.fw_version();
    for (d, s) in a.fw_ver.iter_mut().take(63).zip(fw.bytes()) {
        *d = s as _;
    }
    a
}

#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_query_device(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_device_attr,
) -> c_int {
    let c = ctx_or!(ctx, libc::EINVAL);
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller passed an attribute struct to fill.
    unsafe { attr.write(device_attr(c)) };
    0
}

/// `verbs_context::query_device_ex`: fills at most `attr_size` bytes, as an older caller's
/// struct may be shorter.
pub(crate) unsafe extern "C" fn query_device_ex(
    ctx: *mut sys::ibv_context,
    input: *const sys::ibv_query_device_ex_input,
    attr: *mut sys::ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    let c = ctx_or!(ctx, libc::EINVAL);
    // SAFETY: the caller's input, if any.
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return libc::EINVAL;
    }
    if attr.is_null() || attr_size < std::mem::size_of::<sys::ibv_device_attr>() {
        return libc::EINVAL;
    }
    let caps = c.adapter.hca.caps();
    let raw = 1u32 << sys::IBV_QPT_RAW_PACKET;
    let mut ex = sys::ibv_device_attr_ex {
        orig_attr: device_attr(c),
        tso_caps: sys::ibv_tso_caps {
            max_tso: MAX_TSO,
            supported_qpts: raw,
        },
        rss_caps: sys::ibv_rss_caps {
            supported_qpts: raw,
            max_rwq_indirection_tables: caps.max_qps,
            max_rwq_indirection_table_size: MAX_RWQ_IND_TABLE,
            rx_hash_fields_mask: u64::from(
                sys::IBV_RX_HASH_SRC_IPV4
                    | sys::IBV_RX_HASH_DST_IPV4
                    | sys::IBV_RX_HASH_SRC_IPV6
                    | sys::IBV_RX_HASH_DST_IPV6
                    | sys::IBV_RX_HASH_SRC_PORT_TCP
                    | sys::IBV_RX_HASH_DST_PORT_TCP
                    | sys::IBV_RX_HASH_SRC_PORT_UDP
                    | sys::IBV_RX_HASH_DST_PORT_UDP,
            ),
            rx_hash_function: sys::IBV_RX_HASH_FUNC_TOEPLITZ as u8,
        },
        max_wq_type_rq: caps.max_qps,
        // The FCS kept on request; no VLAN stripping.
        raw_packet_caps: if caps.scatter_fcs {
            sys::IBV_RAW_PACKET_CAP_SCATTER_FCS
        } else {
            0
        },
        phys_port_cnt_ex: u32::from(caps.num_ports),
        ..Default::default()
    };
    ex.comp_mask = 0;
    let n = attr_size.min(std::mem::size_of::<sys::ibv_device_attr_ex>());
    // SAFETY: the caller's struct holds `attr_size` bytes; we copy no more than ours has.
    unsafe {
        ptr::copy_nonoverlapping(
            (&ex as *const sys::ibv_device_attr_ex).cast::<u8>(),
            attr.cast::<u8>(),
            n,
        )
    };
    0
}

fn ib_mtu(mtu: u32) -> sys::ibv_mtu {
    match mtu {
        4096.. => sys::IBV_MTU_4096,
        2048.. => sys::IBV_MTU_2048,
        1024.. => sys::IBV_MTU_1024,
        512.. => sys::IBV_MTU_512,
        _ => sys::IBV_MTU_256,
    }
}

fn port_attr(c: &Context) -> sys::ibv_port_attr {
    let (up, mtu) = port_up(c);
    sys::ibv_port_attr {
        state: if up {
            sys::IBV_PORT_ACTIVE
        } else {
            sys::IBV_PORT_DOWN
        },
        max_mtu: sys::IBV_MTU_4096,
        active_mtu: ib_mtu(mtu),
        gid_tbl_len: 128,
        max_msg_sz: 1 << 30,
        pkey_tbl_len: 128,
        max_vl_num: 1,
        // 4x at 10 Gb/s a lane: the 40GbE of a ConnectX-3 port.
        active_width: 2,
        active_speed: 8,
        phys_state: if up { 5 } else { 3 },
        link_layer: sys::IBV_LINK_LAYER_ETHERNET as u8,
        ..Default::default()
    }
}

/// `verbs_context::query_port`, which `ibv_query_port` in verbs.h calls first.
pub(crate) unsafe extern "C" fn query_port_ex(
    ctx: *mut sys::ibv_context,
    port: u8,
    attr: *mut sys::ibv_port_attr,
    attr_len: usize,
) -> c_int {
    let c = ctx_or!(ctx, libc::EINVAL);
    if attr.is_null() {
        return libc::EINVAL;
    }
    if port != 1 {
        return libc::EINVAL;
    }
    let a = port_attr(c);
    let n = attr_len.min(std::mem::size_of::<sys::ibv_port_attr>());
    // SAFETY: the caller's struct holds `attr_len` bytes.
    unsafe {
        ptr::copy_nonoverlapping(
            (&a as *const sys::ibv_port_attr).cast::<u8>(),
            attr.cast::<u8>(),
            n,
        )
    };
    0
}

/// The exported `ibv_query_port`, which fills the older (shorter) layout.
#[no_mangle]
pub unsafe extern "C" fn mlx4rs_verbs__ibv_query_port(
    ctx: *mut sys::ibv_context,
    port: u8,
    attr: *mut c_void,
) -> c_int {
    // SAFETY: same contract, with the compat struct's size.
    unsafe {
        query_port_ex(
            ctx,
            port,
            attr.cast(),
            std::mem::size_of::<sys::_compat_ibv_port_attr>(),
        )
    }
}
