//! `dpdk-sys`: raw bindings to the installed DPDK: its public headers, generated at build time,
//! and the driver SDK of the same release, committed (`sdk/vYY_MM.rs`, chosen by `build.rs`);
//! plus the C glue for `static inline` functions used on the control path.
//!
//! The supported releases are 22.11, 23.11, 24.11 and 25.11; `cfg(dpdk = "24.11")` and the like
//! name the one this build is for.
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
// Generated code: its unsafe blocks (layout tests, bitfield accessors) carry no comments.
#![allow(clippy::undocumented_unsafe_blocks)]
#![allow(unsafe_op_in_unsafe_fn)]
// bindgen casts some releases' bit fields through transmutes that rustc finds unnecessary.
#![allow(unknown_lints, unnecessary_transmutes)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// The driver SDK of the installed release. Its own bindgen helpers (bitfield units) shadow the
/// public ones inside it; everything else it names resolves against the public bindings above.
#[macro_use]
mod sdk {
    use super::*;
    include!(env!("DPDK_SDK_BINDINGS"));
}
pub use sdk::*;

mod mbuf;
pub use mbuf::{rte_mbuf, rte_mbuf_hash};

/// Constants DPDK defines through `RTE_BIT32`/`RTE_BIT64` macros, which bindgen cannot expand.
/// Values from the 22.11 headers (`rte_ethdev.h`, `rte_mbuf_core.h`).
pub mod bits {
    pub const RTE_ETH_LINK_SPEED_40G: u32 = 1 << 11;
    pub const RTE_ETH_DEV_AUTOFILL_QUEUE_XSTATS: u32 = 1 << 6;
    pub const RTE_ETH_DEV_CAPA_FLOW_RULE_KEEP: u64 = 1 << 3;
    pub const RTE_ETH_DEV_INTR_LSC: u32 = 1 << 1;
    pub const RTE_ETH_DEV_INTR_RMV: u32 = 1 << 3;
    pub const RTE_ETH_RX_OFFLOAD_VLAN_FILTER: u64 = 1 << 9;
    pub const RTE_ETH_TX_OFFLOAD_TCP_TSO: u64 = 1 << 5;
    pub const RTE_ETH_TX_OFFLOAD_OUTER_IPV4_CKSUM: u64 = 1 << 7;
    pub const RTE_ETH_RX_OFFLOAD_OUTER_IPV4_CKSUM: u64 = 1 << 6;
    pub const RTE_MBUF_F_TX_TCP_SEG: u64 = 1 << 50;
    pub const RTE_MBUF_F_TX_TUNNEL_MASK: u64 = 0xf << 45;
    pub const RTE_MBUF_F_TX_OUTER_IP_CKSUM: u64 = 1 << 58;

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

