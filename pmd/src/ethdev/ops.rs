//! Device ops: the `eth_dev_ops` table and the ops that configure, start, stop and close a
//! port, describe it, and set its receive filter and MTU.

use std::ffi::c_int;
use std::sync::LazyLock;
use std::time::Duration;

use dpdk_sys as sys;

use super::eth::{self, Eth};
use super::{filter, flow, fmt_mac, intr, invalid, qctl, queue, release, rss, stats, Error};
use crate::hw::Caps;
use crate::pmd_log;
use crate::port::{self, RxState};

/// The ops every port of this driver shares.
pub(super) static OPS: LazyLock<sys::eth_dev_ops> = LazyLock::new(|| sys::eth_dev_ops {
    dev_configure: Some(dev_configure),
    dev_start: Some(dev_start),
    dev_stop: Some(dev_stop),
    dev_close: Some(dev_close),
    dev_infos_get: Some(dev_infos_get),
    link_update: Some(link_update),
    stats_get: Some(release::stats_get),
    stats_reset: Some(stats::stats_reset),
    promiscuous_enable: Some(promiscuous_enable),
    promiscuous_disable: Some(promiscuous_disable),
    allmulticast_enable: Some(allmulticast_enable),
    allmulticast_disable: Some(allmulticast_disable),
    mac_addr_set: Some(mac_addr_set),
    mtu_set: Some(mtu_set),
    reta_update: Some(rss::reta_update),
    reta_query: Some(rss::reta_query),
    rss_hash_update: Some(rss::rss_hash_update),
    rss_hash_conf_get: Some(rss::rss_hash_conf_get),
    rxq_info_get: Some(queue::rxq_info_get),
    txq_info_get: Some(queue::txq_info_get),
    rx_queue_setup: Some(queue::rx_queue_setup),
    rx_queue_release: Some(queue::rx_queue_release),
    tx_queue_setup: Some(queue::tx_queue_setup),
    tx_queue_release: Some(queue::tx_queue_release),
    tx_done_cleanup: Some(queue::tx_done_cleanup),
    xstats_get: Some(stats::xstats_get),
    xstats_get_names: Some(stats::xstats_get_names),
    xstats_reset: Some(stats::xstats_reset),
    flow_ops_get: Some(flow::flow_ops_get),
    dev_set_link_up: Some(intr::dev_set_link_up),
    dev_set_link_down: Some(intr::dev_set_link_down),
    rx_queue_intr_enable: Some(intr::rx_queue_intr_enable),
    rx_queue_intr_disable: Some(intr::rx_queue_intr_disable),
    mac_addr_add: Some(filter::mac_addr_add),
    mac_addr_remove: Some(filter::mac_addr_remove),
    set_mc_addr_list: Some(filter::set_mc_addr_list),
    vlan_filter_set: Some(filter::vlan_filter_set),
    vlan_offload_set: Some(filter::vlan_offload_set),
    flow_ctrl_get: Some(filter::flow_ctrl_get),
    flow_ctrl_set: Some(filter::flow_ctrl_set),
    fw_version_get: Some(filter::fw_version_get),
    dev_supported_ptypes_get: Some(release::supported_ptypes),
    rx_queue_start: Some(qctl::rx_queue_start),
    rx_queue_stop: Some(qctl::rx_queue_stop),
    tx_queue_start: Some(qctl::tx_queue_start),
    tx_queue_stop: Some(qctl::tx_queue_stop),
    ..Default::default()
});

