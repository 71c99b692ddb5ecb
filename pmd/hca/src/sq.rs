//! The send engine: a send queue's doorbells (routed to it by QPN from any UAR page) and
//! BlueFlame arrivals, and the walk that executes its WQEs in order (doc/prm.md section 10
//! rules 1-4).
//!
//! The ring is `cnt` slots of `1 << stride_shift` bytes (64 for DPDK and mlx4_en, larger for
//! libmlx4 QPs with inline or LSO caps). A WQE starts at a slot and takes
//! `ceil(size / stride)` of them; counters (ownership parity, BlueFlame counter, CQE
//! `wqe_index`) count slots, which with a 64-byte stride are TXBBs.

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

/// How long the device keeps re-reading a BlueFlame copy that still differs from ring memory
/// (the driver's stores may still be landing; a whole write lands in well under a microsecond)
/// before it calls the copy torn: only a writer stopped in the middle of a copy, by preemption
/// or an interrupt, leaves one incomplete that long.
const BF_PATIENCE: Duration = Duration::from_micros(100);
/// DS units per TXBB.
const UNITS_PER_TXBB: usize = TXBB_SIZE / DS_SIZE;
/// TXBBs of the largest WQE.
const MAX_WQE_TXBBS: usize = WQE_UNITS / UNITS_PER_TXBB;

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

/// A send queue's BlueFlame register as the device sees it.
#[derive(Debug)]
pub(crate) struct Bf {
    pub(crate) slot: BfSlot,
    half_size: usize,
    halves: [HostMem; 2],
    /// What the device keeps of the whole copy in each half, checked against ring memory when
    /// it arrived, until the walk reaches its WQE.
    latch: [Latch; 2],
}

#[derive(Debug, Default)]
struct Latch {
    /// The 16-bit counter of the WQE the copy is of; `None` = nothing waiting.
    counter: Option<u16>,
    /// The copy's `srcrb_flags`: the one part of it that may differ from the ring WQE and
    /// still count (bytes 4-7 are the QPN and DS; the BF counter is in dword 0), and only by
    /// asking for a completion or an event the ring WQE does not (see `CopySrcrb`).
    srcrb: [u8; 4],
}

/// How the `srcrb_flags` of a BlueFlame copy that otherwise matches its ring WQE stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopySrcrb {
    /// The ring WQE's flags.
    Same([u8; 4]),
    /// The ring WQE's flags plus a completion or event request: what a copy may add (the WC
    /// self-test does), but also what an older write to the half leaves in the copy's second
    /// qword until this write's lands, for a writer that stores the first qword first.
    Asks([u8; 4]),
}

/// What became of a BlueFlame copy the device tried to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    /// It matches the WQE in ring memory: the walk will use it.
    Whole,
    /// A newer write to the same half began before the device had read it all.
    Superseded,
    /// It still differs from ring memory after the device re-read it, or its `srcrb_flags`
    /// drop a request of the ring WQE's.
    Torn,
}

impl Bf {
    fn has_pending(&self) -> bool {
        self.latch.iter().any(|l| l.counter.is_some())
    }

