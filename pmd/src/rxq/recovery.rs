//! Starting over: a queue reset by the application, and the restart after an error
//! completion stopped the RQ. Neither allocates nor frees a buffer.

use std::sync::atomic::Ordering;

use super::{create_hw, destroy_hw, RxBuf, RxQueue};
use crate::hw::{Device, HwError, QueueState};
use crate::pmd_log;

impl<B: RxBuf> RxQueue<B> {
    /// Device or queue stopped: start over with the same buffers on the same device queues,
    /// the RQ through reset to ready from WQE 0 and the completions it left skipped. Nothing
    /// is allocated or freed, so the rings live from setup to release; the RQ keeps its
    /// number. A device that cannot restart an RQ gets fresh queues instead; if it cannot
    /// make new ones, the old ones stay.
    pub fn reset(&mut self, dev: &dyn Device) -> Result<(), HwError> {
        // Until the ring is handed over again from WQE 0, the restarted RQ must find no WQE:
        // the old producer count means nothing against its new consumer.
        let posted = self.rq.db_rec().swap(0, Ordering::AcqRel);
        match dev.restart_rq(self.qpn) {
            Ok(()) => {}
            Err(HwError::Unsupported(_)) => {
                self.rq.db_rec().store(posted, Ordering::Release);
                return self.recreate(dev);
            }
            Err(e) => {
                self.rq.db_rec().store(posted, Ordering::Release);
                return Err(e);
            }
        }
        // Completions nobody polled: frames the device delivered that the restart drops. Their
        // buffers stay in their slots. No more than one per posted WQE can wait, and the RQ
        // finds no WQE now, so none comes after.
        let mut stale = 0;
        while stale < self.wqe_cnt && self.cq.next_view().is_some() {
            stale += 1;
        }
        self.cq.update_ci();
        self.stats.discarded += u64::from(stale);
        self.rq_ci = 0;
        self.error_seen = None;
        // Buffers outside registered memory never made it into the ring; they fail again here.
        self.post_all_entries();
        self.post_all();
        Ok(())
    }

    /// What [`RxQueue::reset`] does on a device that cannot restart an RQ: new device queues
    /// (new rings) for the old.
    fn recreate(&mut self, dev: &dyn Device) -> Result<(), HwError> {
        let (cq, rq) = create_hw(dev, self.wqe_cnt, &self.cfg)?;
        self.stats.discarded += self.cq.ready(self.wqe_cnt as usize) as u64;
        self.qpn = rq.desc().qpn();
        let old_cq = std::mem::replace(&mut self.cq, cq);
        let old_rq = std::mem::replace(&mut self.rq, rq);
        destroy_hw(dev, old_cq, old_rq);
        self.rq_ci = 0;
        self.error_seen = None;
        self.post_all_entries();
        self.post_all();
        Ok(())
    }

    /// Whether an error completion arrived since the last [`RxQueue::recover`] (one load: the
    /// burst glue asks after every burst).
    #[inline(always)]
    pub fn needs_recovery(&self) -> bool {
        self.error_seen.is_some()
    }

    /// After an error completion: if the device moved the RQ to the error state, restart it in
    /// place. Every slot still holds its buffer (an error completion hands none up and takes no
    /// fresh one), so the ring is handed over again whole from WQE 0, with the same buffers:
    /// nothing is allocated or freed, and the RQ keeps its number and so its place in
    /// the steering tables. Frames that reached it meanwhile were dropped and counted by the
    /// device (`imissed`). Returns whether the queue receives.
    #[cold]
    #[inline(never)]
    pub fn recover(&mut self, dev: &dyn Device) -> bool {
        let Some((syndrome, vendor_err)) = self.error_seen.take() else {
            return true;
        };
        let port = self.cfg.port_id;
        match dev.rq_state(self.qpn) {
            Ok(QueueState::Error) => {}
            Ok(_) => return true,
            Err(e) => {
                pmd_log!(ERR, "port {port}: RX queue {}: state: {e}", self.qid);
                return false;
            }
        }
        if !std::mem::replace(&mut self.error_logged, true) {
            pmd_log!(
                ERR,
                "port {port}: RX queue {}: error CQE syndrome {syndrome:#04x} vendor {vendor_err:#04x} stopped the queue; restarting it",
                self.qid
            );
        }
        // Until the ring is handed over again from WQE 0, the restarted RQ must find no WQE:
        // the old producer count means nothing against its new consumer.
        self.rq.db_rec().store(0, Ordering::Release);
        if let Err(e) = dev.restart_rq(self.qpn) {
            pmd_log!(
                ERR,
                "port {port}: RX queue {}: restart failed: {e}",
                self.qid
            );
            return false;
        }
        self.rq_ci = 0;
        self.post_all();
        self.stats.queue_resets += 1;
        true
    }

    /// Notes an error completion for [`RxQueue::recover`].
    #[cold]
    pub(super) fn on_error_cqe(&mut self, syndrome: u8, vendor_err: u8) {
        self.stats.error_cqes += 1;
        self.error_seen = Some((syndrome, vendor_err));
    }
}
