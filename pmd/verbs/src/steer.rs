//! Receive steering as verbs expresses it (flows attached to hash QPs over WQ indirection
//! tables, or to a QP without receive queue to drop) turned into what the model does: one flow
//! rule per verbs flow, one RSS context per hash QP, and nothing delivered by default, as
//! device-managed flow steering on a ConnectX-3 (with no rule, nothing reaches the
//! application).
//!
//! Where verbs asks for more than the model has, the plan says so in `notes`: the stand-in logs
//! them, and the fidelity list of doc/c-mlx4.md names each with the doc/prm.md section that
//! decides it.

use mlx4_hca::{EthMatch, FlowPattern, Ipv4Match, L4Match, L4Proto, Masked, RssFields, VlanMatch};

use crate::sys;

/// Which kind of verbs flow attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `IBV_FLOW_ATTR_NORMAL`: its specs.
    Normal,
    /// `IBV_FLOW_ATTR_ALL_DEFAULT`: every frame no other rule takes (promiscuous).
    AllDefault,
    /// `IBV_FLOW_ATTR_MC_DEFAULT`: every multicast frame no other rule takes.
    McDefault,
}

/// A verbs flow as the model matches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Match {
    pub kind: Kind,
    /// `ibv_flow_attr.priority` (lower first).
    pub priority: u16,
    pub pattern: FlowPattern,
}

/// Why a flow cannot be created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unsupported(pub String);

/// Fixed-size reads of a flow attribute's bytes (host order, as the C caller laid them out).
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn get<const N: usize>(&self, o: usize) -> Option<[u8; N]> {
        self.0.get(o..o + N)?.try_into().ok()
    }
    fn u16(&self, o: usize) -> Option<u16> {
        self.get(o).map(u16::from_ne_bytes)
    }
    fn u32(&self, o: usize) -> Option<u32> {
        self.get(o).map(u32::from_ne_bytes)
    }
}

/// A value and mask of one filter field: `val` and `mask` are the filter structs' offsets in
/// the spec, `field` the field's offset in the filter.
fn masked<const N: usize>(
    b: &Bytes<'_>,
    off: usize,
    (val, mask, field): (usize, usize, usize),
) -> Option<Masked<[u8; N]>> {
    Some(Masked {
        value: b.get(off + val + field)?,
        mask: b.get(off + mask + field)?,
    })
}

fn be16(m: Masked<[u8; 2]>) -> Masked<u16> {
    Masked {
        value: u16::from_be_bytes(m.value),
        mask: u16::from_be_bytes(m.mask),
    }
}

