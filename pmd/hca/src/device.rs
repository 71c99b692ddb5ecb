//! The device: its resource tables, the send and receive engines, and one poll of the device
//! loop over them.

use std::sync::Arc;

use crate::bar::Bar;
use crate::counters::Counters;
use crate::cq::Cq;
use crate::dma::HostMem;
use crate::error::HcaError;
use crate::events::{Channel, Events, PortEvent};
use crate::fault::{FaultState, Faults};
use crate::flow::{FlowAction, FlowCounters, FlowRule, FlowTable, RssContext, Verdict};
use crate::net;
use crate::rq::{Rq, Rx};
use crate::rss::{RssFields, Toeplitz, RSS_KEY_LEN};
use crate::rx::{FlowControl, RxConfig, RxFilter, MAX_MAC_ADDRS, MAX_MC_ADDRS};
use crate::sq::{Bf, Scratch, Sq, SqWatch, TxCtx};
use crate::tables::{MrTable, Pages, Slots, UarPage, CQN_BASE, QPN_BASE};
use crate::types::{BfReg, Caps, QueueState, RqOptions, SqInfo, SqOptions, Uar};
use crate::wire::{RxPort, WirePort};

/// Received frames handled per poll, so TX doorbells are not starved by a receive flood.
const RX_BUDGET: usize = 64;
/// CQ doorbell commands (bits 25:24 of the high dword): request an event for the next solicited
/// (or error) completion, or for the next completion.
const ARM_SOLICITED: u32 = 1;
const ARM_NEXT: u32 = 2;

/// Send and receive queues share the QPN space.
#[derive(Debug)]
enum Qp {
    Sq(Box<Sq>),
    Rq(Box<Rq>),
}

/// A UAR page in use, as the device polls it: its doorbell words and the send queues on it.
struct ActiveUar {
    page: UarPage,
    sqs: Vec<u32>,
}

