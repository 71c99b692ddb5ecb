//! The send engine: a send queue's doorbells (routed to it by QPN from any UAR page) and
//! BlueFlame arrivals, and the walk that executes its WQEs in order (doc/prm.md section 10
//! rules 1-4).
//!
//! The ring is `cnt` slots of `1 << stride_shift` bytes (64 for DPDK and mlx4_en, larger for
//! libmlx4 QPs with inline or LSO caps). A WQE starts at a slot and takes
//! `ceil(size / stride)` of them; counters (ownership parity, BlueFlame counter, CQE
//! `wqe_index`) count slots, which with a 64-byte stride are TXBBs.
//!
//! Here: the queue, its doorbells and the per-WQE walk (fetch, decode, execute). Apart: the
//! BlueFlame register (`bf`), the same-shape run (`run`) and what a WQE puts out, its
//! completion and frames (`out`).

mod bf;
mod doorbell;
mod out;
mod run;
mod span;

use mlx4_prm::{
    cqe_opcode, cqe_owner, owner_opcode, srcrb, syndrome, wqe_txbbs, Cqe, CtrlSeg, CQE_SIZE,
    DS_SIZE, STAMP_DWORD, TXBB_SIZE,
};

use crate::counters::MacTally;
use crate::cq::{Cq, CqCredit};
use crate::dma::HostMem;
use crate::fault::{FaultState, INJECTED_VENDOR_ERR};
use crate::net;
use crate::send::{self, Segs, WqeBuf, WQE_UNITS};
use crate::shape::Shape;
use crate::tables::{BfSlot, MrTable};
use crate::wire::{RxPort, TxOutcome, WirePort};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::counters::Counters;
use crate::types::{QueueState, Verdict, MAX_FRAME};

pub(crate) use bf::Bf;
use out::{push_send_cqe, transmit, transmit_inline, tx_cqe, Out, Tally};

/// The C field (completion requested) of `srcrb_flags`, in its last byte.
const CQ_UPDATE_BYTE: u8 = srcrb::CQ_UPDATE as u8;
/// The solicited-event bit of `srcrb_flags`, in its last byte.
const SOLICIT_BYTE: u8 = srcrb::SOLICIT as u8;

/// DS units per TXBB.
const UNITS_PER_TXBB: usize = TXBB_SIZE / DS_SIZE;
/// TXBBs of the largest WQE.
const MAX_WQE_TXBBS: usize = WQE_UNITS / UNITS_PER_TXBB;

/// WQEs a walk executes before the rest waits for the next poll. A driver that posts as fast
/// as the device executes would otherwise keep one walk going for ever, and with it the
/// port's receive side, the other queues and the wire's batch (whose frames the receive side
/// sees only once the walk ends): a card's engines take turns. Four times the receive side's
/// budget per poll (`RX_BUDGET`), so that on a looped port with a few busy queues the frames
/// coming back are not mostly dropped at the port while the walks go on.
const WALK_BUDGET: usize = 256;

/// How far the device should walk a send queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    Idle,
    /// A BlueFlame write: up to and including the WQE at this 16-bit counter.
    UpTo(u16),
    /// A UAR doorbell: until the first WQE the device does not own.
    All,
}

impl Walk {
    /// Merge a BlueFlame write for the WQE `ahead` TXBBs past the consumer: the walk goes as
    /// far as the furthest request.
    fn merge_bf(self, c: u16, ci: u16, ahead: u32) -> Walk {
        match self {
            Walk::All => Walk::All,
            Walk::UpTo(old) if u32::from(old.wrapping_sub(ci)) > ahead => Walk::UpTo(old),
            _ => Walk::UpTo(c),
        }
    }
}

/// What tells, without the adapter's lock, that a send queue has work: the doorbell word of its
/// UAR page and its BlueFlame halves (views of device pages) and its pending-walk flag.
pub(crate) struct SqWatch {
    pub(crate) db: HostMem,
    pub(crate) bf: Option<[HostMem; 2]>,
    pub(crate) busy: Arc<AtomicBool>,
}

/// One bit per ring slot, and how many are set: the doorbell path, which has none, skips them,
/// and a run finds the next one a word at a time.
#[derive(Debug)]
struct Marks {
    words: Vec<u64>,
    set: u32,
}

impl Marks {
    fn new(slots: u32) -> Marks {
        Marks {
            words: vec![0; (slots as usize).div_ceil(64)],
            set: 0,
        }
    }

