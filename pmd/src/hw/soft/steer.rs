//! RSS and flow rules in the model's terms: the device's hash fields and rule patterns map
//! one to one onto the model's.

use mlx4_hca::RssFields;

use crate::hw::flow::{FlowPattern, L4Proto, Masked};
use crate::hw::RssHash;

pub(super) fn rss_fields(h: RssHash) -> RssFields {
    let mut f = RssFields::NONE;
    for (ours, theirs) in [
        (RssHash::IPV4, RssFields::IPV4),
        (RssHash::IPV4_TCP, RssFields::IPV4_TCP),
        (RssHash::IPV4_UDP, RssFields::IPV4_UDP),
        (RssHash::IPV6, RssFields::IPV6),
        (RssHash::IPV6_TCP, RssFields::IPV6_TCP),
        (RssHash::IPV6_UDP, RssFields::IPV6_UDP),
    ] {
        if h.contains(ours) {
            f |= theirs;
        }
    }
    f
}

fn masked<T: Copy>(m: Masked<T>) -> mlx4_hca::Masked<T> {
    mlx4_hca::Masked {
        value: m.value,
        mask: m.mask,
    }
}

/// The model's pattern for a device rule: it matches more than the device offers, so every
/// field maps onto one of its fields under the same mask.
pub(super) fn model_pattern(p: &FlowPattern) -> mlx4_hca::FlowPattern {
    mlx4_hca::FlowPattern {
        eth: p.eth_dst.map(|dst| mlx4_hca::EthMatch {
            dst: mlx4_hca::Masked::exact(dst, [0xff; 6]),
            ..Default::default()
        }),
        vlan: p.vlan.map(|vid| mlx4_hca::VlanMatch {
            vid: vid.map_or_else(Default::default, |v| mlx4_hca::Masked::exact(v, 0xfff)),
        }),
        ipv4: p.ipv4.map(|ip| mlx4_hca::Ipv4Match {
            src: masked(ip.src),
            dst: masked(ip.dst),
        }),
        l4: p.l4.map(|l4| mlx4_hca::L4Match {
            proto: match l4.proto {
                L4Proto::Tcp => mlx4_hca::L4Proto::Tcp,
                L4Proto::Udp => mlx4_hca::L4Proto::Udp,
            },
            src_port: masked(l4.src_port),
            dst_port: masked(l4.dst_port),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_hash_maps_each_field_set() {
        assert_eq!(rss_fields(RssHash::NONE), RssFields::NONE);
        let all = RssHash::IPV4
            | RssHash::IPV4_TCP
            | RssHash::IPV4_UDP
            | RssHash::IPV6
            | RssHash::IPV6_TCP
            | RssHash::IPV6_UDP;
        assert_eq!(rss_fields(all), RssFields::ALL);
        assert_eq!(
            rss_fields(RssHash::IPV4 | RssHash::IPV6_UDP),
            RssFields::IPV4 | RssFields::IPV6_UDP
        );
    }

    #[test]
    fn default_key_is_the_devices() {
        assert_eq!(crate::hw::DEFAULT_RSS_KEY, mlx4_hca::DEFAULT_RSS_KEY);
    }
}