/// Parse a flow attribute and the specs that follow it (`attr.size` bytes in all): Ethernet
/// (destination and source MAC, EtherType, VLAN ID, each under its mask), IPv4 (addresses) and
/// TCP/UDP (ports) specs, in that order, for `NORMAL`, `ALL_DEFAULT` and `MC_DEFAULT` flows.
pub(crate) fn parse_flow(bytes: &[u8]) -> Result<Match, Unsupported> {
    use std::mem::{offset_of, size_of};
    let b = Bytes(bytes);
    let hdr_len = size_of::<sys::ibv_flow_attr>();
    if bytes.len() < hdr_len {
        return Err(Unsupported(format!(
            "flow attribute of {} bytes is shorter than its header",
            bytes.len()
        )));
    }
    let field = |o: usize| b.u32(o).expect("inside the header");
    let attr_type = field(offset_of!(sys::ibv_flow_attr, type_));
    let flags = field(offset_of!(sys::ibv_flow_attr, flags));
    let prio = b
        .u16(offset_of!(sys::ibv_flow_attr, priority))
        .expect("inside the header");
    let num_specs = bytes[offset_of!(sys::ibv_flow_attr, num_of_specs)];
    if flags != 0 {
        return Err(Unsupported(format!(
            "flow flags {flags:#x} are not modelled"
        )));
    }
    let kind = match attr_type {
        sys::IBV_FLOW_ATTR_NORMAL => Kind::Normal,
        sys::IBV_FLOW_ATTR_ALL_DEFAULT => Kind::AllDefault,
        sys::IBV_FLOW_ATTR_MC_DEFAULT => Kind::McDefault,
        t => {
            return Err(Unsupported(format!(
                "flow attribute type {t} is not modelled"
            )))
        }
    };
    let mut p = FlowPattern::default();
    let mut off = hdr_len;
    let mut layer = 0;
    for _ in 0..num_specs {
        let (Some(spec_type), Some(size)) = (b.u32(off), b.u16(off + 4)) else {
            return Err(Unsupported(
                "flow specs run past the attribute's size".into(),
            ));
        };
        let size = usize::from(size);
        if size < 8 || off + size > bytes.len() {
            return Err(Unsupported(format!(
                "flow spec of {size} bytes at offset {off} does not fit"
            )));
        }
        let short = |what: &str| Unsupported(format!("{what} flow spec too short"));
        match spec_type {
            sys::IBV_FLOW_SPEC_ETH if layer < 1 => {
                if size < size_of::<sys::ibv_flow_spec_eth>() {
                    return Err(short("Ethernet"));
                }
                let vm = (
                    offset_of!(sys::ibv_flow_spec_eth, val),
                    offset_of!(sys::ibv_flow_spec_eth, mask),
                );
                let f = |fo: usize| (vm.0, vm.1, fo);
                let bad = || short("Ethernet");
                let dst = masked(&b, off, f(offset_of!(sys::ibv_flow_eth_filter, dst_mac)))
                    .ok_or_else(bad)?;
                let src = masked(&b, off, f(offset_of!(sys::ibv_flow_eth_filter, src_mac)))
                    .ok_or_else(bad)?;
                let et = masked(&b, off, f(offset_of!(sys::ibv_flow_eth_filter, ether_type)))
                    .ok_or_else(bad)?;
                let tci = masked(&b, off, f(offset_of!(sys::ibv_flow_eth_filter, vlan_tag)))
                    .ok_or_else(bad)?;
                let tci = be16(tci);
                if tci.mask & 0xf000 != 0 {
                    return Err(Unsupported(format!(
                        "VLAN mask {:#06x}: the priority and DEI bits are not modelled (only \
                         the VLAN ID)",
                        tci.mask
                    )));
                }
                p.eth = Some(EthMatch {
                    dst,
                    src,
                    ether_type: be16(et),
                });
                if tci.mask != 0 {
                    p.vlan = Some(VlanMatch {
                        vid: Masked {
                            value: tci.value & 0x0fff,
                            mask: tci.mask,
                        },
                    });
                }
                layer = 1;
            }
            sys::IBV_FLOW_SPEC_IPV4 if layer < 2 => {
                if size < size_of::<sys::ibv_flow_spec_ipv4>() {
                    return Err(short("IPv4"));
                }
                let vm = (
                    offset_of!(sys::ibv_flow_spec_ipv4, val),
                    offset_of!(sys::ibv_flow_spec_ipv4, mask),
                );
                // Network order in memory: the bytes are the address.
                let src = masked(
                    &b,
                    off,
                    (vm.0, vm.1, offset_of!(sys::ibv_flow_ipv4_filter, src_ip)),
                )
                .ok_or_else(|| short("IPv4"))?;
                let dst = masked(
                    &b,
                    off,
                    (vm.0, vm.1, offset_of!(sys::ibv_flow_ipv4_filter, dst_ip)),
                )
                .ok_or_else(|| short("IPv4"))?;
                p.ipv4 = Some(Ipv4Match { src, dst });
                layer = 2;
            }
            sys::IBV_FLOW_SPEC_TCP | sys::IBV_FLOW_SPEC_UDP if layer < 3 => {
                if size < size_of::<sys::ibv_flow_spec_tcp_udp>() {
                    return Err(short("TCP/UDP"));
                }
                let vm = (
                    offset_of!(sys::ibv_flow_spec_tcp_udp, val),
                    offset_of!(sys::ibv_flow_spec_tcp_udp, mask),
                );
                let port = |fo| {
                    masked(&b, off, (vm.0, vm.1, fo))
                        .map(be16)
                        .ok_or_else(|| short("TCP/UDP"))
                };
                p.l4 = Some(L4Match {
                    proto: if spec_type == sys::IBV_FLOW_SPEC_TCP {
                        L4Proto::Tcp
                    } else {
                        L4Proto::Udp
                    },
                    src_port: port(offset_of!(sys::ibv_flow_tcp_udp_filter, src_port))?,
                    dst_port: port(offset_of!(sys::ibv_flow_tcp_udp_filter, dst_port))?,
                });
                layer = 3;
            }
            sys::IBV_FLOW_SPEC_ETH
            | sys::IBV_FLOW_SPEC_IPV4
            | sys::IBV_FLOW_SPEC_TCP
            | sys::IBV_FLOW_SPEC_UDP => {
                return Err(Unsupported(format!(
                    "flow spec type {spec_type:#x} out of order (Ethernet, IPv4, TCP/UDP)"
                )))
            }
            t => {
                return Err(Unsupported(format!(
                    "flow spec type {t:#x} is not modelled (Ethernet, IPv4, TCP and UDP are)"
                )))
            }
        }
        off += size;
    }
    let pattern = match kind {
        Kind::Normal if p == FlowPattern::default() => {
            return Err(Unsupported(
                "a NORMAL flow without specs is not modelled".into(),
            ))
        }
        Kind::Normal => p,
        // What ALL_DEFAULT and MC_DEFAULT take is fixed by their kind, whatever specs they carry.
        Kind::AllDefault => FlowPattern::default(),
        Kind::McDefault => FlowPattern {
            eth: Some(EthMatch {
                dst: Masked {
                    value: [1, 0, 0, 0, 0, 0],
                    mask: [1, 0, 0, 0, 0, 0],
                },
                ..EthMatch::default()
            }),
            ..FlowPattern::default()
        },
    };
    Ok(Match {
        kind,
        priority: prio,
        pattern,
    })
}

