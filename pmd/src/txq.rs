//! TX queues: inline or gather WQEs in a TXBB ring, then one doorbell per burst, or a
//! BlueFlame copy of the burst's last WQE when that path is live.
//!
//! The queue is generic over the packet buffer ([`TxBuf`]): `rte_mbuf` chains under DPDK,
//! plain buffers in tests, so the whole path runs against the software HCA without EAL.
//! Nothing here allocates, locks or calls C per packet; buffers are released in bulk.
//!
//! # What is paid per burst, and why
//!
//! Under testpmd against a device that drains slowly, `tx_burst` is called tens of times per
//! packet sent, and at burst 32 anything done per packet is paid 32 times. So the burst does
//! once what does not depend on the packet (`doc/design.md`, "The transmit path"):
//! - a call with nothing to send leaves at once; on a full ring it leaves after the
//!   completion poll (which is what makes room: one load and a compare when no CQE waits),
//!   before any set-up. [`TxQueue::burst`] is that front, inline; the rest is out of line;
//! - one room budget: the TXBBs the ring can take before the headroom (and, for gather
//!   packets, the slots of the gather ring); a packet then only compares against the end of
//!   the current run;
//! - the contiguous run to the ring's end is computed once ([`SqRing::poster`]), with at most
//!   one pad NOP where a WQE would cross it (`Poster::wrap`), and its owner word once;
//! - each WQE's owner word is one store, made when the next WQE is taken; the last one waits
//!   for the decisions that concern the burst: whether it asks for a completion (once per
//!   burst, when enough WQEs or TXBBs went unsignaled) and whether it goes out through
//!   BlueFlame or the doorbell;
//! - counters are summed in registers and stored once;
//! - inline packets are released at the end of the burst, straight from the caller's array
//!   when no gather packet came between them (no per-packet bookkeeping); gather ones in one
//!   or two bulk calls when their completion arrives, all completions waiting taken together;
//! - a completion stamps the whole freed run with one value per pass, by an unrolled loop;
//! - a burst of one packet (what a latency-bound application sends, and what testpmd sends
//!   against a slow device) skips the poster: the run, the pending owner store, the loop and
//!   its tally are set-up a single WQE pays for nothing. `TxQueue::post_one` writes a plain
//!   packet that fits a straight-line inline WQE in place and ends the burst as any other
//!   (165 -> 131 instructions on the doorbell path, 232 -> 193 through BlueFlame);
//! - the BlueFlame copy is decided once, at the end: the register exists only on a queue
//!   whose BF path is live, [`BfReg::reserve`] checks the size before the WQE is published
//!   (so the copy's own bound check folds), and the copy dispatches on the routine once for
//!   the whole WQE, straight from the ring, its first 8 bytes (BF counter and QPN) from a
//!   register; only `movdir64b`, whose source is memory, stages its first block, out of line
//!   (a 64-byte aligned local would align the whole burst's frame and cost the inline loop a
//!   register). The ring copy stays a plain WQE: a device that missed the write fetches it.
//!
//! Per packet, a plain packet (one segment, no offload flags, a length class that fits) takes
//! a straight-line path: [`wqe::write_plain_inline1`] / [`wqe::write_plain_inline2`] (one or
//! two TXBBs) or [`wqe::write_plain_gather`] (a buffer in the lkey cache's region), each run
//! in a tight loop of its own (`inline_run`, `gather_run`) over a cursor that keeps the
//! poster in registers: a few loads from the buffer, fixed-size stores, one owner store.
//! Everything else (offloads, VLAN, several segments, long inline WQEs, buffers outside the
//! lkey cache's region) goes through `post_general`, the former code, which produces the
//! same bytes. Which path a packet took is in [`TxStats`] (`general_inline`,
//! `general_gather`), counted on the general path only.

use std::sync::atomic::AtomicU32;

use mlx4_prm::{cqe_opcode, opcode, owner_opcode, SQ_HEADROOM_BYTES, TXBB_SHIFT};

use crate::hw::{Device, HwError};
use crate::mbuf::{BufBatch, BufRing};
use crate::mem::{DmaArray, FixedStr, Lkeys, MemSource, Mr};
use crate::mmio::{BfReg, Copy64, SendDoorbell};
use crate::pmd_log;
use crate::ring::{txbbs_for, CqRing, LastWqe, Posted, Poster, SqRing};
pub use crate::stats::TxStats;
use crate::wqe::{self, TxOffloads, MAX_GATHER_SEGS};

/// What the TX path needs from a packet buffer. Releasing is `unsafe`: a buffer is `Copy`,
/// and only its owner may give it back.
#[allow(unsafe_code)]
pub trait TxBuf: Copy {
    /// Total bytes over all segments.
    fn pkt_len(&self) -> u32;
    /// The segments' bytes, in order.
    fn segs(&self) -> impl Iterator<Item = &[u8]>;
    fn offloads(&self) -> TxOffloads;
    /// The bytes of a plain packet (one segment, no offload requested, its data inside its
    /// buffer), or None: the only question the straight-line path asks, answered with a few
    /// loads.
    fn plain(&self) -> Option<&[u8]>;
    /// The bytes to send, once the general path has checked the buffer's shape (for an mbuf:
    /// `nb_segs` segments ending the chain, each one's data inside its buffer, `pkt_len` their
    /// sum unless the packet is plain), or None for a malformed buffer, which is refused and
    /// counted in `bad_mbufs`. [`TxBuf::segs`] then yields exactly that many bytes.
    fn check(&self) -> Option<u32> {
        Some(self.pkt_len())
    }
    /// Makes a buffer the queue refused safe to release: for an mbuf chain, cut after its
    /// first `nb_segs` distinct segments, so that each is freed once.
    ///
    /// # Safety
    /// The queue took `self` (it is released with the burst) and nothing else uses it.
    unsafe fn refuse(&self) {}
    /// Returns buffers to their pools, once per batch.
    ///
    /// # Safety
    /// The caller owns every buffer in `bufs` (they were handed to the queue and are done
    /// with), none appears twice, and none is used afterwards.
    unsafe fn free_bulk(bufs: &[Self]);
    /// As `free_bulk`, under the application's promise of `MBUF_FAST_FREE`.
    ///
    /// # Safety
    /// As `free_bulk`; moreover every buffer is one segment with reference count 1, and all
    /// come from one pool.
    unsafe fn free_bulk_fast(bufs: &[Self]) {
        // SAFETY: the caller's contract covers free_bulk's.
        unsafe { Self::free_bulk(bufs) }
    }
}

/// Which transmit path is live on a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxPath {
    Doorbell,
    BlueFlame,
}

