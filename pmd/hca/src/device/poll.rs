//! One poll of the device loop: the doorbell words and BlueFlame halves of every UAR page,
//! the CQ doorbells, the send queues they wake, the receive inbox, and the port's link.

use super::*;

/// CQ doorbell commands (bits 25:24 of the high dword): request an event for the next solicited
/// (or error) completion, or for the next completion.
const ARM_SOLICITED: u32 = 1;
const ARM_NEXT: u32 = 2;
/// The device loop publishes its counters to device memory after this many polls that changed
/// them, or once this many polls in a row changed nothing more: about a microsecond of a
/// spinning device thread either way. Whoever reads them through the adapter (the driver's
/// stats and xstats, telemetry, a secondary process asking the primary) has them published at
/// once (`Hca::counters`), so only a reader of bare device memory sees them this late.
const PUBLISH_EVERY: u32 = 64;

impl DevState {
    /// One pass over every doorbell word, BlueFlame half and the receive inbox; returns the work
    /// items done (0 = idle).
    pub(crate) fn poll(&mut self) -> usize {
        if self.removed {
            return 0;
        }
        let mut work = 0;
        for i in 0..self.uars.len() {
            work += self.poll_uar(i);
        }
        // A charged doorbell keeps the device busy before it walks: the walks wait for the
        // next poll, after the charge is spent.
        // Whether a queue was looked at: a walk that does nothing may still count (a stall).
        let mut looked = false;
        if self.owed_ns == 0 {
            for slot in 0..self.qps.len() {
                if matches!(self.qps.get(slot), Some(Qp::Sq(sq)) if !sq.idle()) {
                    looked = true;
                    work += self.poll_sq_slot(slot);
                }
            }
        }
        // Nothing to receive is one load (of the receive buffer's counts) while the wire
        // brings no frames itself.
        if self.wire_rx || self.port.has_pending() {
            work += self.poll_rx();
        }
        if work > 0 {
            self.flush_wire();
        }
        // A poll that took nothing, looked at no queue and has no cable (whose far end counts
        // drops here) changed no counter. The control path publishes what it changes itself
        // (`Hca::state`).
        let changed = work > 0 || looked || self.wire.cable().is_some();
        self.publish_lazily(changed);
        work
    }

    /// End the wire's batch: publish what was delivered to receive buffers, make buffered
    /// output visible. A null wire keeps no batch and no output.
    #[inline]
    fn flush_wire(&mut self) {
        if self.wire.wants_bytes() {
            self.wire.flush();
        }
    }

    /// Publish the counters after `PUBLISH_EVERY` polls that `changed` them, or once as many
    /// polls in a row changed nothing: one publication (a compare of the whole block and the
    /// changed words' stores) per many doorbells, not one per doorbell.
    #[inline]
    fn publish_lazily(&mut self, changed: bool) {
        if changed {
            self.quiet = 0;
            self.unpublished += 1;
            if self.unpublished < PUBLISH_EVERY {
                return;
            }
        } else {
            if self.unpublished == 0 {
                return;
            }
            self.quiet += 1;
            if self.quiet < PUBLISH_EVERY {
                return;
            }
        }
        self.publish();
    }

    pub(crate) fn bar(&self) -> &Bar {
        &self.pages.bar
    }

    /// Make the counters readable from device memory; nothing to do when none changed.
    pub(crate) fn publish(&mut self) {
        self.unpublished = 0;
        self.quiet = 0;
        self.pages.bar.publish(&self.counters, &mut self.published);
    }

    /// One send queue's share of a poll (a runner's call): the doorbells of its UAR page
    /// (which may name other queues of the page), then its own work; 0 if `qpn` is no SQ (any
    /// more).
    pub(crate) fn poll_sq(&mut self, qpn: u32) -> usize {
        if self.removed {
            return 0;
        }
        let slot = qp_slot(qpn);
        let uar = match self.qps.get(slot) {
            Some(Qp::Sq(sq)) if sq.qpn == qpn => sq.uar,
            _ => return 0,
        };
        let mut work = match self.uars.iter().position(|a| a.page.index == uar) {
            Some(i) => self.poll_uar(i),
            None => 0,
        };
        if self.owed_ns == 0 {
            work += self.poll_sq_slot(slot);
        }
        if work > 0 {
            self.flush_wire();
        }
        self.publish_lazily(true);
        work
    }

    /// The receive side's share of a poll (a runner's call).
    pub(crate) fn run_rx(&mut self) -> usize {
        if self.removed {
            return 0;
        }
        let work = self.poll_rx();
        if work > 0 {
            self.flush_wire();
        }
        let changed = work > 0 || self.wire.cable().is_some();
        self.publish_lazily(changed);
        work
    }

    /// What a runner of SQ `qpn` watches (see `Sq::watch`).
    pub(crate) fn sq_watch(&self, qpn: u32) -> Result<SqWatch, HcaError> {
        match self.qps.get(qp_slot(qpn)) {
            Some(Qp::Sq(sq)) if sq.qpn == qpn => {
                let a = self
                    .uars
                    .iter()
                    .find(|a| a.page.index == sq.uar)
                    .expect("an SQ's UAR page is polled");
                Ok(sq.watch(a.page.db.clone()))
            }
            _ => Err(HcaError::NotFound("SQ", qpn)),
        }
    }