/// Map verbs RX hash fields to the model's, as mlx4_ib accepts them: source and destination of
/// one kind always together, ports only with an IP version.
pub(crate) fn rss_fields(mask: u64) -> Result<RssFields, Unsupported> {
    let pair = |src: u32, dst: u32, what: &str| -> Result<bool, Unsupported> {
        match (mask & u64::from(src) != 0, mask & u64::from(dst) != 0) {
            (true, true) => Ok(true),
            (false, false) => Ok(false),
            _ => Err(Unsupported(format!(
                "RX hash fields {mask:#x}: {what} source and destination must be hashed together"
            ))),
        }
    };
    let known = sys::IBV_RX_HASH_SRC_IPV4
        | sys::IBV_RX_HASH_DST_IPV4
        | sys::IBV_RX_HASH_SRC_IPV6
        | sys::IBV_RX_HASH_DST_IPV6
        | sys::IBV_RX_HASH_SRC_PORT_TCP
        | sys::IBV_RX_HASH_DST_PORT_TCP
        | sys::IBV_RX_HASH_SRC_PORT_UDP
        | sys::IBV_RX_HASH_DST_PORT_UDP;
    if mask & !u64::from(known) != 0 {
        return Err(Unsupported(format!(
            "RX hash fields {:#x} are not supported",
            mask & !u64::from(known)
        )));
    }
    let v4 = pair(sys::IBV_RX_HASH_SRC_IPV4, sys::IBV_RX_HASH_DST_IPV4, "IPv4")?;
    let v6 = pair(sys::IBV_RX_HASH_SRC_IPV6, sys::IBV_RX_HASH_DST_IPV6, "IPv6")?;
    let tcp = pair(
        sys::IBV_RX_HASH_SRC_PORT_TCP,
        sys::IBV_RX_HASH_DST_PORT_TCP,
        "TCP port",
    )?;
    let udp = pair(
        sys::IBV_RX_HASH_SRC_PORT_UDP,
        sys::IBV_RX_HASH_DST_PORT_UDP,
        "UDP port",
    )?;
    if (tcp || udp) && !(v4 || v6) {
        return Err(Unsupported(format!(
            "RX hash fields {mask:#x}: ports are hashed only together with IPv4 or IPv6"
        )));
    }
    let mut f = RssFields::NONE;
    if v4 {
        f |= RssFields::IPV4;
        if tcp {
            f |= RssFields::IPV4_TCP;
        }
        if udp {
            f |= RssFields::IPV4_UDP;
        }
    }
    if v6 {
        f |= RssFields::IPV6;
        if tcp {
            f |= RssFields::IPV6_TCP;
        }
        if udp {
            f |= RssFields::IPV6_UDP;
        }
    }
    Ok(f)
}

/// A hash QP as steering sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HashQp {
    pub key: [u8; mlx4_hca::RSS_KEY_LEN],
    pub fields: RssFields,
    /// The model RQs of the indirection table's WQs, in table order.
    pub rqs: Vec<u32>,
    /// In RTR: flows on it receive.
    pub ready: bool,
}