/// Queue parameters fixed at setup.
#[derive(Debug, Clone)]
pub struct TxConfig {
    /// Inline threshold in bytes; 0 disables inlining.
    pub inline_max: u16,
    pub path: TxPath,
    pub copy: Copy64,
    pub fast_free: bool,
    pub source: MemSource,
}

/// Fields only `tx_burst`'s posting side writes: cache lines of their own.
#[repr(C, align(64))]
#[derive(Default)]
struct Producer {
    /// Next TXBB (free-running).
    prod: u32,
    /// Next slot in `marks`.
    marks_head: u32,
    /// WQEs and TXBBs posted since the last one that asked for a completion.
    since_comp: u32,
    txbbs_since_comp: u32,
    /// Gather-ring counter just past the last held buffer of several segments: buffers
    /// before it may not go back through the fast-free path.
    chained_until: u32,
    lkeys: Lkeys,
    packets: u64,
    bytes: u64,
    errors: u64,
    doorbells: u64,
    bf_writes: u64,
    /// Packets that went out in gather WQEs; the others went inline.
    gather_packets: u64,
    ring_full: u64,
    /// Malformed buffers refused (also in `errors`).
    bad_mbufs: u64,
    /// Counted on the general path only, where they cost nothing that matters.
    general_inline: u64,
    general_gather: u64,
}

/// Fields only the completion side writes: another cache line.
#[repr(C, align(64))]
#[derive(Default)]
struct Completion {
    /// First TXBB not yet completed (free-running).
    cons: u32,
    marks_tail: u32,
    completions: u64,
    error_cqes: u64,
    cqe_mismatches: u64,
    error_logged: bool,
    /// An error CQE arrived: the device queue is dead until the control path recreates it
    /// ([`TxQueue::recover`]; never in the middle of a burst, with a WQE still unpublished).
    failed: bool,
}

/// Where a requested completion ends: everything before these counters is done when the CQE
/// naming `wqe_index` (the signaled WQE's first TXBB) arrives.
#[derive(Debug, Default, Clone, Copy)]
struct CompMark {
    txbb_end: u32,
    elts_end: u32,
    wqe_index: u16,
}

/// The queue's objects on the device: ring views over the memory the device handed over, and
/// its registers, which live exactly as long as the rings.
struct HwQueue {
    sq: SqRing,
    cq: CqRing,
    qpn: u32,
    doorbell: SendDoorbell,
    /// The BF register, only if the BlueFlame path is live.
    bf: Option<BfReg>,
    /// Bytes 4-7 of a BF copy less the size byte: the QPN in bytes 4-6 (host order).
    bf_qpn: u32,
}

/// What the error and lost-doorbell paths keep: cold, off the burst's cache lines.
#[derive(Default)]
struct Recovery {
    /// WQE index (TXBB counter, low 16 bits) of the error completion that stopped the queue.
    error_wqe: u16,
    /// `comp.cons` when the last look for a lost doorbell was taken, and how many looks in a
    /// row have seen it unchanged with WQEs outstanding.
    kick_cons: u32,
    stalled_looks: u32,
    /// The producer just after the NOP the last look without progress posted: while nothing
    /// was posted since, that NOP's completion is the one to wait for.
    nop_at: Option<u32>,
    flushed: u64,
    queue_resets: u64,
    doorbell_rerings: u64,
}

/// Calls finding a full ring without progress before it rings again for a lost doorbell.
const FULL_PATIENCE: u32 = 64;

/// Packets gathered for one release when gather packets come between inline ones.
const FREE_BATCH: usize = 64;

pub struct TxQueue<B: TxBuf> {
    prod: Producer,
    comp: Completion,
    hw: HwQueue,
    // Read-mostly below.
    cfg: TxConfig,
    pub qid: u16,
    /// The port's, for log lines.
    name: FixedStr<32>,
    txbb_cnt: u32,
    /// TXBBs the queue may have in flight: the ring less the headroom the device may
    /// prefetch into (2 KB + one WQE).
    usable: u32,
    comp_every: u32,
    comp_txbbs: u32,
    /// Longest packet the straight-line inline path takes: the threshold, at most two TXBBs.
    plain_inline_max: usize,
    /// Buffers of gather WQEs, held until their completion.
    elts: BufRing<B>,
    marks: DmaArray<CompMark>,
    /// Inline packets of a burst that also held gather packets, released together.
    done: BufBatch<B, FREE_BATCH>,
    /// Data segments of the packet being posted on the general path.
    segs: [(u64, u32, u32); MAX_GATHER_SEGS],
    recovery: Recovery,
}

/// Largest WQE we build: 63 DS in 16 TXBBs.
const MAX_WQE_TXBBS: u32 = 16;

impl<B: TxBuf> TxQueue<B> {
    /// A queue for `nb_desc` packets in flight, created on `dev`, for buffers in the
    /// registered regions `mrs`. Everything it keeps is plain data in `cfg.source` memory, so
    /// that another process can run it.
    pub fn new(
        dev: &dyn Device,
        name: &str,
        qid: u16,
        nb_desc: u16,
        cfg: TxConfig,
        mrs: &[Mr],
    ) -> Result<TxQueue<B>, HwError> {
        let elts_n = u32::from(nb_desc).max(64).next_power_of_two();
        let per_pkt = txbbs_for(wqe::inline_wqe_bytes(usize::from(cfg.inline_max))).max(1);
        let headroom = (SQ_HEADROOM_BYTES >> TXBB_SHIFT) as u32 + MAX_WQE_TXBBS;
        // As many TXBBs as nb_desc packets of the largest inline size need, within what the
        // device allows (a smaller ring only means the room check stops a burst sooner).
        let max = dev.caps().max_sq_txbbs.max(1);
        let max = 1 << max.ilog2();
        let txbb_cnt = (elts_n * per_pkt + headroom + MAX_WQE_TXBBS)
            .next_power_of_two()
            .min(max);
        if txbb_cnt < headroom + 2 * MAX_WQE_TXBBS {
            return Err(HwError::Invalid(format!(
                "the device's SQ limit ({max} TXBBs) is below the headroom"
            )));
        }
        let comp_every = 64.min(elts_n / 4).max(1);
        let comp_txbbs = (txbb_cnt / 4).max(MAX_WQE_TXBBS);
        // At most one mark per comp_every WQEs or comp_txbbs TXBBs in flight, plus slack.
        let marks_n = (txbb_cnt / comp_every.min(comp_txbbs) + 4).next_power_of_two();
        let nomem = || HwError::NoMemory("no memory for the TX queue's arrays".into());
        let src = cfg.source;
        let lkeys = Lkeys::new(mrs, src).ok_or_else(nomem)?;
        let elts = BufRing::new(elts_n, src).ok_or_else(nomem)?;
        let marks = DmaArray::new(marks_n as usize, CompMark::default(), src).ok_or_else(nomem)?;
        let hw = create_hw(dev, txbb_cnt, marks_n, &cfg)?;
        Ok(TxQueue {
            prod: Producer {
                lkeys,
                ..Producer::default()
            },
            comp: Completion::default(),
            hw,
            plain_inline_max: usize::from(cfg.inline_max).min(wqe::PLAIN_INLINE_MAX),
            cfg,
            qid,
            name: FixedStr::new(name),
            txbb_cnt,
            usable: txbb_cnt - headroom,
            comp_every,
            comp_txbbs,
            elts,
            marks,
            done: BufBatch::default(),
            segs: [(0, 0, 0); MAX_GATHER_SEGS],
            recovery: Recovery::default(),
        })
    }

