//! The device: its resource tables, the send and receive engines, and one poll of the device
//! loop over them.
//!
//! Here: the tables, the queues' control path and completion channels. Apart: one poll of the
//! device loop and the link (`poll`), and the port's receive settings and flow rules (`port`).

mod poll;
mod port;
mod recv;

use std::sync::Arc;

use crate::bar::{Bar, UarWords};
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

/// Send and receive queues share the QPN space.
#[derive(Debug)]
enum Qp {
    Sq(Box<Sq>),
    Rq(Box<Rq>),
}

/// A UAR page in use, as the device polls it: its doorbell words and the send queues on it.
struct ActiveUar {
    page: UarPage,
    /// Its doorbell words, as each poll reads them.
    words: UarWords,
    /// Whether a writer of this page counts its doorbells: until one does, a taken doorbell is
    /// one write, as no more can be known of a plain store.
    counted: bool,
    sqs: Vec<u32>,
}

impl ActiveUar {
    fn new(page: UarPage, bar: &Bar) -> ActiveUar {
        ActiveUar {
            words: bar.uar_words(page.index),
            counted: false,
            page,
            sqs: Vec::new(),
        }
    }
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
    /// Polls that changed counters since they were last published.
    unpublished: u32,
    /// Polls in a row that changed nothing, since the last one that did.
    quiet: u32,
    scratch: Box<Scratch>,
    /// Time charged per doorbell and BlueFlame burst taken ([`crate::HcaConfig::doorbell_ns`]).
    doorbell_ns: u32,
    /// Nanoseconds charged and not yet spent: whoever holds the lock spends them once it has
    /// let go of it ([`crate::runner::spend`]), so the charge keeps the device busy, not the
    /// lock held.
    owed_ns: u64,
    /// The wire brings frames in itself ([`WirePort::brings_frames`]): a poll looks at it, and
    /// not only at the port's receive buffer, for frames.
    wire_rx: bool,
    /// The CQ slot the last received frame completed to, which may hold a CQE for its
    /// partner until the delivery ends.
    rx_cq: Option<usize>,
    /// A send queue may execute a WQE of the shape it last decoded from its headers
    /// ([`crate::Hca::set_shape_cache`]).
    shape_cache: bool,
    /// The receive delivery may take a run's frames in stretches
    /// ([`crate::Hca::set_rx_stretches`]).
    rx_stretches: bool,
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
        doorbell_ns: u32,
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
            unpublished: 0,
            quiet: 0,
            scratch: Scratch::new(),
            doorbell_ns,
            owed_ns: 0,
            wire_rx: false,
            rx_cq: None,
            shape_cache: true,
            rx_stretches: true,
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
                self.uars
                    .push(ActiveUar::new(page.clone(), &self.pages.bar));
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
        self.uars.push(ActiveUar::new(page, &self.pages.bar));
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
