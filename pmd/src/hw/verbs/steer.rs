//! Receive steering on mlx4 through verbs, as rdma-core allows it: an RSS hash QP over an
//! indirection table of work queues, and flow rules on that QP for the MAC, broadcast,
//! all-multicast and promiscuous mode.
//!
//! mlx4_ib builds an indirection table from a base QPN and a power-of-two range
//! (`mlx4_ib_create_rwq_ind_table` wants consecutive WQNs, the first aligned to the size; libmlx4's
//! `LOG_WQS_RANGE_SZ` reserves such a range for the next WQs). So the driver's 128-entry
//! redirection table maps onto a card only when it repeats `n` consecutive queues in order, `n`
//! a power of two: the default round-robin table does.

use rdma_sys as sys;

use crate::hw::flow::{FlowPattern, L4Proto};
use crate::hw::RssHash;

/// The priority of the port's own rules (its MAC, broadcast): after every rte_flow rule
/// (0..=0xfff, lower first; the last one ties and, being younger, comes after).
pub const DEFAULT_PRIORITY: u16 = 0xfff;

/// The indirection table for a redirection table of WQNs: its `n` queues in order, or why the
/// card cannot do it.
pub fn ind_table(reta: &[u32]) -> Result<Vec<u32>, String> {
    let mut queues: Vec<u32> = Vec::new();
    for &q in reta {
        if !queues.contains(&q) {
            queues.push(q);
        }
    }
    let n = queues.len();
    let round_robin = reta
        .iter()
        .enumerate()
        .all(|(i, &q)| q == queues[i % n.max(1)]);
    let consecutive = queues
        .iter()
        .enumerate()
        .all(|(k, &q)| q == queues[0].wrapping_add(k as u32));
    if n == 0 || !n.is_power_of_two() || !round_robin || !consecutive {
        return Err(format!(
            "mlx4 spreads received frames over a power-of-two run of queues created one after \
             the other, each bucket in turn; this redirection table ({n} queues{}) is not one",
            if round_robin { "" } else { ", not in turn" }
        ));
    }
    Ok(queues)
}

/// The verbs hash fields for the device's field sets: addresses of each IP version hashed,
/// ports of each L4 protocol hashed (verbs has one field mask, not one per packet type).
pub fn hash_fields(h: RssHash) -> u64 {
    let mut f = 0u64;
    let any = |sets: &[RssHash]| sets.iter().any(|s| h.contains(*s));
    if any(&[RssHash::IPV4, RssHash::IPV4_TCP, RssHash::IPV4_UDP]) {
        f |= u64::from(sys::IBV_RX_HASH_SRC_IPV4 | sys::IBV_RX_HASH_DST_IPV4);
    }
    if any(&[RssHash::IPV6, RssHash::IPV6_TCP, RssHash::IPV6_UDP]) {
        f |= u64::from(sys::IBV_RX_HASH_SRC_IPV6 | sys::IBV_RX_HASH_DST_IPV6);
    }
    if any(&[RssHash::IPV4_TCP, RssHash::IPV6_TCP]) {
        f |= u64::from(sys::IBV_RX_HASH_SRC_PORT_TCP | sys::IBV_RX_HASH_DST_PORT_TCP);
    }
    if any(&[RssHash::IPV4_UDP, RssHash::IPV6_UDP]) {
        f |= u64::from(sys::IBV_RX_HASH_SRC_PORT_UDP | sys::IBV_RX_HASH_DST_PORT_UDP);
    }
    f
}

/// A flow rule: its attribute header and at most one Ethernet spec, contiguous as
/// `ibv_create_flow` reads them.
#[repr(C)]
pub struct FlowRule {
    pub attr: sys::ibv_flow_attr,
    pub eth: sys::ibv_flow_spec_eth,
}

/// What the port accepts, as flow rules on the hash QP of physical port `port`: `mac`, then
/// each of `more` (further unicast addresses and the multicast list), broadcast.
pub fn flow_rules(
    port: u8,
    mac: [u8; 6],
    more: &[[u8; 6]],
    promisc: bool,
    allmulti: bool,
) -> Vec<FlowRule> {
    let header = |kind, specs: u8| sys::ibv_flow_attr {
        type_: kind,
        size: if specs == 0 {
            std::mem::size_of::<sys::ibv_flow_attr>()
        } else {
            std::mem::size_of::<FlowRule>()
        } as u16,
        num_of_specs: specs,
        port,
        priority: DEFAULT_PRIORITY,
        ..Default::default()
    };
    let to = |dst: [u8; 6]| FlowRule {
        attr: header(sys::IBV_FLOW_ATTR_NORMAL, 1),
        eth: sys::ibv_flow_spec_eth {
            type_: sys::IBV_FLOW_SPEC_ETH,
            size: std::mem::size_of::<sys::ibv_flow_spec_eth>() as u16,
            val: sys::ibv_flow_eth_filter {
                dst_mac: dst,
                ..Default::default()
            },
            mask: sys::ibv_flow_eth_filter {
                dst_mac: [0xff; 6],
                ..Default::default()
            },
        },
    };
    let bare = |kind| FlowRule {
        attr: header(kind, 0),
        eth: sys::ibv_flow_spec_eth::default(),
    };
    if promisc {
        return vec![bare(sys::IBV_FLOW_ATTR_ALL_DEFAULT)];
    }
    let mut v = vec![to(mac)];
    v.extend(more.iter().filter(|&&m| m != mac).map(|&m| to(m)));
    v.push(to([0xff; 6]));
    if allmulti {
        v.push(bare(sys::IBV_FLOW_ATTR_MC_DEFAULT));
    }
    v
}

