//! Device ops: the `eth_dev_ops` table and the ops that configure, start, stop and close a
//! port, and set its receive filter, MAC and MTU.

use std::ffi::c_int;
use std::sync::LazyLock;
use std::time::Duration;

use dpdk_sys as sys;

use super::eth::{self, given, ops, Eth, EthMut};
use super::{filter, flow, fmt_mac, info, intr, invalid, qctl, queue, release, rss, stats, Error};
use crate::pmd_log;
use crate::port;

/// The ops every port of this driver shares.
pub(super) static OPS: LazyLock<sys::eth_dev_ops> = LazyLock::new(|| sys::eth_dev_ops {
    dev_configure: Some(dev_configure),
    dev_start: Some(dev_start),
    dev_stop: Some(dev_stop),
    dev_close: Some(dev_close),
    dev_infos_get: Some(info::dev_infos_get),
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

ops! {
    fn dev_configure() -> c_int = exclusive configure, "configure";
    fn dev_start() -> c_int = exclusive start, "start";
    fn dev_stop() -> c_int = exclusive stop, "stop";
    fn promiscuous_enable() -> c_int = exclusive promisc_on, "promiscuous on";
    fn promiscuous_disable() -> c_int = exclusive promisc_off, "promiscuous off";
    fn allmulticast_enable() -> c_int = exclusive allmulti_on, "all-multicast on";
    fn allmulticast_disable() -> c_int = exclusive allmulti_off, "all-multicast off";
    fn link_update(_wait: c_int) -> c_int = shared link, "link update";
    fn mac_addr_set(mac: *mut sys::rte_ether_addr) -> c_int = exclusive set_mac, "set MAC";
    fn mtu_set(mtu: u16) -> c_int = exclusive set_mtu, "set MTU";
}

fn promisc_on(e: &mut EthMut<'_>) -> Result<(), Error> {
    e.update_rx(|r| r.promisc = true)
}

fn promisc_off(e: &mut EthMut<'_>) -> Result<(), Error> {
    e.update_rx(|r| r.promisc = false)
}

fn allmulti_on(e: &mut EthMut<'_>) -> Result<(), Error> {
    e.update_rx(|r| r.allmulti = true)
}

fn allmulti_off(e: &mut EthMut<'_>) -> Result<(), Error> {
    e.update_rx(|r| r.allmulti = false)
}

fn configure(e: &mut EthMut<'_>) -> Result<(), Error> {
    e.primary_only()?;
    let (rx, tx) = (e.conf.nb_rx_queues, e.conf.nb_tx_queues);
    if rx > port::MAX_QUEUES || tx > port::MAX_QUEUES {
        return Err(invalid!(
            "{rx} RX / {tx} TX queues requested, at most {} each",
            port::MAX_QUEUES
        ));
    }
    e.port.reset_reta(rx);
    filter::configure(e);
    if e.conf.mtu != 0 {
        e.port.rx.mtu = e.conf.mtu;
    }
    Ok(())
}

fn start(e: &mut EthMut<'_>) -> Result<(), Error> {
    e.primary_only()?;
    e.port.start(e.dev)?;
    e.apply_rx()?;
    flow::port_started(e)?;
    intr::setup_rx(e)?;
    e.set_queue_states(true);
    qctl::defer(e)?;
    let up = e.port.link_up(e.dev);
    e.set_link(up);
    Ok(())
}

fn stop(e: &mut EthMut<'_>) -> Result<(), Error> {
    e.primary_only()?;
    // The bursts of every queue answer 0 from here on.
    e.set_queue_states(false);
    let (dev, name) = (e.dev, e.port.name);
    // Let the device send what tx_burst already took, then stop it.
    for i in 0..e.conf.nb_tx_queues {
        if let Some((_, q)) = e.stopped_txq(i) {
            if !q.drain(dev, Duration::from_secs(1)) {
                pmd_log!(
                    WARNING,
                    "{name}: TX queue {i}: the device did not drain within 1 s"
                );
            }
        }
    }
    // A device that runs in the polling lcore finishes what reached the port, as its thread
    // would have (frames waiting at the port go to the receive queues or are counted).
    dev.poll();
    flow::port_stopping(e);
    e.port.stop(dev);
    // With the device stopped, every buffer still in flight is reclaimed and each queue
    // starts afresh at the next start.
    qctl::reset_all(e);
    e.set_link(false);
    Ok(())
}

pub(super) unsafe extern "C" fn dev_close(dev: *mut sys::rte_eth_dev) -> c_int {
    let _closing = eth::CLOSING.write();
    // SAFETY: as for every op (see `ops!`); ethdev's copy of the interrupt handle is cleared
    // before close frees the handle; after the op nothing references the port: it is freed.
    unsafe {
        if let Some(d) = dev.as_mut() {
            d.intr_handle = std::ptr::null_mut();
        }
        let name = eth::enter!(exclusive, dev, "close", close);
        eth::free_port(dev, !eth::secondary());
        if let Some(name) = name {
            pmd_log!(INFO, "{name}: closed");
        }
    }
    0
}

/// Ends the port: the port event handler unregistered (it must be gone before the device),
/// every queue destroyed, the device stopped. A secondary only lets go of its handles (telling
/// the primary it left): the port and its queues are the primary's.
fn close(e: &mut EthMut<'_>) -> Option<String> {
    drop(e.intr.lock().take());
    if eth::secondary() {
        e.dev.secondary_attached(false);
    } else {
        flow::port_closed(e.conf.port_id);
        queue::close_queues(e);
        e.port.stop(e.dev);
    }
    Some(e.port.name.to_string())
}

fn link(e: &Eth<'_>, _wait: c_int) -> Result<(), Error> {
    // A secondary reads the link the primary keeps in the shared device data.
    if !eth::secondary() {
        e.set_link(e.port.link_up(e.dev));
    }
    Ok(())
}

fn set_mac(e: &mut EthMut<'_>, mac: Option<&mut sys::rte_ether_addr>) -> Result<(), Error> {
    let mac = given(mac)?.addr_bytes;
    if mac[0] & 1 != 0 || mac == [0; 6] {
        return Err(invalid!("{} is not a unicast address", fmt_mac(&mac)));
    }
    e.primary_only()?;
    e.port.mac = mac;
    e.apply_rx()
}

fn set_mtu(e: &mut EthMut<'_>, mtu: u16) -> Result<(), Error> {
    if !(port::MIN_MTU..=port::MAX_MTU).contains(&mtu) {
        return Err(invalid!(
            "MTU {mtu} outside {}..={}",
            port::MIN_MTU,
            port::MAX_MTU
        ));
    }
    e.update_rx(|r| r.mtu = mtu)
}
