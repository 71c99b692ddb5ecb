//! Completions and recovery: consuming CQEs (stamping, bulk frees), error completions and
//! the queue's re-creation, the looks for a lost doorbell, the drain at stop.

use super::*;

impl<B: TxBuf> TxQueue<B> {
    /// Consumes available CQEs: stamps the completed TXBBs and frees the completed buffers in
    /// bulk, once for all of them. Returns the number of buffers freed.
    #[inline(always)]
    pub fn complete(&mut self) -> usize {
        let Some(cqe) = self.hw.cq.poll() else {
            return 0;
        };
        self.complete_from(cqe)
    }

    #[inline(never)]
    pub(super) fn complete_from(
        &mut self,
        first: mlx4_prm::Cqe<[u8; mlx4_prm::CQE_SIZE]>,
    ) -> usize {
        let mut cqe = Some(first);
        let mut end = None;
        let mut cqes = 0;
        while let Some(c) = cqe {
            if c.opcode() == cqe_opcode::ERROR {
                self.on_error_cqe(c.syndrome(), c.vendor_err(), c.wqe_index());
                break;
            }
            // A completion covers its WQE and every one before it (the queue executes in
            // order): it takes the requests up to the one naming its WQE, normally the next.
            let mask = self.marks.len() as u32 - 1;
            let tail = self.comp.marks_tail;
            let pending = self.prod.marks_head.wrapping_sub(tail);
            let at = |k: u32| self.marks[(tail.wrapping_add(k) & mask) as usize];
            let mut k = 0;
            while k < pending && at(k).wqe_index != c.wqe_index() {
                k += 1;
            }
            if k < pending {
                end = Some(at(k));
                self.comp.marks_tail = tail.wrapping_add(k + 1);
                self.prod.stats.cqe_mismatches += u64::from(k);
            } else {
                self.prod.stats.cqe_mismatches += 1;
            }
            cqes += 1;
            cqe = self.hw.cq.poll();
        }
        if cqes > 0 {
            self.hw.cq.update_ci();
            self.prod.stats.completions += cqes;
        }
        let Some(m) = end else { return 0 };
        self.hw.sq.stamp(self.comp.cons, m.txbb_end);
        self.comp.cons = m.txbb_end;
        self.sync_front();
        // Progress: the next look without room starts the count over, and is not counted.
        self.set_full_left(FULL_PATIENCE + 1);
        self.free_elts(m.elts_end)
    }

    /// Releases the held buffers before gather-ring counter `end`, in at most two bulk calls.
    pub(super) fn free_elts(&mut self, end: u32) -> usize {
        let tail = self.elts.head().wrapping_sub(self.elts.len());
        if end == tail {
            return 0;
        }
        // Fast free only if no buffer of several segments is among them.
        let fast = self.cfg.fast_free && (self.prod.chained_until.wrapping_sub(tail) as i32) <= 0;
        let (a, b) = self.elts.take_until(end);
        release(a, fast);
        release(b, fast);
        a.len() + b.len()
    }

    /// An error CQE: the device moved the SQ to the error state. Count and log once per queue;
    /// the queue takes nothing more until [`TxQueue::recover`] restarts it, and counts then
    /// what was lost with it.
    #[cold]
    #[inline(never)]
    pub(super) fn on_error_cqe(&mut self, syndrome: u8, vendor_err: u8, wqe_index: u16) {
        self.prod.stats.error_cqes += 1;
        self.set_detour(self.comp.detour | FAILED);
        self.recovery.error_wqe = wqe_index;
        if !self.comp.error_logged {
            self.comp.error_logged = true;
            pmd_log!(
                ERR,
                "{}: TX queue {}: error CQE syndrome {syndrome:#04x} vendor {vendor_err:#04x} at WQE {wqe_index}; restarting the queue",
                self.name,
                self.qid
            );
        }
    }

    /// Whether an error completion stopped the queue: it needs [`TxQueue::recover`].
    #[inline]
    pub fn failed(&self) -> bool {
        self.comp.detour & FAILED != 0
    }

    /// Drops what was in flight on a failed queue and restarts it on the device
    /// ([`TxQueue::reset`]). Returns whether the queue works again.
    pub fn recover(&mut self, dev: &dyn Device) -> bool {
        match self.reset(dev) {
            Ok(()) => true,
            Err(e) => {
                pmd_log!(
                    ERR,
                    "{}: TX queue {}: recovery failed: {e}",
                    self.name,
                    self.qid
                );
                false
            }
        }
    }

