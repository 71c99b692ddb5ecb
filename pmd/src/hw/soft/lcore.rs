//! The device loop run by the polling lcore rather than a thread of its own.

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

use mlx4_hca::{Hca, RxRunner, SqRunner};

use crate::mem::DmaBuf;

/// The device loop's share of the polling lcore: the burst glue calls [`Lcore::after_tx`]
/// after `tx_burst` posted and [`Lcore::before_rx`] before `rx_burst` polls. The queue code
/// never does: it only stores to memory and device pages, as on a card. The model's runners
/// cost a few loads and no lock when there is nothing to do.
///
/// `Sync` (from its fields) because every polling lcore of the process calls `after_tx` and
/// `before_rx` on the one `Lcore` of its port at the same time: the runners are `Sync` (the
/// model's queues take their own locks), and the table of SQ runners is atomic pointers, which
/// only [`Lcore::set_sq`] replaces and frees, under its contract.
pub struct Lcore {
    hca: Hca,
    rx: RxRunner,
    /// The runner of each TX queue's SQ, by queue index, set by the control path
    /// ([`Lcore::set_sq`]) whenever the queue gets a new SQ.
    sqs: Box<[AtomicPtr<SqRunner>]>,
    /// Keeps the model's device memory until the runners are gone (dropped last).
    _bar_mem: Option<Arc<DmaBuf>>,
}

impl Lcore {
    /// The lcore's share of the device `hca`, for up to `queues` TX queues.
    pub(super) fn new(
        hca: Hca,
        rx: RxRunner,
        queues: usize,
        bar_mem: Option<Arc<DmaBuf>>,
    ) -> Lcore {
        Lcore {
            hca,
            rx,
            sqs: (0..queues)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            _bar_mem: bar_mem,
        }
    }

    /// Executes what TX queue `qid`'s SQ was told to do (doorbells, BlueFlame copies).
    #[inline]
    pub fn after_tx(&self, qid: u16) {
        let p = self.sqs[usize::from(qid)].load(Ordering::Acquire);
        // SAFETY: NULL or a runner set_sq boxed, which is only replaced or freed by the control
        // path while no burst of this process runs on the queue (DPDK's rule for queue setup,
        // release and port stop; recovery runs in the queue's own lcore, between bursts).
        if let Some(r) = unsafe { p.as_ref() } {
            r.run();
        }
    }

    /// Delivers frames waiting at the port to its receive queues.
    #[inline]
    pub fn before_rx(&self) {
        self.rx.run();
    }

    /// TX queue `qid` now runs on the SQ `qpn` (None: the queue is gone). The runner it
    /// replaces is freed here, while another lcore may be in [`Lcore::after_tx`] with it, so
    /// the caller vouches that none is.
    ///
    /// # Safety
    /// No call of `after_tx(qid)` may run, in any thread, while this runs (DPDK's rule that a
    /// queue is set up, released, started and stopped while no lcore polls it, and that
    /// recovery runs in the queue's own lcore between its bursts).
    ///
    /// ```compile_fail
    /// fn swap_under_a_burst(l: &mlx4rs::hw::soft::Lcore) {
    ///     l.set_sq(0, None);
    /// }
    /// ```
    pub unsafe fn set_sq(&self, qid: u16, qpn: Option<u32>) {
        let new = qpn
            .and_then(|q| self.hca.sq_runner(q).ok())
            .map_or(std::ptr::null_mut(), |r| Box::into_raw(Box::new(r)));
        let old = self.sqs[usize::from(qid)].swap(new, Ordering::AcqRel);
        if !old.is_null() {
            // SAFETY: a box set_sq made; no burst runs on the queue (the caller's contract).
            drop(unsafe { Box::from_raw(old) });
        }
    }
}

impl Drop for Lcore {
    fn drop(&mut self) {
        for qid in 0..self.sqs.len() {
            // SAFETY: `&mut self`: no other thread holds the Lcore, so none is in after_tx.
            unsafe { self.set_sq(qid as u16, None) };
        }
    }
}
