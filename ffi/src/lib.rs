//! `dpdk-sys`: raw bindings to the installed DPDK 22.11 (public headers plus the driver SDK),
//! generated at build time, and the C glue for `static inline` functions used on the control path.
//!
//! Nothing here is safe to call without reading the DPDK documentation of the function;
//! the driver wraps what it needs in its `ethdev` module.
#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code
)]
#![allow(clippy::all)]
#![allow(unsafe_op_in_unsafe_fn)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// Constants DPDK defines through `RTE_BIT32`/`RTE_BIT64` macros, which bindgen cannot expand.
/// Values from the 22.11 headers (`rte_ethdev.h`, `rte_mbuf_core.h`).
pub mod bits {
    pub const RTE_ETH_LINK_SPEED_40G: u32 = 1 << 11;
    pub const RTE_ETH_DEV_AUTOFILL_QUEUE_XSTATS: u32 = 1 << 6;

    pub const RTE_ETH_TX_OFFLOAD_VLAN_INSERT: u64 = 1 << 0;
    pub const RTE_ETH_TX_OFFLOAD_IPV4_CKSUM: u64 = 1 << 1;
    pub const RTE_ETH_TX_OFFLOAD_UDP_CKSUM: u64 = 1 << 2;
    pub const RTE_ETH_TX_OFFLOAD_TCP_CKSUM: u64 = 1 << 3;
    pub const RTE_ETH_TX_OFFLOAD_MULTI_SEGS: u64 = 1 << 15;
    pub const RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE: u64 = 1 << 16;

    pub const RTE_ETH_RX_OFFLOAD_IPV4_CKSUM: u64 = 1 << 1;
    pub const RTE_ETH_RX_OFFLOAD_UDP_CKSUM: u64 = 1 << 2;
    pub const RTE_ETH_RX_OFFLOAD_TCP_CKSUM: u64 = 1 << 3;
    pub const RTE_ETH_RX_OFFLOAD_SCATTER: u64 = 1 << 13;
    pub const RTE_ETH_RX_OFFLOAD_KEEP_CRC: u64 = 1 << 16;
    pub const RTE_ETH_RX_OFFLOAD_RSS_HASH: u64 = 1 << 19;

    pub const RTE_MBUF_F_RX_RSS_HASH: u64 = 1 << 1;
    pub const RTE_MBUF_F_RX_L4_CKSUM_BAD: u64 = 1 << 3;
    pub const RTE_MBUF_F_RX_IP_CKSUM_BAD: u64 = 1 << 4;
    pub const RTE_MBUF_F_RX_IP_CKSUM_GOOD: u64 = 1 << 7;
    pub const RTE_MBUF_F_RX_L4_CKSUM_GOOD: u64 = 1 << 8;

    pub const RTE_MBUF_F_TX_TCP_CKSUM: u64 = 1 << 52;
    pub const RTE_MBUF_F_TX_UDP_CKSUM: u64 = 3 << 52;
    pub const RTE_MBUF_F_TX_L4_MASK: u64 = 3 << 52;
    pub const RTE_MBUF_F_TX_IP_CKSUM: u64 = 1 << 54;
    pub const RTE_MBUF_F_TX_IPV4: u64 = 1 << 55;
    pub const RTE_MBUF_F_TX_IPV6: u64 = 1 << 56;
    pub const RTE_MBUF_F_TX_VLAN: u64 = 1 << 57;
}