    /// The doorbells of the `i`th UAR page in use: a send doorbell is taken with a swap (read
    /// first, so the driver's cache line is not stolen while none is there) and routed by the
    /// QPN it names to that queue, whichever page it landed on (doc/prm.md 3.2: the device routes
    /// by QPN).
    #[inline(always)]
    fn poll_uar(&mut self, i: usize) -> usize {
        let Some(a) = self.uars.get(i) else {
            return 0;
        };
        // Two loads decide an idle page.
        let (cq, send) = (a.words.cq(), a.words.send_pending());
        let mut work = 0;
        if cq != [0; 8] {
            work += self.poll_cq_db(i, cq);
        }
        if send {
            work += self.poll_send_db(i);
        }
        work
    }

    /// A CQ arm doorbell on the `i`th UAR page in use: the 64-bit BE store of
    /// `(sn << 28 | cmd | cqn) << 32 | ci` (doc/prm.md 5.3), taken whole with a swap.
    fn poll_cq_db(&mut self, i: usize, q: [u8; 8]) -> usize {
        if !self.uars[i].words.clear_cq_if(q) {
            return 0;
        }
        let v = u64::from_be_bytes(q);
        let (hi, ci) = ((v >> 32) as u32, v as u32);
        let cmd = hi >> 24 & 0x3;
        let cqn = hi & 0x00ff_ffff;
        self.counters.cq_arms += 1;
        match self.cqs.get_mut(cq_slot(cqn)) {
            Some(cq) if cq.cqn == cqn && (cmd == ARM_SOLICITED || cmd == ARM_NEXT) => {
                if cq.arm(cmd == ARM_SOLICITED, ci) {
                    self.counters.cq_events += 1;
                }
            }
            _ => self.counters.cq_arms_bad += 1,
        }
        1
    }

    /// The send doorbell word of the `i`th UAR page in use, which holds one.
    fn poll_send_db(&mut self, i: usize) -> usize {
        let DevState {
            uars,
            qps,
            counters,
            faults,
            owed_ns,
            doorbell_ns,
            ..
        } = self;
        let a = &mut uars[i];
        let v = a.words.take_send();
        // A card takes every UAR write (each a posted write of its own); a plain store that
        // lands on a word not yet taken merges with it here. A writer that counts its writes
        // (it bumps the count before its store) is charged each of them, conserved across
        // takes; a page no writer counts on is charged one write per doorbell taken.
        let n = a.words.take_writes();
        a.counted |= n != 0;
        let writes = if a.counted { u64::from(n) } else { 1 };
        counters.doorbells += writes;
        *owed_ns += writes * u64::from(*doorbell_ns);
        if faults.doorbell.tick() {
            // An injected fault: the write never reached the device.
            counters.inj_doorbells_dropped += 1;
            return 1;
        }
        let qpn = mlx4_prm::doorbell_qpn(v);
        match qps.get_mut(qp_slot(qpn)) {
            Some(Qp::Sq(sq)) if sq.qpn == qpn => {
                sq.doorbell(false, counters);
            }
            _ => {
                counters.doorbells_bad_qpn += 1;
                return 1;
            }
        }
        // On a shared page this doorbell may have overwritten another queue's.
        if a.sqs.len() > 1 {
            for &other in a.sqs.iter().filter(|&&q| q != qpn) {
                if let Some(Qp::Sq(sq)) = qps.get_mut(qp_slot(other)) {
                    sq.doorbell(true, counters);
                }
            }
        }
        1
    }

    fn poll_sq_slot(&mut self, slot: usize) -> usize {
        // The queue is worked on in place, beside the tables it needs: borrowing each field
        // apart, not moving the queue out of its slot and back.
        let DevState {
            qps,
            cqs,
            counters,
            wc,
            caps,
            mrs,
            wire,
            port,
            scratch,
            faults,
            shape_cache,
            ..
        } = self;
        let Some(Qp::Sq(sq)) = qps.get_mut(slot) else {
            unreachable!("the caller checked the slot")
        };
        let before = (counters.tx_frames, counters.tx_drops_wire);
        let bf_before = counters.bf_bursts;
        let work = match cqs.get_mut(cq_slot(sq.cqn)) {
            Some(cq) => {
                let work = sq.poll(&mut TxCtx {
                    wc: *wc,
                    pro: caps.tunnel_offloads,
                    max_wqe_size: caps.max_wqe_size as usize,
                    mrs,
                    cq,
                    wire,
                    port,
                    counters,
                    scratch,
                    faults,
                    shape_cache: *shape_cache,
                });
                cq.flush();
                work
            }
            None => 0,
        };
        self.charge_doorbells(self.counters.bf_bursts - bf_before);
        if self.faults.cfg.link_flap_every != 0 {
            let sent = self.counters.tx_frames - before.0;
            let lost = self.counters.tx_drops_wire - before.1;
            self.flap(sent, lost);
        }
        work
    }