pub(crate) struct DevState {
    pub(crate) caps: Caps,
    wc: bool,
    /// Queues are created in `Reset` (else `Ready`).
    reset_on_create: bool,
    mrs: MrTable,
    cqs: Slots<Cq>,
    qps: Slots<Qp>,
    /// QPNs of the RQs, ascending: where frames go when the steering table is empty.
    rqs: Vec<u32>,
    /// Reserved QPN ranges: (first QPN, count).
    ranges: Vec<(u32, u32)>,
    pages: Pages,
    /// UAR pages in use, in allocation order.
    uars: Vec<ActiveUar>,
    wire: WirePort,
    port: Arc<RxPort>,
    rx: RxConfig,
    flow_control: FlowControl,
    flows: FlowTable,
    events: Arc<Events>,
    /// Completion channels, by id - 1.
    channels: Vec<Option<Arc<Channel>>>,
    /// The link state last reported (a change is an event).
    link_reported: bool,
    /// The adapter went away: nothing runs any more.
    removed: bool,
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
    pub(crate) fn new(
        caps: Caps,
        (wc, reset_on_create): (bool, bool),
        port: Arc<RxPort>,
        bar: Bar,
        events: Arc<Events>,
    ) -> Self {
        DevState {
            caps,
            wc,
            reset_on_create,
            mrs: MrTable::default(),
            cqs: Slots::new(caps.max_cqs as usize),
            qps: Slots::new(caps.max_qps as usize),
            rqs: Vec::new(),
            ranges: Vec::new(),
            pages: Pages::new(bar),
            uars: Vec::new(),
            wire: WirePort::null(),
            port,
            rx: RxConfig::default(),
            flow_control: FlowControl::default(),
            flows: FlowTable::default(),
            events,
            channels: Vec::new(),
            link_reported: true,
            removed: false,
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
        let slot = self.cqs.insert_with("CQs", |slot| {
            Ok(Cq::new(CQN_BASE + slot as u32, ring, cnt, ci_db))
        })?;
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

    fn initial_state(&self) -> QueueState {
        if self.reset_on_create {
            QueueState::Reset
        } else {
            QueueState::Ready
        }
    }

    /// Put a new queue at `qpn` (a free number of a reserved range) or at any free number.
    fn insert_qp(
        &mut self,
        qpn: Option<u32>,
        make: impl FnOnce(u32) -> Result<Qp, HcaError>,
    ) -> Result<u32, HcaError> {
        match qpn {
            Some(q) => {
                let slot = qp_slot(q);
                self.qps.insert_at(slot, |_| make(q)).map_err(|_| {
                    HcaError::InvalidArgument(format!(
                        "QPN {q:#x} is not a free number of a reserved range"
                    ))
                })?;
                Ok(q)
            }
            None => {
                let slot = self
                    .qps
                    .insert_with("QPs", |slot| make(QPN_BASE + slot as u32))?;
                Ok(QPN_BASE + slot as u32)
            }
        }
    }

    /// A UAR page of its own for a new send queue, or one more queue on page `shared`.
    fn uar_for_sq(&mut self, shared: Option<u32>) -> Result<UarPage, HcaError> {
        match shared {
            Some(i) => self.pages.share_uar(i as usize),
            None => {
                let page = self.pages.alloc_uar(false)?;
                self.uars.push(ActiveUar {
                    page: page.clone(),
                    sqs: Vec::new(),
                });
                Ok(page)
            }
        }
    }

    /// Release a send queue's share of UAR page `i`; the page leaves the polled list when
    /// nobody uses it any more.
    fn release_uar(&mut self, i: usize, qpn: u32) {
        if let Some(a) = self.uars.iter_mut().find(|a| a.page.index == i) {
            a.sqs.retain(|&q| q != qpn);
        }
        self.pages.drop_sq(i);
        if !self.pages.in_use(i) {
            self.uars.retain(|a| a.page.index != i);
        }
    }

    pub(crate) fn alloc_uar(&mut self) -> Result<Uar, HcaError> {
        let page = self.pages.alloc_uar(true)?;
        let uar = Uar {
            index: page.index as u32,
            page: self.pages.bar.uar_ptr(page.index),
            bf_page: self.pages.bf_page_ptr(page.index),
        };
        self.uars.push(ActiveUar {
            page,
            sqs: Vec::new(),
        });
        Ok(uar)
    }

    pub(crate) fn free_uar(&mut self, index: u32) -> Result<(), HcaError> {
        self.pages.free_uar(index as usize)?;
        self.uars.retain(|a| a.page.index != index as usize);
        Ok(())
    }

    pub(crate) fn create_sq(
        &mut self,
        ring: HostMem,
        txbbs: u32,
        cqn: u32,
        opts: &SqOptions,
    ) -> Result<SqInfo, HcaError> {
        self.cq_mut(cqn)?;
        let state = self.initial_state();
        let stride = opts.stride_shift;
        let page = self.uar_for_sq(opts.uar)?;
        let uar = page.index;
        let bf_reg_size = self.caps.bf_reg_size as usize;
        let bf = if bf_reg_size == 0 {
            None
        } else {
            self.pages.alloc_bf(uar)
        };
        let reg = bf.as_ref().map(|&(_, _, reg)| BfReg {
            reg,
            half_size: bf_reg_size / 2,
        });
        let cnt = txbbs >> (stride - mlx4_prm::TXBB_SHIFT);
        let bf_slot = bf.as_ref().map(|b| b.0);
        let made = self.insert_qp(opts.qpn, move |qpn| {
            let bf = bf.map(|(slot, halves, _)| Bf::new(slot, halves, bf_reg_size / 2));
            Ok(Qp::Sq(Box::new(Sq::new(
                qpn, ring, cnt, stride, cqn, uar, bf, state,
            ))))
        });
        let qpn = match made {
            Ok(q) => q,
            Err(e) => {
                if let Some(slot) = bf_slot {
                    self.pages.free_bf(slot);
                }
                self.release_uar(uar, 0);
                return Err(e);
            }
        };
        if let Some(a) = self.uars.iter_mut().find(|a| a.page.index == uar) {
            a.sqs.push(qpn);
        }
        self.cq_mut(cqn)?.users += 1;
        Ok(SqInfo {
            qpn,
            uar: self.pages.bar.uar_ptr(uar),
            uar_index: uar as u32,
            bf: reg,
        })
    }

    pub(crate) fn create_rq(
        &mut self,
        ring: HostMem,
        (cnt, sges): (u32, u32),
        cqn: u32,
        db: HostMem,
        opts: &RqOptions,
    ) -> Result<u32, HcaError> {
        self.cq_mut(cqn)?;
        let state = self.initial_state();
        let fcs = opts.scatter_fcs;
        let tunnels = self.caps.tunnel_offloads;
        let qpn = self.insert_qp(opts.qpn, |qpn| {
            let mut rq = Rq::new(qpn, ring, (cnt, sges), cqn, db, state);
            rq.scatter_fcs = fcs;
            rq.tunnels = tunnels;
            Ok(Qp::Rq(Box::new(rq)))
        })?;
        self.cq_mut(cqn)?.users += 1;
        let at = self.rqs.partition_point(|&q| q < qpn);
        self.rqs.insert(at, qpn);
        Ok(qpn)
    }

    /// Hold back `count` (a power of two) consecutive QPNs, the first a multiple of `count`,
    /// for queues created at those numbers: an RSS context's range.
    pub(crate) fn reserve_qpns(&mut self, count: u32) -> Result<u32, HcaError> {
        if !count.is_power_of_two() || count > self.caps.max_qps {
            return Err(HcaError::InvalidArgument(format!(
                "a QPN range of {count}: not a power of two up to {}",
                self.caps.max_qps
            )));
        }
        let slot = self
            .qps
            .reserve_range(count as usize, |s| (QPN_BASE + s as u32) % count == 0)
            .ok_or(HcaError::NoResources("aligned QPN ranges"))?;
        let base = QPN_BASE + slot as u32;
        self.ranges.push((base, count));
        Ok(base)
    }

    pub(crate) fn release_qpns(&mut self, base: u32) -> Result<(), HcaError> {
        let i = self
            .ranges
            .iter()
            .position(|&(b, _)| b == base)
            .ok_or(HcaError::NotFound("QPN range", base))?;
        let count = self.ranges[i].1;
        if !self.qps.release_range(qp_slot(base), count as usize) {
            return Err(HcaError::Busy(base));
        }
        self.ranges.swap_remove(i);
        Ok(())
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
        if let Some(bf) = &sq.bf {
            self.pages.free_bf(bf.slot);
        }
        self.release_uar(sq.uar, qpn);
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

    pub(crate) fn set_sq_state(&mut self, qpn: u32, to: QueueState) -> Result<(), HcaError> {
        match self.qps.get_mut(qp_slot(qpn)) {
            Some(Qp::Sq(sq)) => {
                check_transition("SQ", qpn, sq.state, to)?;
                sq.set_state(to);
                Ok(())
            }
            _ => Err(HcaError::NotFound("SQ", qpn)),
        }
    }

    pub(crate) fn set_rq_scatter_fcs(&mut self, qpn: u32, on: bool) -> Result<(), HcaError> {
        match self.qps.get_mut(qp_slot(qpn)) {
            Some(Qp::Rq(rq)) => {
                rq.scatter_fcs = on;
                Ok(())
            }
            _ => Err(HcaError::NotFound("RQ", qpn)),
        }
    }

    pub(crate) fn set_rq_state(&mut self, qpn: u32, to: QueueState) -> Result<(), HcaError> {
        match self.qps.get_mut(qp_slot(qpn)) {
            Some(Qp::Rq(rq)) => {
                check_transition("RQ", qpn, rq.state, to)?;
                rq.set_state(to);
                Ok(())
            }
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

    /// The port's MAC as the only unicast address, and the two switches.
    pub(crate) fn set_rx_filter(&mut self, mac: [u8; 6], promisc: bool, allmulti: bool) {
        let f = &mut self.rx.filter;
        f.unicast = vec![mac];
        f.promisc = promisc;
        f.allmulti = allmulti;
    }

    pub(crate) fn set_mac_table(&mut self, macs: &[[u8; 6]]) -> Result<(), HcaError> {
        if macs.len() > MAX_MAC_ADDRS {
            return Err(HcaError::NoResources("MAC table entries"));
        }
        if let Some(m) = macs.iter().find(|m| m[0] & 1 != 0) {
            return Err(HcaError::InvalidArgument(format!(
                "{m:02x?} is a multicast address, not one for the unicast table"
            )));
        }
        self.rx.filter.unicast = dedup(macs);
        Ok(())
    }

    pub(crate) fn set_mc_list(&mut self, macs: &[[u8; 6]]) -> Result<(), HcaError> {
        if macs.len() > MAX_MC_ADDRS {
            return Err(HcaError::NoResources("multicast list entries"));
        }
        if let Some(m) = macs.iter().find(|m| m[0] & 1 == 0) {
            return Err(HcaError::InvalidArgument(format!(
                "{m:02x?} is a unicast address, not one for the multicast list"
            )));
        }
        self.rx.filter.multicast = dedup(macs);
        Ok(())
    }

    pub(crate) fn set_promisc(&mut self, on: bool) {
        self.rx.filter.promisc = on;
    }

    pub(crate) fn set_allmulti(&mut self, on: bool) {
        self.rx.filter.allmulti = on;
    }

    pub(crate) fn set_vlan_filtering(&mut self, on: bool) {
        self.rx.filter.vlan_filter = on;
    }

    pub(crate) fn set_vlan(&mut self, vid: u16, member: bool) -> Result<(), HcaError> {
        if vid >= 4096 {
            return Err(HcaError::InvalidArgument(format!(
                "VLAN ID {vid} is not below 4096"
            )));
        }
        self.rx.filter.set_vlan(vid, member);
        Ok(())
    }

    pub(crate) fn rx_filter(&self) -> RxFilter {
        self.rx.filter.snapshot()
    }

    pub(crate) fn set_flows_only(&mut self, on: bool) {
        self.rx.flows_only = on;
    }

    pub(crate) fn set_flow_control(&mut self, fc: FlowControl) -> Result<(), HcaError> {
        if fc.low_water > fc.high_water {
            return Err(HcaError::InvalidArgument(format!(
                "flow control low water {} above high water {}",
                fc.low_water, fc.high_water
            )));
        }
        self.flow_control = fc;
        Ok(())
    }

    pub(crate) fn flow_control(&self) -> FlowControl {
        self.flow_control
    }

    /// The port's MTU; a TAP interface takes it too.
    pub(crate) fn set_mtu(&mut self, mtu: u16) -> std::io::Result<()> {
        self.rx.mtu = mtu;
        self.wire.set_mtu(mtu)
    }

    pub(crate) fn mtu(&self) -> u16 {
        self.rx.mtu
    }

    // ---------------------------------------------------------------- device loop

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
        work += self.poll_sq_slot(slot);
        if work > 0 {
            self.wire.flush();
        }
        self.publish();
        work
    }

    /// The receive side's share of a poll (a runner's call).
    pub(crate) fn run_rx(&mut self) -> usize {
        if self.removed {
            return 0;
        }
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
    fn poll_uar(&mut self, i: usize) -> usize {
        self.poll_cq_db(i) + self.poll_send_db(i)
    }

    /// A CQ arm doorbell on the `i`th UAR page in use: the 64-bit BE store of
    /// `(sn << 28 | cmd | cqn) << 32 | ci` (doc/prm.md 5.3), taken whole with a swap.
    fn poll_cq_db(&mut self, i: usize) -> usize {
        let db = &self.uars[i].page.cq_db;
        let Some(q) = db.load_bytes8(0) else {
            return 0;
        };
        if q == [0; 8] || !db.clear_bytes8_if(0, q) {
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

    /// The send doorbell word of the `i`th UAR page in use.
    fn poll_send_db(&mut self, i: usize) -> usize {
        let db = &self.uars[i].page.db;
        if db.load_be32(0).unwrap_or(0) == 0 {
            return 0;
        }
        let v = db.take_be32(0).unwrap_or(0);
        self.counters.doorbells += 1;
        if self.faults.doorbell.tick() {
            // An injected fault: the write never reached the device.
            self.counters.inj_doorbells_dropped += 1;
            return 1;
        }
        let qpn = mlx4_prm::doorbell_qpn(v.to_be_bytes());
        match self.qps.get_mut(qp_slot(qpn)) {
            Some(Qp::Sq(sq)) if sq.qpn == qpn => {
                sq.doorbell(false, &mut self.counters);
            }
            _ => {
                self.counters.doorbells_bad_qpn += 1;
                return 1;
            }
        }
        // On a shared page this doorbell may have overwritten another queue's.
        let a = &self.uars[i];
        if a.sqs.len() > 1 {
            for k in 0..a.sqs.len() {
                let other = self.uars[i].sqs[k];
                if other == qpn {
                    continue;
                }
                if let Some(Qp::Sq(sq)) = self.qps.get_mut(qp_slot(other)) {
                    sq.doorbell(true, &mut self.counters);
                }
            }
        }
        1
    }

    fn poll_sq_slot(&mut self, slot: usize) -> usize {
        let Some(Qp::Sq(mut sq)) = self.qps.take(slot) else {
            unreachable!("the caller checked the slot")
        };
        let before = (self.counters.tx_frames, self.counters.tx_drops_wire);
        let work = match self.cqs.get_mut(cq_slot(sq.cqn)) {
            Some(cq) => sq.poll(&mut TxCtx {
                wc: self.wc,
                pro: self.caps.tunnel_offloads,
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
    fn link(&mut self, up: bool) {
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

    /// Offer one frame to the port: flow rules, else the filters and the default RSS; the
    /// MTU; then its RQ.
    fn receive(&mut self, frame: &[u8]) -> Rx {
        let verdict = if self.flows.is_empty() {
            None
        } else {
            self.flows.lookup(&net::frame_fields(frame), frame.len())
        };
        let (qpn, hash) = match verdict {
            Some(Verdict::Drop) => {
                self.counters.rx_drops_flow += 1;
                return Rx::Done;
            }
            Some(v) => {
                if !self.rx.mtu_passes(frame, &mut self.counters) {
                    return Rx::Done;
                }
                match v {
                    Verdict::Queue(q) => (Some(q), self.rx.hash(frame)),
                    Verdict::Rss(slot) => match self.flows.ctx(slot) {
                        Some(c) => {
                            let h = net::rss_hash(frame, &c.toeplitz, c.ctx.fields);
                            let rqs = &c.ctx.rqs;
                            (rqs.get(h as usize % rqs.len().max(1)).copied(), h)
                        }
                        None => (None, 0),
                    },
                    Verdict::Drop => unreachable!("handled above"),
                }
            }
            None => {
                if !self.rx.filters_pass(frame, &mut self.counters)
                    || !self.rx.mtu_passes(frame, &mut self.counters)
                {
                    return Rx::Done;
                }
                let hash = self.rx.hash(frame);
                (self.rx.steer(hash, &self.rqs), hash)
            }
        };
        let Some(qpn) = qpn else {
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

    // ---------------------------------------------------------------- completion events

    pub(crate) fn create_channel(&mut self) -> Result<u32, HcaError> {
        let ch = Arc::new(Channel::new()?);
        let slot = match self.channels.iter().position(Option::is_none) {
            Some(s) => s,
            None => {
                self.channels.push(None);
                self.channels.len() - 1
            }
        };
        self.channels[slot] = Some(ch);
        Ok(slot as u32 + 1)
    }

    pub(crate) fn channel(&self, id: u32) -> Result<Arc<Channel>, HcaError> {
        id.checked_sub(1)
            .and_then(|s| self.channels.get(s as usize)?.clone())
            .ok_or(HcaError::NotFound("completion channel", id))
    }

    pub(crate) fn destroy_channel(&mut self, id: u32) -> Result<(), HcaError> {
        let ch = self.channel(id)?;
        let used = (0..self.cqs.len()).any(|s| {
            self.cqs
                .get(s)
                .and_then(|c| c.channel.as_ref())
                .is_some_and(|c| Arc::ptr_eq(c, &ch))
        });
        if used {
            return Err(HcaError::Busy(id));
        }
        self.channels[id as usize - 1] = None;
        Ok(())
    }

    pub(crate) fn has_channels(&self) -> bool {
        self.channels.iter().any(Option::is_some)
    }

    pub(crate) fn set_cq_channel(&mut self, cqn: u32, id: Option<u32>) -> Result<(), HcaError> {
        let ch = id.map(|i| self.channel(i)).transpose()?;
        self.cq_mut(cqn)?.channel = ch;
        Ok(())
    }

    // ---------------------------------------------------------------- flow steering

    fn check_rq(&self, qpn: u32) -> Result<(), HcaError> {
        match self.qps.get(qp_slot(qpn)) {
            Some(Qp::Rq(rq)) if rq.qpn == qpn => Ok(()),
            _ => Err(HcaError::NotFound("RQ", qpn)),
        }
    }

    pub(crate) fn create_rss_context(&mut self, ctx: RssContext) -> Result<u32, HcaError> {
        if ctx.rqs.is_empty() {
            return Err(HcaError::InvalidArgument(
                "an RSS context without RQs".into(),
            ));
        }
        for &q in &ctx.rqs {
            self.check_rq(q)?;
        }
        self.flows.create_ctx(ctx)
    }

    pub(crate) fn destroy_rss_context(&mut self, id: u32) -> Result<(), HcaError> {
        self.flows.destroy_ctx(id)
    }

    pub(crate) fn rss_context(&self, id: u32) -> Option<RssContext> {
        self.flows.rss_context(id)
    }

    pub(crate) fn create_flow(&mut self, rule: &FlowRule) -> Result<u32, HcaError> {
        if let FlowAction::Queue(q) = rule.action {
            self.check_rq(q)?;
        }
        self.flows.create(*rule)
    }

    pub(crate) fn destroy_flow(&mut self, id: u32) -> Result<(), HcaError> {
        self.flows.destroy(id)
    }

    pub(crate) fn flow_counters(&self, id: u32) -> Result<FlowCounters, HcaError> {
        self.flows
            .counters(id)
            .ok_or(HcaError::NotFound("flow rule", id))
    }

    pub(crate) fn flows(&self) -> Vec<(u32, FlowRule)> {
        self.flows.list()
    }
}

/// Queue state changes the device allows: to `Ready` only from `Reset` (or staying `Ready`),
/// to `Reset` and `Error` from anywhere; an errored queue must be reset before it runs again.
fn check_transition(
    what: &str,
    qpn: u32,
    from: QueueState,
    to: QueueState,
) -> Result<(), HcaError> {
    match (from, to) {
        (QueueState::Reset | QueueState::Ready, QueueState::Ready)
        | (_, QueueState::Reset | QueueState::Error) => Ok(()),
        (QueueState::Error, QueueState::Ready) => Err(HcaError::InvalidArgument(format!(
            "{what} {qpn:#x} is in error: reset it before making it ready"
        ))),
    }
}

/// `macs` without repeats, in their first order.
fn dedup(macs: &[[u8; 6]]) -> Vec<[u8; 6]> {
    let mut v: Vec<[u8; 6]> = Vec::with_capacity(macs.len());
    for m in macs {
        if !v.contains(m) {
            v.push(*m);
        }
    }
    v
}