/// An `extern "C"` op taking only the device, running `$body` with `$e: &mut Eth`.
macro_rules! op {
    ($(#[$m:meta])* $name:ident, $what:literal, |$e:ident| $body:expr) => {
        $(#[$m])*
        pub(super) unsafe extern "C" fn $name(dev: *mut sys::rte_eth_dev) -> c_int {
            // SAFETY: ethdev calls ops only on live ports of this driver, one control op at a
            // time per port.
            unsafe { eth::run(dev, $what, |$e: &mut Eth<'_>| $body) }
        }
    };
}
pub(super) use op;

op!(dev_configure, "configure", |e| {
    e.primary_only()?;
    configure(e)
});
op!(dev_start, "start", |e| {
    e.primary_only()?;
    start(e)
});
op!(dev_stop, "stop", |e| {
    e.primary_only()?;
    stop(e);
    Ok(())
});
op!(promiscuous_enable, "promiscuous on", |e| update_rx(
    e,
    |r| { r.promisc = true }
));
op!(promiscuous_disable, "promiscuous off", |e| update_rx(
    e,
    |r| { r.promisc = false }
));
op!(allmulticast_enable, "all-multicast on", |e| update_rx(
    e,
    |r| { r.allmulti = true }
));
op!(allmulticast_disable, "all-multicast off", |e| update_rx(
    e,
    |r| { r.allmulti = false }
));

fn configure(e: &mut Eth<'_>) -> Result<(), Error> {
    let (rx, tx) = (e.nb_rx_queues(), e.nb_tx_queues());
    if rx > port::MAX_QUEUES || tx > port::MAX_QUEUES {
        return Err(invalid!(
            "{rx} RX / {tx} TX queues requested, at most {} each",
            port::MAX_QUEUES
        ));
    }
    e.port.reset_reta(rx);
    filter::configure(e);
    if e.mtu() != 0 {
        e.port.rx.mtu = e.mtu();
    }
    Ok(())
}

fn start(e: &mut Eth<'_>) -> Result<(), Error> {
    e.port.start(e.dev)?;
    apply_rx(e)?;
    flow::port_started(e)?;
    intr::setup_rx(e)?;
    e.set_queue_states(true);
    qctl::defer(e)?;
    let up = e.port.link_up(e.dev);
    e.set_link(up);
    Ok(())
}

fn stop(e: &mut Eth<'_>) {
    let (dev, name) = (e.dev, e.port.name);
    // Let the device send what tx_burst already took, then stop it.
    e.for_each_txq(|i, q| {
        if !q.drain(dev, Duration::from_secs(1)) {
            pmd_log!(
                WARNING,
                "{name}: TX queue {i}: the device did not drain within 1 s"
            );
        }
    });
    // A device that runs in the polling lcore finishes what reached the port, as its thread
    // would have (frames waiting at the port go to the receive queues or are counted).
    dev.poll();
    flow::port_stopping(e);
    e.port.stop(dev);
    // With the device stopped, every buffer still in flight is reclaimed and each queue
    // starts afresh at the next start.
    let lcore = e.lcore;
    e.for_each_txq(|i, q| {
        if let Err(err) = q.reset(dev) {
            pmd_log!(ERR, "{name}: TX queue {i}: reset failed: {err}");
        }
        if let Some(l) = lcore {
            l.set_sq(i, Some(q.qpn()));
        }
    });
    dev.rq_batch(e.nb_rx_queues());
    e.for_each_rxq(|i, q| {
        if let Err(err) = q.reset(dev) {
            pmd_log!(ERR, "{name}: RX queue {i}: reset failed: {err}");
        }
    });
    e.set_queue_states(false);
    e.set_link(false);
}

pub(super) unsafe extern "C" fn dev_close(dev: *mut sys::rte_eth_dev) -> c_int {
    // SAFETY: as for every op (see `op!`); the handler must be gone before the device.
    unsafe { intr::uninstall(dev) };
    // SAFETY: as for every op (see `op!`).
    if let Some(name) = unsafe { eth::close(dev) } {
        pmd_log!(INFO, "{name}: closed");
    }
    0
}

/// Pushes the port's receive settings to the device: filter, MTU, RSS, and the redirection
/// table over the current RX queues.
pub(super) fn apply_rx(e: &mut Eth<'_>) -> Result<(), Error> {
    let mut qpns = Vec::new();
    e.for_each_rxq(|_, q| qpns.push(q.qpn()));
    Ok(e.port.apply_rx(e.dev, &qpns)?)
}

/// Changes one receive setting and applies it.
pub(super) fn update_rx(e: &mut Eth<'_>, f: impl FnOnce(&mut RxState)) -> Result<(), Error> {
    e.primary_only()?;
    f(&mut e.port.rx);
    apply_rx(e)
}

unsafe extern "C" fn dev_infos_get(
    dev: *mut sys::rte_eth_dev,
    info: *mut sys::rte_eth_dev_info,
) -> c_int {
    // SAFETY: ethdev passes a live port of ours and a zeroed info struct of its own.
    let info = unsafe { &mut *info };
    // SAFETY: as for every op.
    unsafe {
        eth::run(dev, "device info", |e| {
            infos(info, &e.port.caps);
            Ok(())
        })
    }
}

/// TX offloads the WQE carries (checksums, VLAN insertion) or the queue implements.
pub(super) const TX_OFFLOAD_CAPA: u64 = sys::bits::RTE_ETH_TX_OFFLOAD_VLAN_INSERT
    | sys::bits::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM
    | sys::bits::RTE_ETH_TX_OFFLOAD_UDP_CKSUM
    | sys::bits::RTE_ETH_TX_OFFLOAD_TCP_CKSUM
    | sys::bits::RTE_ETH_TX_OFFLOAD_MULTI_SEGS
    | sys::bits::RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE
    | sys::bits::RTE_ETH_TX_OFFLOAD_TCP_TSO;

/// RX offloads: checksum verdicts, RSS hash, scattered frames.
pub(super) const RX_OFFLOAD_CAPA: u64 = sys::bits::RTE_ETH_RX_OFFLOAD_IPV4_CKSUM
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

/// The packet types the port's receive path recognises, ending with `RTE_PTYPE_UNKNOWN` (0);
/// None for a port that is gone.
///
/// # Safety
/// As for every op.
pub(super) unsafe fn supported_ptypes(dev: *mut sys::rte_eth_dev) -> Option<&'static [u32]> {
    // SAFETY: as for every op.
    let tunnel = unsafe { eth::query(dev, |e| e.port.caps.tunnel_offloads) }?;
    Some(if tunnel { &PTYPES_TUNNEL } else { &PTYPES })
}

unsafe extern "C" fn link_update(dev: *mut sys::rte_eth_dev, _wait: c_int) -> c_int {
    // SAFETY: as for every op.
    unsafe {
        eth::run(dev, "link update", |e| {
            // A secondary reads the link the primary keeps in the shared device data.
            if !super::mp::secondary() {
                let up = e.port.link_up(e.dev);
                e.set_link(up);
            }
            Ok(())
        })
    }
}

unsafe extern "C" fn mac_addr_set(
    dev: *mut sys::rte_eth_dev,
    mac: *mut sys::rte_ether_addr,
) -> c_int {
    // SAFETY: ethdev passes a valid address (and stores it in mac_addrs itself).
    let mac = unsafe { (*mac).addr_bytes };
    // SAFETY: as for every op.
    unsafe {
        eth::run(dev, "set MAC", |e| {
            if mac[0] & 1 != 0 || mac == [0; 6] {
                return Err(invalid!("{} is not a unicast address", fmt_mac(&mac)));
            }
            e.primary_only()?;
            e.port.mac = mac;
            apply_rx(e)
        })
    }
}

unsafe extern "C" fn mtu_set(dev: *mut sys::rte_eth_dev, mtu: u16) -> c_int {
    // SAFETY: as for every op.
    unsafe {
        eth::run(dev, "set MTU", |e| {
            if !(port::MIN_MTU..=port::MAX_MTU).contains(&mtu) {
                return Err(invalid!(
                    "MTU {mtu} outside {}..={}",
                    port::MIN_MTU,
                    port::MAX_MTU
                ));
            }
            update_rx(e, |r| r.mtu = mtu)
        })
    }
}