    /// Charge what `n` UAR writes cost a card's device side, when the model is asked to
    /// ([`crate::HcaConfig::doorbell_ns`]). Spent by the caller with the lock released
    /// ([`DevState::take_owed`]).
    #[inline]
    fn charge_doorbells(&mut self, n: u64) {
        self.owed_ns += n * u64::from(self.doorbell_ns);
    }

    /// The charge to spend now, with the lock released: a doorbell's before the walk it asked
    /// for (the next poll), a BlueFlame burst's after the walk of its copy.
    #[inline]
    pub(crate) fn take_owed(&mut self) -> u64 {
        std::mem::take(&mut self.owed_ns)
    }

    /// Injected link flaps: down after `link_flap_every` frames sent, up again after
    /// `link_flap_frames` more were sent into the dead link.
    fn flap(&mut self, sent: u64, lost: u64) {
        let f = &mut self.faults;
        if !f.flapped {
            if sent < f.flap_left {
                f.flap_left -= sent;
                return;
            }
            f.flapped = true;
            f.flap_left = u64::from(f.cfg.link_flap_frames.max(1));
            self.counters.inj_link_downs += 1;
            self.link(false);
        } else {
            if lost < f.flap_left {
                f.flap_left -= lost;
                return;
            }
            f.flapped = false;
            f.flap_left = u64::from(f.cfg.link_flap_every);
            self.link(true);
        }
    }

    /// Faults to inject from now on (their schedules start over); a link an injected flap took
    /// down comes back up.
    pub(crate) fn set_faults(&mut self, faults: Faults) {
        if self.faults.flapped {
            self.link(true);
        }
        self.faults = FaultState::new(faults);
    }

    pub(crate) fn set_shape_cache(&mut self, on: bool) {
        self.shape_cache = on;
    }

    pub(crate) fn set_rx_stretches(&mut self, on: bool) {
        self.rx_stretches = on;
    }

    pub(crate) fn faults(&self) -> Faults {
        self.faults.cfg
    }

    /// Frames the far end of a cable sent that this end's ring refused: this port's drops.
    pub(crate) fn fold_wire_drops(&mut self) {
        if let Some(c) = self.wire.cable() {
            self.counters.rx_drops_wire += c.new_rx_drops();
        }
    }

    /// Plug the port into `wire`; a cable end takes the port's link state.
    pub(crate) fn set_wire(&mut self, wire: WirePort) {
        self.fold_wire_drops();
        self.wire = wire;
        self.wire_rx = self.wire.brings_frames();
        let up = self.port.up();
        if let Some(c) = self.wire.cable() {
            c.rx.set_up(up);
        }
        self.counters.rx_drops_wire += self.wire.set_port_up(up);
        // Best effort: a TAP interface the kernel will not give this MTU keeps its own.
        let _ = self.wire.set_mtu(self.rx.mtu);
        self.check_link();
    }

    /// The link now: the port up (not set down, no injected flap, not removed) and a carrier
    /// on its wire. A change from what was last reported is an event; so is finding the wire
    /// gone for good (removal).
    pub(crate) fn check_link(&mut self) -> bool {
        let (carrier, gone) = self.wire.carrier();
        if gone && !self.removed {
            self.remove();
            return false;
        }
        let up = self.port.up() && carrier && !self.removed;
        if up != self.link_reported {
            self.link_reported = up;
            self.events.push(if up {
                PortEvent::LinkUp
            } else {
                PortEvent::LinkDown
            });
        }
        up
    }

    /// The adapter goes away: the link goes down, nothing is executed or received any more,
    /// and the driver hears of it (`Removed`).
    pub(crate) fn remove(&mut self) {
        if self.removed {
            return;
        }
        self.removed = true;
        // Down (reporting it) before the removal itself.
        self.link(false);
        self.events.push(PortEvent::Removed);
    }

    pub(crate) fn removed(&self) -> bool {
        self.removed
    }

    /// The port goes down or up (explicitly, ending an injected flap).
    pub(crate) fn set_port_up(&mut self, up: bool) {
        self.link(up);
        if self.faults.flapped {
            self.faults.flapped = false;
            self.faults.flap_left = u64::from(self.faults.cfg.link_flap_every);
        }
        self.publish();
    }

    /// Take frames or refuse them, in the receive buffer and on a cable's incoming ring; going
    /// down, what they held is lost, and counted.
    pub(super) fn link(&mut self, up: bool) {
        let up = up && !self.removed;
        self.port.inbox.set_up(up);
        if !up {
            self.counters.rx_drops_wire += self.port.inbox.clear();
        }
        if let Some(c) = self.wire.cable() {
            c.rx.set_up(up);
            if !up {
                self.counters.rx_drops_wire += c.rx.clear();
            }
        }
        self.counters.rx_drops_wire += self.wire.set_port_up(up);
        self.check_link();
    }

    pub(crate) fn wire_name(&self) -> String {
        self.wire.describe()
    }
}
