//! Receive steering as verbs expresses it (flows attached to hash QPs over WQ indirection
//! tables) turned into what the model can do (one MAC filter with promiscuous and all-multicast
//! switches, one RSS key and field set, one indirection table per port).
//!
//! Where verbs asks for more than the model has, the plan says so in `notes`: the stand-in logs
//! them, and the README's fidelity list names each with the spec section that decides it.

use mlx4_hca::RssFields;

use crate::sys;

/// What a flow matches, as far as the model can filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Match {
    /// Destination MAC (unicast, multicast or broadcast), optionally with a VLAN ID.
    Mac { mac: [u8; 6], vlan: Option<u16> },
    /// Every frame not taken by another rule (`IBV_FLOW_ATTR_ALL_DEFAULT`): promiscuous.
    AllDefault,
    /// Every multicast frame not taken by another rule (`IBV_FLOW_ATTR_MC_DEFAULT`).
    McDefault,
}

/// Why a flow cannot be created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unsupported(pub String);

/// Parse a flow attribute and the specs that follow it (`attr.size` bytes in all).
///
/// Supported: `NORMAL` with one Ethernet spec matching the whole destination MAC (and nothing
/// else but, optionally, the VLAN ID), `ALL_DEFAULT`, `MC_DEFAULT` with at most such an Ethernet
/// spec (DPDK's mlx4 uses exactly these for MAC, promiscuous and all-multicast rules).
pub(crate) fn parse_flow(bytes: &[u8]) -> Result<Match, Unsupported> {
    let hdr_len = std::mem::size_of::<sys::ibv_flow_attr>();
    if bytes.len() < hdr_len {
        return Err(Unsupported(format!(
            "flow attribute of {} bytes is shorter than its header",
            bytes.len()
        )));
    }
    let u32_at = |o: usize| u32::from_ne_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    let u16_at = |o: usize| u16::from_ne_bytes(bytes[o..o + 2].try_into().expect("2 bytes"));
    let attr_type = u32_at(std::mem::offset_of!(sys::ibv_flow_attr, type_));
    let num_specs = bytes[std::mem::offset_of!(sys::ibv_flow_attr, num_of_specs)];
    let flags = u32_at(std::mem::offset_of!(sys::ibv_flow_attr, flags));
    if flags != 0 {
        return Err(Unsupported(format!(
            "flow flags {flags:#x} are not modelled"
        )));
    }
    let mut off = hdr_len;
    let mut eth: Option<([u8; 6], Option<u16>)> = None;
    for _ in 0..num_specs {
        if off + 8 > bytes.len() {
            return Err(Unsupported(
                "flow specs run past the attribute's size".into(),
            ));
        }
        let spec_type = u32_at(off);
        let spec_size = u16_at(off + 4) as usize;
        if spec_size < 8 || off + spec_size > bytes.len() {
            return Err(Unsupported(format!(
                "flow spec of {spec_size} bytes at offset {off} does not fit"
            )));
        }
        if spec_type != sys::IBV_FLOW_SPEC_ETH {
            return Err(Unsupported(format!(
                "flow spec type {spec_type:#x} is not modelled (the model filters on the \
                 destination MAC only)"
            )));
        }
        if spec_size < std::mem::size_of::<sys::ibv_flow_spec_eth>() {
            return Err(Unsupported("Ethernet flow spec too short".into()));
        }
        let val = off + std::mem::offset_of!(sys::ibv_flow_spec_eth, val);
        let mask = off + std::mem::offset_of!(sys::ibv_flow_spec_eth, mask);
        let f = |base: usize, field: usize| base + field;
        let dst = std::mem::offset_of!(sys::ibv_flow_eth_filter, dst_mac);
        let src = std::mem::offset_of!(sys::ibv_flow_eth_filter, src_mac);
        let etype = std::mem::offset_of!(sys::ibv_flow_eth_filter, ether_type);
        let vlan = std::mem::offset_of!(sys::ibv_flow_eth_filter, vlan_tag);
        let dst_val: [u8; 6] = bytes[f(val, dst)..f(val, dst) + 6].try_into().expect("6");
        let dst_mask: [u8; 6] = bytes[f(mask, dst)..f(mask, dst) + 6].try_into().expect("6");
        if bytes[f(mask, src)..f(mask, src) + 6]
            .iter()
            .any(|&b| b != 0)
            || u16_at(f(mask, etype)) != 0
        {
            return Err(Unsupported(
                "flows on the source MAC or EtherType are not modelled".into(),
            ));
        }
        let vlan_mask = u16::from_be(u16_at(f(mask, vlan)));
        let vlan_val = u16::from_be(u16_at(f(val, vlan)));
        let vlan = match vlan_mask {
            0 => None,
            0x0fff => Some(vlan_val & 0x0fff),
            m => {
                return Err(Unsupported(format!(
                    "VLAN mask {m:#06x} is not modelled (only the whole VLAN ID)"
                )))
            }
        };
        match attr_type {
            sys::IBV_FLOW_ATTR_NORMAL if dst_mask == [0xff; 6] => {
                eth = Some((dst_val, vlan));
            }
            sys::IBV_FLOW_ATTR_MC_DEFAULT | sys::IBV_FLOW_ATTR_ALL_DEFAULT => {}
            _ => {
                return Err(Unsupported(format!(
                    "destination MAC mask {dst_mask:02x?} is not modelled (only the whole \
                     address)"
                )))
            }
        }
        off += spec_size;
    }
    match attr_type {
        sys::IBV_FLOW_ATTR_NORMAL => match eth {
            Some((mac, vlan)) => Ok(Match::Mac { mac, vlan }),
            None => Err(Unsupported(
                "a NORMAL flow without an Ethernet spec is not modelled".into(),
            )),
        },
        sys::IBV_FLOW_ATTR_ALL_DEFAULT => Ok(Match::AllDefault),
        sys::IBV_FLOW_ATTR_MC_DEFAULT => Ok(Match::McDefault),
        t => Err(Unsupported(format!(
            "flow attribute type {t} is not modelled"
        ))),
    }
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

/// What the model is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// `Hca::set_rx_steering`.
    pub table: Vec<u32>,
    /// `Hca::set_rss`, when a hash QP receives.
    pub rss: Option<([u8; mlx4_hca::RSS_KEY_LEN], RssFields)>,
    /// `Hca::set_rx_filter`: (mac, promiscuous, all-multicast).
    pub filter: ([u8; 6], bool, bool),
    /// Where the model cannot do what verbs asked.
    pub notes: Vec<String>,
}

