//! RSS: the redirection table and the hash configuration (key and hashed packet types).

use std::ffi::c_int;

use dpdk_sys as sys;

use super::eth::{given, ops, CArray, Eth, EthMut, FromC};
use super::{invalid, Error};
use crate::hw::RSS_KEY_LEN;
use crate::port::{self, RETA_SIZE};

ops! {
    fn reta_update(conf: *mut sys::rte_eth_rss_reta_entry64 [groups_of(size)], size: u16)
        -> c_int = exclusive update_reta, "RETA update";
    fn reta_query(conf: *mut sys::rte_eth_rss_reta_entry64 [groups_of(size)], size: u16)
        -> c_int = shared query_reta, "RETA query";
    fn rss_hash_update(conf: *mut sys::rte_eth_rss_conf as RssConf) -> c_int
        = exclusive update_hash, "RSS hash update";
    fn rss_hash_conf_get(conf: *mut sys::rte_eth_rss_conf as RssConf) -> c_int
        = shared query_hash, "RSS hash query";
}

/// The application's `rte_eth_rss_conf`, with its key buffer: `rss_key_len` bytes at
/// `rss_key` when that is not NULL (ethdev's contract for both ops).
struct RssConf<'a> {
    conf: Option<&'a mut sys::rte_eth_rss_conf>,
    key: Option<&'a mut [u8]>,
}

impl FromC<*mut sys::rte_eth_rss_conf> for RssConf<'_> {
    unsafe fn from_c(p: *mut sys::rte_eth_rss_conf) -> Self {
        // SAFETY: NULL or a valid conf whose key buffer is NULL or holds rss_key_len bytes, a
        // buffer of its own (the caller's contract).
        unsafe {
            let conf = p.as_mut();
            let key = conf.as_ref().and_then(|c| {
                (!c.rss_key.is_null())
                    .then(|| std::slice::from_raw_parts_mut(c.rss_key, usize::from(c.rss_key_len)))
            });
            RssConf { conf, key }
        }
    }
}

/// How many groups of 64 entries ethdev passes for a table of `size` entries.
fn groups_of(size: u16) -> usize {
    usize::from(size).div_ceil(sys::RTE_ETH_RETA_GROUP_SIZE as usize)
}

/// The application's redirection-table groups, when their size is the device's.
fn groups(
    conf: CArray<'_, sys::rte_eth_rss_reta_entry64>,
    size: u16,
) -> Result<&mut [sys::rte_eth_rss_reta_entry64], Error> {
    if usize::from(size) != RETA_SIZE {
        return Err(invalid!("RETA size {size}, the device has {RETA_SIZE}"));
    }
    given(conf.get())
}

fn update_reta(
    e: &mut EthMut<'_>,
    conf: CArray<'_, sys::rte_eth_rss_reta_entry64>,
    size: u16,
) -> Result<(), Error> {
    let conf = groups(conf, size)?;
    let nb_rxq = e.conf.nb_rx_queues;
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
    e.update_rx(|r| r.reta = reta)
}

fn query_reta(
    e: &Eth<'_>,
    conf: CArray<'_, sys::rte_eth_rss_reta_entry64>,
    size: u16,
) -> Result<(), Error> {
    for (g, c) in groups(conf, size)?.iter_mut().enumerate() {
        for i in 0..64 {
            if c.mask & (1 << i) != 0 {
                c.reta[i] = e.port.rx.reta[g * 64 + i];
            }
        }
    }
    Ok(())
}

fn update_hash(e: &mut EthMut<'_>, conf: RssConf<'_>) -> Result<(), Error> {
    let c = given(conf.conf)?;
    let hf = c.rss_hf;
    if hf & !port::RSS_HF_ALL != 0 {
        return Err(invalid!(
            "unsupported RSS hash types {:#x}",
            hf & !port::RSS_HF_ALL
        ));
    }
    let mut new_key = e.port.rx.rss_key;
    if let Some(key) = conf.key {
        let len = key.len();
        if len != RSS_KEY_LEN {
            return Err(invalid!(
                "RSS key of {len} bytes, the device takes {RSS_KEY_LEN}"
            ));
        }
        new_key.copy_from_slice(key);
    }
    e.update_rx(|r| {
        r.rss_key = new_key;
        r.rss_hf = hf;
    })
}

/// DPDK 22.11's ethdev passes the application's conf as it is, and the key buffer holds
/// `rss_key_len` bytes, nothing more is known: a buffer smaller than the key is refused, as
/// DPDK 23.11's ethdev does itself, and at most the key is written.
fn query_hash(e: &Eth<'_>, conf: RssConf<'_>) -> Result<(), Error> {
    let c = given(conf.conf)?;
    if let Some(key) = conf.key {
        let room = key.len();
        if room < RSS_KEY_LEN {
            return Err(invalid!(
                "RSS key buffer of {room} bytes (rss_key_len), the key has {RSS_KEY_LEN}"
            ));
        }
        key[..RSS_KEY_LEN].copy_from_slice(&e.port.rx.rss_key);
        c.rss_key_len = RSS_KEY_LEN as u8;
    }
    c.rss_hf = e.port.rx.rss_hf;
    Ok(())
}