    pub fn qpn(&self) -> u32 {
        self.hw.qpn
    }

    /// What the device handed over for this queue (ring, registers, QPN).
    pub fn sq_desc(&self) -> &crate::hw::SqDesc {
        self.hw.sq.desc()
    }

    /// Packets in flight the queue was sized for.
    pub fn nb_desc(&self) -> u32 {
        self.elts.capacity()
    }

    /// The configured path, unless the device gave this queue no BF register.
    pub fn path(&self) -> TxPath {
        match self.hw.bf {
            Some(_) => self.cfg.path,
            None => TxPath::Doorbell,
        }
    }

    pub fn stats(&self) -> TxStats {
        let p = &self.prod;
        TxStats {
            packets: p.packets,
            bytes: p.bytes,
            errors: p.errors,
            doorbells: p.doorbells,
            bf_writes: p.bf_writes,
            inline_packets: p.packets - p.gather_packets,
            gather_packets: p.gather_packets,
            ring_full: p.ring_full,
            completions: self.comp.completions,
            error_cqes: self.comp.error_cqes,
            cqe_mismatches: self.comp.cqe_mismatches,
            general_inline: p.general_inline,
            general_gather: p.general_gather,
            bad_mbufs: p.bad_mbufs,
            flushed: self.recovery.flushed,
            queue_resets: self.recovery.queue_resets,
            doorbell_rerings: self.recovery.doorbell_rerings,
        }
    }

    pub fn reset_stats(&mut self) {
        let p = &mut self.prod;
        (p.packets, p.bytes, p.errors, p.doorbells, p.bf_writes) = (0, 0, 0, 0, 0);
        (p.gather_packets, p.ring_full) = (0, 0);
        (p.general_inline, p.general_gather, p.bad_mbufs) = (0, 0, 0);
        (self.comp.completions, self.comp.error_cqes) = (0, 0);
        self.comp.cqe_mismatches = 0;
        let r = &mut self.recovery;
        (r.flushed, r.queue_resets, r.doorbell_rerings) = (0, 0, 0);
    }

    /// The counters, read beside the lcore that bursts (telemetry, `show port stats`, a
    /// secondary) word by word through `q`, never through a reference to the queue.
    ///
    /// # Safety
    /// `q` points to a live queue.
    #[allow(unsafe_code)]
    pub unsafe fn stats_raw(q: *const Self) -> TxStats {
        use std::ptr::addr_of;
        // SAFETY: the caller's live queue; each counter is an aligned u64 word.
        unsafe {
            let (p, c, r) = (
                addr_of!((*q).prod),
                addr_of!((*q).comp),
                addr_of!((*q).recovery),
            );
            let rd = |w: *const u64| w.read_volatile();
            let (packets, gather) = (
                rd(addr_of!((*p).packets)),
                rd(addr_of!((*p).gather_packets)),
            );
            TxStats {
                packets,
                bytes: rd(addr_of!((*p).bytes)),
                errors: rd(addr_of!((*p).errors)),
                doorbells: rd(addr_of!((*p).doorbells)),
                bf_writes: rd(addr_of!((*p).bf_writes)),
                inline_packets: packets.wrapping_sub(gather),
                gather_packets: gather,
                ring_full: rd(addr_of!((*p).ring_full)),
                completions: rd(addr_of!((*c).completions)),
                error_cqes: rd(addr_of!((*c).error_cqes)),
                cqe_mismatches: rd(addr_of!((*c).cqe_mismatches)),
                general_inline: rd(addr_of!((*p).general_inline)),
                general_gather: rd(addr_of!((*p).general_gather)),
                bad_mbufs: rd(addr_of!((*p).bad_mbufs)),
                flushed: rd(addr_of!((*r).flushed)),
                queue_resets: rd(addr_of!((*r).queue_resets)),
                doorbell_rerings: rd(addr_of!((*r).doorbell_rerings)),
            }
        }
    }

    /// Zeroes the counters from beside the lcore, as [`TxQueue::stats_raw`] reads them.
    ///
    /// # Safety
    /// `q` points to a live queue.
    #[allow(unsafe_code)]
    pub unsafe fn reset_stats_raw(q: *mut Self) {
        use std::ptr::addr_of_mut;
        // SAFETY: as for stats_raw.
        unsafe {
            let (p, c, r) = (
                addr_of_mut!((*q).prod),
                addr_of_mut!((*q).comp),
                addr_of_mut!((*q).recovery),
            );
            for w in [
                addr_of_mut!((*p).packets),
                addr_of_mut!((*p).bytes),
                addr_of_mut!((*p).errors),
                addr_of_mut!((*p).doorbells),
                addr_of_mut!((*p).bf_writes),
                addr_of_mut!((*p).gather_packets),
                addr_of_mut!((*p).ring_full),
                addr_of_mut!((*p).general_inline),
                addr_of_mut!((*p).general_gather),
                addr_of_mut!((*p).bad_mbufs),
                addr_of_mut!((*c).completions),
                addr_of_mut!((*c).error_cqes),
                addr_of_mut!((*c).cqe_mismatches),
                addr_of_mut!((*r).flushed),
                addr_of_mut!((*r).queue_resets),
                addr_of_mut!((*r).doorbell_rerings),
            ] {
                w.write_volatile(0);
            }
        }
    }

    /// TXBBs in the send ring.
    pub fn txbb_cnt(&self) -> u32 {
        self.txbb_cnt
    }

    /// The producer counter: where the next WQE goes (free-running, in TXBBs).
    pub fn producer(&self) -> u32 {
        self.prod.prod
    }

    /// Buffers posted and not yet completed.
    pub fn outstanding(&self) -> u32 {
        self.elts.len()
    }

    /// TXBBs the ring can take now, the prefetch headroom kept free.
    #[inline(always)]
    fn room(&self) -> u32 {
        let used = self.prod.prod.wrapping_sub(self.comp.cons);
        self.usable.saturating_sub(used)
    }