    pub const RTE_ETH_RSS_IPV4: u64 = 1 << 2;
    pub const RTE_ETH_RSS_FRAG_IPV4: u64 = 1 << 3;
    pub const RTE_ETH_RSS_NONFRAG_IPV4_TCP: u64 = 1 << 4;
    pub const RTE_ETH_RSS_NONFRAG_IPV4_UDP: u64 = 1 << 5;
    pub const RTE_ETH_RSS_NONFRAG_IPV4_OTHER: u64 = 1 << 7;
    pub const RTE_ETH_RSS_IPV6: u64 = 1 << 8;
    pub const RTE_ETH_RSS_FRAG_IPV6: u64 = 1 << 9;
    pub const RTE_ETH_RSS_NONFRAG_IPV6_TCP: u64 = 1 << 10;
    pub const RTE_ETH_RSS_NONFRAG_IPV6_UDP: u64 = 1 << 11;
    pub const RTE_ETH_RSS_NONFRAG_IPV6_OTHER: u64 = 1 << 13;

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

/// A table of `(name, value)` that glue.c fills from the headers, by name.
///
/// # Safety
/// `table` points to `n` entries whose names are static NUL-terminated strings.
#[cfg(test)]
unsafe fn named_values(
    table: *const mlx4rs_named_bit,
    n: u32,
) -> std::collections::HashMap<&'static str, u64> {
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts(table, n as usize) }
        .iter()
        // SAFETY: as above.
        .map(|b| {
            (
                unsafe { std::ffi::CStr::from_ptr(b.name) }
                    .to_str()
                    .unwrap(),
                b.value,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::named_values;

    /// The committed SDK bindings embed public types by name; the sizes those types had when the
    /// bindings were generated must be what the installed headers give them here, or every
    /// offset after them in `rte_eth_dev_data` (say) would be wrong at run time.
    #[test]
    fn sdk_public_types_match_the_installed_headers() {
        let mut wrong = Vec::new();
        macro_rules! check {
            ($t:ident, $n:expr) => {
                if std::mem::size_of::<super::$t>() != $n {
                    wrong.push(format!(
                        "{}: {} bytes when {} was generated, {} in the installed headers",
                        stringify!($t),
                        $n,
                        super::SDK_TAG,
                        std::mem::size_of::<super::$t>()
                    ));
                }
            };
        }
        sdk_public_sizes!(check);
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// Every constant of `bits`, by name.
    macro_rules! restated {
        ($($name:ident),* $(,)?) => {
            [$((stringify!($name), u64::from(super::bits::$name))),*]
        };
    }

    #[test]
    fn restated_bits_match_the_headers() {
        // SAFETY: glue.c's table and its length.
        let header = unsafe {
            named_values(
                super::mlx4rs_header_bits.as_ptr(),
                super::mlx4rs_header_bits_n,
            )
        };
        let ours = restated!(
            RTE_ETH_LINK_SPEED_40G,
            RTE_ETH_DEV_AUTOFILL_QUEUE_XSTATS,
            RTE_ETH_DEV_INTR_LSC,
            RTE_ETH_DEV_INTR_RMV,
            RTE_ETH_RX_OFFLOAD_VLAN_FILTER,
            RTE_ETH_TX_OFFLOAD_TCP_TSO,
            RTE_ETH_TX_OFFLOAD_OUTER_IPV4_CKSUM,
            RTE_ETH_RX_OFFLOAD_OUTER_IPV4_CKSUM,
            RTE_MBUF_F_TX_TCP_SEG,
            RTE_MBUF_F_TX_TUNNEL_MASK,
            RTE_MBUF_F_TX_OUTER_IP_CKSUM,
            RTE_ETH_TX_OFFLOAD_VLAN_INSERT,
            RTE_ETH_TX_OFFLOAD_IPV4_CKSUM,
            RTE_ETH_TX_OFFLOAD_UDP_CKSUM,
            RTE_ETH_TX_OFFLOAD_TCP_CKSUM,
            RTE_ETH_TX_OFFLOAD_MULTI_SEGS,
            RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE,
            RTE_ETH_RX_OFFLOAD_IPV4_CKSUM,
            RTE_ETH_RX_OFFLOAD_UDP_CKSUM,
            RTE_ETH_RX_OFFLOAD_TCP_CKSUM,
            RTE_ETH_RX_OFFLOAD_SCATTER,
            RTE_ETH_RX_OFFLOAD_KEEP_CRC,
            RTE_ETH_RX_OFFLOAD_RSS_HASH,
            RTE_ETH_RSS_IPV4,
            RTE_ETH_RSS_FRAG_IPV4,
            RTE_ETH_RSS_NONFRAG_IPV4_TCP,
            RTE_ETH_RSS_NONFRAG_IPV4_UDP,
            RTE_ETH_RSS_NONFRAG_IPV4_OTHER,
            RTE_ETH_RSS_IPV6,
            RTE_ETH_RSS_FRAG_IPV6,
            RTE_ETH_RSS_NONFRAG_IPV6_TCP,
            RTE_ETH_RSS_NONFRAG_IPV6_UDP,
            RTE_ETH_RSS_NONFRAG_IPV6_OTHER,
            RTE_MBUF_F_RX_RSS_HASH,
            RTE_MBUF_F_RX_L4_CKSUM_BAD,
            RTE_MBUF_F_RX_IP_CKSUM_BAD,
            RTE_MBUF_F_RX_IP_CKSUM_GOOD,
            RTE_MBUF_F_RX_L4_CKSUM_GOOD,
            RTE_MBUF_F_TX_TCP_CKSUM,
            RTE_MBUF_F_TX_UDP_CKSUM,
            RTE_MBUF_F_TX_L4_MASK,
            RTE_MBUF_F_TX_IP_CKSUM,
            RTE_MBUF_F_TX_IPV4,
            RTE_MBUF_F_TX_IPV6,
            RTE_MBUF_F_TX_VLAN,
        );
        assert_eq!(
            ours.len(),
            header.len(),
            "glue.c lists every restated constant"
        );
        for (name, value) in ours {
            assert_eq!(header.get(name), Some(&value), "{name}");
        }
    }
}
