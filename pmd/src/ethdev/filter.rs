//! Receive filters beyond the main MAC (more unicast addresses, a multicast list, the VLAN
//! filter), flow control and the firmware version.
//!
//! The filters are kept in the port ([`crate::port::Filters`]) and every change goes to the
//! device through [`super::eth::EthMut::apply_rx`], so a restart or a change of promiscuous mode gives
//! the device the whole set again.

use std::ffi::{c_char, c_int};

use dpdk_sys as sys;

use super::eth::{given, ops, CArray, Eth, EthMut};
use super::{fmt_mac, invalid, Error};
use crate::hw::FlowControl;
use crate::port::{MAX_MAC_ADDRS, MAX_MC_ADDRS};

ops! {
    fn mac_addr_add(mac: *mut sys::rte_ether_addr, index: u32, _vmdq: u32) -> c_int
        = exclusive add_mac, "add MAC";
    fn mac_addr_remove(index: u32) = exclusive remove_mac, "remove MAC";
    fn set_mc_addr_list(list: *mut sys::rte_ether_addr [n], n: u32) -> c_int
        = exclusive set_mc_list, "set multicast list";
    fn vlan_filter_set(vid: u16, on: c_int) -> c_int = exclusive set_vlan, "VLAN filter";
    fn vlan_offload_set(_mask: c_int) -> c_int = exclusive set_vlan_offload, "VLAN offloads";
    fn flow_ctrl_get(conf: *mut sys::rte_eth_fc_conf) -> c_int = shared get_fc, "flow control";
    fn flow_ctrl_set(conf: *mut sys::rte_eth_fc_conf) -> c_int
        = exclusive set_fc, "set flow control";
    fn fw_version_get(buf: *mut c_char [size], size: usize) -> c_int
        = shared fw_version, "firmware version";
}

fn add_mac(
    e: &mut EthMut<'_>,
    mac: Option<&mut sys::rte_ether_addr>,
    index: u32,
    _vmdq: u32,
) -> Result<(), Error> {
    let mac = given(mac)?.addr_bytes;
    let i = index as usize;
    if i == 0 || i >= MAX_MAC_ADDRS {
        return Err(invalid!("MAC index {index} outside 1..{MAX_MAC_ADDRS}"));
    }
    if mac[0] & 1 != 0 || mac == [0; 6] {
        return Err(invalid!("{} is not a unicast address", fmt_mac(&mac)));
    }
    let old = e.port.filters.macs[i];
    e.port.filters.macs[i] = mac;
    e.update_rx(|_| {})
        .inspect_err(|_| e.port.filters.macs[i] = old)
}

fn remove_mac(e: &mut EthMut<'_>, index: u32) {
    let i = index as usize;
    if i == 0 || i >= MAX_MAC_ADDRS {
        crate::pmd_log!(
            ERR,
            "{}: remove MAC: MAC index {index} outside 1..{MAX_MAC_ADDRS}",
            e.port.name
        );
        return;
    }
    e.port.filters.macs[i] = [0; 6];
    if let Err(err) = e.update_rx(|_| {}) {
        crate::pmd_log!(ERR, "{}: remove MAC: {err}", e.port.name);
    }
}

fn set_mc_list(
    e: &mut EthMut<'_>,
    list: CArray<'_, sys::rte_ether_addr>,
    n: u32,
) -> Result<(), Error> {
    let n = n as usize;
    if n > MAX_MC_ADDRS {
        return Err(invalid!("{n} multicast addresses, at most {MAX_MC_ADDRS}"));
    }
    let macs: Vec<[u8; 6]> = list
        .get()
        .unwrap_or_default()
        .iter()
        .map(|a| a.addr_bytes)
        .collect();
    if let Some(m) = macs.iter().find(|m| m[0] & 1 == 0) {
        return Err(invalid!("{} is not a multicast address", fmt_mac(m)));
    }
    let f = &mut e.port.filters;
    f.mc[..macs.len()].copy_from_slice(&macs);
    f.n_mc = macs.len();
    e.update_rx(|_| {})
}