    fn any(&self) -> bool {
        self.set > 0
    }

    fn get(&self, slot: u32) -> bool {
        self.words[slot as usize / 64] & 1 << (slot % 64) != 0
    }

    fn set(&mut self, slot: u32) {
        let w = &mut self.words[slot as usize / 64];
        if *w & 1 << (slot % 64) == 0 {
            *w |= 1 << (slot % 64);
            self.set += 1;
        }
    }

    fn clear(&mut self, slot: u32) {
        let w = &mut self.words[slot as usize / 64];
        if *w & 1 << (slot % 64) != 0 {
            *w &= !(1 << (slot % 64));
            self.set -= 1;
        }
    }

    fn clear_all(&mut self) {
        self.words.fill(0);
        self.set = 0;
    }

    /// The first marked slot from `from` on, below `end`; `end` if none.
    fn first_from(&self, from: u32, end: u32) -> u32 {
        if self.set == 0 {
            return end;
        }
        let mut i = from as usize / 64;
        let mut w = self.words.get(i).copied().unwrap_or(0) & !0u64 << (from % 64);
        loop {
            if w != 0 {
                return (i as u32 * 64 + w.trailing_zeros()).min(end);
            }
            i += 1;
            if i * 64 >= end as usize {
                return end;
            }
            w = self.words[i];
        }
    }
}

/// A send queue: the context firmware would keep, plus where the device is in its ring.
#[derive(Debug)]
pub(crate) struct Sq {
    pub(crate) qpn: u32,
    ring: HostMem,
    /// Slots of the ring.
    cnt: u32,
    /// log2 of TXBBs per slot (stride_shift - 6).
    txbb_shift: u32,
    pub(crate) cqn: u32,
    /// Free-running consumer, in slots.
    ci: u32,
    pub(crate) state: QueueState,
    pub(crate) uar: usize,
    pub(crate) bf: Option<Bf>,
    walk: Walk,
    /// The walk was asked for by a doorbell seen for another queue of a shared UAR page (one
    /// that may have overwritten this queue's own): WQEs it runs are counted as inferred.
    inferred: bool,
    stalled: bool,
    /// Per slot: a BlueFlame write announced the WQE starting there. Its control segment's
    /// bytes 4-6 are then the QPN (drivers write it into the ring copy too), not a VLAN request.
    bf_marks: Marks,
    /// The layout of the last inline WQE, which most following WQEs share.
    shape: Box<Shape>,
    /// Where a run's scans note the signaled WQEs they pass: kept here, as a run of one WQE
    /// would otherwise set it up for nothing.
    signals: run::Signals,
    /// Set while a walk is pending: unfinished (its CQ was full), or asked for by a doorbell
    /// another queue's runner took from a shared UAR page; a runner comes back for it.
    busy: Arc<AtomicBool>,
}

/// Buffers a walk reuses, so steady-state traffic does not allocate.
pub(crate) struct Scratch {
    /// The WQE being executed (whole TXBBs of it).
    wqe: WqeBuf,
    segs: Segs,
    frame: Vec<u8>,
    /// One LSO segment being built.
    seg: Vec<u8>,
}

impl Scratch {
    pub(crate) fn new() -> Box<Scratch> {
        Box::new(Scratch {
            wqe: [[0; DS_SIZE]; WQE_UNITS],
            segs: Segs::new(),
            frame: Vec::with_capacity(MAX_FRAME + 8),
            seg: Vec::with_capacity(MAX_FRAME + 8),
        })
    }
}

/// What a walk works with besides the queue itself.
pub(crate) struct TxCtx<'a> {
    pub(crate) wc: bool,
    /// A ConnectX-3 Pro: inner checksums (IIP/ILP) of VXLAN frames.
    pub(crate) pro: bool,
    pub(crate) max_wqe_size: usize,
    pub(crate) mrs: &'a MrTable,
    pub(crate) cq: &'a mut Cq,
    pub(crate) wire: &'a mut WirePort,
    pub(crate) port: &'a RxPort,
    pub(crate) counters: &'a mut Counters,
    pub(crate) scratch: &'a mut Scratch,
    pub(crate) faults: &'a mut FaultState,
    /// WQEs of the remembered shape may be executed from their headers.
    pub(crate) shape_cache: bool,
}

