//! The device: its resource tables, the send and receive engines, and one poll of the device
//! loop over them.

use std::sync::Arc;

use crate::bar::Bar;
use crate::cq::Cq;
use crate::dma::HostMem;
use crate::fault::{FaultState, Faults};
use crate::rq::{Rq, Rx};
use crate::rss::{RssFields, Toeplitz, RSS_KEY_LEN};
use crate::rx::{MacFilter, RxConfig};
use crate::sq::{Bf, Scratch, Sq, SqWatch, TxCtx};
use crate::tables::{MrTable, Pages, Slots, CQN_BASE, QPN_BASE};
use crate::wire::{RxPort, WirePort};
use crate::{BfReg, Caps, Counters, HcaError, QueueState, SqInfo};

/// Received frames handled per poll, so TX doorbells are not starved by a receive flood.
const RX_BUDGET: usize = 64;

/// Send and receive queues share the QPN space.
#[derive(Debug)]
enum Qp {
    Sq(Box<Sq>),
    Rq(Box<Rq>),
}

pub(crate) struct DevState {
    pub(crate) caps: Caps,
    wc: bool,
    mrs: MrTable,
    cqs: Slots<Cq>,
    qps: Slots<Qp>,
    /// QPNs of the RQs, ascending: where frames go when the steering table is empty.
    rqs: Vec<u32>,
    pages: Pages,
    wire: WirePort,
    port: Arc<RxPort>,
    rx: RxConfig,
    pub(crate) counters: Counters,
    faults: FaultState,
    /// What device memory shows.
    published: Counters,
    scratch: Box<Scratch>,
}

fn cq_slot(cqn: u32) -> usize {
    cqn.wrapping_sub(CQN_BASE) as usize
}

fn qp_slot(qpn: u32) -> usize {
    qpn.wrapping_sub(QPN_BASE) as usize
}

impl DevState {
    pub(crate) fn new(caps: Caps, wc: bool, port: Arc<RxPort>, bar: Bar) -> Self {
        DevState {
            caps,
            wc,
            mrs: MrTable::default(),
            cqs: Slots::new(caps.max_cqs as usize),
            qps: Slots::new(caps.max_qps as usize),
            rqs: Vec::new(),
            pages: Pages::new(bar),
            wire: WirePort::null(),
            port,
            rx: RxConfig::default(),
            counters: Counters::default(),
            faults: FaultState::default(),
            published: Counters::default(),
            scratch: Scratch::new(),
        }
    }

    // ---------------------------------------------------------------- control path ("firmware")

    pub(crate) fn reg_mr(&mut self, mem: HostMem) -> Result<u32, HcaError> {
        self.mrs.register(mem)
    }

    pub(crate) fn dereg_mr(&mut self, lkey: u32) -> Result<(), HcaError> {
        self.mrs.deregister(lkey)
    }

    pub(crate) fn create_cq(
        &mut self,
        ring: HostMem,
        cnt: u32,
        ci_db: HostMem,
    ) -> Result<u32, HcaError> {
        let slot = self
            .cqs
            .insert_with("CQs", |_| Ok(Cq::new(ring, cnt, ci_db)))?;
        Ok(CQN_BASE + slot as u32)
    }

    fn cq_mut(&mut self, cqn: u32) -> Result<&mut Cq, HcaError> {
        self.cqs
            .get_mut(cq_slot(cqn))
            .ok_or(HcaError::NotFound("CQ", cqn))
    }

    pub(crate) fn destroy_cq(&mut self, cqn: u32) -> Result<(), HcaError> {
        if self.cq_mut(cqn)?.users > 0 {
            return Err(HcaError::Busy(cqn));
        }
        self.cqs.remove(cq_slot(cqn));
        Ok(())
    }

    pub(crate) fn create_sq(
        &mut self,
        ring: HostMem,
        cnt: u32,
        cqn: u32,
    ) -> Result<SqInfo, HcaError> {
        self.cq_mut(cqn)?;
        let pages = &mut self.pages;
        let bf_reg_size = self.caps.bf_reg_size as usize;
        let mut info = None;
        self.qps.insert_with("QPs", |slot| {
            let qpn = QPN_BASE + slot as u32;
            let (uar, db, uar_ptr) = pages.alloc_uar()?;
            let (bf, reg) = if bf_reg_size == 0 {
                (None, None)
            } else {
                let (slot, halves, reg) = match pages.alloc_bf() {
                    Ok(x) => x,
                    Err(e) => {
                        pages.free_uar(uar);
                        return Err(e);
                    }
                };
                let half_size = bf_reg_size / 2;
                (
                    Some(Bf::new(slot, halves, half_size)),
                    Some(BfReg { reg, half_size }),
                )
            };
            info = Some(SqInfo {
                qpn,
                uar: uar_ptr,
                bf: reg,
            });
            Ok(Qp::Sq(Box::new(Sq::new(qpn, ring, cnt, cqn, uar, db, bf))))
        })?;
        self.cq_mut(cqn)?.users += 1;
        Ok(info.expect("set by insert_with"))
    }