    #[inline(always)]
    fn marks_free(&self) -> bool {
        self.prod.marks_head.wrapping_sub(self.comp.marks_tail) < self.marks.len() as u32
    }

    /// Posts a signaled one-TXBB NOP, whose completion covers everything posted before it.
    fn post_signaled_nop(&mut self) {
        let start = self.prod.prod;
        wqe::write_nop(&mut self.hw.sq.wqe_mut(start, 1), 1, true);
        self.prod.prod = start.wrapping_add(1);
        let mask = self.marks.len() as u32 - 1;
        self.marks[(self.prod.marks_head & mask) as usize] = CompMark {
            txbb_end: self.prod.prod,
            elts_end: self.elts.head(),
            wqe_index: start as u16,
        };
        self.prod.marks_head = self.prod.marks_head.wrapping_add(1);
        (self.prod.since_comp, self.prod.txbbs_since_comp) = (0, 0);
        self.hw
            .sq
            .publish(start, self.hw.sq.owner_word(start, opcode::NOP));
    }

    /// Posts as many of `pkts` as fit; returns how many were taken. Taken packets belong to
    /// the queue (sent, or dropped and counted in `errors` if they can never be sent).
    #[inline(always)]
    pub fn burst(&mut self, pkts: &[B]) -> usize {
        if pkts.is_empty() {
            return 0;
        }
        // Completions make the room, so they come first. With none waiting and the queue
        // healthy this is one load and a compare, and the front calls nothing but `post`.
        if self.hw.cq.has_cqe() || self.comp.failed {
            return self.burst_after_completions(pkts);
        }
        // `room()` spelled out: one subtraction whose flags say full.
        let used = self.prod.prod.wrapping_sub(self.comp.cons);
        if used >= self.usable {
            return self.full();
        }
        self.post_any(pkts, self.usable - used)
    }

    #[inline(never)]
    fn burst_after_completions(&mut self, pkts: &[B]) -> usize {
        self.complete();
        if self.comp.failed {
            // The control path recreates the queue (`recover`), with the device in hand.
            return 0;
        }
        // `room()` spelled out: one subtraction whose flags say full.
        let used = self.prod.prod.wrapping_sub(self.comp.cons);
        if used >= self.usable {
            return self.full();
        }
        self.post_any(pkts, self.usable - used)
    }

    /// A burst of one packet goes its own way: see [`TxQueue::post_one`].
    #[inline(always)]
    fn post_any(&mut self, pkts: &[B], room: u32) -> usize {
        match pkts {
            [pkt] => self.post_one(pkt, room),
            _ => self.post(pkts, room),
        }
    }

    /// A burst of one packet, what a latency-bound application sends: a plain packet that
    /// fits a straight-line inline WQE before the ring's end is written in place, without
    /// the poster's set-up for a run (the run's end, the pending owner store, the loop and its
    /// tally), which a burst of one pays in full for nothing; the end of the burst is the
    /// same. Anything else is a burst like any other ([`TxQueue::post`]).
    #[inline(never)]
    fn post_one(&mut self, pkt: &B, room: u32) -> usize {
        let pkts = std::slice::from_ref(pkt);
        let Some(data) = pkt.plain() else {
            return self.post(pkts, room);
        };
        let len = data.len();
        let start = self.prod.prod;
        let txbbs = wqe::plain_inline_txbbs(len);
        // Two TXBBs before the ring's end whatever the class: the writers' own bound checks
        // then fold away (a one-TXBB WQE in the last slot is rare, and `post` takes it).
        let cnt = self.hw.sq.txbb_cnt();
        let slot = start & (cnt - 1);
        // `len > PLAIN_INLINE_MAX` is implied by the first test (the threshold is clamped to
        // it); said again so that the compiler knows the second chunk's size.
        if len.wrapping_sub(1) >= self.plain_inline_max
            || len > wqe::PLAIN_INLINE_MAX
            || txbbs > room
            || slot + 2 > cnt
        {
            return self.post(pkts, room);
        }
        if len <= wqe::FIRST_CHUNK {
            wqe::write_plain_inline1(&mut self.hw.sq.wqe_fixed::<1>(start), data);
        } else {
            wqe::write_plain_inline2(&mut self.hw.sq.wqe_fixed::<2>(start), data);
        }
        let end = start.wrapping_add(txbbs);
        let last = LastWqe {
            start,
            txbbs,
            send_be: self.hw.sq.owner_word(start, opcode::SEND).to_be(),
        };
        let posted = Posted {
            end,
            last: Some(last),
        };
        self.end_burst(posted, start, pkts, Tally::straight(1, len as u64))
    }

    /// The burst proper, with `room` TXBBs (more than none) to fill. A burst of plain packets
    /// that fit inline WQEs (the common one) is one straight-line run; anything else continues
    /// in [`post_rest`].
    #[inline(never)]
    fn post(&mut self, pkts: &[B], room: u32) -> usize {
        let start = self.prod.prod;
        let sink = AtomicU32::new(0);
        let mut poster = self.hw.sq.poster(start, start.wrapping_add(room), &sink);
        let (mut n, mut bytes) = (0, 0);
        let stop = inline_run(&mut poster, pkts, &mut n, self.plain_inline_max, &mut bytes);
        if stop == Stop::End {
            // Every packet went the straight-line way: the tally is two registers, and the
            // end of the burst a copy of its own with the rest folded away.
            let posted = poster.finish();
            return self.end_burst(posted, start, pkts, Tally::straight(n, bytes));
        }
        let rest = Rest {
            inline_max: usize::from(self.cfg.inline_max),
            plain_inline_max: self.plain_inline_max,
            elts_room: self.elts.capacity() - self.elts.len(),
            fast_free: self.cfg.fast_free,
            prod: &mut self.prod,
            elts: &mut self.elts,
            done: &mut self.done,
            segs: &mut self.segs,
        };
        // The poster goes in and out by value, so that it need not live in memory on the
        // straight-line path.
        let (poster, t) = post_rest(poster, pkts, stop, Tally::straight(n, bytes), rest);
        let posted = poster.finish();
        let taken = self.end_burst(posted, start, pkts, t);
        if t.last && taken < pkts.len() {
            // A WQE that had to be the last went out with its doorbell: the rest continue
            // as a burst of their own.
            return taken + self.burst(&pkts[taken..]);
        }
        if taken == 0 {
            // Too little room for the first packet: as for a full ring (see `full`).
            self.look_without_room();
        }
        taken
    }