/// Where a flow sends what it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// A hash QP (its id in [`Steering::hash_qps`]).
    Hash(u32),
    /// A QP without a receive queue: what it matches is dropped.
    Nowhere,
}

/// A live flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flow {
    pub id: u64,
    pub target: Target,
    pub matches: Match,
}

/// All receive steering of one port.
#[derive(Debug, Default)]
pub(crate) struct Steering {
    pub hash_qps: Vec<(u32, HashQp)>,
    pub flows: Vec<Flow>,
}

/// A model flow rule to create: what it matches, how urgently, where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rule {
    pub priority: u16,
    pub pattern: FlowPattern,
    /// `Some(hash QP id)`: that QP's RSS context; `None`: drop.
    pub hash: Option<u32>,
}

/// What the model is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// One RSS context per hash QP some rule uses: (hash QP id, key, fields, RQs).
    pub contexts: Vec<(u32, HashQp)>,
    /// The rules, in creation order.
    pub rules: Vec<Rule>,
    /// Where the model cannot do what verbs asked.
    pub notes: Vec<String>,
}

/// The model priority of a verbs flow: `NORMAL` flows by their own priority, then the default
/// multicast rule, then the default of everything, as mlx4 orders them.
fn model_priority(m: &Match) -> u16 {
    match m.kind {
        Kind::Normal => m.priority.min(u16::MAX - 2),
        Kind::McDefault => u16::MAX - 1,
        Kind::AllDefault => u16::MAX,
    }
}

impl Steering {
    /// The model rules for the flows that receive (their hash QP is ready) or drop.
    pub(crate) fn plan(&self) -> Plan {
        let mut notes = Vec::new();
        let mut contexts: Vec<(u32, HashQp)> = Vec::new();
        let mut rules = Vec::new();
        for f in &self.flows {
            let hash = match f.target {
                Target::Nowhere => None,
                Target::Hash(id) => {
                    let Some((_, qp)) = self.hash_qps.iter().find(|(i, _)| *i == id) else {
                        continue;
                    };
                    if !qp.ready {
                        continue;
                    }
                    if qp.rqs.is_empty() {
                        notes.push(format!("hash QP {id} has no receive queue"));
                        continue;
                    }
                    if !contexts.iter().any(|(i, _)| *i == id) {
                        contexts.push((id, qp.clone()));
                    }
                    Some(id)
                }
            };
            rules.push(Rule {
                priority: model_priority(&f.matches),
                pattern: f.matches.pattern,
                hash,
            });
        }
        Plan {
            contexts,
            rules,
            notes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of a plain C struct, as the C caller hands it over.
    fn raw<T>(t: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a plain C struct of integers.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts((t as *const T).cast::<u8>(), std::mem::size_of::<T>())
                .to_vec()
        }
    }

    fn flow_bytes(attr_type: u32, priority: u16, specs: &[Vec<u8>]) -> Vec<u8> {
        let hdr = std::mem::size_of::<sys::ibv_flow_attr>();
        let attr = sys::ibv_flow_attr {
            type_: attr_type,
            num_of_specs: specs.len() as u8,
            port: 1,
            priority,
            size: (hdr + specs.iter().map(Vec::len).sum::<usize>()) as u16,
            ..Default::default()
        };
        let mut v = raw(&attr);
        for s in specs {
            v.extend(s);
        }
        v
    }

    fn eth(dst: [u8; 6], mask: [u8; 6], vlan: Option<(u16, u16)>) -> Vec<u8> {
        let mut s = sys::ibv_flow_spec_eth {
            type_: sys::IBV_FLOW_SPEC_ETH,
            size: std::mem::size_of::<sys::ibv_flow_spec_eth>() as u16,
            ..Default::default()
        };
        s.val.dst_mac = dst;
        s.mask.dst_mac = mask;
        if let Some((v, m)) = vlan {
            s.val.vlan_tag = v.to_be();
            s.mask.vlan_tag = m.to_be();
        }
        raw(&s)
    }

    fn ipv4(dst: [u8; 4], mask: [u8; 4]) -> Vec<u8> {
        let mut s = sys::ibv_flow_spec_ipv4 {
            type_: sys::IBV_FLOW_SPEC_IPV4,
            size: std::mem::size_of::<sys::ibv_flow_spec_ipv4>() as u16,
            ..Default::default()
        };
        s.val.dst_ip = u32::from_ne_bytes(dst);
        s.mask.dst_ip = u32::from_ne_bytes(mask);
        raw(&s)
    }

    fn udp_dst(port: u16) -> Vec<u8> {
        let mut s = sys::ibv_flow_spec_tcp_udp {
            type_: sys::IBV_FLOW_SPEC_UDP,
            size: std::mem::size_of::<sys::ibv_flow_spec_tcp_udp>() as u16,
            ..Default::default()
        };
        s.val.dst_port = port.to_be();
        s.mask.dst_port = 0xffff;
        raw(&s)
    }

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 7];