    pub(crate) fn new(slot: BfSlot, halves: [HostMem; 2], half_size: usize) -> Bf {
        Bf {
            slot,
            half_size,
            halves,
            latch: Default::default(),
        }
    }
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

/// Bits of a WQE's first, second and later 8-byte words (memory order, read natively) that a
/// BlueFlame copy must share with the ring WQE: dword 0 but the BF counter, then bytes 12-15
/// (bytes 4-11, QPN/DS and `srcrb_flags`, may differ), then everything.
const CTRL_COMPARED: [u64; 3] = [
    u32::from_ne_bytes((!owner_opcode::BF_COUNTER_MASK).to_be_bytes()) as u64,
    u64::from_ne_bytes([0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]),
    !0,
];

/// The C field (completion requested) of `srcrb_flags`, in its last byte.
const CQ_UPDATE_BYTE: u8 = srcrb::CQ_UPDATE as u8;
/// The solicited-event bit of `srcrb_flags`, in its last byte.
const SOLICIT_BYTE: u8 = srcrb::SOLICIT as u8;

/// The `srcrb_flags` of a copy's second qword `copy` against the ring WQE's `ring`: `None`
/// unless the copy's are the ring's, or the ring's plus completion or event requests.
fn compare_srcrb(ring: u64, copy: u64) -> Option<CopySrcrb> {
    let r: [u8; 8] = ring.to_ne_bytes();
    let c: [u8; 8] = copy.to_ne_bytes();
    let flags: [u8; 4] = c[..4].try_into().expect("four bytes");
    if r[..4] == c[..4] {
        return Some(CopySrcrb::Same(flags));
    }
    let added = c[3] & !r[3];
    let kept = r[3] & !c[3] == 0;
    (r[..3] == c[..3] && kept && added & !(CQ_UPDATE_BYTE | SOLICIT_BYTE) == 0)
        .then_some(CopySrcrb::Asks(flags))
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
            work += self.walk(cx);
        }
        let pending = self.walk != Walk::Idle;
        if pending != self.busy.load(Ordering::Relaxed) {
            self.busy.store(pending, Ordering::Release);
        }
        work
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

    /// BlueFlame arrivals in either half: each is a doorbell up to its WQE, and with write
    /// combining a copy of that WQE, which the device takes at once (checked against ring
    /// memory, where the driver wrote the WQE first) so that a newer write to the same half
    /// cannot spoil it later, as a real device latches a posted write when it lands.
    fn take_bf_arrivals(&mut self, wc: bool, counters: &mut Counters) -> usize {
        let Some(mut bf) = self.bf.take() else {
            return 0;
        };
        let mut work = 0;
        for h in 0..2 {
            // Read-only while nothing arrives.
            let Some(q) = bf.halves[h].load_bytes8(0) else {
                continue;
            };
            if q == [0; 8] {
                continue;
            }
            work += 1;
            counters.bf_bursts += 1;
            let ctrl = CtrlSeg::new_unchecked(&q[..]);
            let c = ctrl.bf_counter();
            let ahead = u32::from(c.wrapping_sub(self.ci as u16));
            if ctrl.bf_qpn() != self.qpn || ahead >= self.cnt || self.state != QueueState::Ready {
                counters.bf_ignored += 1;
            } else {
                if bf.latch[h].counter.take().is_some() {
                    // The walk never reached the copy this half held.
                    counters.bf_superseded += 1;
                }
                self.bf_marks.set(u32::from(c) & (self.cnt - 1));
                if wc {
                    match self.latch_copy(&mut bf, h, q, ahead) {
                        Taken::Whole => bf.latch[h].counter = Some(c),
                        Taken::Superseded => counters.bf_superseded += 1,
                        Taken::Torn => counters.bf_torn += 1,
                    }
                } else {
                    // Without write combining the copy trickles in as 8-byte stores; only its
                    // first qword (QPN and counter) is trusted, as a doorbell.
                    let bytes = wqe_txbbs(ctrl.ds().max(1)) as usize * TXBB_SIZE;
                    counters.bf_torn += 1;
                    counters.bf_pieces += (bytes.min(bf.half_size) / 8) as u64;
                }
                self.walk = self.walk.merge_bf(c, self.ci as u16, ahead);
            }
            // Consumed by zeroing its first qword, like the swap on the UAR doorbell word; a
            // newer write that already replaced it is found by the next look.
            bf.halves[h].clear_bytes8_if(0, q);
        }
        self.bf = Some(bf);
        work
    }