    /// Once per burst: the completion request, the BlueFlame copy or the doorbell, the
    /// release of what was copied inline, the counters.
    #[inline(always)]
    fn end_burst(&mut self, posted: Posted, start: u32, pkts: &[B], t: Tally) -> usize {
        let end = posted.end;
        let p = &mut self.prod;
        p.prod = end;
        if let Some(last) = posted.last {
            p.since_comp += (t.n as u32) - t.errors;
            p.txbbs_since_comp += end.wrapping_sub(start);
            // The last WQE asks for a completion when enough went unsignaled.
            if (p.since_comp >= self.comp_every || p.txbbs_since_comp >= self.comp_txbbs)
                && p.marks_head.wrapping_sub(self.comp.marks_tail) < self.marks.len() as u32
            {
                wqe::set_signaled(&mut self.hw.sq.wqe_mut(last.start, last.txbbs));
                let mask = self.marks.len() as u32 - 1;
                self.marks[(p.marks_head & mask) as usize] = CompMark {
                    txbb_end: end,
                    elts_end: self.elts.head(),
                    wqe_index: last.start as u16,
                };
                p.marks_head = p.marks_head.wrapping_add(1);
                (p.since_comp, p.txbbs_since_comp) = (0, 0);
            }
            let word = u32::from_be(last.send_be);
            let hw = &mut self.hw;
            match hw.bf.as_mut().and_then(|bf| bf.reserve(last.txbbs)) {
                Some(half) => {
                    let dword1 = hw.sq.ctrl_dword1(last.start);
                    // The copy's bytes 4-6 carry the QPN where a VLAN-inserting WQE has its
                    // tag: such a WQE never goes through BF. The ring keeps a plain WQE for a
                    // device that falls back to fetching it.
                    if (dword1 >> 8) & 0xff == 0 {
                        let word = word | (last.start & 0xffff) << owner_opcode::BF_COUNTER_SHIFT;
                        let mut head = [0u8; 8];
                        head[..4].copy_from_slice(&word.to_be_bytes());
                        head[4..].copy_from_slice(&(hw.bf_qpn | (dword1 & 0xff)).to_be_bytes());
                        half.write(head, hw.sq.publish_blocks(last.start, last.txbbs, word));
                        p.bf_writes += 1;
                    } else {
                        hw.sq.publish(last.start, word);
                        hw.doorbell.ring();
                        p.doorbells += 1;
                    }
                }
                None => {
                    hw.sq.publish(last.start, word);
                    hw.doorbell.ring();
                    p.doorbells += 1;
                }
            }
        }
        // Inline and dropped packets go back to their pools now (an inline packet's bytes
        // are in its WQE): straight from the caller's array unless gather packets came
        // between them.
        let fast = self.cfg.fast_free && t.single_seg;
        if t.kept == 0 && t.n == pkts.len() {
            release(pkts, fast);
        } else if self.done.is_empty() {
            release(&pkts[t.kept..t.n], fast);
        } else {
            stash(&mut self.done, &pkts[t.kept..t.n], fast);
            release(self.done.take(), fast);
        }
        let p = &mut self.prod;
        p.packets += (t.n - t.errors as usize) as u64;
        p.bytes += t.bytes;
        t.n
    }

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
    fn complete_from(&mut self, first: mlx4_prm::Cqe<[u8; mlx4_prm::CQE_SIZE]>) -> usize {
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
                self.comp.cqe_mismatches += u64::from(k);
            } else {
                self.comp.cqe_mismatches += 1;
            }
            cqes += 1;
            cqe = self.hw.cq.poll();
        }
        if cqes > 0 {
            self.hw.cq.update_ci();
            self.comp.completions += cqes;
        }
        let Some(m) = end else { return 0 };
        self.hw.sq.stamp(self.comp.cons, m.txbb_end);
        self.comp.cons = m.txbb_end;
        self.free_elts(m.elts_end)
    }

    /// Releases the held buffers before gather-ring counter `end`, in at most two bulk calls.
    fn free_elts(&mut self, end: u32) -> usize {
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
    /// the queue takes nothing more until [`TxQueue::recover`] recreates it, and counts then
    /// what was lost with it.
    #[cold]
    #[inline(never)]
    fn on_error_cqe(&mut self, syndrome: u8, vendor_err: u8, wqe_index: u16) {
        self.comp.error_cqes += 1;
        self.comp.failed = true;
        self.recovery.error_wqe = wqe_index;
        if !self.comp.error_logged {
            self.comp.error_logged = true;
            pmd_log!(
                ERR,
                "{}: TX queue {}: error CQE syndrome {syndrome:#04x} vendor {vendor_err:#04x} at WQE {wqe_index}; recreating the queue",
                self.name,
                self.qid
            );
        }
    }

    /// Whether an error completion stopped the queue: it needs [`TxQueue::recover`].
    #[inline]
    pub fn failed(&self) -> bool {
        self.comp.failed
    }

    /// Drops what was in flight on a failed queue and recreates it on the device. Returns
    /// whether the queue works again.
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

    /// Frees every outstanding buffer and gives the device a fresh queue. Used after an error
    /// and when the port stops (the device no longer executes anything then). If the device
    /// cannot make a new queue, the old one stays, and so does its state.
    pub fn reset(&mut self, dev: &dyn Device) -> Result<(), HwError> {
        let fresh = create_hw(dev, self.txbb_cnt, self.marks.len() as u32, &self.cfg)?;
        if self.comp.failed {
            // Read from the old ring before it goes.
            let lost = self.count_flushed();
            let r = &mut self.recovery;
            r.flushed += lost;
            r.queue_resets += 1;
            self.prod.errors += lost;
        }
        destroy_hw(dev, std::mem::replace(&mut self.hw, fresh));
        self.free_elts(self.elts.head());
        debug_assert!(self.elts.is_empty());
        (self.prod.prod, self.prod.marks_head, self.prod.since_comp) = (0, 0, 0);
        self.prod.txbbs_since_comp = 0;
        (self.comp.cons, self.comp.marks_tail) = (0, 0);
        self.comp.failed = false;
        self.recovery.nop_at = None;
        Ok(())
    }

    /// Packets in the WQEs from the failed one up to the producer: what the device of a queue
    /// in error never sends. WQEs before the failed one executed (a queue executes in order).
    /// NOPs (completion requests, the padding to the ring's end) hold none.
    fn count_flushed(&self) -> u64 {
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
                pos = (pos | (self.txbb_cnt - 1)).wrapping_add(1);
                continue;
            }
            pos = pos.wrapping_add(txbbs);
        }
        n
    }

    /// No room: counted, and a look for a lost doorbell (see [`TxQueue::look_without_room`]).
    #[inline(always)]
    fn full(&mut self) -> usize {
        self.prod.ring_full += 1;
        self.look_without_room();
        0
    }

    /// A burst that found no room looks for a lost doorbell: a full ring whose last doorbell
    /// was lost would otherwise take nothing from every later burst, and so never ring again.
    /// An application spinning on a full ring calls often while the device is merely behind,
    /// so this rings only after [`FULL_PATIENCE`] calls without progress. The burst's front
    /// found no completion waiting and the queue healthy, so the look is only the count.
    #[inline(always)]
    fn look_without_room(&mut self) {
        let cons = self.comp.cons;
        let r = &mut self.recovery;
        if r.kick_cons != cons {
            (r.kick_cons, r.stalled_looks) = (cons, 0);
        } else {
            r.stalled_looks += 1;
            if r.stalled_looks >= FULL_PATIENCE {
                self.ring_again();
            }
        }
    }

    /// For a queue nobody posts on. A doorbell can be lost (the device takes only WQEs a
    /// doorbell covered), leaving posted WQEs waiting with nothing after them to ring again;
    /// a burst with packets needs none of this, as its doorbell covers everything posted
    /// before. So: if WQEs are outstanding and no completion progressed since the last look,
    /// ring again, first asking for a completion, so that the next look can see progress.
    /// Counted in `doorbell_rerings`. Called by `tx_burst` with no packets, `tx_done_cleanup`
    /// and [`TxQueue::drain`] (a burst that finds no room has its own, more patient look);
    /// returns whether it rang.
    #[cold]
    #[inline(never)]
    pub fn kick(&mut self) -> bool {
        self.complete();
        let cons = self.comp.cons;
        if std::mem::replace(&mut self.recovery.kick_cons, cons) != cons
            || self.comp.failed
            || cons == self.prod.prod
        {
            self.recovery.stalled_looks = 0;
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
    fn ring_again(&mut self) {
        self.recovery.stalled_looks = 0;
        self.recovery.doorbell_rerings += 1;
        if self.recovery.nop_at != Some(self.prod.prod) && self.ask_completion_even_if_signaled() {
            self.recovery.nop_at = Some(self.prod.prod);
        }
        self.hw.doorbell.ring();
        self.prod.doorbells += 1;
    }

    /// Posts a signaled NOP if the last WQEs asked for no completion (and there is room for
    /// it), so that their execution shows; whether it did. The caller rings.
    fn ask_completion(&mut self) -> bool {
        let unsignaled = self.prod.since_comp > 0 || self.prod.txbbs_since_comp > 0;
        unsignaled && self.ask_completion_even_if_signaled()
    }

    /// Posts a signaled NOP if there is room for it; whether it did. The caller rings.
    fn ask_completion_even_if_signaled(&mut self) -> bool {
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
            self.complete();
            if self.comp.failed {
                // Nothing more will execute; the queue is recreated when the port stops.
                return false;
            }
            if self.comp.cons == self.prod.prod {
                return true;
            }
            if self.ask_completion() {
                self.hw.doorbell.ring();
                self.prod.doorbells += 1;
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

    /// Destroys the device queue, then frees what was still in flight. A queue dropped without
    /// this leaves its device queue (and its memory) to the backend, and leaks its buffers.
    pub fn destroy(self, dev: &dyn Device) {
        let TxQueue { hw, mut elts, .. } = self;
        // The device must stop reading the ring and the buffers before either goes away.
        destroy_hw(dev, hw);
        // Not the fast-free path: what is left may hold chains of several segments.
        let (a, b) = elts.take_all();
        release(a, false);
        release(b, false);
    }
}

/// Creates a CQ of `cqe_cnt` entries and an SQ of `txbb_cnt` TXBBs completing into it.
fn create_hw(
    dev: &dyn Device,
    txbb_cnt: u32,
    cqe_cnt: u32,
    cfg: &TxConfig,
) -> Result<HwQueue, HwError> {
    let socket = cfg.source.socket();
    let cq = dev.create_cq(cqe_cnt, socket)?;
    let sq = match dev.create_sq(txbb_cnt, &cq, socket) {
        Ok(sq) => sq,
        Err(e) => {
            let _ = dev.destroy_cq(cq);
            return Err(e);
        }
    };
    let sq = SqRing::new(sq);
    let qpn = sq.desc().qpn();
    let bf = match cfg.path {
        TxPath::BlueFlame => sq.bf_reg(cfg.copy),
        TxPath::Doorbell => None,
    };
    Ok(HwQueue {
        qpn,
        doorbell: sq.doorbell(),
        bf,
        bf_qpn: (qpn & 0x00ff_ffff) << 8,
        sq,
        cq: CqRing::new(cq),
    })
}

/// Destroys the SQ, then its CQ; the registers go first, with the rings.
fn destroy_hw(dev: &dyn Device, hw: HwQueue) {
    let HwQueue { sq, cq, .. } = hw;
    let _ = dev.destroy_sq(sq.into_desc());
    let _ = dev.destroy_cq(cq.into_desc());
}

/// What posting one packet came to.
enum Step {
    /// An inline WQE of this many packet bytes; the packet is released with its chunk.
    Inline(u32),
    /// A gather WQE; the packet is held until its completion.
    Gather(u32),
    /// A gather WQE whose owner word is not a SEND's (LSO, inner checksums): held as
    /// `Gather`, and the burst ends with it ([`Poster::take_last`]).
    GatherLast(u32),
    /// It can never be sent (empty, too many segments, memory the device cannot reach, or
    /// malformed: see [`refuse`]): taken, released and counted, rather than retried forever.
    Dropped,
    /// No room for it: the burst ends before it.
    Full,
}

/// Why a straight-line run stopped.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Every packet of the chunk is posted.
    End,
    /// No room for the next packet.
    Full,
    /// The next packet, of this many TXBBs, does not fit before the current run's end.
    RunEnd(u32),
    /// The next packet is not for this run.
    Other,
}

/// Posts plain packets that fit an inline WQE of one or two TXBBs, from `pkts[*n]` on, until
/// one does not; adds their bytes to `bytes`.
#[inline(always)]
fn inline_run<B: TxBuf>(
    poster: &mut Poster<'_>,
    pkts: &[B],
    n: &mut usize,
    plain_inline_max: usize,
    bytes: &mut u64,
) -> Stop {
    let mut sum = *bytes;
    let mut poster = poster.cursor();
    let todo = &pkts[*n..];
    let mut i = 0;
    let stop = loop {
        if i == todo.len() {
            break Stop::End;
        }
        let Some(data) = todo[i].plain() else {
            break Stop::Other;
        };
        let len = data.len();
        if len.wrapping_sub(1) >= plain_inline_max {
            break Stop::Other;
        }
        // Each length class with its own constant WQE size.
        if len <= wqe::FIRST_CHUNK {
            let Some(mut w) = poster.take::<1>() else {
                break Stop::RunEnd(1);
            };
            wqe::write_plain_inline1(&mut w, data);
        } else {
            // Already known (the threshold is clamped to it); said again so that the compiler
            // knows the second chunk's size too.
            if len > wqe::PLAIN_INLINE_MAX {
                break Stop::Other;
            }
            let Some(mut w) = poster.take::<2>() else {
                break Stop::RunEnd(2);
            };
            wqe::write_plain_inline2(&mut w, data);
        }
        sum += len as u64;
        i += 1;
    };
    *n += i;
    *bytes = sum;
    stop
}

/// Posts plain packets above the inline threshold whose buffer lies in the lkey cache's
/// region, as gather WQEs of one data segment, from `pkts[*n]` on, holding each in `elts`;
/// adds their bytes to `bytes`.
#[inline(always)]
fn gather_run<B: TxBuf>(
    poster: &mut Poster<'_>,
    pkts: &[B],
    n: &mut usize,
    inline_max: usize,
    lkeys: &Lkeys,
    elts: &mut BufRing<B>,
    bytes: &mut u64,
) -> Stop {
    // The region in registers; a buffer outside it goes the general way, which looks it up.
    let Some(mr) = lkeys.cached() else {
        return Stop::Other;
    };
    let mut sum = *bytes;
    let mut poster = poster.cursor();
    let mut held = elts.pusher();
    let todo = &pkts[*n..];
    let mut i = 0;
    let stop = loop {
        if i == todo.len() {
            break Stop::End;
        }
        let pkt = todo[i];
        let Some(data) = pkt.plain() else {
            break Stop::Other;
        };
        let (addr, len) = (data.as_ptr() as usize, data.len());
        if len <= inline_max || !mr.contains(addr, len) {
            break Stop::Other;
        }
        if held.is_full() {
            break Stop::Full;
        }
        let Some(mut w) = poster.take::<1>() else {
            break Stop::RunEnd(1);
        };
        wqe::write_plain_gather(&mut w, addr as u64, len as u32, mr.lkey);
        held.push(pkt);
        sum += len as u64;
        i += 1;
    };
    *n += i;
    *bytes = sum;
    stop
}

/// What a burst came to.
#[derive(Clone, Copy)]
struct Tally {
    /// Packets taken (posted or dropped).
    n: usize,
    bytes: u64,
    gathers: u32,
    errors: u32,
    /// Packets before this are held for gather WQEs or kept in `done`; from it up to `n`,
    /// they are released straight from the caller's array.
    kept: usize,
    /// No packet released with this burst's may have several segments (fast free allowed).
    single_seg: bool,
    /// The burst stopped for want of room.
    full: bool,
    /// The burst ended with a WQE that must be its last ([`Step::GatherLast`]).
    last: bool,
}

impl Tally {
    /// `n` packets of `bytes` in all, every one posted by the straight-line path.
    #[inline(always)]
    fn straight(n: usize, bytes: u64) -> Tally {
        Tally {
            n,
            bytes,
            gathers: 0,
            errors: 0,
            kept: 0,
            single_seg: true,
            full: false,
            last: false,
        }
    }
}

/// What [`post_rest`] needs of the queue besides the poster.
struct Rest<'q, B: TxBuf> {
    inline_max: usize,
    plain_inline_max: usize,
    elts_room: u32,
    fast_free: bool,
    prod: &'q mut Producer,
    elts: &'q mut BufRing<B>,
    done: &'q mut BufBatch<B, FREE_BATCH>,
    segs: &'q mut [(u64, u32, u32); MAX_GATHER_SEGS],
}

/// The rest of a burst after a straight-line inline run stopped with `stop`: runs of plain
/// gather packets, the ring's end, and the general path, until the packets or the room end.
#[inline(never)]
fn post_rest<'a, B: TxBuf>(
    mut poster: Poster<'a>,
    pkts: &[B],
    stop: Stop,
    mut t: Tally,
    mut q: Rest<'_, B>,
) -> (Poster<'a>, Tally) {
    rest_loop(&mut poster, pkts, stop, &mut t, &mut q);
    let p = q.prod;
    p.ring_full += u64::from(t.full);
    p.errors += u64::from(t.errors);
    p.gather_packets += u64::from(t.gathers);
    (poster, t)
}