fn is_multicast(mac: &[u8; 6]) -> bool {
    mac[0] & 1 != 0
}

impl Steering {
    /// The model settings for the flows that receive (their hash QP is ready).
    pub(crate) fn plan(&self) -> Plan {
        let mut notes = Vec::new();
        let mut chosen: Option<u32> = None;
        let (mut promisc, mut allmulti) = (false, false);
        let mut unicast: Vec<[u8; 6]> = Vec::new();
        let mut multicast = 0usize;
        let mut vlans = false;
        for f in &self.flows {
            let Target::Hash(id) = f.target else {
                notes.push(
                    "a flow steers to a QP without receive queue (a drop rule): the model has no \
                     per-flow drop, frames it matches are delivered by the other rules"
                        .into(),
                );
                continue;
            };
            let Some((_, qp)) = self.hash_qps.iter().find(|(i, _)| *i == id) else {
                continue;
            };
            if !qp.ready {
                continue;
            }
            match chosen {
                None => chosen = Some(id),
                Some(c) if c != id => {
                    if let Some((_, other)) = self.hash_qps.iter().find(|(i, _)| *i == c) {
                        if other.rqs != qp.rqs || other.key != qp.key || other.fields != qp.fields {
                            notes.push(format!(
                                "flows steer to two different RSS contexts; the model has one \
                                 per port and uses the first (hash QP {c})"
                            ));
                        }
                    }
                }
                Some(_) => {}
            }
            match f.matches {
                Match::AllDefault => promisc = true,
                Match::McDefault => allmulti = true,
                Match::Mac { mac, vlan } => {
                    vlans |= vlan.is_some();
                    if mac == [0xff; 6] {
                        // The model always accepts broadcast.
                    } else if is_multicast(&mac) {
                        multicast += 1;
                    } else if !unicast.contains(&mac) {
                        unicast.push(mac);
                    }
                }
            }
        }
        if vlans {
            notes.push("VLAN-qualified MAC flows: the model does not filter on the VLAN ID".into());
        }
        if multicast > 0 && !allmulti && !promisc {
            notes.push(format!(
                "{multicast} multicast MAC flow(s): the model filters multicast only as a whole \
                 (all-multicast off drops them)"
            ));
        }
        if unicast.len() > 1 && !promisc {
            notes.push(format!(
                "{} unicast MAC flows: the model filters one MAC; frames to the others count as \
                 rx_drops_filter",
                unicast.len()
            ));
        }
        let hash = chosen.and_then(|c| self.hash_qps.iter().find(|(i, _)| *i == c));
        Plan {
            table: hash.map(|(_, q)| q.rqs.clone()).unwrap_or_default(),
            rss: hash.map(|(_, q)| (q.key, q.fields)),
            filter: (
                unicast.first().copied().unwrap_or([0; 6]),
                promisc,
                allmulti,
            ),
            notes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow_bytes(attr_type: u32, specs: &[sys::ibv_flow_spec_eth]) -> Vec<u8> {
        let mut attr = sys::ibv_flow_attr {
            type_: attr_type,
            num_of_specs: specs.len() as u8,
            port: 1,
            ..Default::default()
        };
        let hdr = std::mem::size_of::<sys::ibv_flow_attr>();
        let spec = std::mem::size_of::<sys::ibv_flow_spec_eth>();
        attr.size = (hdr + std::mem::size_of_val(specs)) as u16;
        let mut v = Vec::new();
        // SAFETY: both are plain C structs without padding-sensitive invariants; reading their
        // bytes is how the C caller hands them over.
        #[allow(unsafe_code)]
        unsafe {
            v.extend_from_slice(std::slice::from_raw_parts(
                (&attr as *const sys::ibv_flow_attr).cast::<u8>(),
                hdr,
            ));
            for s in specs {
                v.extend_from_slice(std::slice::from_raw_parts(
                    (s as *const sys::ibv_flow_spec_eth).cast::<u8>(),
                    spec,
                ));
            }
        }
        v
    }

    fn eth(dst: [u8; 6], mask: [u8; 6], vlan: Option<(u16, u16)>) -> sys::ibv_flow_spec_eth {
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
        s
    }

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 7];

    #[test]
    fn dpdk_mlx4_rules_parse() {
        let b = flow_bytes(sys::IBV_FLOW_ATTR_NORMAL, &[eth(MAC, [0xff; 6], None)]);
        assert_eq!(
            parse_flow(&b),
            Ok(Match::Mac {
                mac: MAC,
                vlan: None
            })
        );
        let b = flow_bytes(
            sys::IBV_FLOW_ATTR_NORMAL,
            &[eth(MAC, [0xff; 6], Some((5, 0xfff)))],
        );
        assert_eq!(
            parse_flow(&b),
            Ok(Match::Mac {
                mac: MAC,
                vlan: Some(5)
            })
        );
        let b = flow_bytes(sys::IBV_FLOW_ATTR_ALL_DEFAULT, &[]);
        assert_eq!(parse_flow(&b), Ok(Match::AllDefault));
        let m = [1, 0, 0, 0, 0, 0];
        let b = flow_bytes(sys::IBV_FLOW_ATTR_MC_DEFAULT, &[eth(m, m, None)]);
        assert_eq!(parse_flow(&b), Ok(Match::McDefault));
    }

    #[test]
    fn unmodelled_rules_say_why() {
        let b = flow_bytes(
            sys::IBV_FLOW_ATTR_NORMAL,
            &[eth(MAC, [0xff, 0xff, 0, 0, 0, 0], None)],
        );
        assert!(parse_flow(&b).unwrap_err().0.contains("mask"));
        let b = flow_bytes(
            sys::IBV_FLOW_ATTR_NORMAL,
            &[eth(MAC, [0xff; 6], Some((5, 0xf)))],
        );
        assert!(parse_flow(&b).unwrap_err().0.contains("VLAN mask"));
        let mut ip = flow_bytes(sys::IBV_FLOW_ATTR_NORMAL, &[eth(MAC, [0xff; 6], None)]);
        let hdr = std::mem::size_of::<sys::ibv_flow_attr>();
        ip[hdr..hdr + 4].copy_from_slice(&sys::IBV_FLOW_SPEC_IPV4.to_ne_bytes());
        assert!(parse_flow(&ip).unwrap_err().0.contains("spec type 0x30"));
        assert!(parse_flow(&ip[..10]).is_err());
        let mut short = flow_bytes(sys::IBV_FLOW_ATTR_NORMAL, &[eth(MAC, [0xff; 6], None)]);
        short.truncate(hdr + 6);
        assert!(parse_flow(&short).unwrap_err().0.contains("past"));
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

    #[test]
    fn plans_from_flows() {
        let mut s = Steering::default();
        assert_eq!(
            s.plan(),
            Plan {
                table: vec![],
                rss: None,
                filter: ([0; 6], false, false),
                notes: vec![]
            },
            "nothing steered: only broadcast passes the filter"
        );
        s.hash_qps.push((1, hqp(&[0x41, 0x42], false)));
        let mac = |id, mac| Flow {
            id,
            target: Target::Hash(1),
            matches: Match::Mac { mac, vlan: None },
        };
        s.flows.push(mac(1, MAC));
        s.flows.push(mac(2, [0xff; 6]));
        assert_eq!(s.plan().table, Vec::<u32>::new(), "hash QP not ready");
        s.hash_qps[0].1.ready = true;
        let p = s.plan();
        assert_eq!(p.table, vec![0x41, 0x42]);
        assert_eq!(p.rss, Some((mlx4_hca::DEFAULT_RSS_KEY, RssFields::IPV4)));
        assert_eq!(p.filter, (MAC, false, false));
        assert!(p.notes.is_empty(), "{:?}", p.notes);
        s.flows.push(Flow {
            id: 3,
            target: Target::Hash(1),
            matches: Match::AllDefault,
        });
        assert_eq!(s.plan().filter, (MAC, true, false));
        s.flows.pop();
        s.flows.push(mac(4, [2, 0, 0, 0, 0, 8]));
        let p = s.plan();
        assert_eq!(p.filter, (MAC, false, false));
        assert!(p.notes[0].contains("2 unicast MAC flows"), "{:?}", p.notes);
        s.hash_qps.push((2, hqp(&[0x43], true)));
        s.flows.push(Flow {
            id: 5,
            target: Target::Hash(2),
            matches: Match::McDefault,
        });
        let p = s.plan();
        assert_eq!(p.table, vec![0x41, 0x42], "first context wins");
        assert!(p.filter.2);
        assert!(p
            .notes
            .iter()
            .any(|n| n.contains("two different RSS contexts")));
        s.flows.push(Flow {
            id: 6,
            target: Target::Nowhere,
            matches: Match::AllDefault,
        });
        assert!(s.plan().notes.iter().any(|n| n.contains("drop rule")));
    }
}
