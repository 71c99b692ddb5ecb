//! The version seam: what differs between the supported DPDK releases (22.11, 23.11, 24.11,
//! 25.11) as a PMD sees it, in one place. The rest of the driver sees one API.
//!
//! Struct layouts need nothing here: the bindings of each release are generated from its own
//! headers (`ffi/sdk/`), and the driver names fields, never offsets. What is left are the ops
//! whose C signatures changed (doc/dpdk-releases.md):
//! - `dev_supported_ptypes_get` returns the list's length through a pointer from 24.03 on;
//! - `stats_get` hands the per-queue counters over in a struct of their own from 25.11 on;
//! - 25.11's ethdev leaves a secondary's queue-count slots NULL.
//!
//! Both run once per call of a control op, never on the data path.

use std::ffi::c_int;

use dpdk_sys as sys;

use super::{eth, ops, stats};

/// Where ethdev wants the per-queue counters (`q_ipackets` ... `q_errors`).
#[cfg(not(dpdk = "25.11"))]
pub(super) type QueueStats = sys::rte_eth_stats;
/// Where ethdev wants the per-queue counters (`q_ipackets` ... `q_errors`).
#[cfg(dpdk = "25.11")]
pub(super) type QueueStats = sys::eth_queue_stats;

/// `stats_get` up to 24.11: the queue counters are fields of `rte_eth_stats`.
#[cfg(not(dpdk = "25.11"))]
pub(super) unsafe extern "C" fn stats_get(
    dev: *mut sys::rte_eth_dev,
    st: *mut sys::rte_eth_stats,
) -> c_int {
    // SAFETY: ethdev passes a zeroed stats struct of its own; the op runs like every op.
    unsafe {
        let st = &mut *st;
        eth::run(dev, "stats", |e| {
            stats::fill_totals(e, st);
            stats::fill_queues(e, st);
            Ok(())
        })
    }
}

/// `stats_get` from 25.11: the queue counters come separately, and only when ethdev asks.
#[cfg(dpdk = "25.11")]
pub(super) unsafe extern "C" fn stats_get(
    dev: *mut sys::rte_eth_dev,
    st: *mut sys::rte_eth_stats,
    qst: *mut sys::eth_queue_stats,
) -> c_int {
    // SAFETY: ethdev passes a zeroed stats struct of its own and a queue-stats struct or NULL;
    // the op runs like every op.
    unsafe {
        let (st, qst) = (&mut *st, qst.as_mut());
        eth::run(dev, "stats", |e| {
            stats::fill_totals(e, st);
            if let Some(q) = qst {
                stats::fill_queues(e, q);
            }
            Ok(())
        })
    }
}

/// `dev_supported_ptypes_get` up to 23.11: a list ending with `RTE_PTYPE_UNKNOWN`.
#[cfg(any(dpdk = "22.11", dpdk = "23.11"))]
pub(super) unsafe extern "C" fn supported_ptypes(dev: *mut sys::rte_eth_dev) -> *const u32 {
    // SAFETY: as for every op.
    unsafe { ops::supported_ptypes(dev) }.map_or(std::ptr::null(), <[u32]>::as_ptr)
}

/// `dev_supported_ptypes_get` from 24.03: the list and its length, which leaves the
/// terminating `RTE_PTYPE_UNKNOWN` out.
#[cfg(not(any(dpdk = "22.11", dpdk = "23.11")))]
pub(super) unsafe extern "C" fn supported_ptypes(
    dev: *mut sys::rte_eth_dev,
    len: *mut usize,
) -> *const u32 {
    // SAFETY: as for every op.
    let list = unsafe { ops::supported_ptypes(dev) }.unwrap_or(&[0]);
    // SAFETY: ethdev passes the address of its own count.
    unsafe { *len = list.len() - 1 };
    if list.len() > 1 {
        list.as_ptr()
    } else {
        std::ptr::null()
    }
}

/// Fills the fast-path slots that 25.11's ethdev gives a primary's new port (functions that
/// answer "not supported") but leaves NULL on a port a secondary attaches to: there,
/// `rte_eth_rx_queue_count` (which `dpdk-proc-info --show-port` calls) would jump to NULL.
/// Earlier releases check for NULL in ethdev.
pub(super) fn fill_secondary_fast_path(dev: &mut sys::rte_eth_dev) {
    #[cfg(dpdk = "25.11")]
    {
        dev.rx_queue_count = dev.rx_queue_count.or(Some(sys::rte_eth_queue_count_dummy));
        dev.tx_queue_count = dev.tx_queue_count.or(Some(sys::rte_eth_queue_count_dummy));
    }
    #[cfg(not(dpdk = "25.11"))]
    let _ = dev;
}
