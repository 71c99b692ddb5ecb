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
    let mut x = e.port.xstats(e.dev, &txqs, &rxqs);
    let std = standard(&x);
    x.extend(std);
    x
}

/// The port counters under the names other DPDK drivers give them and applications (Open
/// vSwitch) read by name, where the device keeps them (the software HCA's `hca_*` port
/// counters): `rx/tx_broadcast_packets`, `rx/tx_multicast_packets`, the seven size buckets
/// each way (`rx_size_64_packets` ... `rx_size_1523_to_max_packets`, lengths with the FCS),
/// and the RMON receive errors. `rx_oversize_errors` are frames longer than the MTU allows
/// (`hca_rx_drops_mtu`); the model's wires carry no frame with a bad FCS, and short frames
/// count as padded to 64 bytes by the sender, so `rx_undersized_errors`,
/// `rx_fragmented_errors` and `rx_jabber_errors` stay 0. A device without these counters
/// gets none of the names.
pub(crate) fn standard(x: &[(String, u64)]) -> Vec<(String, u64)> {
    const MAC: [&str; 18] = [
        "rx_broadcast",
        "rx_multicast",
        "rx_size_64",
        "rx_size_65_to_127",
        "rx_size_128_to_255",
        "rx_size_256_to_511",
        "rx_size_512_to_1023",
        "rx_size_1024_to_1522",
        "rx_size_1523_to_max",
        "tx_broadcast",
        "tx_multicast",
        "tx_size_64",
        "tx_size_65_to_127",
        "tx_size_128_to_255",
        "tx_size_256_to_511",
        "tx_size_512_to_1023",
        "tx_size_1024_to_1522",
        "tx_size_1523_to_max",
    ];
    let get = |name: &str| {
        x.iter()
            .find(|(n, _)| n.strip_prefix("hca_") == Some(name))
            .map(|&(_, v)| v)
    };
    if get(MAC[0]).is_none() {
        return Vec::new();
    }
    let mut out: Vec<(String, u64)> = MAC
        .iter()
        .map(|m| (format!("{m}_packets"), get(m).unwrap_or(0)))
        .collect();
    out.extend([
        ("rx_undersized_errors".to_owned(), 0),
        (
            "rx_oversize_errors".to_owned(),
            get("rx_drops_mtu").unwrap_or(0),
        ),
        ("rx_fragmented_errors".to_owned(), 0),
        ("rx_jabber_errors".to_owned(), 0),
    ]);
    out
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

#[cfg(test)]
mod tests {
    use super::standard;

    #[test]
    fn standard_names_from_the_port_counters() {
        let mut x: Vec<(String, u64)> = mlx4_hca::Counters::NAMES
            .iter()
            .enumerate()
            .map(|(i, n)| (format!("hca_{n}"), i as u64 + 1))
            .collect();
        let val = |name: &str| {
            x.iter()
                .find(|(n, _)| n == &format!("hca_{name}"))
                .unwrap()
                .1
        };
        let s = standard(&x);
        assert_eq!(s.len(), 22);
        let get = |name: &str| s.iter().find(|(n, _)| n == name).map(|&(_, v)| v);
        assert_eq!(get("rx_broadcast_packets"), Some(val("rx_broadcast")));
        assert_eq!(
            get("tx_size_1523_to_max_packets"),
            Some(val("tx_size_1523_to_max"))
        );
        assert_eq!(
            get("rx_size_1024_to_1522_packets"),
            Some(val("rx_size_1024_to_1522"))
        );
        assert_eq!(get("rx_oversize_errors"), Some(val("rx_drops_mtu")));
        assert_eq!(get("rx_undersized_errors"), Some(0));
        x.retain(|(n, _)| !n.starts_with("hca_"));
        assert!(standard(&x).is_empty(), "no port counters, no names");
    }
}
