//! Basic and extended statistics.
//!
//! Basic: each queue's [`crate::stats`] counters of kind `Basic` map onto `rte_eth_stats`, and
//! the device's missed count is `imissed`. Extended: the port's xstats list
//! ([`crate::port::Port::xstats`]), names and values in one order.

use std::ffi::{c_char, c_int};

use dpdk_sys as sys;

use super::eth::{self, Eth};
use super::release::QueueStats;

/// The port's totals (`stats_get` through [`super::release`]).
pub(super) fn fill_totals(e: &mut Eth<'_>, st: &mut sys::rte_eth_stats) {
    // Frames the port received and lost before any queue took them, as a NIC counts them.
    st.imissed = e.dev.missed();
    e.for_each_txq(|_, q| {
        let s = q.stats();
        st.opackets += s.packets;
        st.obytes += s.bytes;
        st.oerrors += s.errors;
    });
    e.for_each_rxq(|_, q| {
        let s = q.stats();
        st.ipackets += s.packets;
        st.ibytes += s.bytes;
        st.ierrors += s.errors;
        st.rx_nombuf += s.nombuf;
    });
}

/// Each queue's counters, for as many queues as ethdev keeps them.
pub(super) fn fill_queues(e: &mut Eth<'_>, q: &mut QueueStats) {
    let n = q.q_opackets.len();
    e.for_each_txq(|i, t| {
        let (s, i) = (t.stats(), usize::from(i));
        if i < n {
            q.q_opackets[i] = s.packets;
            q.q_obytes[i] = s.bytes;
        }
    });
    e.for_each_rxq(|i, r| {
        let (s, i) = (r.stats(), usize::from(i));
        if i < n {
            q.q_ipackets[i] = s.packets;
            q.q_ibytes[i] = s.bytes;
            q.q_errors[i] = s.errors;
        }
    });
}

/// Zeroes the queues' counters.
fn reset_queues(e: &mut Eth<'_>) {
    e.for_each_txq(|_, q| q.reset_stats());
    e.for_each_rxq(|_, q| q.reset_stats());
}

super::ops::op!(stats_reset, "stats reset", |e| {
    reset_queues(e);
    Ok(())
});

super::ops::op!(
    /// ethdev does not reset the basic stats when a driver resets its xstats, so this resets
    /// both, and the device's own counters.
    xstats_reset,
    "xstats reset",
    |e| {
        reset_queues(e);
        e.dev.reset_counters();
        Ok(())
    }
);

fn xstats(e: &mut Eth<'_>) -> Vec<(String, u64)> {
    let mut txqs = Vec::new();
    e.for_each_txq(|_, q| txqs.push(q.stats()));
    let mut rxqs = Vec::new();
    e.for_each_rxq(|_, q| rxqs.push(q.stats()));
    e.port.xstats(e.dev, &txqs, &rxqs)
}

pub(super) unsafe extern "C" fn xstats_get_names(
    dev: *mut sys::rte_eth_dev,
    names: *mut sys::rte_eth_xstat_name,
    size: u32,
) -> c_int {
    // SAFETY: as for every op.
    let Some(x) = (unsafe { eth::query(dev, xstats) }) else {
        return -libc::ENODEV;
    };
    if names.is_null() || (size as usize) < x.len() {
        return x.len() as c_int;
    }
    // SAFETY: `names` has room for `size` >= x.len() entries.
    let out = unsafe { std::slice::from_raw_parts_mut(names, x.len()) };
    for ((name, _), slot) in x.iter().zip(out) {
        let n = name.len().min(slot.name.len() - 1);
        for (d, s) in slot.name.iter_mut().zip(&name.as_bytes()[..n]) {
            *d = *s as c_char;
        }
        slot.name[n] = 0;
    }
    x.len() as c_int
}

pub(super) unsafe extern "C" fn xstats_get(
    dev: *mut sys::rte_eth_dev,
    stats: *mut sys::rte_eth_xstat,
    n: u32,
) -> c_int {
    // SAFETY: as for every op.
    let Some(x) = (unsafe { eth::query(dev, xstats) }) else {
        return -libc::ENODEV;
    };
    if stats.is_null() || (n as usize) < x.len() {
        return x.len() as c_int;
    }
    // SAFETY: `stats` has room for `n` >= x.len() entries.
    let out = unsafe { std::slice::from_raw_parts_mut(stats, x.len()) };
    for (i, ((_, v), slot)) in x.iter().zip(out).enumerate() {
        slot.id = i as u64;
        slot.value = *v;
    }
    x.len() as c_int
}
