//! Starting and stopping single queues while the port runs, deferred start, and the reset of
//! every queue at port stop.
//!
//! A stopped queue's bursts answer 0 without touching it, so an application still polling it
//! reaches neither its rings nor its buffers. Its device queue is in reset: an RQ in reset
//! takes no frame (the device drops its share of the traffic and counts it), an SQ in reset
//! executes nothing. Starting a queue brings the same device queue back through reset to
//! ready, on the same rings, as a port start does: what a stopped RX queue held is gone, and
//! what a TX queue had not sent when it stopped is freed.

use std::ffi::c_int;
use std::time::Duration;

use super::eth::{ops, EthMut};
use super::slot::point_lcore;
use super::{invalid, Error};
use crate::pmd_log;

ops! {
    fn rx_queue_start(qid: u16) -> c_int = exclusive rx_start, "RX queue start";
    fn rx_queue_stop(qid: u16) -> c_int = exclusive rx_stop, "RX queue stop";
    fn tx_queue_start(qid: u16) -> c_int = exclusive tx_start, "TX queue start";
    fn tx_queue_stop(qid: u16) -> c_int = exclusive tx_stop, "TX queue stop";
}

fn rx_start(e: &mut EthMut<'_>, qid: u16) -> Result<(), Error> {
    e.primary_only()?;
    let dev = e.dev;
    let Some((s, q)) = e.stopped_rxq(qid) else {
        return e
            .rxq(qid)
            .map(|_| ())
            .ok_or_else(|| invalid!("RX queue {qid} not set up"));
    };
    q.reset(dev)?;
    s.set_qpn(q.qpn());
    // The redirection table names the new RQ.
    e.apply_rx()?;
    e.set_queue_state(false, qid, true);
    Ok(())
}

fn rx_stop(e: &mut EthMut<'_>, qid: u16) -> Result<(), Error> {
    e.primary_only()?;
    let s = e
        .rxq(qid)
        .ok_or_else(|| invalid!("RX queue {qid} not set up"))?;
    e.set_queue_state(false, qid, false);
    e.dev.set_rq_ready(s.qpn(), false)?;
    Ok(())
}

fn tx_start(e: &mut EthMut<'_>, qid: u16) -> Result<(), Error> {
    e.primary_only()?;
    let (dev, lcore) = (e.dev, e.lcore);
    let Some((s, q)) = e.stopped_txq(qid) else {
        return e
            .txq(qid)
            .map(|_| ())
            .ok_or_else(|| invalid!("TX queue {qid} not set up"));
    };
    q.reset(dev)?;
    s.set_qpn(q.qpn());
    point_lcore(lcore, q, true);
    e.set_queue_state(true, qid, true);
    Ok(())
}

fn tx_stop(e: &mut EthMut<'_>, qid: u16) -> Result<(), Error> {
    e.primary_only()?;
    if e.txq(qid).is_none() {
        return Err(invalid!("TX queue {qid} not set up"));
    }
    e.set_queue_state(true, qid, false);
    let (dev, name) = (e.dev, e.port.name);
    let (s, q) = e.stopped_txq(qid).expect("set up, and stopped above");
    if !q.drain(dev, Duration::from_secs(1)) {
        pmd_log!(
            WARNING,
            "{name}: TX queue {qid}: the device did not drain within 1 s"
        );
    }
    dev.set_sq_ready(s.qpn(), false)?;
    Ok(())
}

/// At port start: queues set up with deferred start stay stopped until started by name.
pub(super) fn defer(e: &mut EthMut<'_>) -> Result<(), Error> {
    for (i, s) in e.rxqs().filter(|(_, s)| s.x.deferred) {
        e.set_queue_state(false, i, false);
        e.dev.set_rq_ready(s.qpn(), false)?;
    }
    for (i, s) in e.txqs().filter(|(_, s)| s.x.deferred) {
        e.set_queue_state(true, i, false);
        e.dev.set_sq_ready(s.qpn(), false)?;
    }
    Ok(())
}

/// At port stop, with the device stopped: every buffer still in flight is reclaimed and each
/// queue starts afresh at the next start.
pub(super) fn reset_all(e: &mut EthMut<'_>) {
    let (dev, name, lcore) = (e.dev, e.port.name, e.lcore);
    for i in 0..e.conf.nb_tx_queues {
        let Some((s, q)) = e.stopped_txq(i) else {
            continue;
        };
        if let Err(err) = q.reset(dev) {
            pmd_log!(ERR, "{name}: TX queue {i}: reset failed: {err}");
        }
        s.set_qpn(q.qpn());
        point_lcore(lcore, q, true);
    }
    dev.rq_batch(e.conf.nb_rx_queues);
    for i in 0..e.conf.nb_rx_queues {
        let Some((s, q)) = e.stopped_rxq(i) else {
            continue;
        };
        if let Err(err) = q.reset(dev) {
            pmd_log!(ERR, "{name}: RX queue {i}: reset failed: {err}");
        }
        s.set_qpn(q.qpn());
    }
}