/// The WQE at the consumer, as its first TXBB announces it.
#[derive(Debug, Clone, Copy)]
struct Fetched {
    opcode: u8,
    ds: u8,
    txbbs: u32,
    /// Larger than the device accepts or than the ring: executed as an error, not fetched.
    oversized: bool,
}

impl Fetched {
    fn len(&self) -> usize {
        usize::from(self.ds) * DS_SIZE
    }
}

impl Sq {
    /// A send queue of `cnt` slots of `1 << stride_shift` bytes (at least 64) on `ring`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        qpn: u32,
        ring: HostMem,
        cnt: u32,
        stride_shift: u32,
        cqn: u32,
        uar: usize,
        bf: Option<Bf>,
        state: QueueState,
    ) -> Sq {
        Sq {
            qpn,
            ring,
            cnt,
            txbb_shift: stride_shift - mlx4_prm::TXBB_SHIFT,
            cqn,
            ci: 0,
            state,
            uar,
            bf,
            walk: Walk::Idle,
            inferred: false,
            stalled: false,
            bf_marks: Marks::new(cnt),
            shape: Box::new(Shape::new()),
            signals: run::Signals::new(),
            busy: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Take BlueFlame arrivals, then execute what they and the doorbells routed here asked
    /// for; returns the work items done (0 = nothing arrived and nothing was pending).
    pub(crate) fn poll(&mut self, cx: &mut TxCtx<'_>) -> usize {
        let mut work = 0;
        if self.bf.is_some() {
            work += self.take_bf_arrivals(cx.wc, cx.counters);
        }
        if self.walk != Walk::Idle {
            let (n, finished) = self.doorbell_run(cx);
            work += n;
            if !finished {
                work += self.walk(cx);
            }
        }
        let pending = self.walk != Walk::Idle;
        if pending != self.busy.load(Ordering::Relaxed) {
            self.busy.store(pending, Ordering::Release);
        }
        work
    }

    /// Nothing to do: no walk pending, no BlueFlame write waiting in either half, and no
    /// runner told to come back. A poll then passes the queue by (two loads at most, of
    /// lines only the driver writes, which stay shared while it writes nothing).
    #[inline]
    pub(crate) fn idle(&self) -> bool {
        self.walk == Walk::Idle
            && !self.busy.load(Ordering::Relaxed)
            && self.bf.as_ref().map_or(true, Bf::quiet)
    }

    /// What a runner watches to know whether this queue has work (`db`: its UAR page's send
    /// doorbell word).
    pub(crate) fn watch(&self, db: HostMem) -> SqWatch {
        SqWatch {
            db,
            bf: self.bf.as_ref().map(|b| b.halves.clone()),
            busy: self.busy.clone(),
        }
    }

    /// A doorbell naming this queue arrived (on any UAR page). `inferred`: it named another
    /// queue of a shared page, and may have overwritten one for this queue. Returns whether
    /// the queue will walk (a queue not in `Ready` drops doorbells, as a QP not in RTS).
    pub(crate) fn doorbell(&mut self, inferred: bool, counters: &mut Counters) -> bool {
        if self.state != QueueState::Ready {
            if !inferred {
                counters.doorbells_not_ready += 1;
            }
            return false;
        }
        if !inferred {
            self.walk = Walk::All;
            self.inferred = false;
        } else if self.walk == Walk::Idle {
            self.walk = Walk::All;
            self.inferred = true;
        }
        self.busy.store(true, Ordering::Release);
        true
    }

    /// Move to `state` (the checks are the caller's). Going to `Reset` forgets where the device
    /// was: the next `Ready` starts at slot 0 with nothing pending, as a QP reset does.
    pub(crate) fn set_state(&mut self, state: QueueState) {
        if state == QueueState::Reset {
            self.ci = 0;
            self.walk = Walk::Idle;
            self.inferred = false;
            self.stalled = false;
            self.bf_marks.clear_all();
            if let Some(bf) = self.bf.as_mut() {
                for l in &mut bf.latch {
                    l.counter = None;
                }
            }
            self.shape.forget();
        }
        self.state = state;
    }

    /// Execute WQEs from the consumer on, as far as the walk allows (a doorbell covers every
    /// owned WQE, a BlueFlame write those up to its own) and the device owns them (OWNER equals
    /// the pass parity and DS is not zero). Loads of the ring are the only per-WQE accesses to
    /// shared memory; counters are tallied locally and added once.
    #[inline(never)]
    fn walk(&mut self, cx: &mut TxCtx<'_>) -> usize {
        if self.state != QueueState::Ready {
            self.walk = Walk::Idle;
            return 0;
        }
        let stop = match self.walk {
            Walk::Idle => return 0,
            Walk::All => None,
            Walk::UpTo(c) => Some(c),
        };
        let mut t = Tally::default();
        let mut credit = CqCredit::default();
        let out = Out {
            link_up: cx.port.up(),
            bytes: cx.wire.wants_bytes(),
        };
        // Copies and marks only exist after BlueFlame writes; the doorbell path skips them.
        let bf_live = self.bf_marks.any() || self.bf.as_ref().is_some_and(Bf::has_pending);
        // With no frame bytes wanted, a WQE of the remembered shape needs only its headers
        // checked (see `shape`), whether a doorbell or a BlueFlame write announced it. With
        // them, one whose frame is all inline is fetched and put on the wire from the places
        // the shape remembers, without a decode.
        let fast = !out.bytes && cx.shape_cache;
        let bytes_fast = out.bytes && cx.shape_cache;
        let epoch = cx.mrs.epoch();
        let txbb_mask = self.txbb_mask();
        // The ring's geometry in registers: the fields would be reloaded per WQE.
        let (slot_mask, shift) = (self.cnt - 1, self.txbb_shift);
        let mut done = 0;
        let inferred = std::mem::take(&mut self.inferred);
        self.walk = Walk::Idle;
        // Runs need the shape as learnt and no fault to count WQEs or completions for.
        let runs = (fast || bytes_fast) && !cx.faults.per_send_wqe();
        let budget = WALK_BUDGET;
        let resume = match stop {
            None => Walk::All,
            Some(c) => Walk::UpTo(c),
        };
        loop {
            if done >= budget {
                self.walk = resume;
                break;
            }
            if runs {
                let (n, at_stop, unowned) =
                    self.run(stop, epoch, bf_live, &mut credit, &out, &mut t, cx);
                done += n;
                if at_stop {
                    break;
                }
                if unowned {
                    self.unposted(stop);
                    break;
                }
            }
            let counter = self.ci as u16;
            if matches!(stop, Some(c) if u32::from(c.wrapping_sub(counter)) >= self.cnt) {
                break;
            }
            let first = (self.ci & slot_mask) << shift;
            let off = first as usize * TXBB_SIZE;
            let Some(dw0) = self.ring.load_be32(off) else {
                break;
            };
            if (dw0 & owner_opcode::OWNER != 0) != (self.ci & self.cnt != 0) {
                self.unposted(stop);
                break;
            }
            // The WQE an injected error replaces takes the full path.
            let inject = cx.faults.tx_error.next_hits();
            if !inject && (fast || bytes_fast && self.shape.inline_spans().is_some()) {
                let mut ctrl = [0u8; DS_SIZE];
                self.ring.read_array(off, &mut ctrl);
                // A latched copy is always of a WQE whose slot is marked: the rest of a BF
                // burst costs one load of its mark.
                let bf_posted = bf_live && self.bf_marks.get(self.ci & slot_mask);
                let bf_half = if bf_posted {
                    self.pending_copy(counter)
                } else {
                    None
                };
                if let Some(h) = bf_half {
                    // The copy's `srcrb_flags` rule, as on the full path (`use_bf_copy`).
                    self.bf_srcrb(h, &mut ctrl);
                }
                if let Some(hit) = self
                    .shape
                    .recall(&self.ring, first, txbb_mask, &ctrl, bf_posted, epoch)
                    .filter(|hit| {
                        // A pending BlueFlame copy's bytes are the full path's to weigh.
                        !out.bytes
                            || hit.verdict.frames == 0
                            || bf_half.is_none() && self.stage_inline(dw0, cx)
                    })
                {
                    if hit.signaled && !credit.take(cx.cq) {
                        self.stall(stop, cx.counters);
                        break;
                    }
                    self.stalled = false;
                    cx.faults.tx_error.tick();
                    if let (Some(h), Some(bf)) = (bf_half, self.bf.as_mut()) {
                        bf.latch[h].counter = None;
                        t.from_bf += 1;
                    } else {
                        t.fetched += 1;
                        t.fetch_bytes += u64::from(hit.wqe_bytes);
                    }
                    if hit.verdict.frames > 0 {
                        match self.shape.inline_spans() {
                            Some(spans) if out.bytes && self.shape.plain() => {
                                transmit_inline(hit.verdict, spans, bf_posted, &out, &mut t, cx)
                            }
                            _ => transmit(hit.verdict, bf_posted, &out, &mut t, cx),
                        }
                    }
                    if hit.signaled {
                        let op = cqe_owner::SEND | hit.opcode;
                        let solicited = ctrl[11] & SOLICIT_BYTE != 0;
                        let cqe = tx_cqe(self.qpn, counter, op, 0, 0);
                        push_send_cqe(cqe, solicited, true, &mut credit, &mut t, cx);
                    }
                    self.advance(hit.txbbs, bf_live);
                    t.txbbs += u64::from(hit.txbbs);
                    done += 1;
                    if stop == Some(counter) {
                        break;
                    }
                    continue;
                }
            }
            let Some(w) = self.fetch(dw0, &mut cx.scratch.wqe, cx.max_wqe_size) else {
                self.unposted(stop);
                break;
            };
            let (bf_half, bf_posted) = if bf_live {
                let slot = self.ci & (self.cnt - 1);
                (self.pending_copy(counter), self.bf_marks.get(slot))
            } else {
                (None, false)
            };
            let from_bf = match bf_half {
                Some(h) if !w.oversized => self.use_bf_copy(h, w.len(), cx),
                _ => false,
            };
            let wqe = &cx.scratch.wqe;
            // An injected error looks like a malformed WQE to the driver.
            let result = if inject || w.oversized {
                Err(syndrome::LOCAL_QP_OP)
            } else if out.bytes {
                let segs = &mut cx.scratch.segs;
                send::decode::<true>(wqe, w.ds, bf_posted, cx.mrs, segs, &mut self.shape)
            } else {
                let segs = &mut cx.scratch.segs;
                send::decode::<false>(wqe, w.ds, bf_posted, cx.mrs, segs, &mut self.shape)
            };
            let signaled = result.is_err() || wqe[0][11] & CQ_UPDATE_BYTE == CQ_UPDATE_BYTE;
            let solicited = wqe[0][11] & SOLICIT_BYTE != 0;
            if signaled && !credit.take(cx.cq) {
                self.stall(stop, cx.counters);
                break;
            }
            self.stalled = false;
            cx.faults.tx_error.tick();
            if inject {
                t.injected += 1;
            }
            if let (Some(h), Some(bf)) = (bf_half, self.bf.as_mut()) {
                bf.latch[h].counter = None;
            }
            if from_bf {
                t.from_bf += 1;
            } else {
                t.fetched += 1;
                t.fetch_bytes += w.len() as u64;
            }
            if !w.oversized && w.txbbs > 1 && stamp_inside(wqe, w.txbbs) {
                t.stamps += 1;
            }
            let (op, syn) = match result {
                Ok(v) => {
                    if v.frames > 0 {
                        transmit(v, bf_posted, &out, &mut t, cx);
                    }
                    (cqe_owner::SEND | w.opcode, 0)
                }
                Err(syn) => {
                    self.state = QueueState::Error;
                    (cqe_owner::SEND | cqe_opcode::ERROR, syn)
                }
            };
            if signaled {
                let vendor = if inject { INJECTED_VENDOR_ERR } else { 0 };
                let cqe = tx_cqe(self.qpn, counter, op, syn, vendor);
                push_send_cqe(cqe, solicited, syn == 0, &mut credit, &mut t, cx);
                t.error_cqes += u64::from(syn != 0);
            }
            self.advance(w.txbbs, bf_live);
            t.txbbs += u64::from(w.txbbs);
            done += 1;
            if syn != 0 || stop == Some(counter) {
                break;
            }
        }
        if inferred && done > 0 {
            cx.counters.doorbells_inferred += 1;
        }
        t.add_to(cx.counters);
        if bf_live {
            self.drop_stale_copies(cx.counters);
        }
        done
    }

    /// The WQE at the consumer is not (yet) the device's. A doorbell is used up there; but a
    /// BlueFlame write named the WQEs up to its own as posted, and their ring stores may still
    /// be on their way (the copy can overtake them), so the walk stays to come back.
    fn unposted(&mut self, stop: Option<u16>) {
        if let Some(c) = stop {
            self.walk = Walk::UpTo(c);
        }
    }

    /// The CQ has no room for the WQE at the consumer: come back to it when the consumer index
    /// moves.
    fn stall(&mut self, stop: Option<u16>, counters: &mut Counters) {
        if !self.stalled {
            self.stalled = true;
            counters.cq_full_stalls += 1;
        }
        self.walk = stop.map_or(Walk::All, Walk::UpTo);
    }

    /// Fetch the WQE at the consumer (owned by the device, first dword `dw0`) into `dst`: the
    /// first TXBB, and unless it is oversized, the others. `None` for a zero DS, which marks
    /// memory no WQE was written to.
    #[inline(always)]
    fn fetch(&self, dw0: u32, dst: &mut WqeBuf, max_wqe_size: usize) -> Option<Fetched> {
        self.fetch_txbb(0, dst);
        let ds = dst[0][7] & mlx4_prm::fence_size::DS_MASK;
        if ds == 0 {
            return None;
        }
        let txbbs = wqe_txbbs(ds);
        let oversized = usize::from(ds) * DS_SIZE > max_wqe_size || txbbs > self.txbb_mask() + 1;
        if !oversized {
            for k in 1..txbbs {
                self.fetch_txbb(k, dst);
            }
        }
        Some(Fetched {
            opcode: (dw0 & owner_opcode::OPCODE_MASK) as u8,
            ds,
            txbbs,
            oversized,
        })
    }

    /// Ready the frame of the WQE at the consumer, recalled with the remembered shape, for the
    /// wire: its TXBBs fetched into the scratch WQE, its segments the shape's inline spans.
    /// False (the full path takes the WQE) if the shape knows no spans or the WQE is too
    /// large to fetch.
    fn stage_inline(&self, dw0: u32, cx: &mut TxCtx<'_>) -> bool {
        let Some(spans) = self.shape.inline_spans() else {
            return false;
        };
        match self.fetch(dw0, &mut cx.scratch.wqe, cx.max_wqe_size) {
            Some(w) if !w.oversized => {
                cx.scratch.segs.set_inline(spans);
                true
            }
            _ => false,
        }
    }

    /// Copy TXBB `k` of the WQE at the consumer from ring memory into `dst`; a WQE's later TXBBs
    /// may wrap to the ring's start.
    #[inline(always)]
    fn fetch_txbb(&self, k: u32, dst: &mut WqeBuf) {
        let slot = (self.first_txbb(self.ci).wrapping_add(k) & self.txbb_mask()) as usize;
        let k = k as usize % MAX_WQE_TXBBS;
        let units = &mut dst[k * UNITS_PER_TXBB..(k + 1) * UNITS_PER_TXBB];
        let block: &mut [u8; TXBB_SIZE] = units
            .as_flattened_mut()
            .try_into()
            .expect("a TXBB is four DS units");
        self.ring.read_array(slot * TXBB_SIZE, block);
    }

    /// Move the consumer past a WQE of `txbbs`. Every slot it covered loses its BlueFlame mark,
    /// so a stale announcement (one naming a slot inside a WQE) cannot apply to a later WQE
    /// starting there.
    #[inline(always)]
    fn advance(&mut self, txbbs: u32, bf_live: bool) {
        let slots = self.slots(txbbs);
        if bf_live && self.bf_marks.any() {
            for k in 0..slots.min(self.cnt) {
                self.bf_marks
                    .clear(self.ci.wrapping_add(k) & (self.cnt - 1));
            }
        }
        self.ci = self.ci.wrapping_add(slots);
    }

    /// Slots a WQE of `txbbs` TXBBs takes.
    #[inline(always)]
    fn slots(&self, txbbs: u32) -> u32 {
        (txbbs + (1 << self.txbb_shift) - 1) >> self.txbb_shift
    }

    /// The TXBB of the ring where the slot of counter `c` starts.
    #[inline(always)]
    fn first_txbb(&self, c: u32) -> u32 {
        (c & (self.cnt - 1)) << self.txbb_shift
    }

    /// TXBBs of the ring, minus one.
    #[inline(always)]
    fn txbb_mask(&self) -> u32 {
        (self.cnt << self.txbb_shift) - 1
    }
}

/// Whether a later TXBB of the WQE starts with a stamp (doc/prm.md 10.1's optional check): the
/// driver published the owner before the rest, or payload bytes just look like one.
fn stamp_inside(wqe: &WqeBuf, txbbs: u32) -> bool {
    (1..txbbs as usize).any(|k| {
        let u = &wqe[k * UNITS_PER_TXBB];
        u32::from_be_bytes([u[0], u[1], u[2], u[3]]) & !owner_opcode::OWNER == STAMP_DWORD
    })
}
