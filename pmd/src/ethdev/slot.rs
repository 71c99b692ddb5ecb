//! The queue slots: what an ethdev `tx_queues`/`rx_queues` entry points to.
//!
//! The aliasing rule: an lcore holds its queue mutably for a whole burst, while DPDK's
//! telemetry thread, `show port stats` and secondary processes read the same queue's
//! counters. So a slot is only ever shared (`&Slot`): its queue sits in an `UnsafeCell` that
//! the polling lcore alone turns into `&mut` ([`Slot::queue`]), and readers take the counters
//! word by word through the raw pointer ([`crate::txq::TxQueue::stats_raw`]). What an op reads
//! beside the data path (QPN, started) are atomics in the slot; the rest is fixed at setup.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::hw::soft::Lcore;
use crate::mbuf::{Mbuf, Pool};
use crate::rxq::{RxQueue, RxStats};
use crate::txq::{TxQueue, TxStats};

pub(super) type TxQ = TxQueue<Mbuf>;
pub(super) type RxQ = RxQueue<Mbuf>;

/// What a `tx_queues`/`rx_queues` entry points to: the queue, owned by the lcore that polls
/// it, beside what other threads may read about it.
pub(super) struct Slot<Q, X> {
    pub port_id: u16,
    /// Fixed at setup.
    pub x: X,
    /// A stopped queue's burst returns 0 without touching the queue.
    started: AtomicBool,
    /// The device queue's number, renewed when the queue is recreated.
    qpn: AtomicU32,
    q: UnsafeCell<Q>,
}

impl<Q, X> Slot<Q, X> {
    pub fn new(port_id: u16, x: X, qpn: u32, q: Q) -> Self {
        Slot {
            port_id,
            x,
            started: AtomicBool::new(false),
            qpn: AtomicU32::new(qpn),
            q: UnsafeCell::new(q),
        }
    }

    /// Acquire: a queue started by a control thread is seen as that thread left it.
    #[inline(always)]
    pub fn started(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }

    pub fn set_started(&self, on: bool) {
        self.started.store(on, Ordering::Release);
    }

    pub fn qpn(&self) -> u32 {
        self.qpn.load(Ordering::Relaxed)
    }

    pub fn set_qpn(&self, qpn: u32) {
        self.qpn.store(qpn, Ordering::Relaxed);
    }

    pub fn into_queue(self) -> Q {
        self.q.into_inner()
    }

    /// Runs one of the queue's word-by-word counter accessors (`stats_raw`,
    /// `reset_stats_raw`), which reach the counters through the raw pointer and never make a
    /// reference to the queue: the one way a thread beside the polling lcore touches it.
    fn counters<P: QueuePtr<Q>, R>(&self, accessor: unsafe fn(P) -> R) -> R {
        // SAFETY: the slot's live queue; the accessors are the queue's own, whose one
        // contract is a pointer to a live queue.
        unsafe { accessor(P::from_cell(self.q.get())) }
    }

    /// The queue, to use mutably.
    ///
    /// # Safety
    /// Nothing else uses the queue meanwhile: the caller is the lcore that polls it (ethdev's
    /// rule: one lcore per queue), or a control op while no lcore polls it (the port or the
    /// queue stopped).
    #[allow(
        clippy::mut_from_ref,
        reason = "the UnsafeCell's one user, by contract"
    )]
    #[inline(always)]
    pub unsafe fn queue(&self) -> &mut Q {
        // SAFETY: the caller's contract.
        unsafe { &mut *self.q.get() }
    }
}

/// The pointer a counter accessor takes (`*const` to read, `*mut` to reset), from the cell's.
trait QueuePtr<Q> {
    fn from_cell(p: *mut Q) -> Self;
}

impl<Q> QueuePtr<Q> for *const Q {
    fn from_cell(p: *mut Q) -> Self {
        p.cast_const()
    }
}

impl<Q> QueuePtr<Q> for *mut Q {
    fn from_cell(p: *mut Q) -> Self {
        p
    }
}

/// What a TX queue's slot fixes at setup.
pub(super) struct TxFixed {
    /// The queue's doorbell and BlueFlame registers are mapped at the same address in every
    /// process, so a secondary may transmit on it.
    pub registers_shared: bool,
    /// Left stopped at port start (`tx_deferred_start`).
    pub deferred: bool,
    pub nb_desc: u16,
}

/// What an RX queue's slot fixes at setup.
pub(super) struct RxFixed {
    /// Left stopped at port start (`rx_deferred_start`).
    pub deferred: bool,
    pub nb_desc: u16,
    pub pool: Pool,
    pub scattered: bool,
}

/// What a `tx_queues` entry points to.
pub(super) type TxSlot = Slot<TxQ, TxFixed>;
/// What an `rx_queues` entry points to.
pub(super) type RxSlot = Slot<RxQ, RxFixed>;

impl TxSlot {
    /// The queue's counters, as a thread beside its lcore reads them.
    pub fn stats(&self) -> TxStats {
        self.counters(TxQ::stats_raw)
    }

    pub fn reset_stats(&self) {
        self.counters(TxQ::reset_stats_raw)
    }
}

impl RxSlot {
    /// As [`TxSlot::stats`].
    pub fn stats(&self) -> RxStats {
        self.counters(RxQ::stats_raw)
    }

    pub fn reset_stats(&self) {
        self.counters(RxQ::reset_stats_raw)
    }
}

/// Points the device that runs in the polling lcore (if it does) at TX queue `q`'s SQ
/// (`live`), or at none (a queue being released), by the queue's id.
///
/// `q` is the queue of its port's slot `q.qid` (or was just taken out of it). Whoever holds
/// that queue mutably is its one user, and the lcore's device runs a queue (`after_tx`) only
/// inside that queue's burst, which holds it: so holding `q` is what `Lcore::set_sq` asks
/// for. Holders are the queue's lcore between bursts (recovery), and control ops on a queue
/// no lcore polls (set up, released, stopped: DPDK's rules).
pub(super) fn point_lcore(lcore: Option<&Lcore>, q: &mut TxQ, live: bool) {
    if let Some(l) = lcore {
        // SAFETY: no after_tx on this queue runs while `q` is held (above).
        unsafe { l.set_sq(q.qid, live.then(|| q.qpn())) };
    }
}