    /// Frees every outstanding buffer and brings the same device queue back from slot 0: the
    /// SQ through reset to ready, its ring stamped whole again, the completions of the run
    /// that ended skipped. Nothing is allocated or freed but the buffers, so the rings live
    /// from setup to release. Used after an error, at queue start and when the port stops
    /// (the device no longer executes anything then). A device that cannot move a send queue
    /// through reset gets a fresh queue instead; if it cannot make one, the old one stays,
    /// and so does its state.
    pub fn reset(&mut self, dev: &dyn Device) -> Result<(), HwError> {
        match dev.set_sq_ready(self.qpn(), false) {
            Ok(()) => {}
            Err(HwError::Unsupported(_)) => return self.recreate(dev),
            Err(e) => return Err(e),
        }
        // The SQ executes nothing now, so nothing more completes into its CQ.
        self.count_lost();
        // Each CQE names a WQE of the run that ended: against the new run's marks it would
        // match the wrong one. At most a CQ's worth can wait.
        let mut stale = 0;
        while stale < self.hw.cq.cqe_cnt() && self.hw.cq.poll().is_some() {
            stale += 1;
        }
        self.hw.cq.update_ci();
        // A doorbell walks until the first slot the device does not own: old WQEs of the
        // same parity would run again. Stamped as pass 1's, every slot is invalid for pass 0,
        // as at creation.
        let cnt = self.txbb_cnt();
        self.hw.sq.stamp(cnt, cnt.wrapping_mul(2));
        self.restart_counters();
        dev.set_sq_ready(self.qpn(), true)
    }

    /// What [`TxQueue::reset`] does on a device without send queue states: a new device queue
    /// (new rings) for the old.
    fn recreate(&mut self, dev: &dyn Device) -> Result<(), HwError> {
        let fresh = create_hw(dev, self.txbb_cnt(), self.marks.len() as u32, &self.cfg)?;
        // Read from the old ring before it goes.
        self.count_lost();
        destroy_hw(dev, std::mem::replace(&mut self.hw, fresh));
        // The new queue's registers may not be the old one's.
        self.one = Self::one_for(&self.hw);
        self.restart_counters();
        Ok(())
    }

    /// On a failed queue: counts what the device will never send (read from the ring).
    fn count_lost(&mut self) {
        if self.failed() {
            let lost = self.count_flushed();
            let st = &mut self.prod.stats;
            st.flushed += lost;
            st.queue_resets += 1;
            st.errors += lost;
        }
    }

    /// Frees what was in flight and starts the counters over at slot 0, where the device
    /// starts.
    fn restart_counters(&mut self) {
        self.free_elts(self.elts.head());
        debug_assert!(self.elts.is_empty());
        (self.prod.prod, self.prod.marks_head, self.prod.since_comp) = (0, 0, 0);
        self.prod.txbbs_since_comp = 0;
        (self.prod.bell, self.prod.unrung) = (0, 0);
        (self.comp.cons, self.comp.marks_tail) = (0, 0);
        let r = &mut self.recovery;
        (r.nop_at, r.kick_cons) = (None, 0);
        self.set_full_left(FULL_PATIENCE);
        self.set_detour(self.comp.detour & !FAILED);
    }

    /// Packets in the WQEs from the failed one up to the producer: what the device of a queue
    /// in error never sends. WQEs before the failed one executed (a queue executes in order).
    /// NOPs (completion requests, the padding to the ring's end) hold none.
    pub(super) fn count_flushed(&self) -> u64 {
        let (cons, prod) = (self.comp.cons, self.prod.prod);
        let ahead = |c: u32| c.wrapping_sub(cons);
        let mut pos =
            cons.wrapping_add(u32::from(self.recovery.error_wqe.wrapping_sub(cons as u16)));
        let mut n = 0;
        while ahead(pos) < ahead(prod) {
            let ctrl = self.hw.sq.ctrl_head(pos);
            let txbbs = txbbs_for(usize::from(ctrl.ds()) * 16).max(1);
            if ctrl.opcode() != opcode::NOP {
                n += 1;
            } else if txbbs > 1 {
                // Padding: it runs to the ring's end (its size field may say less).
                pos = (pos | (self.txbb_cnt() - 1)).wrapping_add(1);
                continue;
            }
            pos = pos.wrapping_add(txbbs);
        }
        n
    }

    /// No room: counted, and a look for a lost doorbell (see [`TxQueue::look_without_room`]).
    #[inline(always)]
    pub(super) fn full(&mut self) -> usize {
        self.prod.stats.ring_full += 1;
        self.look_without_room();
        0
    }

    /// A burst that found no room looks for a lost doorbell: a full ring whose last doorbell
    /// was lost would otherwise take nothing from every later burst, and so never ring again.
    /// An application spinning on a full ring calls often while the device is merely behind,
    /// so this rings only after [`FULL_PATIENCE`] calls without progress, and after twice as
    /// many each time a ring again brought none ([`TxQueue::ring_again`]). The burst's front
    /// found no completion waiting and the queue healthy, so the look is only the count.
    /// The count is a countdown that the completion side winds up whenever the consumer
    /// moves, so that a look is one decrement and its test.
    #[inline(always)]
    pub(super) fn look_without_room(&mut self) {
        let left = self.looks_left();
        *left -= 1;
        if *left == 0 {
            self.ring_again();
        }
    }