    /// Check the copy in half `h` (first qword `q`) against the WQE `ahead` TXBBs past the
    /// consumer in ring memory, in place, and latch its `srcrb_flags`. While it differs, the
    /// driver's stores may still be arriving: re-read for up to `BF_PATIENCE`; a first qword
    /// that changed means a newer write began.
    ///
    /// The copy's `srcrb_flags` are not checked against the ring, so the device cannot tell
    /// them landed: with 8-byte stores, first qword first, they are an older write's for as
    /// long as the writer takes to its second store. An older write's flags that lack the
    /// ring WQE's completion request would execute the WQE unsignaled and lose its CQE; ones
    /// that carry a request the WQE lacks would add a CQE the driver never asked for. Either
    /// way the driver's count of completions drifts from its ring, until its ring looks full
    /// for good (the txbench stall). So flags that drop a request never count (the ring's
    /// WQE runs, fetched), and flags that add one count only once they held for the whole
    /// patience, longer than any writer between two adjacent stores but a preempted one.
    fn latch_copy(&self, bf: &mut Bf, h: usize, q: [u8; 8], ahead: u32) -> Taken {
        let ds = CtrlSeg::new_unchecked(&q[..]).ds();
        let len = usize::from(ds) * DS_SIZE;
        if ds == 0 || len.next_multiple_of(TXBB_SIZE) > bf.half_size {
            return Taken::Torn;
        }
        // The WQE in ring memory, which the driver posted before writing the copy; its stores
        // may become visible after the copy's (x86 orders a `movdir64b` or WC store after
        // earlier stores only behind a fence), so it too is waited for, as briefly.
        let idx = self.ci.wrapping_add(ahead);
        let first = self.first_txbb(idx);
        let parity = idx & self.cnt != 0;
        let half = &bf.halves[h];
        let mut since = None;
        for n in 0u32.. {
            let posted = self
                .ring
                .load_be32(first as usize * TXBB_SIZE)
                .is_some_and(|w| (w & owner_opcode::OWNER != 0) == parity);
            let seen = if posted {
                self.copy_matches_ring(half, first, len)
            } else {
                None
            };
            // The copy just compared was the write announced by `q`, not part of a newer one.
            if half.load_bytes8(0) != Some(q) {
                return Taken::Superseded;
            }
            let waited =
                n % 16 == 15 && since.get_or_insert_with(Instant::now).elapsed() > BF_PATIENCE;
            match seen {
                Some(CopySrcrb::Same(srcrb)) => {
                    bf.latch[h].srcrb = srcrb;
                    return Taken::Whole;
                }
                Some(CopySrcrb::Asks(srcrb)) if waited => {
                    bf.latch[h].srcrb = srcrb;
                    return Taken::Whole;
                }
                _ if waited => break,
                _ => std::hint::spin_loop(),
            }
        }
        // Still no posted WQE to be a copy of (the write is only a doorbell), or the copy
        // never became whole.
        Taken::Torn
    }

