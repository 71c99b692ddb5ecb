//! What a received frame's CQE says in DPDK's terms: packet types and offload flags, decoded
//! from the status word once per status at build time and looked up per frame.

use mlx4_prm::{rx_status, Cqe};

/// Offload results of one received frame, in DPDK's terms.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RxMeta {
    pub ol_flags: u64,
    pub packet_type: u32,
    pub rss_hash: u32,
}

// mbuf flags and packet types (rte_mbuf_core.h, rte_mbuf_ptype.h), repeated here so that the
// CQE parsing below stays plain Rust that tests can check without DPDK.
pub const RX_RSS_HASH: u64 = 1 << 1;
pub const RX_L4_CKSUM_BAD: u64 = 1 << 3;
pub const RX_IP_CKSUM_BAD: u64 = 1 << 4;
pub const RX_IP_CKSUM_GOOD: u64 = 1 << 7;
pub const RX_L4_CKSUM_GOOD: u64 = 1 << 8;
pub const PTYPE_L2_ETHER: u32 = 0x1;
pub const PTYPE_L3_IPV4_EXT_UNKNOWN: u32 = 0x90;
pub const PTYPE_L3_IPV6_EXT_UNKNOWN: u32 = 0xe0;
pub const PTYPE_L4_TCP: u32 = 0x100;
pub const PTYPE_L4_UDP: u32 = 0x200;
pub const PTYPE_L4_FRAG: u32 = 0x300;
pub const PTYPE_L3_MASK: u32 = 0xf0;
pub const PTYPE_L4_MASK: u32 = 0xf00;
pub const PTYPE_TUNNEL_VXLAN: u32 = 0x3000;
pub const PTYPE_INNER_L2_ETHER: u32 = 0x1_0000;
pub const RX_OUTER_IP_CKSUM_BAD: u64 = 1 << 5;
pub const RX_OUTER_L4_CKSUM_BAD: u64 = 1 << 21;
pub const RX_OUTER_L4_CKSUM_GOOD: u64 = 1 << 22;

/// A ConnectX-3 Pro's VXLAN frame (`vlan_my_qpn` tunnel bits): the status word described the
/// inner packet, so its types move to the inner fields (inner L3 and L4 sit 16 bits above the
/// outer ones in DPDK's packet type) and the checksum verdicts stay the inner ones; the outer
/// headers come from the tunnel bits.
pub fn with_tunnel(mut m: RxMeta, vlan_my_qpn: u32, csum: bool) -> RxMeta {
    use mlx4_prm::cqe_vlan::{L2_TUNNEL, L2_TUNNEL_IPOK, L2_TUNNEL_IPV4, L2_TUNNEL_L4_CSUM};
    if vlan_my_qpn & L2_TUNNEL == 0 {
        return m;
    }
    let v4 = vlan_my_qpn & L2_TUNNEL_IPV4 != 0;
    let inner = (m.packet_type & (PTYPE_L3_MASK | PTYPE_L4_MASK)) << 16;
    m.packet_type = PTYPE_L2_ETHER
        | if v4 {
            PTYPE_L3_IPV4_EXT_UNKNOWN
        } else {
            PTYPE_L3_IPV6_EXT_UNKNOWN
        }
        | PTYPE_L4_UDP
        | PTYPE_TUNNEL_VXLAN
        | PTYPE_INNER_L2_ETHER
        | inner;
    if csum {
        if v4 && vlan_my_qpn & L2_TUNNEL_IPOK == 0 {
            m.ol_flags |= RX_OUTER_IP_CKSUM_BAD;
        }
        m.ol_flags |= if vlan_my_qpn & L2_TUNNEL_L4_CSUM != 0 {
            RX_OUTER_L4_CKSUM_GOOD
        } else {
            RX_OUTER_L4_CKSUM_BAD
        };
    }
    m
}