    /// For a queue nobody posts on. A doorbell can be lost (the device takes only WQEs a
    /// doorbell covered), leaving posted WQEs waiting with nothing after them to ring again;
    /// a burst with packets needs none of this, as its doorbell covers everything posted
    /// before. So: if WQEs are outstanding and no completion progressed since the last look,
    /// ring again, first asking for a completion, so that the next look can see progress.
    /// The first look without progress rings; after that, each ring again that brought no
    /// progress doubles the looks to the next ([`Recovery::kick_stalled`]), counted in calls so
    /// that a look reads no clock. Counted in `doorbell_rerings`. Called by `tx_burst` with
    /// no packets, `tx_done_cleanup` and [`TxQueue::drain`] (a burst that finds no room has
    /// its own, more patient look); returns whether it rang.
    #[cold]
    #[inline(never)]
    pub fn kick(&mut self) -> bool {
        self.complete();
        if self.prod.unrung != 0 && !self.failed() {
            // Doorbell avoidance left WQEs waiting: this call is the later one that rings.
            self.ring_unrung();
            return true;
        }
        let cons = self.comp.cons;
        let r = &mut self.recovery;
        let progressed = std::mem::replace(&mut r.kick_cons, cons) != cons;
        if progressed || cons == self.prod.prod {
            r.kick_stalled = 0;
        }
        if progressed || self.failed() || cons == self.prod.prod {
            self.set_full_left(FULL_PATIENCE);
            return false;
        }
        let r = &mut self.recovery;
        r.kick_stalled = r.kick_stalled.wrapping_add(1);
        // The n-th look in a row rings where n + 1 is a power of two, then every
        // FULL_PATIENCE_MAX looks once the gaps reach that.
        let n = u64::from(r.kick_stalled) + 1;
        let max = u64::from(FULL_PATIENCE_MAX);
        if !(n.is_power_of_two() && n <= max || n > max && n % max == 0) {
            return false;
        }
        self.ring_again();
        true
    }

    /// What a look that saw no progress for long enough does: ring again, first asking for a
    /// completion. Also when the tail asked for one: a device that lost it (a card does not)
    /// would otherwise hold the queue for ever; one NOP per stretch without progress.
    #[cold]
    #[inline(never)]
    pub(super) fn ring_again(&mut self) {
        let r = &mut self.recovery;
        r.rering_patience = if r.rering_cons == self.comp.cons {
            r.rering_patience.saturating_mul(2)
        } else {
            0
        }
        .clamp(FULL_PATIENCE, FULL_PATIENCE_MAX);
        r.rering_cons = self.comp.cons;
        let patience = r.rering_patience;
        self.set_full_left(patience);
        self.prod.stats.doorbell_rerings += 1;
        if self.recovery.nop_at != Some(self.prod.prod) && self.ask_completion_even_if_signaled() {
            self.recovery.nop_at = Some(self.prod.prod);
        }
        self.hw.doorbell.ring();
        self.prod.stats.doorbells += 1;
        (self.prod.bell, self.prod.unrung) = (self.prod.prod, 0);
    }

    /// Posts a signaled NOP if the last WQEs asked for no completion (and there is room for
    /// it), so that their execution shows; whether it did. The caller rings.
    pub(super) fn ask_completion(&mut self) -> bool {
        let unsignaled = self.prod.since_comp > 0 || self.prod.txbbs_since_comp > 0;
        unsignaled && self.ask_completion_even_if_signaled()
    }

    /// Posts a signaled NOP if there is room for it; whether it did. The caller rings.
    pub(super) fn ask_completion_even_if_signaled(&mut self) -> bool {
        let ask = self.room() >= 1 && self.marks_free();
        if ask {
            self.post_signaled_nop();
        }
        ask
    }

    /// Waits (at most `limit`) until the device has executed everything posted, asking for a
    /// completion with a NOP if the last WQEs did not, and ringing again if nothing progresses
    /// for a millisecond (a lost doorbell). Used before the port stops, so that what
    /// `tx_burst` took reaches the wire rather than being discarded with the queue.
    pub fn drain(&mut self, dev: &dyn Device, limit: std::time::Duration) -> bool {
        let start = std::time::Instant::now();
        let mut looked = start;
        loop {
            if self.prod.unrung != 0 {
                self.ring_unrung();
            }
            self.complete();
            if self.failed() {
                // Nothing more will execute; the queue restarts when the port stops.
                return false;
            }
            if self.comp.cons == self.prod.prod {
                return true;
            }
            if self.ask_completion() {
                self.hw.doorbell.ring();
                self.prod.stats.doorbells += 1;
                self.prod.bell = self.prod.prod;
            } else if looked.elapsed() >= std::time::Duration::from_millis(1) {
                looked = std::time::Instant::now();
                self.kick();
            }
            if start.elapsed() >= limit {
                return false;
            }
            dev.poll();
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    /// `tx_done_cleanup`: reclaims completed buffers (and rings again if posted WQEs made no
    /// progress, see [`TxQueue::kick`]); returns how many were freed.
    pub fn done_cleanup(&mut self, _free_cnt: u32) -> usize {
        let freed = self.complete();
        self.kick();
        freed
    }
}
