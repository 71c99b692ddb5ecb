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

use super::eth::{ops, Eth};
use super::stats::{self, QueueCounters};
use super::{info, Error};

/// Where ethdev wants the per-queue counters (`q_ipackets` ... `q_errors`).
#[cfg(not(dpdk = "25.11"))]
type QueueStats = sys::rte_eth_stats;
/// Where ethdev wants the per-queue counters (`q_ipackets` ... `q_errors`).
#[cfg(dpdk = "25.11")]
type QueueStats = sys::eth_queue_stats;

impl QueueCounters for QueueStats {
    fn arrays(&mut self) -> [&mut [u64]; 5] {
        [
            &mut self.q_ipackets,
            &mut self.q_opackets,
            &mut self.q_ibytes,
            &mut self.q_obytes,
            &mut self.q_errors,
        ]
    }
}

// `stats_get` up to 24.11: the queue counters are fields of `rte_eth_stats`.
#[cfg(not(dpdk = "25.11"))]
ops! {
    fn stats_get(st: *mut sys::rte_eth_stats) -> c_int = shared stats_op, "stats";
}

#[cfg(not(dpdk = "25.11"))]
fn stats_op(e: &Eth<'_>, st: Option<&mut sys::rte_eth_stats>) -> Result<(), Error> {
    let st = super::eth::given(st)?;
    stats::fill_totals(e, st);
    stats::fill_queues(e, st);
    Ok(())
}

// `stats_get` from 25.11: the queue counters come separately, and only when ethdev asks.
#[cfg(dpdk = "25.11")]
ops! {
    fn stats_get(st: *mut sys::rte_eth_stats, qst: *mut sys::eth_queue_stats) -> c_int
        = shared stats_op, "stats";
}

#[cfg(dpdk = "25.11")]
fn stats_op(
    e: &Eth<'_>,
    st: Option<&mut sys::rte_eth_stats>,
    qst: Option<&mut sys::eth_queue_stats>,
) -> Result<(), Error> {
    stats::fill_totals(e, super::eth::given(st)?);
    if let Some(q) = qst {
        stats::fill_queues(e, q);
    }
    Ok(())
}

// `dev_supported_ptypes_get` up to 23.11: a list ending with `RTE_PTYPE_UNKNOWN`.
#[cfg(any(dpdk = "22.11", dpdk = "23.11"))]
ops! {
    fn supported_ptypes() -> *const u32 = shared ptypes_op, "packet types";
}

#[cfg(any(dpdk = "22.11", dpdk = "23.11"))]
fn ptypes_op(e: &Eth<'_>) -> *const u32 {
    info::supported_ptypes(e).as_ptr()
}

// `dev_supported_ptypes_get` from 24.03: the list and its length, which leaves the
// terminating `RTE_PTYPE_UNKNOWN` out.
#[cfg(not(any(dpdk = "22.11", dpdk = "23.11")))]
ops! {
    fn supported_ptypes(len: *mut usize) -> *const u32 = shared ptypes_op, "packet types";
}

#[cfg(not(any(dpdk = "22.11", dpdk = "23.11")))]
fn ptypes_op(e: &Eth<'_>, len: Option<&mut usize>) -> *const u32 {
    let list = info::supported_ptypes(e);
    if let Some(len) = len {
        *len = list.len() - 1;
    }
    list.as_ptr()
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