    #[test]
    fn dpdk_mlx4_rules_parse() {
        let b = flow_bytes(
            sys::IBV_FLOW_ATTR_NORMAL,
            0xfff,
            &[eth(MAC, [0xff; 6], None)],
        );
        let m = parse_flow(&b).unwrap();
        assert_eq!((m.kind, m.priority), (Kind::Normal, 0xfff));
        let e = m.pattern.eth.unwrap();
        assert_eq!((e.dst.value, e.dst.mask), (MAC, [0xff; 6]));
        assert_eq!((e.src.mask, e.ether_type.mask), ([0; 6], 0));
        assert!(m.pattern.vlan.is_none() && m.pattern.ipv4.is_none());
        // A MAC on VLAN 5, as DPDK's mlx4 writes it with VLAN filtering on.
        let b = flow_bytes(
            sys::IBV_FLOW_ATTR_NORMAL,
            0xfff,
            &[eth(MAC, [0xff; 6], Some((5, 0xfff)))],
        );
        let v = parse_flow(&b).unwrap().pattern.vlan.unwrap();
        assert_eq!((v.vid.value, v.vid.mask), (5, 0xfff));
        // testpmd's `eth / ipv4 dst is 10.0.0.2 / udp dst is 53`, with DPDK's empty eth spec.
        let b = flow_bytes(
            sys::IBV_FLOW_ATTR_NORMAL,
            0,
            &[
                eth([0; 6], [0; 6], None),
                ipv4([10, 0, 0, 2], [255; 4]),
                udp_dst(53),
            ],
        );
        let m = parse_flow(&b).unwrap();
        let ip = m.pattern.ipv4.unwrap();
        assert_eq!((ip.dst.value, ip.dst.mask), ([10, 0, 0, 2], [255; 4]));
        let l4 = m.pattern.l4.unwrap();
        assert_eq!(l4.proto, L4Proto::Udp);
        assert_eq!((l4.dst_port.value, l4.dst_port.mask), (53, 0xffff));
        assert_eq!(l4.src_port.mask, 0);
        // Promiscuous and all-multicast.
        let b = flow_bytes(sys::IBV_FLOW_ATTR_ALL_DEFAULT, 0, &[]);
        let m = parse_flow(&b).unwrap();
        assert_eq!(
            (m.kind, m.pattern),
            (Kind::AllDefault, FlowPattern::default())
        );
        let mc = [1, 0, 0, 0, 0, 0];
        let b = flow_bytes(sys::IBV_FLOW_ATTR_MC_DEFAULT, 0, &[eth(mc, mc, None)]);
        let m = parse_flow(&b).unwrap();
        assert_eq!(m.kind, Kind::McDefault);
        assert_eq!(m.pattern.eth.unwrap().dst.mask, mc);
    }

    #[test]
    fn unmodelled_rules_say_why() {
        let b = flow_bytes(
            sys::IBV_FLOW_ATTR_NORMAL,
            0,
            &[eth(MAC, [0xff; 6], Some((5, 0xffff)))],
        );
        assert!(parse_flow(&b).unwrap_err().0.contains("VLAN mask"));
        let b = flow_bytes(
            sys::IBV_FLOW_ATTR_NORMAL,
            0,
            &[udp_dst(53), eth(MAC, MAC, None)],
        );
        assert!(parse_flow(&b).unwrap_err().0.contains("out of order"));
        let mut v6 = eth(MAC, [0xff; 6], None);
        v6[0..4].copy_from_slice(&sys::IBV_FLOW_SPEC_IPV6.to_ne_bytes());
        let b = flow_bytes(sys::IBV_FLOW_ATTR_NORMAL, 0, &[v6]);
        assert!(parse_flow(&b).unwrap_err().0.contains("not modelled"));
        let b = flow_bytes(sys::IBV_FLOW_ATTR_NORMAL, 0, &[]);
        assert!(parse_flow(&b).unwrap_err().0.contains("without specs"));
        assert!(parse_flow(&b[..10]).is_err());
        let mut short = flow_bytes(sys::IBV_FLOW_ATTR_NORMAL, 0, &[eth(MAC, MAC, None)]);
        short.truncate(std::mem::size_of::<sys::ibv_flow_attr>() + 6);
        assert!(parse_flow(&short).unwrap_err().0.contains("does not fit"));
    }