fn set_vlan(e: &mut EthMut<'_>, vid: u16, on: c_int) -> Result<(), Error> {
    if vid >= 4096 {
        return Err(invalid!("VLAN ID {vid} above 4095"));
    }
    e.primary_only()?;
    e.dev.set_vlan(vid, on != 0)?;
    e.port.filters.set_vlan(vid, on != 0);
    Ok(())
}

fn set_vlan_offload(e: &mut EthMut<'_>, _mask: c_int) -> Result<(), Error> {
    configure(e);
    e.update_rx(|_| {})
}

/// The VLAN filter as configured at start (`rxmode.offloads`).
pub(super) fn configure(e: &mut EthMut<'_>) {
    e.port.filters.vlan_filter =
        e.conf.rx_offloads & sys::bits::RTE_ETH_RX_OFFLOAD_VLAN_FILTER != 0;
}

fn get_fc(e: &Eth<'_>, conf: Option<&mut sys::rte_eth_fc_conf>) -> Result<(), Error> {
    let conf = given(conf)?;
    let f = e.dev.flow_control()?;
    conf.mode = match (f.rx_pause, f.tx_pause) {
        (false, false) => sys::rte_eth_fc_mode_RTE_ETH_FC_NONE,
        (true, false) => sys::rte_eth_fc_mode_RTE_ETH_FC_RX_PAUSE,
        (false, true) => sys::rte_eth_fc_mode_RTE_ETH_FC_TX_PAUSE,
        (true, true) => sys::rte_eth_fc_mode_RTE_ETH_FC_FULL,
    };
    conf.high_water = f.high_water;
    conf.low_water = f.low_water;
    conf.pause_time = f.pause_time;
    conf.send_xon = u16::from(f.send_xon);
    conf.mac_ctrl_frame_fwd = u8::from(f.mac_ctrl_frame_fwd);
    conf.autoneg = u8::from(f.autoneg);
    Ok(())
}

fn set_fc(e: &mut EthMut<'_>, conf: Option<&mut sys::rte_eth_fc_conf>) -> Result<(), Error> {
    let c = *given(conf)?;
    e.primary_only()?;
    let (rx_pause, tx_pause) = match c.mode {
        sys::rte_eth_fc_mode_RTE_ETH_FC_NONE => (false, false),
        sys::rte_eth_fc_mode_RTE_ETH_FC_RX_PAUSE => (true, false),
        sys::rte_eth_fc_mode_RTE_ETH_FC_TX_PAUSE => (false, true),
        sys::rte_eth_fc_mode_RTE_ETH_FC_FULL => (true, true),
        m => return Err(invalid!("flow control mode {m}")),
    };
    if c.low_water > c.high_water {
        return Err(invalid!(
            "flow control low water {} above high water {}",
            c.low_water,
            c.high_water
        ));
    }
    e.dev.set_flow_control(&FlowControl {
        rx_pause,
        tx_pause,
        autoneg: c.autoneg != 0,
        pause_time: c.pause_time,
        high_water: c.high_water,
        low_water: c.low_water,
        send_xon: c.send_xon != 0,
        mac_ctrl_frame_fwd: c.mac_ctrl_frame_fwd != 0,
    })
}

/// `major.minor.subminor` into `buf`; as ethdev wants it: 0, or the size needed when `size` is
/// too small. Not an error to log: the answer for a device without a version.
fn fw_version(e: &Eth<'_>, buf: CArray<'_, c_char>, size: usize) -> Result<c_int, Error> {
    let Some(v) = e.port.caps.fw_version() else {
        return Ok(-libc::ENOTSUP);
    };
    let need = v.len() + 1;
    if size < need {
        return Ok(need as c_int);
    }
    let out = given(buf.get())?;
    for (d, s) in out[..need].iter_mut().zip(v.bytes().chain([0])) {
        *d = s as c_char;
    }
    Ok(0)
}