/// Reads an RX CQE's status word and hash into mbuf metadata. Checksum flags only when the
/// application enabled RX checksum offload; the hash only with RSS.
pub const fn parse_rx_cqe(status: u32, hash: u32, csum: bool, rss: bool) -> RxMeta {
    let mut m = RxMeta {
        ol_flags: 0,
        packet_type: PTYPE_L2_ETHER,
        rss_hash: 0,
    };
    let v4 = status & rx_status::IPV4 != 0;
    let v6 = status & rx_status::IPV6 != 0;
    let frag = status & (rx_status::IPV4F | rx_status::IPV6F) != 0;
    if v4 {
        m.packet_type |= PTYPE_L3_IPV4_EXT_UNKNOWN;
    } else if v6 {
        m.packet_type |= PTYPE_L3_IPV6_EXT_UNKNOWN;
    }
    let l4 = status & (rx_status::TCP | rx_status::UDP) != 0;
    if (v4 || v6) && frag {
        m.packet_type |= PTYPE_L4_FRAG;
    } else if status & rx_status::TCP != 0 {
        m.packet_type |= PTYPE_L4_TCP;
    } else if status & rx_status::UDP != 0 {
        m.packet_type |= PTYPE_L4_UDP;
    }
    if csum {
        if v4 {
            m.ol_flags |= if status & rx_status::IP_HDR_CSUM_OK != 0 {
                RX_IP_CKSUM_GOOD
            } else {
                RX_IP_CKSUM_BAD
            };
        }
        if (v4 || v6) && l4 && !frag {
            m.ol_flags |= if status & rx_status::TCP_UDP_CSUM_OK != 0 {
                RX_L4_CKSUM_GOOD
            } else {
                RX_L4_CKSUM_BAD
            };
        }
    }
    if rss {
        m.ol_flags |= RX_RSS_HASH;
        m.rss_hash = hash;
    }
    m
}

/// The status bits [`parse_rx_cqe`] reads, packed into an index of [`RX_META`]: bits 22..=28
/// (IPv4, IPv4 fragment, IPv6, IPv4 options, TCP, UDP, IP checksum good) as they lie, the L4
/// checksum verdict (bit 2) above them, the IPv6 fragment bit (12) above that.
#[inline(always)]
const fn meta_index(status: u32) -> usize {
    (((status >> 22) & 0x7f)
        | ((status & rx_status::TCP_UDP_CSUM_OK) << 5)
        | ((status & rx_status::IPV6F) >> 4)) as usize
}

/// [`parse_rx_cqe`]'s packet type and flags for every index of [`meta_index`], with RX
/// checksum offload off (`[0]`) and on (`[1]`), computed by that very function at build
/// time: the burst loads a frame's answer instead of branching on each bit. The RSS hash and
/// tunnel fields stay per frame. `meta_table_matches_the_full_decode` checks every entry.
pub(super) static RX_META: [[(u32, u32); 512]; 2] = {
    let mut t = [[(0u32, 0u32); 512]; 2];
    let mut i = 0;
    while i < 512 {
        let status = ((i as u32 & 0x7f) << 22)
            | (((i as u32 >> 7) & 1) << 2)
            | (((i as u32 >> 8) & 1) << 12);
        let off = parse_rx_cqe(status, 0, false, false);
        let on = parse_rx_cqe(status, 0, true, false);
        t[0][i] = (off.packet_type, off.ol_flags as u32);
        t[1][i] = (on.packet_type, on.ol_flags as u32);
        i += 1;
    }
    t
};

/// [`parse_rx_cqe`] through [`RX_META`] (`table` is its row for the queue's checksum setting).
#[inline(always)]
pub(super) fn rx_meta(table: &[(u32, u32); 512], status: u32, hash: u32, rss: bool) -> RxMeta {
    let (packet_type, flags) = table[meta_index(status)];
    let mut m = RxMeta {
        ol_flags: u64::from(flags),
        packet_type,
        rss_hash: 0,
    };
    if rss {
        m.ol_flags |= RX_RSS_HASH;
        m.rss_hash = hash;
    }
    m
}

/// What the second pass needs of a CQE, copied out by the first.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Seen {
    /// The status word (high half) and the byte count (low half); in an error CQE's, the
    /// syndrome and the vendor error (bits 15:8 and 7:0).
    pub(super) status_len: u64,
    /// `immed_rss_invalid` and `vlan_my_qpn`, copied only for queues that read them.
    pub(super) hash: u32,
    pub(super) vlan: u32,
}