/// Appends the bytes of `v` to `buf` (which `ibv_create_flow` reads as one attribute).
fn push<T>(buf: &mut Vec<u8>, v: &T) {
    // SAFETY: `T` is a plain C struct of the verbs ABI, read as its bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts(std::ptr::from_ref(v).cast::<u8>(), std::mem::size_of::<T>())
    };
    buf.extend_from_slice(bytes);
}

/// An rte_flow pattern as a verbs flow attribute of physical port `port`: the header, then an
/// Ethernet spec (destination MAC, VLAN ID), IPv4 (addresses) and TCP/UDP (ports) specs for
/// the layers the pattern has, contiguous, in the 8-byte aligned words `ibv_create_flow`
/// reads. Verbs cannot say "tagged, any VLAN ID": that is refused.
pub fn user_rule(port: u8, priority: u16, p: &FlowPattern) -> Result<Vec<u64>, &'static str> {
    let mut specs = Vec::new();
    let mut n = 0u8;
    let mut eth = sys::ibv_flow_spec_eth {
        type_: sys::IBV_FLOW_SPEC_ETH,
        size: std::mem::size_of::<sys::ibv_flow_spec_eth>() as u16,
        ..Default::default()
    };
    if let Some(dst) = p.eth_dst {
        eth.val.dst_mac = dst;
        eth.mask.dst_mac = [0xff; 6];
    }
    match p.vlan {
        None => {}
        Some(None) => return Err("matching any VLAN tag (verbs matches a VLAN ID)"),
        Some(Some(vid)) => {
            eth.val.vlan_tag = vid.to_be();
            eth.mask.vlan_tag = 0x0fffu16.to_be();
        }
    }
    push(&mut specs, &eth);
    n += 1;
    if let Some(ip) = p.ipv4 {
        let spec = sys::ibv_flow_spec_ipv4 {
            type_: sys::IBV_FLOW_SPEC_IPV4,
            size: std::mem::size_of::<sys::ibv_flow_spec_ipv4>() as u16,
            val: sys::ibv_flow_ipv4_filter {
                src_ip: u32::from_ne_bytes(ip.src.value),
                dst_ip: u32::from_ne_bytes(ip.dst.value),
            },
            mask: sys::ibv_flow_ipv4_filter {
                src_ip: u32::from_ne_bytes(ip.src.mask),
                dst_ip: u32::from_ne_bytes(ip.dst.mask),
            },
        };
        push(&mut specs, &spec);
        n += 1;
    }
    if let Some(l4) = p.l4 {
        let spec = sys::ibv_flow_spec_tcp_udp {
            type_: match l4.proto {
                L4Proto::Tcp => sys::IBV_FLOW_SPEC_TCP,
                L4Proto::Udp => sys::IBV_FLOW_SPEC_UDP,
            },
            size: std::mem::size_of::<sys::ibv_flow_spec_tcp_udp>() as u16,
            val: sys::ibv_flow_tcp_udp_filter {
                dst_port: l4.dst_port.value.to_be(),
                src_port: l4.src_port.value.to_be(),
            },
            mask: sys::ibv_flow_tcp_udp_filter {
                dst_port: l4.dst_port.mask.to_be(),
                src_port: l4.src_port.mask.to_be(),
            },
        };
        push(&mut specs, &spec);
        n += 1;
    }
    let attr = sys::ibv_flow_attr {
        type_: sys::IBV_FLOW_ATTR_NORMAL,
        size: (std::mem::size_of::<sys::ibv_flow_attr>() + specs.len()) as u16,
        priority,
        num_of_specs: n,
        port,
        ..Default::default()
    };
    let mut bytes = Vec::new();
    push(&mut bytes, &attr);
    bytes.extend_from_slice(&specs);
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    // SAFETY: `words` holds at least `bytes.len()` bytes; the two do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr().cast::<u8>(), bytes.len())
    };
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_tables_over_consecutive_queues_map() {
        let reta: Vec<u32> = (0..128).map(|i| 0x40 + (i % 4)).collect();
        assert_eq!(ind_table(&reta).unwrap(), vec![0x40, 0x41, 0x42, 0x43]);
        assert_eq!(ind_table(&[7; 128]).unwrap(), vec![7]);
        for (what, reta) in [
            (
                "three queues",
                (0..128).map(|i| 10 + i % 3).collect::<Vec<u32>>(),
            ),
            ("a gap", (0..128).map(|i| 10 + 2 * (i % 2)).collect()),
            (
                "out of turn",
                (0..128)
                    .map(|i| if i == 5 { 10 } else { 10 + i % 2 })
                    .collect(),
            ),
            ("empty", Vec::new()),
        ] {
            assert!(ind_table(&reta).is_err(), "{what}");
        }
    }

    #[test]
    fn hash_fields_follow_the_field_sets() {
        assert_eq!(hash_fields(RssHash::NONE), 0);
        let v4 = u64::from(sys::IBV_RX_HASH_SRC_IPV4 | sys::IBV_RX_HASH_DST_IPV4);
        let tcp = u64::from(sys::IBV_RX_HASH_SRC_PORT_TCP | sys::IBV_RX_HASH_DST_PORT_TCP);
        assert_eq!(hash_fields(RssHash::IPV4), v4);
        assert_eq!(hash_fields(RssHash::IPV4_TCP), v4 | tcp);
        assert_eq!(
            hash_fields(RssHash::IPV6_UDP).count_ones(),
            4,
            "IPv6 addresses and UDP ports"
        );
    }

    #[test]
    fn a_user_rule_has_the_specs_of_its_layers() {
        use crate::hw::flow::{Ipv4Match, L4Match, Masked};
        let p = FlowPattern {
            eth_dst: None,
            vlan: Some(Some(5)),
            ipv4: Some(Ipv4Match::default()),
            l4: Some(L4Match {
                proto: L4Proto::Udp,
                src_port: Masked::default(),
                dst_port: Masked {
                    value: 53,
                    mask: 0xffff,
                },
            }),
        };
        let words = user_rule(1, 3, &p).unwrap();
        // SAFETY: the words start with the attribute header.
        let attr = unsafe { &*words.as_ptr().cast::<sys::ibv_flow_attr>() };
        assert_eq!((attr.num_of_specs, attr.priority, attr.port), (3, 3, 1));
        let hdr = std::mem::size_of::<sys::ibv_flow_attr>();
        let eth = std::mem::size_of::<sys::ibv_flow_spec_eth>();
        let ip = std::mem::size_of::<sys::ibv_flow_spec_ipv4>();
        assert_eq!(
            usize::from(attr.size),
            hdr + eth + ip + std::mem::size_of::<sys::ibv_flow_spec_tcp_udp>()
        );
        // SAFETY: the UDP spec follows the Ethernet and IPv4 specs, inside the words.
        let udp = unsafe {
            &*words
                .as_ptr()
                .cast::<u8>()
                .add(hdr + eth + ip)
                .cast::<sys::ibv_flow_spec_tcp_udp>()
        };
        assert_eq!(udp.type_, sys::IBV_FLOW_SPEC_UDP);
        assert_eq!(u16::from_be(udp.val.dst_port), 53);
        let any_tag = FlowPattern {
            vlan: Some(None),
            ..Default::default()
        };
        assert!(user_rule(1, 0, &any_tag).is_err());
    }

    #[test]
    fn flows_for_each_filter_mode() {
        let mac = [2, 0, 0, 0, 0, 9];
        let f = flow_rules(1, mac, &[], false, false);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].eth.val.dst_mac, mac);
        assert_eq!(f[1].eth.val.dst_mac, [0xff; 6]);
        assert_eq!(usize::from(f[0].attr.size), std::mem::size_of::<FlowRule>());
        assert_eq!((f[0].attr.num_of_specs, f[0].attr.port), (1, 1));
        let m = flow_rules(2, mac, &[], false, true);
        assert_eq!(m[2].attr.type_, sys::IBV_FLOW_ATTR_MC_DEFAULT);
        assert_eq!(m[2].attr.num_of_specs, 0);
        let p = flow_rules(1, mac, &[], true, true);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].attr.type_, sys::IBV_FLOW_ATTR_ALL_DEFAULT);
        // More unicast addresses and a multicast group: a rule each, the main MAC once.
        let extra = [[2, 0, 0, 0, 0, 7], mac, [1, 0, 0x5e, 0, 0, 7]];
        let e = flow_rules(1, mac, &extra, false, false);
        let dsts: Vec<[u8; 6]> = e.iter().map(|r| r.eth.val.dst_mac).collect();
        assert_eq!(dsts, [mac, extra[0], extra[2], [0xff; 6]]);
    }
}
