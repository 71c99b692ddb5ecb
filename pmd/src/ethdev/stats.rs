//! Basic and extended statistics.
//!
//! Basic: each queue's [`crate::stats`] counters of kind `Basic` map onto `rte_eth_stats`, and
//! the device's missed count is `imissed`. Extended: the port's xstats list
//! ([`crate::port::Port::xstats`]), names and values in one order.

use std::ffi::{c_char, c_int};

use dpdk_sys as sys;

use super::eth::{ops, CArray, Eth};
use super::Error;
use crate::stats::sum;

/// The port's totals (`stats_get` through [`super::release`]).
pub(super) fn fill_totals(e: &Eth<'_>, st: &mut sys::rte_eth_stats) {
    // Frames the port received and lost before any queue took them, as a NIC counts them.
    st.imissed = e.dev.missed();
    let tx = sum(e.txqs().map(|(_, s)| s.stats()));
    (st.opackets, st.obytes, st.oerrors) = (tx.packets, tx.bytes, tx.errors);
    let rx = sum(e.rxqs().map(|(_, s)| s.stats()));
    (st.ipackets, st.ibytes, st.ierrors) = (rx.packets, rx.bytes, rx.errors);
    st.rx_nombuf = rx.nombuf;
}

/// Where ethdev wants each queue's counters (its struct differs between releases): `[ipackets,
/// opackets, ibytes, obytes, errors]`, one entry per queue.
pub(super) trait QueueCounters {
    fn arrays(&mut self) -> [&mut [u64]; 5];
}

/// Each queue's counters, for as many queues as ethdev keeps them.
pub(super) fn fill_queues(e: &Eth<'_>, q: &mut impl QueueCounters) {
    let [ipackets, opackets, ibytes, obytes, errors] = q.arrays();
    let n = opackets.len();
    for (i, t) in e.txqs().filter(|(i, _)| usize::from(*i) < n) {
        let (s, i) = (t.stats(), usize::from(i));
        (opackets[i], obytes[i]) = (s.packets, s.bytes);
    }
    for (i, r) in e.rxqs().filter(|(i, _)| usize::from(*i) < n) {
        let (s, i) = (r.stats(), usize::from(i));
        (ipackets[i], ibytes[i], errors[i]) = (s.packets, s.bytes, s.errors);
    }
}

/// Zeroes the queues' counters.
fn stats_reset_op(e: &Eth<'_>) -> Result<(), Error> {
    e.txqs().for_each(|(_, s)| s.reset_stats());
    e.rxqs().for_each(|(_, s)| s.reset_stats());
    Ok(())
}

/// ethdev does not reset the basic stats when a driver resets its xstats, so this resets
/// both, and the device's own counters.
fn xstats_reset_op(e: &Eth<'_>) -> Result<(), Error> {
    stats_reset_op(e)?;
    e.dev.reset_counters();
    Ok(())
}

ops! {
    fn stats_reset() -> c_int = shared stats_reset_op, "stats reset";
    fn xstats_reset() -> c_int = shared xstats_reset_op, "xstats reset";
    fn xstats_get_names(names: *mut sys::rte_eth_xstat_name [size], size: u32) -> c_int
        = shared xstats_names_op, "xstats names";
    fn xstats_get(stats: *mut sys::rte_eth_xstat [n], n: u32) -> c_int
        = shared xstats_op, "xstats";
}

fn xstats(e: &Eth<'_>) -> Vec<(String, u64)> {
    let txqs: Vec<_> = e.txqs().map(|(_, s)| s.stats()).collect();
    let rxqs: Vec<_> = e.rxqs().map(|(_, s)| s.stats()).collect();
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

/// The first `need` entries of ethdev's array, or None when it is absent or shorter.
fn room<T>(array: CArray<'_, T>, need: usize) -> Option<&mut [T]> {
    if array.len() < need {
        return None;
    }
    array.get().map(|a| &mut a[..need])
}

fn xstats_names_op(
    e: &Eth<'_>,
    names: CArray<'_, sys::rte_eth_xstat_name>,
    _size: u32,
) -> Result<c_int, Error> {
    let x = xstats(e);
    for ((name, _), slot) in x.iter().zip(room(names, x.len()).unwrap_or_default()) {
        let n = name.len().min(slot.name.len() - 1);
        for (d, s) in slot.name.iter_mut().zip(&name.as_bytes()[..n]) {
            *d = *s as c_char;
        }
        slot.name[n] = 0;
    }
    Ok(x.len() as c_int)
}

fn xstats_op(e: &Eth<'_>, stats: CArray<'_, sys::rte_eth_xstat>, _n: u32) -> Result<c_int, Error> {
    let x = xstats(e);
    let out = room(stats, x.len()).unwrap_or_default();
    for (i, ((_, v), slot)) in x.iter().zip(out).enumerate() {
        slot.id = i as u64;
        slot.value = *v;
    }
    Ok(x.len() as c_int)
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