#[inline(always)]
fn rest_loop<B: TxBuf>(
    poster: &mut Poster<'_>,
    pkts: &[B],
    mut stop: Stop,
    t: &mut Tally,
    q: &mut Rest<'_, B>,
) {
    loop {
        let n0 = t.n;
        if stop == Stop::Other {
            let before = t.n;
            stop = gather_run(
                poster,
                pkts,
                &mut t.n,
                q.inline_max,
                &q.prod.lkeys,
                q.elts,
                &mut t.bytes,
            );
            if t.n != before {
                stash(q.done, &pkts[t.kept..before], q.fast_free && t.single_seg);
                t.gathers += (t.n - before) as u32;
                t.kept = t.n;
            }
        }
        match stop {
            Stop::End => return,
            Stop::Full => {
                t.full = true;
                return;
            }
            // The ring's end, once per burst at most: one pad NOP, then the next pass.
            Stop::RunEnd(txbbs) => {
                if !poster.wrap(txbbs) {
                    t.full = true;
                    return;
                }
            }
            Stop::Other if t.n == n0 => {
                let pkt = pkts[t.n];
                let room = q.elts_room - t.gathers;
                let step = post_general(poster, pkt, q.inline_max, q.prod, q.segs, room);
                match step {
                    // It may have several segments: no fast free for what is released with it.
                    Step::Inline(len) => {
                        t.single_seg = false;
                        t.bytes += u64::from(len);
                        q.prod.general_inline += 1;
                    }
                    Step::Dropped => {
                        t.single_seg = false;
                        t.errors += 1;
                    }
                    Step::Gather(len) | Step::GatherLast(len) => {
                        stash(q.done, &pkts[t.kept..t.n], q.fast_free && t.single_seg);
                        q.elts.push(pkt);
                        q.prod.chained_until = q.elts.head();
                        q.prod.general_gather += 1;
                        t.gathers += 1;
                        t.bytes += u64::from(len);
                        t.kept = t.n + 1;
                        if matches!(step, Step::GatherLast(_)) {
                            t.n += 1;
                            t.last = true;
                            return;
                        }
                    }
                    Step::Full => {
                        t.full = true;
                        return;
                    }
                }
                t.n += 1;
                if t.n == pkts.len() {
                    return;
                }
            }
            Stop::Other => {}
        }
        stop = inline_run(poster, pkts, &mut t.n, q.plain_inline_max, &mut t.bytes);
    }
}

