//! Receive filters beyond the main MAC (more unicast addresses, a multicast list, the VLAN
//! filter), flow control and the firmware version.
//!
//! The filters are kept in the port ([`crate::port::Filters`]) and every change goes to the
//! device through [`super::ops::apply_rx`], so a restart or a change of promiscuous mode gives
//! the device the whole set again.

use std::ffi::{c_char, c_int};

use dpdk_sys as sys;

use super::eth::{self, Eth};
use super::ops::update_rx;
use super::{fmt_mac, invalid};
use crate::hw::FlowControl;
use crate::port::{MAX_MAC_ADDRS, MAX_MC_ADDRS};

pub(super) unsafe extern "C" fn mac_addr_add(
    dev: *mut sys::rte_eth_dev,
    mac: *mut sys::rte_ether_addr,
    index: u32,
    _vmdq: u32,
) -> c_int {
    // SAFETY: ethdev passes a valid address.
    let mac = unsafe { (*mac).addr_bytes };
    // SAFETY: as for every op.
    unsafe {
        eth::run(dev, "add MAC", |e| {
            let i = index as usize;
            if i == 0 || i >= MAX_MAC_ADDRS {
                return Err(invalid!("MAC index {index} outside 1..{MAX_MAC_ADDRS}"));
            }
            if mac[0] & 1 != 0 || mac == [0; 6] {
                return Err(invalid!("{} is not a unicast address", fmt_mac(&mac)));
            }
            let old = e.port.filters.macs[i];
            e.port.filters.macs[i] = mac;
            update_rx(e, |_| {}).inspect_err(|_| e.port.filters.macs[i] = old)
        })
    }
}

pub(super) unsafe extern "C" fn mac_addr_remove(dev: *mut sys::rte_eth_dev, index: u32) {
    // SAFETY: as for every op.
    unsafe {
        eth::run(dev, "remove MAC", |e| {
            let i = index as usize;
            if i == 0 || i >= MAX_MAC_ADDRS {
                return Err(invalid!("MAC index {index} outside 1..{MAX_MAC_ADDRS}"));
            }
            e.port.filters.macs[i] = [0; 6];
            update_rx(e, |_| {})
        })
    };
}

pub(super) unsafe extern "C" fn set_mc_addr_list(
    dev: *mut sys::rte_eth_dev,
    list: *mut sys::rte_ether_addr,
    n: u32,
) -> c_int {
    let n = n as usize;
    let macs: Vec<[u8; 6]> = if n == 0 || list.is_null() {
        Vec::new()
    } else {
        // SAFETY: ethdev passes `n` addresses.
        unsafe { std::slice::from_raw_parts(list, n) }
            .iter()
            .map(|a| a.addr_bytes)
            .collect()
    };
    // SAFETY: as for every op.
    unsafe {
        eth::run(dev, "set multicast list", |e| {
            if macs.len() > MAX_MC_ADDRS {
                return Err(invalid!(
                    "{} multicast addresses, at most {MAX_MC_ADDRS}",
                    macs.len()
                ));
            }
            if let Some(m) = macs.iter().find(|m| m[0] & 1 == 0) {
                return Err(invalid!("{} is not a multicast address", fmt_mac(m)));
            }
            let f = &mut e.port.filters;
            f.mc[..macs.len()].copy_from_slice(&macs);
            f.n_mc = macs.len();
            update_rx(e, |_| {})
        })
    }
}

pub(super) unsafe extern "C" fn vlan_filter_set(
    dev: *mut sys::rte_eth_dev,
    vid: u16,
    on: c_int,
) -> c_int {
    // SAFETY: as for every op.
    unsafe {
        eth::run(dev, "VLAN filter", |e| {
            if vid >= 4096 {
                return Err(invalid!("VLAN ID {vid} above 4095"));
            }
            e.primary_only()?;
            e.dev.set_vlan(vid, on != 0)?;
            e.port.filters.set_vlan(vid, on != 0);
            Ok(())
        })
    }
}

pub(super) unsafe extern "C" fn vlan_offload_set(
    dev: *mut sys::rte_eth_dev,
    _mask: c_int,
) -> c_int {
    // SAFETY: as for every op.
    unsafe {
        eth::run(dev, "VLAN offloads", |e| {
            let on = e.rx_offloads() & sys::bits::RTE_ETH_RX_OFFLOAD_VLAN_FILTER != 0;
            e.port.filters.vlan_filter = on;
            update_rx(e, |_| {})
        })
    }
}

/// The VLAN filter as configured at start (`rxmode.offloads`).
pub(super) fn configure(e: &mut Eth<'_>) {
    e.port.filters.vlan_filter = e.rx_offloads() & sys::bits::RTE_ETH_RX_OFFLOAD_VLAN_FILTER != 0;
}

pub(super) unsafe extern "C" fn flow_ctrl_get(
    dev: *mut sys::rte_eth_dev,
    conf: *mut sys::rte_eth_fc_conf,
) -> c_int {
    // SAFETY: ethdev passes a valid struct of its caller's.
    let conf = unsafe { &mut *conf };
    // SAFETY: as for every op.
    unsafe {
        eth::run(dev, "flow control", |e| {
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
        })
    }
}

pub(super) unsafe extern "C" fn flow_ctrl_set(
    dev: *mut sys::rte_eth_dev,
    conf: *mut sys::rte_eth_fc_conf,
) -> c_int {
    // SAFETY: ethdev passes a valid struct.
    let c = unsafe { *conf };
    // SAFETY: as for every op.
    unsafe {
        eth::run(dev, "set flow control", |e| {
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
            Ok(e.dev.set_flow_control(&FlowControl {
                rx_pause,
                tx_pause,
                autoneg: c.autoneg != 0,
                pause_time: c.pause_time,
                high_water: c.high_water,
                low_water: c.low_water,
                send_xon: c.send_xon != 0,
                mac_ctrl_frame_fwd: c.mac_ctrl_frame_fwd != 0,
            })?)
        })
    }
}

/// `major.minor.subminor` into `buf`; as ethdev wants it: 0, or the size needed when `size` is
/// too small.
pub(super) unsafe extern "C" fn fw_version_get(
    dev: *mut sys::rte_eth_dev,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    // SAFETY: as for every op.
    let Some(v) = (unsafe { eth::query(dev, |e| e.port.caps.fw_version()) }) else {
        return -libc::ENODEV;
    };
    let Some(v) = v else {
        return -libc::ENOTSUP;
    };
    let need = v.len() + 1;
    if size < need {
        return need as c_int;
    }
    // SAFETY: ethdev's buffer of `size` bytes, `need` of which are written.
    unsafe {
        std::ptr::copy_nonoverlapping(v.as_ptr(), buf.cast::<u8>(), v.len());
        *buf.add(v.len()) = 0;
    }
    0
}
