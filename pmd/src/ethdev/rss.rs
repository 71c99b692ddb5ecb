//! RSS: the redirection table and the hash configuration (key and hashed packet types).

use std::ffi::c_int;

use dpdk_sys as sys;

use super::eth;
use super::invalid;
use super::ops::update_rx;
use crate::hw::RSS_KEY_LEN;
use crate::port::{self, RETA_SIZE};

/// Redirection-table groups of 64 entries.
const GROUPS: usize = RETA_SIZE / sys::RTE_ETH_RETA_GROUP_SIZE as usize;

pub(super) unsafe extern "C" fn reta_update(
    dev: *mut sys::rte_eth_dev,
    conf: *mut sys::rte_eth_rss_reta_entry64,
    size: u16,
) -> c_int {
    // SAFETY: ethdev passes `size / 64` groups; read only when the size is ours.
    let conf = (usize::from(size) == RETA_SIZE)
        .then(|| unsafe { std::slice::from_raw_parts(conf, GROUPS) });
    // SAFETY: as for every op.
    unsafe {
        eth::run(dev, "RETA update", |e| {
            let conf =
                conf.ok_or_else(|| invalid!("RETA size {size}, the device has {RETA_SIZE}"))?;
            let nb_rxq = e.nb_rx_queues();
            let mut reta = e.port.rx.reta;
            for (g, c) in conf.iter().enumerate() {
                for (i, &q) in c.reta.iter().enumerate() {
                    if c.mask & (1 << i) != 0 {
                        if q >= nb_rxq {
                            return Err(invalid!("RETA entry names RX queue {q} of {nb_rxq}"));
                        }
                        reta[g * 64 + i] = q;
                    }
                }
            }
            update_rx(e, |r| r.reta = reta)
        })
    }
}

pub(super) unsafe extern "C" fn reta_query(
    dev: *mut sys::rte_eth_dev,
    conf: *mut sys::rte_eth_rss_reta_entry64,
    size: u16,
) -> c_int {
    if usize::from(size) != RETA_SIZE {
        return -libc::EINVAL;
    }
    // SAFETY: ethdev passes `size / 64` groups, ours to fill.
    let conf = unsafe { std::slice::from_raw_parts_mut(conf, GROUPS) };
    // SAFETY: as for every op.
    unsafe {
        eth::run(dev, "RETA query", |e| {
            for (g, c) in conf.iter_mut().enumerate() {
                for i in 0..64 {
                    if c.mask & (1 << i) != 0 {
                        c.reta[i] = e.port.rx.reta[g * 64 + i];
                    }
                }
            }
            Ok(())
        })
    }
}

pub(super) unsafe extern "C" fn rss_hash_update(
    dev: *mut sys::rte_eth_dev,
    conf: *mut sys::rte_eth_rss_conf,
) -> c_int {
    // SAFETY: ethdev passes a valid conf; its key (if any) holds rss_key_len bytes.
    let (hf, key) = unsafe {
        let c = &*conf;
        let key = (!c.rss_key.is_null())
            .then(|| std::slice::from_raw_parts(c.rss_key, usize::from(c.rss_key_len)));
        (c.rss_hf, key)
    };
    // SAFETY: as for every op.
    unsafe {
        eth::run(dev, "RSS hash update", |e| {
            if hf & !port::RSS_HF_ALL != 0 {
                return Err(invalid!(
                    "unsupported RSS hash types {:#x}",
                    hf & !port::RSS_HF_ALL
                ));
            }
            let mut new_key = e.port.rx.rss_key;
            if let Some(k) = key {
                new_key = k.try_into().map_err(|_| {
                    invalid!(
                        "RSS key of {} bytes, the device takes {RSS_KEY_LEN}",
                        k.len()
                    )
                })?;
            }
            update_rx(e, |r| {
                r.rss_key = new_key;
                r.rss_hf = hf;
            })
        })
    }
}

pub(super) unsafe extern "C" fn rss_hash_conf_get(
    dev: *mut sys::rte_eth_dev,
    conf: *mut sys::rte_eth_rss_conf,
) -> c_int {
    // DPDK 22.11's ethdev passes the application's conf as it is, and the key buffer holds
    // `rss_key_len` bytes, nothing more is known: a buffer smaller than the key is refused, as
    // DPDK 23.11's ethdev does itself (issue 26 #1), and at most the key is written.
    // SAFETY: ethdev passes a valid conf.
    let c = unsafe { &mut *conf };
    let (key, key_room) = (c.rss_key, usize::from(c.rss_key_len));
    let key = if key.is_null() {
        None
    } else if key_room < RSS_KEY_LEN {
        Some(None)
    } else {
        // SAFETY: the application's key buffer holds rss_key_len >= RSS_KEY_LEN bytes.
        Some(Some(unsafe {
            std::slice::from_raw_parts_mut(key, RSS_KEY_LEN)
        }))
    };
    let conf = c;
    // SAFETY: as for every op.
    unsafe {
        eth::run(dev, "RSS hash query", |e| {
            match key {
                None => {}
                Some(None) => {
                    return Err(invalid!(
                    "RSS key buffer of {key_room} bytes (rss_key_len), the key has {RSS_KEY_LEN}"
                ))
                }
                Some(Some(out)) => {
                    out.copy_from_slice(&e.port.rx.rss_key);
                    conf.rss_key_len = RSS_KEY_LEN as u8;
                }
            }
            conf.rss_hf = e.port.rx.rss_hf;
            Ok(())
        })
    }
}