    /// Whether the first `len` bytes of the BlueFlame copy in `half` are the WQE starting at
    /// ring TXBB `first`, allowing for what a copy legitimately changes (the BF counter in
    /// dword 0, QPN and DS in dword 1, requests added to `srcrb_flags`): how the copy's
    /// `srcrb_flags` stand if so. Both are read a TXBB at a time, 8 bytes per load, as the
    /// copy lands, and neither is copied.
    fn copy_matches_ring(&self, half: &HostMem, first: u32, len: usize) -> Option<CopySrcrb> {
        let mut srcrb = CopySrcrb::Same([0; 4]);
        for k in 0..len.div_ceil(TXBB_SIZE) {
            let txbb = first.wrapping_add(k as u32) & self.txbb_mask();
            let r: [u64; TXBB_SIZE / 8] = self.ring.load_qwords(txbb as usize * TXBB_SIZE)?;
            let c: [u64; TXBB_SIZE / 8] = half.load_qwords(k * TXBB_SIZE)?;
            let qwords = (len - k * TXBB_SIZE) / 8;
            let mut diff = 0;
            for (i, (r, c)) in r.iter().zip(&c).enumerate().take(qwords) {
                let care = if k == 0 { CTRL_COMPARED[i.min(2)] } else { !0 };
                diff |= (r ^ c) & care;
            }
            if diff != 0 {
                return None;
            }
            if k == 0 {
                srcrb = compare_srcrb(r[1], c[1])?;
            }
        }
        Some(srcrb)
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
        // checked (see `shape`), whether a doorbell or a BlueFlame write announced it.
        let fast = !out.bytes;
        let epoch = cx.mrs.epoch();
        let txbb_mask = self.txbb_mask();
        // The ring's geometry in registers: the fields would be reloaded per WQE.
        let (slot_mask, shift) = (self.cnt - 1, self.txbb_shift);
        let mut done = 0;
        let inferred = std::mem::take(&mut self.inferred);
        self.walk = Walk::Idle;
        // Runs need the shape as learnt and no fault to count WQEs or completions for.
        let runs = fast && !cx.faults.per_send_wqe();
        loop {
            if runs {
                let (n, at_stop) = self.run(stop, epoch, bf_live, &mut credit, &out, &mut t, cx);
                done += n;
                if at_stop {
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
            if fast && !inject {
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
                        transmit(hit.verdict, bf_posted, &out, &mut t, cx);
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

    /// Execute the run of WQEs of the remembered shape from the consumer on, on a wire
    /// that wants no frame bytes. Each WQE costs the checks of its ownership, control segment
    /// and headers: nothing is fetched or decoded, and the run's counts are added once. The run
    /// ends before the first WQE that needs more (not yet owned, of another shape, marked by a
    /// BlueFlame write, reaching past the ring's end, its completion not fitting), which the
    /// walk's per-WQE path then takes. Returns the WQEs executed, and whether the last was the
    /// one the walk was to stop at.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn run(
        &mut self,
        stop: Option<u16>,
        epoch: u64,
        bf_live: bool,
        credit: &mut CqCredit,
        out: &Out,
        t: &mut Tally,
        cx: &mut TxCtx<'_>,
    ) -> (usize, bool) {
        let Some(plan) = self.shape.plan(epoch) else {
            return (0, false);
        };
        let hit = plan.hit;
        let (slot_mask, shift, cnt) = (self.cnt - 1, self.txbb_shift, self.cnt);
        let slots = self.slots(hit.txbbs);
        // How many WQEs the walk's stop allows (the one at the stop included), and whether the
        // last of them is the one at the stop.
        let (max_n, stops_on_last) = match stop {
            Some(c) => {
                let d = u32::from(c.wrapping_sub(self.ci as u16));
                if d >= cnt {
                    return (0, false);
                }
                (d / slots + 1, d % slots == 0)
            }
            None => (u32::MAX, false),
        };
        // The run ends before a WQE would reach past the ring's end and before the first slot
        // a BlueFlame write marked (found once: the BlueFlame path has about one mark per
        // burst, and the run then stops at the ring's end, up to which it looked): a WQE
        // starting at `last_slot` or before, and not before `first` once marks are live, lies
        // before both.
        let first = self.ci & slot_mask;
        let (end, lowest) = if bf_live {
            (self.bf_marks.first_from(first, cnt), first)
        } else {
            (cnt, 0)
        };
        let Some(last_slot) = (end << shift).checked_sub(hit.txbbs) else {
            return (0, false);
        };
        let last_slot = last_slot >> shift;
        let op = cqe_owner::SEND | hit.opcode;
        // In locals: the loop stores nothing to the queue until it ends.
        let (ring, qpn) = (self.ring.clone(), self.qpn);
        let mut ci = self.ci;
        let mut n = 0u32;
        loop {
            let slot = ci & slot_mask;
            if n == max_n || slot > last_slot || slot < lowest {
                break;
            }
            let off = (slot << shift) as usize * TXBB_SIZE;
            let Some(dw0) = ring.load_be32(off) else {
                break;
            };
            if (dw0 & owner_opcode::OWNER != 0) != (ci & cnt != 0) {
                break;
            }
            let mut ctrl = [0u8; DS_SIZE];
            if !ring.read_array(off, &mut ctrl) || !plan.matches(&ring, off, &ctrl) {
                break;
            }
            if ctrl[11] & CQ_UPDATE_BYTE == CQ_UPDATE_BYTE {
                if !credit.take(cx.cq) {
                    break;
                }
                // The plain write of `push_send_cqe`: runs are off while a fault loses or
                // repeats completions, and its fault checks here cost the loop registers.
                let solicited = ctrl[11] & SOLICIT_BYTE != 0;
                if cx.cq.push(tx_cqe(qpn, ci as u16, op, 0, 0), solicited) {
                    t.events += 1;
                }
                t.cqes += 1;
            }
            ci = ci.wrapping_add(slots);
            n += 1;
        }
        let at_stop = n == max_n && stops_on_last;
        self.ci = ci;
        if n > 0 {
            self.stalled = false;
            let n64 = u64::from(n);
            t.fetched += n64;
            t.fetch_bytes += n64 * u64::from(hit.wqe_bytes);
            t.txbbs += n64 * u64::from(hit.txbbs);
            // As `transmit` for each (NOPs have no frames and leave the wire alone).
            let v = hit.verdict;
            if v.frames > 0 {
                t.dma += n64 * u64::from(v.dma);
                if out.link_up {
                    t.frames += n64 * u64::from(v.frames);
                    t.bytes += n64 * u64::from(v.len);
                    t.mac
                        .sized((v.len / v.frames) as usize, n64 * u64::from(v.frames));
                } else {
                    t.drops += n64 * u64::from(v.frames);
                }
            }
        }
        (n as usize, at_stop)
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

    /// The BlueFlame half holding a whole copy of the WQE at `counter`, if any.
    #[inline(always)]
    fn pending_copy(&self, counter: u16) -> Option<usize> {
        let bf = self.bf.as_ref()?;
        (0..2).find(|&h| bf.latch[h].counter == Some(counter))
    }

    /// Take the copy latched in half `h` for the WQE fetched into `scratch.wqe` (`len` bytes):
    /// it equals ring memory except for what a copy may change, of which the device honours
    /// its `srcrb_flags` (a copy may ask for a completion the ring copy does not: the WC
    /// self-test relies on it; never for less, see `latch_copy`). The latch is cleared once
    /// the WQE runs.
    fn use_bf_copy(&mut self, h: usize, len: usize, cx: &mut TxCtx<'_>) -> bool {
        let Some(bf) = self.bf.as_ref() else {
            return false;
        };
        if len > bf.half_size {
            return false;
        }
        cx.scratch.wqe[0][8..12].copy_from_slice(&bf.latch[h].srcrb);
        true
    }

    /// Put the `srcrb_flags` of the copy latched in half `h` into the control segment `ctrl`.
    #[inline(always)]
    fn bf_srcrb(&self, h: usize, ctrl: &mut [u8; DS_SIZE]) {
        if let Some(bf) = self.bf.as_ref() {
            ctrl[8..12].copy_from_slice(&bf.latch[h].srcrb);
        }
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

    /// Copies for WQEs the walk has passed are of no further use.
    fn drop_stale_copies(&mut self, counters: &mut Counters) {
        let ci = self.ci as u16;
        let cnt = self.cnt;
        if let Some(bf) = self.bf.as_mut() {
            for l in &mut bf.latch {
                if matches!(l.counter, Some(c) if u32::from(c.wrapping_sub(ci)) >= cnt) {
                    l.counter = None;
                    counters.bf_superseded += 1;
                }
            }
        }
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

/// A send completion for the WQE at `counter`; `syndrome` and `vendor` only for an error CQE.
fn tx_cqe(qpn: u32, counter: u16, owner_sr_opcode: u8, syn: u8, vendor: u8) -> [u8; CQE_SIZE] {
    let mut cqe = [0u8; CQE_SIZE];
    let mut w = Cqe::new_unchecked(&mut cqe[..]);
    w.set_qpn(qpn);
    w.set_wqe_index(counter);
    if syn != 0 {
        w.set_syndrome(syn);
        w.set_vendor_err(vendor);
    }
    w.set_owner_sr_opcode(owner_sr_opcode);
    cqe
}

/// Write the send completion `cqe` (its room taken from `credit`), unless it is `good` and the
/// `cqe_drop` fault loses it; a good one the `cqe_dup` fault picks is written again if the CQ
/// has room. Error completions are never lost nor repeated: the driver learns of the error
/// from them alone.
#[inline(always)]
fn push_send_cqe(
    cqe: [u8; CQE_SIZE],
    solicited: bool,
    good: bool,
    credit: &mut CqCredit,
    t: &mut Tally,
    cx: &mut TxCtx<'_>,
) {
    if good && cx.faults.cqe_drop.tick() {
        t.cqe_drops += 1;
        return;
    }
    let mut write = |cq: &mut Cq| {
        if cq.push(cqe, solicited) {
            t.events += 1;
        }
        t.cqes += 1;
    };
    write(cx.cq);
    // Asked only now: a credit that re-reads the CQ's room must see the first copy in it.
    let dup = good && cx.faults.cqe_dup.tick() && credit.take(cx.cq);
    if dup {
        write(cx.cq);
    }
    t.cqe_dups += u64::from(dup);
}

/// What the port does with frames during one walk.
struct Out {
    link_up: bool,
    /// The wire wants the frames' bytes (every wire but null).
    bytes: bool,
}

/// Counts of one walk, added to the device counters when it ends.
#[derive(Default)]
struct Tally {
    fetched: u64,
    fetch_bytes: u64,
    from_bf: u64,
    txbbs: u64,
    stamps: u64,
    frames: u64,
    bytes: u64,
    drops: u64,
    dma: u64,
    cqes: u64,
    error_cqes: u64,
    injected: u64,
    cqe_drops: u64,
    cqe_dups: u64,
    events: u64,
    /// The port counters of the frames put on the wire.
    mac: MacTally,
}

impl Tally {
    fn add_to(&self, c: &mut Counters) {
        c.wqe_fetched += self.fetched;
        c.wqe_fetch_bytes += self.fetch_bytes;
        c.wqe_from_bf += self.from_bf;
        c.txbbs += self.txbbs;
        c.wqe_stamp_seen += self.stamps;
        c.tx_frames += self.frames;
        c.tx_bytes += self.bytes;
        c.tx_drops_wire += self.drops;
        c.dma_read_bytes += self.dma;
        c.cqes += self.cqes;
        c.error_cqes += self.error_cqes;
        c.inj_tx_errors += self.injected;
        c.inj_cqe_drops += self.cqe_drops;
        c.inj_cqe_dups += self.cqe_dups;
        c.cq_events += self.events;
        self.mac.add_tx(c);
    }
}

/// Put the frames of a valid SEND on the wire (its segments are in `scratch.segs`).
#[inline(always)]
fn transmit(v: Verdict, bf_posted: bool, out: &Out, t: &mut Tally, cx: &mut TxCtx<'_>) {
    t.dma += u64::from(v.dma);
    if !out.link_up {
        t.drops += u64::from(v.frames);
    } else if !out.bytes {
        t.frames += u64::from(v.frames);
        t.bytes += u64::from(v.len);
        t.mac
            .sized((v.len / v.frames) as usize, u64::from(v.frames));
    } else {
        put_on_wire(bf_posted, t, cx);
    }
}

/// Assemble the frame(s) of the WQE in `scratch` and hand them to the wire.
fn put_on_wire(bf_posted: bool, t: &mut Tally, cx: &mut TxCtx<'_>) {
    let s = &mut *cx.scratch;
    let lso = send::assemble(&s.wqe, &s.segs, cx.mrs, (bf_posted, cx.pro), &mut s.frame);
    let (wire, port) = (&mut *cx.wire, cx.port);
    let mut put = |frame: &[u8]| match wire.transmit(port, frame) {
        TxOutcome::Sent => {
            t.frames += 1;
            t.bytes += frame.len() as u64;
            t.mac.frame(frame);
        }
        TxOutcome::Dropped => t.drops += 1,
    };
    match lso {
        None => put(&s.frame),
        Some((mss, hdr)) => net::for_each_tso_segment(&s.frame, hdr, mss, &mut s.seg, put),
    }
}
