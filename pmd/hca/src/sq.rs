//! The send engine: a send queue's doorbell and BlueFlame arrivals, and the walk that executes
//! its WQEs in order (spec section 10 rules 1-4).

use mlx4_prm::{
    cqe_opcode, cqe_owner, owner_opcode, srcrb, syndrome, wqe_txbbs, Cqe, CtrlSeg, CQE_SIZE,
    DS_SIZE, STAMP_DWORD, TXBB_SIZE,
};

use crate::cq::{Cq, CqCredit};
use crate::dma::HostMem;
use crate::net;
use crate::send::{self, Send};
use crate::tables::{BfSlot, MrTable};
use crate::wire::{RxPort, TxOutcome, WirePort};
use crate::{Counters, QueueState};

/// Times a BlueFlame copy is re-read while it still differs from ring memory, before the device
/// gives up on it as torn.
const BF_REREADS: u32 = 256;
/// Largest WQE the DS field can describe.
pub(crate) const MAX_WQE_BYTES: usize = mlx4_prm::MAX_WQE_DS as usize * DS_SIZE;

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

/// A send queue's BlueFlame register as the device sees it.
#[derive(Debug)]
pub(crate) struct Bf {
    pub(crate) slot: BfSlot,
    half_size: usize,
    halves: [HostMem; 2],
    /// First qword of the last arrival in each half (the device zeroes it in the register).
    first: [[u8; 8]; 2],
    /// Counter of a whole (WC) copy waiting in each half to be used for its WQE.
    pending: [Option<u16>; 2],
}

impl Bf {
    pub(crate) fn new(slot: BfSlot, halves: [HostMem; 2], half_size: usize) -> Bf {
        Bf {
            slot,
            half_size,
            halves,
            first: [[0; 8]; 2],
            pending: [None; 2],
        }
    }
}

/// A send queue: the context firmware would keep, plus where the device is in its ring.
#[derive(Debug)]
pub(crate) struct Sq {
    pub(crate) qpn: u32,
    ring: HostMem,
    cnt: u32,
    pub(crate) cqn: u32,
    /// Free-running consumer, in TXBBs.
    ci: u32,
    pub(crate) state: QueueState,
    pub(crate) uar: usize,
    db: HostMem,
    pub(crate) bf: Option<Bf>,
    walk: Walk,
    stalled: bool,
    /// Per TXBB slot: a BlueFlame write announced the WQE starting there. Its control segment's
    /// bytes 4-6 are then the QPN (drivers write it into the ring copy too), not a VLAN request.
    bf_marks: Vec<bool>,
}

/// Buffers a walk reuses, so steady-state traffic does not allocate.
pub(crate) struct Scratch {
    wqe: [u8; MAX_WQE_BYTES],
    bf: Vec<u8>,
    /// A second read of the same copy: a copy is trusted only when two reads agree.
    bf_again: Vec<u8>,
    segs: Vec<send::Seg>,
    frame: Vec<u8>,
    /// One LSO segment being built.
    seg: Vec<u8>,
}

impl Scratch {
    pub(crate) fn new() -> Box<Scratch> {
        Box::new(Scratch {
            wqe: [0; MAX_WQE_BYTES],
            bf: Vec::with_capacity(4096),
            bf_again: Vec::with_capacity(4096),
            segs: Vec::with_capacity(64),
            frame: Vec::with_capacity(send::MAX_FRAME + 8),
            seg: Vec::with_capacity(send::MAX_FRAME + 8),
        })
    }
}

/// What a walk works with besides the queue itself.
pub(crate) struct TxCtx<'a> {
    pub(crate) wc: bool,
    pub(crate) max_wqe_size: usize,
    pub(crate) mrs: &'a MrTable,
    pub(crate) cq: &'a mut Cq,
    pub(crate) wire: &'a mut WirePort,
    pub(crate) port: &'a RxPort,
    pub(crate) counters: &'a mut Counters,
    pub(crate) scratch: &'a mut Scratch,
}