    pub(crate) fn create_rq(
        &mut self,
        ring: HostMem,
        cnt: u32,
        sges: u32,
        cqn: u32,
        db: HostMem,
    ) -> Result<u32, HcaError> {
        self.cq_mut(cqn)?;
        let slot = self.qps.insert_with("QPs", |slot| {
            let qpn = QPN_BASE + slot as u32;
            Ok(Qp::Rq(Box::new(Rq::new(qpn, ring, cnt, sges, cqn, db))))
        })?;
        self.cq_mut(cqn)?.users += 1;
        let qpn = QPN_BASE + slot as u32;
        let at = self.rqs.partition_point(|&q| q < qpn);
        self.rqs.insert(at, qpn);
        Ok(qpn)
    }

    fn release_cq(&mut self, cqn: u32) {
        if let Ok(cq) = self.cq_mut(cqn) {
            cq.users -= 1;
        }
    }

    pub(crate) fn destroy_sq(&mut self, qpn: u32) -> Result<(), HcaError> {
        let slot = qp_slot(qpn);
        if !matches!(self.qps.get(slot), Some(Qp::Sq(_))) {
            return Err(HcaError::NotFound("SQ", qpn));
        }
        let Some(Qp::Sq(sq)) = self.qps.remove(slot) else {
            unreachable!("checked above")
        };
        self.pages.free_uar(sq.uar);
        if let Some(bf) = &sq.bf {
            self.pages.free_bf(bf.slot);
        }
        self.release_cq(sq.cqn);
        Ok(())
    }

    pub(crate) fn destroy_rq(&mut self, qpn: u32) -> Result<(), HcaError> {
        let slot = qp_slot(qpn);
        if !matches!(self.qps.get(slot), Some(Qp::Rq(_))) {
            return Err(HcaError::NotFound("RQ", qpn));
        }
        let Some(Qp::Rq(rq)) = self.qps.remove(slot) else {
            unreachable!("checked above")
        };
        self.rqs.retain(|&q| q != qpn);
        self.release_cq(rq.cqn);
        Ok(())
    }

    pub(crate) fn sq_state(&self, qpn: u32) -> Result<QueueState, HcaError> {
        match self.qps.get(qp_slot(qpn)) {
            Some(Qp::Sq(sq)) => Ok(sq.state),
            _ => Err(HcaError::NotFound("SQ", qpn)),
        }
    }

    pub(crate) fn rq_state(&self, qpn: u32) -> Result<QueueState, HcaError> {
        match self.qps.get(qp_slot(qpn)) {
            Some(Qp::Rq(rq)) => Ok(rq.state),
            _ => Err(HcaError::NotFound("RQ", qpn)),
        }
    }

    /// Receive queues the flow hash spreads frames over, in indirection-table order; empty =
    /// every RQ in QPN order.
    pub(crate) fn set_steering(&mut self, qpns: &[u32]) -> Result<(), HcaError> {
        if let Some(&bad) = qpns.iter().find(|&&q| !self.rqs.contains(&q)) {
            return Err(HcaError::NotFound("RQ", bad));
        }
        self.rx.steering = qpns.to_vec();
        Ok(())
    }

    pub(crate) fn set_rss(&mut self, key: [u8; RSS_KEY_LEN], fields: RssFields) {
        self.rx.rss_key = key;
        self.rx.toeplitz = Toeplitz::new(&key);
        self.rx.rss_fields = fields;
    }

    pub(crate) fn rss(&self) -> ([u8; RSS_KEY_LEN], RssFields) {
        (self.rx.rss_key, self.rx.rss_fields)
    }

    /// `None` = promiscuous; otherwise the port's MAC and whether all multicast is accepted.
    pub(crate) fn set_rx_filter(&mut self, filter: Option<([u8; 6], bool)>) {
        self.rx.filter = filter.map(|(mac, allmulti)| MacFilter { mac, allmulti });
    }

    pub(crate) fn set_mtu(&mut self, mtu: u16) {
        self.rx.mtu = mtu;
    }

    pub(crate) fn mtu(&self) -> u16 {
        self.rx.mtu
    }

    // ---------------------------------------------------------------- device loop

    /// One pass over every doorbell word, BlueFlame half and the receive inbox; returns the work
    /// items done (0 = idle).
    pub(crate) fn poll(&mut self) -> usize {
        let mut work = 0;
        for slot in 0..self.qps.len() {
            if matches!(self.qps.get(slot), Some(Qp::Sq(_))) {
                work += self.poll_sq_slot(slot);
            }
        }
        work += self.poll_rx();
        if work > 0 {
            self.wire.flush();
        }
        self.publish();
        work
    }

