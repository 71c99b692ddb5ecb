//! Starting and stopping single queues while the port runs, and deferred start.
//!
//! A stopped queue's device queue is in reset: an RQ in reset takes no frame (the device drops
//! its share of the traffic and counts it), an SQ in reset executes nothing. Starting a queue
//! gives it a fresh device queue, as a port start does: what a stopped RX queue held is gone,
//! and what a TX queue had not sent when it stopped is freed.

use std::ffi::c_int;
use std::time::Duration;

use dpdk_sys as sys;

use super::eth::{self, Eth};
use super::{invalid, ops, Error};
use crate::pmd_log;

/// Runs `f` on queue `qid` of `dev` in the primary.
///
/// # Safety
/// As for every op.
unsafe fn qop(
    dev: *mut sys::rte_eth_dev,
    qid: u16,
    what: &str,
    f: fn(&mut Eth<'_>, u16) -> Result<(), Error>,
) -> c_int {
    // SAFETY: as for every op; ethdev checked that qid is a configured queue.
    unsafe {
        eth::run(dev, what, |e| {
            e.primary_only()?;
            f(e, qid)
        })
    }
}

pub(super) unsafe extern "C" fn rx_queue_start(dev: *mut sys::rte_eth_dev, qid: u16) -> c_int {
    // SAFETY: as for every op.
    unsafe { qop(dev, qid, "RX queue start", rx_start) }
}

pub(super) unsafe extern "C" fn rx_queue_stop(dev: *mut sys::rte_eth_dev, qid: u16) -> c_int {
    // SAFETY: as for every op.
    unsafe { qop(dev, qid, "RX queue stop", rx_stop) }
}

pub(super) unsafe extern "C" fn tx_queue_start(dev: *mut sys::rte_eth_dev, qid: u16) -> c_int {
    // SAFETY: as for every op.
    unsafe { qop(dev, qid, "TX queue start", tx_start) }
}

pub(super) unsafe extern "C" fn tx_queue_stop(dev: *mut sys::rte_eth_dev, qid: u16) -> c_int {
    // SAFETY: as for every op.
    unsafe { qop(dev, qid, "TX queue stop", tx_stop) }
}

fn rx_start(e: &mut Eth<'_>, qid: u16) -> Result<(), Error> {
    let dev = e.dev;
    let s = e
        .rxq(qid)
        .ok_or_else(|| invalid!("RX queue {qid} not set up"))?;
    s.q.reset(dev)?;
    // The redirection table names the new RQ.
    ops::apply_rx(e)?;
    e.set_queue_state(false, qid, true);
    Ok(())
}

fn rx_stop(e: &mut Eth<'_>, qid: u16) -> Result<(), Error> {
    let dev = e.dev;
    let s = e
        .rxq(qid)
        .ok_or_else(|| invalid!("RX queue {qid} not set up"))?;
    dev.set_rq_ready(s.q.qpn(), false)?;
    e.set_queue_state(false, qid, false);
    Ok(())
}

fn tx_start(e: &mut Eth<'_>, qid: u16) -> Result<(), Error> {
    let (dev, lcore) = (e.dev, e.lcore);
    let s = e
        .txq(qid)
        .ok_or_else(|| invalid!("TX queue {qid} not set up"))?;
    s.q.reset(dev)?;
    if let Some(l) = lcore {
        l.set_sq(qid, Some(s.q.qpn()));
    }
    e.set_queue_state(true, qid, true);
    Ok(())
}

fn tx_stop(e: &mut Eth<'_>, qid: u16) -> Result<(), Error> {
    let (dev, name) = (e.dev, e.port.name);
    let s = e
        .txq(qid)
        .ok_or_else(|| invalid!("TX queue {qid} not set up"))?;
    if !s.q.drain(dev, Duration::from_secs(1)) {
        pmd_log!(
            WARNING,
            "{name}: TX queue {qid}: the device did not drain within 1 s"
        );
    }
    dev.set_sq_ready(s.q.qpn(), false)?;
    e.set_queue_state(true, qid, false);
    Ok(())
}

/// At port start: queues set up with deferred start stay stopped until started by name.
pub(super) fn defer(e: &mut Eth<'_>) -> Result<(), Error> {
    let dev = e.dev;
    for i in 0..e.nb_rx_queues() {
        if let Some(s) = e.rxq(i).filter(|s| s.deferred) {
            dev.set_rq_ready(s.q.qpn(), false)?;
            e.set_queue_state(false, i, false);
        }
    }
    for i in 0..e.nb_tx_queues() {
        if let Some(s) = e.txq(i).filter(|s| s.deferred) {
            dev.set_sq_ready(s.q.qpn(), false)?;
            e.set_queue_state(true, i, false);
        }
    }
    Ok(())
}