/// The general path: offloads, VLAN insertion, several segments, long inline WQEs, buffers
/// outside the lkey cache's region. `gathers_left` is the room in the gather ring.
#[inline(never)]
fn post_general<B: TxBuf>(
    poster: &mut Poster<'_>,
    pkt: B,
    inline_max: usize,
    prod: &mut Producer,
    segs: &mut [(u64, u32, u32); MAX_GATHER_SEGS],
    gathers_left: u32,
) -> Step {
    // The one look at the buffer's shape; from here on its lengths hold.
    let Some(len) = pkt.check() else {
        return refuse(prod, pkt);
    };
    let lkeys = &mut prod.lkeys;
    let off = pkt.offloads();
    if let Some(bits) = off.owner_bits() {
        return post_last(poster, pkt, len, off, bits, prod, segs, gathers_left);
    }
    let len = len as usize;
    if len > 0 && len <= inline_max {
        let bytes = wqe::inline_wqe_bytes(len);
        let Some(mut w) = poster.take_dyn(txbbs_for(bytes)) else {
            return Step::Full;
        };
        wqe::write_ctrl(&mut w, wqe::ds_of(bytes), off, false);
        wqe::write_inline(&mut w, len, pkt.segs());
        return Step::Inline(len as u32);
    }
    let Some(nsegs) = data_segs(pkt.segs(), MAX_GATHER_SEGS, lkeys, segs) else {
        return Step::Dropped;
    };
    if gathers_left == 0 {
        return Step::Full;
    }
    let bytes = wqe::gather_wqe_bytes(nsegs);
    let Some(mut w) = poster.take_dyn(txbbs_for(bytes)) else {
        return Step::Full;
    };
    wqe::write_ctrl(&mut w, wqe::ds_of(bytes), off, false);
    wqe::write_gather(&mut w, &segs[..nsegs]);
    Step::Gather(len as u32)
}

