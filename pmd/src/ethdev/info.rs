//! What a port tells about itself: `dev_infos_get` and the packet types it recognises.

use std::ffi::c_int;

use dpdk_sys as sys;

use super::eth::{given, ops, Eth};
use super::Error;
use crate::hw::Caps;
use crate::port;

ops! {
    fn dev_infos_get(info: *mut sys::rte_eth_dev_info) -> c_int = shared infos_op, "device info";
}

fn infos_op(e: &Eth<'_>, info: Option<&mut sys::rte_eth_dev_info>) -> Result<(), Error> {
    infos(given(info)?, &e.port.caps);
    Ok(())
}

/// TX offloads the WQE carries (checksums, VLAN insertion) or the queue implements.
const TX_OFFLOAD_CAPA: u64 = sys::bits::RTE_ETH_TX_OFFLOAD_VLAN_INSERT
    | sys::bits::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM
    | sys::bits::RTE_ETH_TX_OFFLOAD_UDP_CKSUM
    | sys::bits::RTE_ETH_TX_OFFLOAD_TCP_CKSUM
    | sys::bits::RTE_ETH_TX_OFFLOAD_MULTI_SEGS
    | sys::bits::RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE
    | sys::bits::RTE_ETH_TX_OFFLOAD_TCP_TSO;

/// RX offloads: checksum verdicts, RSS hash, scattered frames.
const RX_OFFLOAD_CAPA: u64 = sys::bits::RTE_ETH_RX_OFFLOAD_IPV4_CKSUM
    | sys::bits::RTE_ETH_RX_OFFLOAD_UDP_CKSUM
    | sys::bits::RTE_ETH_RX_OFFLOAD_TCP_CKSUM
    | sys::bits::RTE_ETH_RX_OFFLOAD_RSS_HASH
    | sys::bits::RTE_ETH_RX_OFFLOAD_SCATTER;

fn infos(info: &mut sys::rte_eth_dev_info, caps: &Caps) {
    info.max_rx_queues = port::MAX_QUEUES;
    info.max_tx_queues = port::MAX_QUEUES;
    info.max_mac_addrs = caps.max_mac_addrs.clamp(1, port::MAX_MAC_ADDRS as u32);
    info.min_rx_bufsize = 32;
    info.max_rx_pktlen = u32::from(port::MAX_MTU) + 18;
    info.min_mtu = port::MIN_MTU;
    info.max_mtu = port::MAX_MTU;
    info.speed_capa = sys::bits::RTE_ETH_LINK_SPEED_40G;
    let lim = sys::rte_eth_desc_lim {
        nb_max: port::MAX_DESC,
        nb_min: port::MIN_DESC,
        nb_align: 1,
        ..Default::default()
    };
    info.rx_desc_lim = lim;
    info.tx_desc_lim = lim;
    let conf = sys::rte_eth_dev_portconf {
        burst_size: port::DEFAULT_BURST,
        ring_size: port::DEFAULT_RING,
        nb_queues: 1,
    };
    info.default_rxportconf = conf;
    info.default_txportconf = conf;
    info.tx_offload_capa = TX_OFFLOAD_CAPA;
    info.tx_desc_lim.nb_seg_max = crate::wqe::MAX_GATHER_SEGS as u16;
    info.tx_desc_lim.nb_mtu_seg_max = crate::wqe::MAX_GATHER_SEGS as u16;
    info.tx_queue_offload_capa = 0;
    info.reta_size = port::RETA_SIZE as u16;
    info.hash_key_size = crate::hw::RSS_KEY_LEN as u8;
    info.flow_type_rss_offloads = port::RSS_HF_ALL;
    info.rx_offload_capa = RX_OFFLOAD_CAPA;
    if caps.keep_crc {
        info.rx_offload_capa |= sys::bits::RTE_ETH_RX_OFFLOAD_KEEP_CRC;
    }
    if caps.vlan_filter {
        info.rx_offload_capa |= sys::bits::RTE_ETH_RX_OFFLOAD_VLAN_FILTER;
    }
    if caps.tunnel_offloads {
        // VXLAN: the outer IP checksum on send (inner ones through IIP/ILP), the outer
        // verdicts on receive.
        info.tx_offload_capa |= sys::bits::RTE_ETH_TX_OFFLOAD_OUTER_IPV4_CKSUM;
        info.rx_offload_capa |= sys::bits::RTE_ETH_RX_OFFLOAD_OUTER_IPV4_CKSUM;
    }
    info.rx_queue_offload_capa = 0;
    // Flow rules are kept across a restart (see `flow`).
    info.dev_capa |= sys::bits::RTE_ETH_DEV_CAPA_FLOW_RULE_KEEP;
}

/// The packet types the RX path sets (`rxq::parse_rx_cqe`, `rxq::with_tunnel`), ending with
/// RTE_PTYPE_UNKNOWN (0).
static PTYPES: [u32; 7] = {
    use crate::rxq::*;
    [
        PTYPE_L2_ETHER,
        PTYPE_L3_IPV4_EXT_UNKNOWN,
        PTYPE_L3_IPV6_EXT_UNKNOWN,
        PTYPE_L4_FRAG,
        PTYPE_L4_TCP,
        PTYPE_L4_UDP,
        0,
    ]
};
/// As [`PTYPES`], with the tunnel and inner types of a ConnectX-3 Pro.
static PTYPES_TUNNEL: [u32; 13] = {
    use crate::rxq::*;
    [
        PTYPE_L2_ETHER,
        PTYPE_L3_IPV4_EXT_UNKNOWN,
        PTYPE_L3_IPV6_EXT_UNKNOWN,
        PTYPE_L4_FRAG,
        PTYPE_L4_TCP,
        PTYPE_L4_UDP,
        PTYPE_TUNNEL_VXLAN,
        PTYPE_INNER_L2_ETHER,
        PTYPE_L3_IPV4_EXT_UNKNOWN << 16,
        PTYPE_L3_IPV6_EXT_UNKNOWN << 16,
        PTYPE_L4_TCP << 16,
        PTYPE_L4_UDP << 16,
        0,
    ]
};

/// The packet types the port's receive path recognises, ending with `RTE_PTYPE_UNKNOWN` (0).
pub(super) fn supported_ptypes(e: &Eth<'_>) -> &'static [u32] {
    if e.port.caps.tunnel_offloads {
        &PTYPES_TUNNEL
    } else {
        &PTYPES
    }
}