impl Seen {
    /// Everything the hand-up may read of `c`.
    #[inline(always)]
    pub(super) fn of(c: &Cqe<&[u8]>) -> Seen {
        let (status, len) = c.status_byte_cnt();
        Seen {
            status_len: u64::from(status) << 32 | u64::from(len),
            hash: c.immed_rss_invalid(),
            vlan: c.vlan_my_qpn(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cqe_status_to_flags() {
        let s = rx_status::IPV4
            | rx_status::TCP
            | rx_status::IP_HDR_CSUM_OK
            | rx_status::TCP_UDP_CSUM_OK;
        let m = parse_rx_cqe(s, 0xdead_beef, true, true);
        assert_eq!(
            m.packet_type,
            PTYPE_L2_ETHER | PTYPE_L3_IPV4_EXT_UNKNOWN | PTYPE_L4_TCP
        );
        assert_eq!(
            m.ol_flags,
            RX_IP_CKSUM_GOOD | RX_L4_CKSUM_GOOD | RX_RSS_HASH
        );
        assert_eq!(m.rss_hash, 0xdead_beef);

        let m = parse_rx_cqe(rx_status::IPV4 | rx_status::UDP, 0, true, false);
        assert_eq!(
            m.packet_type,
            PTYPE_L2_ETHER | PTYPE_L3_IPV4_EXT_UNKNOWN | PTYPE_L4_UDP
        );
        assert_eq!(m.ol_flags, RX_IP_CKSUM_BAD | RX_L4_CKSUM_BAD);

        let m = parse_rx_cqe(
            rx_status::IPV6 | rx_status::UDP | rx_status::TCP_UDP_CSUM_OK,
            0,
            true,
            false,
        );
        assert_eq!(
            m.packet_type,
            PTYPE_L2_ETHER | PTYPE_L3_IPV6_EXT_UNKNOWN | PTYPE_L4_UDP
        );
        assert_eq!(m.ol_flags, RX_L4_CKSUM_GOOD, "IPv6 has no header checksum");

        let m = parse_rx_cqe(
            rx_status::IPV4 | rx_status::IPV4F | rx_status::UDP | rx_status::IP_HDR_CSUM_OK,
            0,
            true,
            false,
        );
        assert_eq!(
            m.packet_type,
            PTYPE_L2_ETHER | PTYPE_L3_IPV4_EXT_UNKNOWN | PTYPE_L4_FRAG
        );
        assert_eq!(m.ol_flags, RX_IP_CKSUM_GOOD, "no L4 verdict on a fragment");

        let m = parse_rx_cqe(0, 7, true, false);
        assert_eq!(
            (m.packet_type, m.ol_flags),
            (PTYPE_L2_ETHER, 0),
            "non-IP: nothing to judge"
        );
        assert_eq!(
            parse_rx_cqe(s, 0, false, false).ol_flags,
            0,
            "offload off: no flags"
        );
    }

    #[test]
    fn meta_table_matches_the_full_decode() {
        // Every combination of the bits the decode reads, alone and with every other bit of
        // the status word set, each way of checksum and RSS.
        let read = rx_status::IPV4
            | rx_status::IPV4F
            | rx_status::IPV6
            | rx_status::IPV6F
            | rx_status::IPV4OPT
            | rx_status::TCP
            | rx_status::UDP
            | rx_status::IP_HDR_CSUM_OK
            | rx_status::TCP_UDP_CSUM_OK;
        let bits: Vec<u32> = (0..32)
            .map(|b| 1u32 << b)
            .filter(|b| read & b != 0)
            .collect();
        assert_eq!(bits.len(), 9);
        for combo in 0..512u32 {
            let status: u32 = (0..9)
                .filter(|k| combo >> k & 1 != 0)
                .map(|k| bits[k])
                .sum();
            for noise in [0, !read, 0x5555_5555 & !read] {
                for (csum, rss) in [(false, false), (true, false), (false, true), (true, true)] {
                    let s = status | noise;
                    assert_eq!(
                        rx_meta(&RX_META[usize::from(csum)], s, 0x1234_5678, rss),
                        parse_rx_cqe(s, 0x1234_5678, csum, rss),
                        "status {s:#010x} csum {csum} rss {rss}"
                    );
                }
            }
        }
    }

    #[test]
    fn flag_values_match_dpdk() {
        use dpdk_sys::bits;
        assert_eq!(RX_RSS_HASH, bits::RTE_MBUF_F_RX_RSS_HASH);
        assert_eq!(RX_IP_CKSUM_GOOD, bits::RTE_MBUF_F_RX_IP_CKSUM_GOOD);
        assert_eq!(RX_IP_CKSUM_BAD, bits::RTE_MBUF_F_RX_IP_CKSUM_BAD);
        assert_eq!(RX_L4_CKSUM_GOOD, bits::RTE_MBUF_F_RX_L4_CKSUM_GOOD);
        assert_eq!(RX_L4_CKSUM_BAD, bits::RTE_MBUF_F_RX_L4_CKSUM_BAD);
        assert_eq!(
            PTYPE_L3_IPV4_EXT_UNKNOWN,
            dpdk_sys::RTE_PTYPE_L3_IPV4_EXT_UNKNOWN
        );
        assert_eq!(
            PTYPE_L3_IPV6_EXT_UNKNOWN,
            dpdk_sys::RTE_PTYPE_L3_IPV6_EXT_UNKNOWN
        );
        assert_eq!(PTYPE_L4_FRAG, dpdk_sys::RTE_PTYPE_L4_FRAG);
        assert_eq!(PTYPE_L4_UDP, dpdk_sys::RTE_PTYPE_L4_UDP);
    }
}