    #[test]
    fn hash_fields_follow_mlx4_ib() {
        use sys::*;
        let ip4 = u64::from(IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4);
        let ip6 = u64::from(IBV_RX_HASH_SRC_IPV6 | IBV_RX_HASH_DST_IPV6);
        let tcp = u64::from(IBV_RX_HASH_SRC_PORT_TCP | IBV_RX_HASH_DST_PORT_TCP);
        let udp = u64::from(IBV_RX_HASH_SRC_PORT_UDP | IBV_RX_HASH_DST_PORT_UDP);
        assert_eq!(rss_fields(0), Ok(RssFields::NONE));
        assert_eq!(rss_fields(ip4), Ok(RssFields::IPV4));
        assert_eq!(
            rss_fields(ip4 | ip6 | tcp | udp),
            Ok(RssFields::ALL),
            "all pairs"
        );
        assert_eq!(
            rss_fields(ip6 | tcp),
            Ok(RssFields::IPV6 | RssFields::IPV6_TCP)
        );
        assert!(rss_fields(u64::from(IBV_RX_HASH_SRC_IPV4)).is_err());
        assert!(rss_fields(tcp).unwrap_err().0.contains("only together"));
        assert!(rss_fields(ip4 | u64::from(IBV_RX_HASH_INNER)).is_err());
    }

    fn hqp(rqs: &[u32], ready: bool) -> HashQp {
        HashQp {
            key: mlx4_hca::DEFAULT_RSS_KEY,
            fields: RssFields::IPV4,
            rqs: rqs.to_vec(),
            ready,
        }
    }

    fn mac_flow(id: u64, target: Target, priority: u16) -> Flow {
        let b = flow_bytes(
            sys::IBV_FLOW_ATTR_NORMAL,
            priority,
            &[eth(MAC, [0xff; 6], None)],
        );
        Flow {
            id,
            target,
            matches: parse_flow(&b).unwrap(),
        }
    }

    #[test]
    fn plans_from_flows() {
        let mut s = Steering::default();
        let empty = s.plan();
        assert!(
            empty.rules.is_empty() && empty.contexts.is_empty(),
            "nothing delivered"
        );
        s.hash_qps.push((1, hqp(&[0x40, 0x41], false)));
        s.flows.push(mac_flow(1, Target::Hash(1), 0xfff));
        assert!(s.plan().rules.is_empty(), "hash QP not ready");
        s.hash_qps[0].1.ready = true;
        let p = s.plan();
        assert_eq!(p.contexts.len(), 1);
        assert_eq!(p.contexts[0].1.rqs, vec![0x40, 0x41]);
        assert_eq!(p.rules.len(), 1);
        assert_eq!((p.rules[0].priority, p.rules[0].hash), (0xfff, Some(1)));
        // Defaults come after every NORMAL rule; a drop rule has no context.
        s.flows.push(Flow {
            id: 2,
            target: Target::Hash(1),
            matches: parse_flow(&flow_bytes(sys::IBV_FLOW_ATTR_ALL_DEFAULT, 0, &[])).unwrap(),
        });
        s.flows.push(mac_flow(3, Target::Nowhere, 0));
        s.hash_qps.push((2, hqp(&[0x42], true)));
        s.flows.push(mac_flow(4, Target::Hash(2), 1));
        let p = s.plan();
        let prios: Vec<_> = p.rules.iter().map(|r| (r.priority, r.hash)).collect();
        assert_eq!(
            prios,
            [
                (0xfff, Some(1)),
                (u16::MAX, Some(1)),
                (0, None),
                (1, Some(2))
            ]
        );
        assert_eq!(p.contexts.len(), 2, "one RSS context per hash QP");
        assert!(p.notes.is_empty(), "{:?}", p.notes);
    }
}