/// The gather entries (address, length, lkey) of a packet's non-empty pieces, at most `max`:
/// their count, or `None` when the packet cannot be sent (nothing to send, too many pieces, or
/// a piece outside registered memory).
#[inline]
fn data_segs<'a>(
    pieces: impl Iterator<Item = &'a [u8]>,
    max: usize,
    lkeys: &mut Lkeys,
    segs: &mut [(u64, u32, u32); MAX_GATHER_SEGS],
) -> Option<usize> {
    let mut n = 0;
    for s in pieces.filter(|s| !s.is_empty()) {
        if n == max {
            return None;
        }
        let lkey = lkeys.lookup(s.as_ptr() as usize, s.len())?;
        segs[n] = (s.as_ptr() as u64, s.len() as u32, lkey);
        n += 1;
    }
    (n > 0).then_some(n)
}

/// A packet whose WQE is not a plain SEND: an LSO WQE (the header copied into it, the rest
/// gathered) or a gather WQE with inner checksums. Its owner word differs from the run's, so
/// it ends the burst.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn post_last<B: TxBuf>(
    poster: &mut Poster<'_>,
    pkt: B,
    len: u32,
    off: TxOffloads,
    bits: u32,
    prod: &mut Producer,
    segs: &mut [(u64, u32, u32); MAX_GATHER_SEGS],
    gathers_left: u32,
) -> Step {
    let hdr_len = off.tso.map_or(0, |t| usize::from(t.hdr_len));
    let mut all = pkt.segs();
    let first = all.next().unwrap_or(&[]);
    // What a card refuses (an error completion that stops the queue): no segment size, no
    // header, a header it cannot copy, or beyond the first segment, or nothing after it.
    if off.tso.is_some_and(|t| t.mss == 0 || t.hdr_len == 0)
        || hdr_len > mlx4_prm::LSO_MAX_HEADER
        || hdr_len > first.len()
        || hdr_len == len as usize
    {
        return refuse(prod, pkt);
    }
    let lkeys = &mut prod.lkeys;
    let (hdr, rest) = first.split_at(hdr_len);
    // The LSO segment (its header copy) takes DS slots from the gather entries.
    let max = MAX_GATHER_SEGS - mlx4_prm::lso_seg_len(hdr_len) / mlx4_prm::DS_SIZE;
    let Some(nsegs) = data_segs(std::iter::once(rest).chain(all), max, lkeys, segs) else {
        return Step::Dropped;
    };
    if gathers_left == 0 {
        return Step::Full;
    }
    let bytes = match off.tso {
        Some(_) => wqe::lso_wqe_bytes(hdr_len, nsegs),
        None => wqe::gather_wqe_bytes(nsegs),
    };
    let Some(mut w) = poster.take_last(txbbs_for(bytes), bits) else {
        return Step::Full;
    };
    wqe::write_ctrl(&mut w, wqe::ds_of(bytes), off, false);
    match off.tso {
        Some(t) => wqe::write_lso(&mut w, t, hdr, &segs[..nsegs]),
        None => wqe::write_gather(&mut w, &segs[..nsegs]),
    }
    Step::GatherLast(len)
}

/// A malformed buffer ([`TxBuf::check`], or a TSO request a card refuses): made safe to
/// release ([`TxBuf::refuse`]), counted in `bad_mbufs`, and dropped as any packet that can
/// never be sent (`errors`). Done here, out of the burst's loop: a step of its own there cost
/// the straight-line gather path 3 instructions a packet.
#[cold]
#[inline(never)]
#[allow(unsafe_code)]
fn refuse<B: TxBuf>(prod: &mut Producer, pkt: B) -> Step {
    // SAFETY: `Dropped` makes the burst take this packet and release it with the burst, and
    // nothing else uses it.
    unsafe { pkt.refuse() };
    prod.bad_mbufs += 1;
    Step::Dropped
}

/// Keeps packets for the release at the end of the burst, releasing a full batch on the way.
#[inline]
fn stash<B: TxBuf, const N: usize>(done: &mut BufBatch<B, N>, pkts: &[B], fast: bool) {
    for &b in pkts {
        if !done.push(b) {
            release(done.take(), fast);
            done.push(b);
        }
    }
}

/// Returns buffers the queue is done with. `fast`: the application promised `MBUF_FAST_FREE`
/// and every one of them is a single segment.
#[inline(always)]
#[allow(unsafe_code)]
fn release<B: TxBuf>(bufs: &[B], fast: bool) {
    if bufs.is_empty() {
        return;
    }
    // SAFETY: `tx_burst` handed these buffers to the queue, which is done with them (copied
    // inline, or completed), holds them nowhere else (a packet is either released with its
    // chunk or held in the gather ring, and the ring gives each up once) and never touches
    // them again; with `fast`, the caller checked the single-segment condition.
    unsafe {
        if fast {
            B::free_bulk_fast(bufs)
        } else {
            B::free_bulk(bufs)
        }
    }
}