    pub(crate) fn bar(&self) -> &Bar {
        &self.pages.bar
    }

    /// Make the counters readable from device memory; nothing to do when none changed.
    pub(crate) fn publish(&mut self) {
        if self.counters != self.published {
            self.pages.bar.publish(&self.counters);
            self.published = self.counters.clone();
        }
    }

    /// One send queue's share of a poll (a runner's call); 0 if `qpn` is no SQ (any more).
    pub(crate) fn poll_sq(&mut self, qpn: u32) -> usize {
        let slot = qp_slot(qpn);
        if !matches!(self.qps.get(slot), Some(Qp::Sq(sq)) if sq.qpn == qpn) {
            return 0;
        }
        let work = self.poll_sq_slot(slot);
        if work > 0 {
            self.wire.flush();
        }
        self.publish();
        work
    }

    /// The receive side's share of a poll (a runner's call).
    pub(crate) fn run_rx(&mut self) -> usize {
        let work = self.poll_rx();
        if work > 0 {
            self.wire.flush();
        }
        self.publish();
        work
    }

    /// What a runner of SQ `qpn` watches (see `Sq::watch`).
    pub(crate) fn sq_watch(&self, qpn: u32) -> Result<SqWatch, HcaError> {
        match self.qps.get(qp_slot(qpn)) {
            Some(Qp::Sq(sq)) if sq.qpn == qpn => Ok(sq.watch()),
            _ => Err(HcaError::NotFound("SQ", qpn)),
        }
    }

    fn poll_sq_slot(&mut self, slot: usize) -> usize {
        let Some(Qp::Sq(mut sq)) = self.qps.take(slot) else {
            unreachable!("the caller checked the slot")
        };
        let before = (self.counters.tx_frames, self.counters.tx_drops_wire);
        let work = match self.cqs.get_mut(cq_slot(sq.cqn)) {
            Some(cq) => sq.poll(&mut TxCtx {
                wc: self.wc,
                max_wqe_size: self.caps.max_wqe_size as usize,
                mrs: &self.mrs,
                cq,
                wire: &mut self.wire,
                port: &self.port,
                counters: &mut self.counters,
                scratch: &mut self.scratch,
                faults: &mut self.faults,
            }),
            None => 0,
        };
        self.qps.put_back(slot, Qp::Sq(sq));
        if self.faults.cfg.link_flap_every != 0 {
            let sent = self.counters.tx_frames - before.0;
            let lost = self.counters.tx_drops_wire - before.1;
            self.flap(sent, lost);
        }
        work
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

    pub(crate) fn faults(&self) -> Faults {
        self.faults.cfg
    }

    fn poll_rx(&mut self) -> usize {
        let mut work = self.wire.poll_rx(&self.port, RX_BUDGET);
        if let Some(ring) = self.wire.cable().map(|c| c.rx.clone()) {
            if ring.pending() != 0 {
                work += ring.consume(RX_BUDGET, |frame| self.receive(frame) == Rx::Done);
            }
            self.fold_wire_drops();
        }
        if !self.port.has_pending() {
            return work;
        }
        let port = self.port.clone();
        work += port
            .inbox
            .consume(RX_BUDGET, |frame| self.receive(frame) == Rx::Done);
        work
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
        let up = self.port.up();
        if let Some(c) = self.wire.cable() {
            c.rx.set_up(up);
        }
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
    fn link(&mut self, up: bool) {
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
    }

    pub(crate) fn wire_name(&self) -> String {
        self.wire.describe()
    }

    /// Offer one frame to the port: filter, MTU, steering, then its RQ.
    fn receive(&mut self, frame: &[u8]) -> Rx {
        let Some(hash) = self.rx.admit(frame, &mut self.counters) else {
            return Rx::Done;
        };
        let Some(qpn) = self.rx.steer(hash, &self.rqs) else {
            self.counters.rx_drops_no_wqe += 1;
            return Rx::Done;
        };
        let slot = qp_slot(qpn);
        let rq = match self.qps.get_mut(slot) {
            Some(Qp::Rq(rq)) => rq,
            // A steering entry whose RQ was destroyed: nowhere to put the frame.
            _ => {
                self.counters.rx_drops_no_wqe += 1;
                return Rx::Done;
            }
        };
        match self.cqs.get_mut(cq_slot(rq.cqn)) {
            Some(cq) => rq.receive(
                frame,
                hash,
                &self.mrs,
                cq,
                &mut self.counters,
                &mut self.faults.rx_error,
            ),
            None => {
                self.counters.rx_drops_no_wqe += 1;
                Rx::Done
            }
        }
    }
}