/// The WQE at the consumer, as its first TXBB announces it.
#[derive(Debug, Clone, Copy)]
struct Head {
    /// Byte offset in the ring.
    off: usize,
    /// 16-bit counter (the consumer's low bits), as CQEs and BlueFlame copies name WQEs.
    counter: u16,
    opcode: u8,
    len: usize,
    txbbs: u32,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Sq {
    pub(crate) fn new(
        qpn: u32,
        ring: HostMem,
        cnt: u32,
        cqn: u32,
        uar: usize,
        db: HostMem,
        bf: Option<Bf>,
    ) -> Sq {
        Sq {
            qpn,
            ring,
            cnt,
            cqn,
            ci: 0,
            state: QueueState::Ready,
            uar,
            db,
            bf,
            walk: Walk::Idle,
            stalled: false,
            bf_marks: vec![false; cnt as usize],
        }
    }

    /// Take doorbell and BlueFlame arrivals, then execute what they asked for; returns the work
    /// items done (0 = nothing arrived and nothing was pending).
    pub(crate) fn poll(&mut self, cx: &mut TxCtx<'_>) -> usize {
        let mut work = self.take_doorbell(cx.counters);
        work += self.take_bf_arrivals(cx.wc, cx.counters);
        if self.walk != Walk::Idle {
            work += self.walk(cx);
        }
        work
    }

    /// A UAR doorbell, read-only until one is there so the driver's cache line is not stolen per
    /// poll, then taken with a swap so none is lost.
    fn take_doorbell(&mut self, counters: &mut Counters) -> usize {
        if self.db.load_be32(0).unwrap_or(0) == 0 {
            return 0;
        }
        let v = self.db.take_be32(0).unwrap_or(0);
        counters.doorbells += 1;
        if mlx4_prm::doorbell_qpn(v.to_be_bytes()) == self.qpn {
            self.walk = Walk::All;
        } else {
            counters.doorbells_bad_qpn += 1;
        }
        1
    }

    /// BlueFlame arrivals in either half: each is a doorbell up to its WQE, and with write
    /// combining a copy of that WQE the walk may use instead of ring memory.
    fn take_bf_arrivals(&mut self, wc: bool, counters: &mut Counters) -> usize {
        let Some(bf) = self.bf.as_mut() else {
            return 0;
        };
        let mut work = 0;
        for h in 0..2 {
            // Read-only while nothing arrives; an arrival is consumed by zeroing its first qword
            // (only if unchanged), like the swap on the UAR doorbell word.
            let Some(q) = bf.halves[h].load_bytes8(0) else {
                continue;
            };
            if q == [0; 8] || !bf.halves[h].clear_bytes8_if(0, q) {
                continue;
            }
            bf.first[h] = q;
            work += 1;
            counters.bf_bursts += 1;
            let ctrl = CtrlSeg::new_unchecked(&q[..]);
            let c = ctrl.bf_counter();
            let ahead = u32::from(c.wrapping_sub(self.ci as u16));
            if ctrl.bf_qpn() != self.qpn || ahead >= self.cnt {
                counters.bf_ignored += 1;
                continue;
            }
            self.bf_marks[usize::from(c) & (self.cnt as usize - 1)] = true;
            if wc {
                bf.pending[h] = Some(c);
            } else {
                // Without write combining the copy trickles in as 8-byte stores; only its first
                // qword (QPN and counter) is trusted, as a doorbell.
                let bytes = wqe_txbbs(ctrl.ds().max(1)) as usize * TXBB_SIZE;
                counters.bf_torn += 1;
                counters.bf_pieces += (bytes.min(bf.half_size) / 8) as u64;
                bf.pending[h] = None;
            }
            self.walk = self.walk.merge_bf(c, self.ci as u16, ahead);
        }
        work
    }

    /// The WQE at the consumer if the walk may run it: the device owns it (OWNER equals the
    /// pass parity and DS is not zero) and a doorbell or BlueFlame write reached it.
    fn head(&mut self) -> Option<Head> {
        if self.state == QueueState::Error {
            self.walk = Walk::Idle;
            return None;
        }
        let counter = self.ci as u16;
        match self.walk {
            Walk::Idle => return None,
            Walk::UpTo(c) if u32::from(c.wrapping_sub(counter)) >= self.cnt => {
                self.walk = Walk::Idle;
                return None;
            }
            _ => {}
        }
        let off = (self.ci & (self.cnt - 1)) as usize * TXBB_SIZE;
        let dw0 = self.ring.load_be32(off).unwrap_or(0);
        let fence_size = self.ring.load_be32(off + 4).unwrap_or(0) as u8;
        let ds = fence_size & mlx4_prm::fence_size::DS_MASK;
        let parity = self.ci & self.cnt != 0;
        if (dw0 & owner_opcode::OWNER != 0) != parity || ds == 0 {
            // Not (yet) handed to the device: the doorbell is used up.
            self.walk = Walk::Idle;
            return None;
        }
        Some(Head {
            off,
            counter,
            opcode: (dw0 & owner_opcode::OPCODE_MASK) as u8,
            len: usize::from(ds) * DS_SIZE,
            txbbs: wqe_txbbs(ds),
        })
    }

    /// Execute WQEs from the consumer on, as far as the walk allows and the device owns them.
    fn walk(&mut self, cx: &mut TxCtx<'_>) -> usize {
        let mut done = 0;
        let mut credit = CqCredit::default();
        while let Some(head) = self.head() {
            let oversized = head.len > cx.max_wqe_size || head.txbbs > self.cnt;
            if !oversized {
                self.fetch(&head, &mut cx.scratch.wqe[..head.len]);
            }
            let bf_half = self.pending_copy(head.counter);
            let from_bf = match bf_half {
                Some(h) if !oversized => self.use_bf_copy(h, head.len, cx),
                _ => false,
            };
            let slot = (self.ci & (self.cnt - 1)) as usize;
            let result = if oversized {
                Err(syndrome::LOCAL_QP_OP)
            } else {
                let wqe = &cx.scratch.wqe[..head.len];
                send::decode(wqe, self.bf_marks[slot], cx.mrs, &mut cx.scratch.segs)
            };
            let signaled = match result {
                Err(_) => true,
                Ok(_) => {
                    let flags = CtrlSeg::new_unchecked(&cx.scratch.wqe[..]).srcrb_flags();
                    flags & srcrb::CQ_UPDATE == srcrb::CQ_UPDATE
                }
            };
            if signaled && !credit.take(cx.cq) {
                if !self.stalled {
                    self.stalled = true;
                    cx.counters.cq_full_stalls += 1;
                }
                break;
            }
            self.stalled = false;
            if let (Some(h), Some(bf)) = (bf_half, self.bf.as_mut()) {
                bf.pending[h] = None;
            }
            self.count_fetch(&head, from_bf, oversized, cx);
            let cqe = match result {
                Ok(send) => {
                    if let Some(send) = send {
                        transmit(&send, head.len, cx);
                    }
                    tx_cqe(self.qpn, head.counter, cqe_owner::SEND | head.opcode, 0)
                }
                Err(syn) => {
                    self.state = QueueState::Error;
                    tx_cqe(
                        self.qpn,
                        head.counter,
                        cqe_owner::SEND | cqe_opcode::ERROR,
                        syn,
                    )
                }
            };
            if signaled {
                cx.cq.push(cqe);
                cx.counters.cqes += 1;
                if result.is_err() {
                    cx.counters.error_cqes += 1;
                }
            }
            self.advance(&head, cx.counters);
            done += 1;
            if self.walk == Walk::UpTo(head.counter) {
                self.walk = Walk::Idle;
                break;
            }
        }
        self.drop_stale_copies();
        done
    }

    /// Copy the WQE at `head` from ring memory; its later TXBBs may wrap to the ring's start.
    fn fetch(&self, head: &Head, dst: &mut [u8]) {
        let size = self.cnt as usize * TXBB_SIZE;
        let first = dst.len().min(size - head.off);
        let (a, b) = dst.split_at_mut(first);
        self.ring.read(head.off, a);
        if !b.is_empty() {
            self.ring.read(0, b);
        }
    }

    /// The BlueFlame half holding a whole copy of the WQE at `counter`, if any.
    fn pending_copy(&self, counter: u16) -> Option<usize> {
        let bf = self.bf.as_ref()?;
        (0..2).find(|&h| bf.pending[h] == Some(counter))
    }

    /// Whether the copy in half `h` replaces the WQE fetched into `scratch.wqe`. Torn is a fact
    /// about the burst: decided (and counted) once. A whole copy stays pending until its WQE is
    /// executed, so a walk that waits for CQ room uses it next time.
    fn use_bf_copy(&mut self, h: usize, len: usize, cx: &mut TxCtx<'_>) -> bool {
        let Some(bf) = self.bf.as_mut() else {
            return false;
        };
        let whole = take_bf_copy(bf, h, len, cx);
        if !whole {
            bf.pending[h] = None;
        }
        whole
    }

    fn count_fetch(&self, head: &Head, from_bf: bool, oversized: bool, cx: &mut TxCtx<'_>) {
        let c = &mut *cx.counters;
        if !oversized && head.len > TXBB_SIZE && stamp_inside(&cx.scratch.wqe[..head.len]) {
            c.wqe_stamp_seen += 1;
        }
        if from_bf {
            c.wqe_from_bf += 1;
        } else {
            c.wqe_fetched += 1;
            c.wqe_fetch_bytes += head.len as u64;
        }
    }

    /// Move the consumer past the WQE at `head`. Every slot it covered loses its BlueFlame mark,
    /// so a stale announcement (one naming a slot inside a WQE) cannot apply to a later WQE
    /// starting there.
    fn advance(&mut self, head: &Head, counters: &mut Counters) {
        for k in 0..head.txbbs.min(self.cnt) {
            self.bf_marks[(self.ci.wrapping_add(k) & (self.cnt - 1)) as usize] = false;
        }
        self.ci = self.ci.wrapping_add(head.txbbs);
        counters.txbbs += u64::from(head.txbbs);
    }

    /// Copies for WQEs the walk has passed are of no further use.
    fn drop_stale_copies(&mut self) {
        let ci = self.ci as u16;
        let cnt = self.cnt;
        if let Some(bf) = self.bf.as_mut() {
            for p in &mut bf.pending {
                if matches!(*p, Some(c) if u32::from(c.wrapping_sub(ci)) >= cnt) {
                    *p = None;
                }
            }
        }
    }
}

/// Whether a later TXBB of the WQE starts with a stamp (spec 10.1's optional check): the driver
/// published the owner before the rest, or payload bytes just look like one.
fn stamp_inside(wqe: &[u8]) -> bool {
    wqe[TXBB_SIZE..]
        .chunks(TXBB_SIZE)
        .any(|b| b.len() >= 4 && be32(b, 0) & !owner_opcode::OWNER == STAMP_DWORD)
}

/// A send completion for the WQE at `counter`; `syndrome` only for an error CQE.
fn tx_cqe(qpn: u32, counter: u16, owner_sr_opcode: u8, syn: u8) -> [u8; CQE_SIZE] {
    let mut cqe = [0u8; CQE_SIZE];
    let mut w = Cqe::new_unchecked(&mut cqe[..]);
    w.set_qpn(qpn);
    w.set_wqe_index(counter);
    if syn != 0 {
        w.set_syndrome(syn);
    }
    w.set_owner_sr_opcode(owner_sr_opcode);
    cqe
}

/// Compare the copy in BlueFlame half `h` with the ring WQE in `scratch.wqe[..len]`; when it is
/// whole, take its `srcrb_flags` (a copy may ask for a completion the ring copy does not: the
/// WC self-test relies on it) and return true. A copy still differing after a bounded re-read is
/// torn and ignored.
fn take_bf_copy(bf: &Bf, h: usize, len: usize, cx: &mut TxCtx<'_>) -> bool {
    let bytes = len.div_ceil(TXBB_SIZE) * TXBB_SIZE;
    if bytes > bf.half_size {
        cx.counters.bf_torn += 1;
        return false;
    }
    let Scratch {
        bf: copy,
        bf_again: again,
        wqe,
        ..
    } = &mut *cx.scratch;
    copy.resize(bytes, 0);
    again.resize(bytes, 0);
    let ring = &wqe[..len];
    for _ in 0..BF_REREADS {
        // A real BF write lands whole; here the driver's stores may still be arriving, or (if
        // the device fell behind) a newer copy may be overwriting this half. Two equal reads
        // rule out the first; the first qword, zeroed at arrival and written first by any newer
        // copy, still being zero rules out the second (stores and loads are ordered on the
        // platforms we model).
        let whole = bf.halves[h].read_qwords(0, copy)
            && bf.halves[h].read_qwords(0, again)
            && copy[8..] == again[8..]
            && bf.halves[h].load_bytes8(0) == Some([0; 8]);
        if whole && {
            // The first qword was consumed from the register at arrival; use what arrived.
            copy[..8].copy_from_slice(&bf.first[h]);
            bf_copy_matches(ring, &copy[..len])
        } {
            let flags = CtrlSeg::new_unchecked(&copy[..]).srcrb_flags();
            wqe[8..12].copy_from_slice(&flags.to_be_bytes());
            return true;
        }
        std::hint::spin_loop();
    }
    cx.counters.bf_torn += 1;
    false
}

/// Whether a BlueFlame copy is the ring WQE, allowing for what the copy legitimately changes:
/// the counter in dword 0, QPN/DS in dword 1, and the srcrb flags.
fn bf_copy_matches(ring: &[u8], copy: &[u8]) -> bool {
    let mask = !owner_opcode::BF_COUNTER_MASK;
    be32(ring, 0) & mask == be32(copy, 0) & mask && ring[12..] == copy[12..]
}

/// Put a validated SEND on the wire (the WQE's bytes are in `scratch.wqe[..len]`).
fn transmit(send: &Send, len: usize, cx: &mut TxCtx<'_>) {
    let c = &mut *cx.counters;
    c.dma_read_bytes += send.dma_len as u64;
    if !cx.port.up.load(std::sync::atomic::Ordering::Relaxed) {
        c.tx_drops_wire += send.frames as u64;
        return;
    }
    if !cx.wire.wants_bytes() {
        c.tx_frames += send.frames as u64;
        c.tx_bytes += send.len as u64;
        return;
    }
    let s = &mut *cx.scratch;
    send::assemble(&s.wqe[..len], &s.segs, cx.mrs, send, &mut s.frame);
    let (wire, port) = (&mut *cx.wire, cx.port);
    let mut put = |frame: &[u8]| match wire.transmit(port, frame) {
        TxOutcome::Sent => {
            c.tx_frames += 1;
            c.tx_bytes += frame.len() as u64;
        }
        TxOutcome::Dropped => c.tx_drops_wire += 1,
    };
    match send.lso {
        Some((mss, hdr)) => {
            let hdr = hdr + if send.vlan.is_some() { 4 } else { 0 };
            net::for_each_tso_segment(&s.frame, hdr, mss, &mut s.seg, put);
        }
        None => put(&s.frame),
    }
}
