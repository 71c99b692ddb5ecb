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

use crate::buf::{BufBatch, BufRing, Pusher};
use crate::hw::{Device, HwError};
use crate::mem::{DmaArray, FixedStr, Lkeys, MemSource, Mr};
use crate::mmio::{BfReg, Copy64, SendDoorbell};
use crate::pmd_log;
use crate::ring::{txbbs_for, CqRing, Cursor, LastWqe, Posted, Poster, SqRing};
pub use crate::stats::TxStats;
use crate::wqe::{self, TxOffloads, MAX_GATHER_SEGS};

mod completion;
mod gather_run;
mod general;
mod straight;

use gather_run::*;
use general::*;
use straight::*;

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

/// Doorbell avoidance (devarg `tx_db_avoid`, after Eric Dumazet's "auto doorbell" for mlx4):
/// a burst that finds the last doorbell still outstanding (the device has not completed what
/// it announced) publishes its WQEs without a doorbell or BlueFlame copy, for a later call to
/// ring: the next burst that does not skip, `tx_burst` with no packets and `tx_done_cleanup`
/// ([`TxQueue::kick`]), or the drain at stop. While avoidance is on, every burst that rings
/// asks for a completion, so that "outstanding" means what it says.
///
/// The skip is bounded, whichever comes first:
/// - `packets` (default [`DbAvoid::PACKETS`], 32): past a burst's worth of packets a doorbell
///   costs less than 1/32 of one per packet, so skipping longer gains little, and the device
///   (which runs what it was told about, then idles) must not starve;
/// - `cycles` (default [`DbAvoid::NANOS`], 4 us, in TSC ticks), checked on every call: a few
///   of mlx4's doorbell-to-completion times (about 1.1 us) plus the wire time of 32 frames of
///   64 bytes at 40 Gb/s (0.5 us). A completion later than that means the device is slow, not
///   busy with us, and the packet should not wait for it.
///
/// The skip also needs room for the next burst's largest WQE on either side of the ring's end
/// and a free gather slot: a burst that can take nothing decides nothing, so it must never
/// find WQEs waiting for it to ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DbAvoid {
    /// Packets published without a doorbell, at most.
    pub packets: u32,
    /// TSC ticks ([`crate::mmio::tsc`]) the first of them may wait, at most.
    pub cycles: u64,
}

impl DbAvoid {
    pub const PACKETS: u32 = 32;
    pub const NANOS: u64 = 4_000;

    /// The default bounds, the deadline converted with the TSC's measured rate.
    pub fn default_bound() -> DbAvoid {
        let hz = u128::from(crate::mmio::tsc_hz());
        DbAvoid {
            packets: Self::PACKETS,
            cycles: (hz * u128::from(Self::NANOS) / 1_000_000_000) as u64,
        }
    }
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
    /// Every counter of the queue, the completion side's and the recovery's too (the same
    /// lcore writes them all): one struct, read and zeroed whole from beside the lcore
    /// ([`TxQueue::stats_raw`]), so that a counter added to [`TxStats`] cannot be left out.
    /// `inline_packets` is not counted: it is `packets - gather_packets`, derived there.
    stats: TxStats,
    /// Doorbell avoidance ([`DbAvoid`]): the producer after the last doorbell or BlueFlame
    /// copy, the packets published since without one, and when the first of those must be
    /// rung for at the latest (TSC).
    bell: u32,
    unrung: u32,
    unrung_deadline: u64,
}

/// Fields only the completion side writes: another cache line.
#[repr(C, align(64))]
#[derive(Default)]
struct Completion {
    /// First TXBB not yet completed (free-running).
    cons: u32,
    marks_tail: u32,
    error_logged: bool,
    /// The last TXBB counter the queue may fill (`cons` plus the TXBBs it may have in flight,
    /// less one), or `cons - 1` while `detour` is set: the front's room less one is this less
    /// the producer, whose sign says full (one load, a subtraction, a sign test), and a
    /// detour reads as no room, so that the front tests neither `cons` nor `detour`.
    room_last: u32,
    /// Looks without room left before one rings again for a lost doorbell
    /// ([`TxQueue::look_without_room`]): [`FULL_PATIENCE`] looks in a row that saw `cons`
    /// unchanged with WQEs outstanding. While `detour` is set it stays at 1, so that the
    /// front's one decrement and test on a full ring also catches a detour, and the count is
    /// `detour_left`'s.
    full_left: u32,
    detour_left: u32,
    /// Why a burst leaves the front for [`TxQueue::burst_detour`], as bits ([`FAILED`],
    /// [`AVOIDING`]) tested as one byte, so that doorbell avoidance costs the bursts of a
    /// queue without it nothing.
    detour: u8,
}

/// An error CQE arrived: the device queue is dead until the control path restarts it
/// ([`TxQueue::recover`]; never in the middle of a burst, with a WQE still unpublished).
const FAILED: u8 = 1;
/// Doorbell avoidance is on ([`DbAvoid`]): the bursts take the posters that decide it.
const AVOIDING: u8 = 2;

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
    doorbell: SendDoorbell,
    /// The BF register, only if the BlueFlame path is live.
    bf: Option<BfReg>,
    /// Bytes 4-7 of a BF copy less the size byte, as stored: the QPN in bytes 4-6.
    bf_qpn_be: u32,
}

/// What the error and lost-doorbell paths keep: cold, off the burst's cache lines.
#[derive(Default)]
struct Recovery {
    /// WQE index (TXBB counter, low 16 bits) of the error completion that stopped the queue.
    error_wqe: u16,
    /// `comp.cons` when the last [`TxQueue::kick`] looked for a lost doorbell.
    kick_cons: u32,
    /// Looks of `kick` in a row that saw no progress; it rings again at the 1st, 3rd, 7th
    /// ... of them (twice the looks each time, up to [`FULL_PATIENCE_MAX`] apart), so that an
    /// application spinning on empty bursts against a slow or stuck device rings a few
    /// times, not on every call.
    kick_stalled: u32,
    /// The producer just after the NOP the last look without progress posted: while nothing
    /// was posted since, that NOP's completion is the one to wait for.
    nop_at: Option<u32>,
    /// `comp.cons` at the last ring again, and the looks it gave the next one: a ring again
    /// that brought no progress doubles them (up to [`FULL_PATIENCE_MAX`]), so that a device
    /// merely slow is not sent a doorbell every few calls, each costing it a UAR write.
    rering_cons: u32,
    rering_patience: u32,
}

/// Calls finding a full ring without progress before it rings again for a lost doorbell.
const FULL_PATIENCE: u32 = 64;
/// The most calls between two rings again without progress: 1024 times the patience, about
/// half a millisecond of a lcore spinning on a full ring.
const FULL_PATIENCE_MAX: u32 = FULL_PATIENCE << 10;

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
    /// TXBBs the queue may have in flight: the ring less the headroom the device may
    /// prefetch into (2 KB + one WQE).
    usable: u32,
    comp_every: u32,
    comp_txbbs: u32,
    /// Longest packet the straight-line inline path takes: the threshold, at most two TXBBs.
    plain_inline_max: usize,
    /// Doorbell avoidance's bounds ([`DbAvoid`]), while on (`AVOIDING`).
    avoid_packets: u32,
    avoid_cycles: u64,
    /// Buffers of gather WQEs, held until their completion.
    elts: BufRing<B>,
    marks: DmaArray<CompMark>,
    /// Inline packets of a burst that also held gather packets, released together.
    done: BufBatch<B, FREE_BATCH>,
    /// Data segments of the packet being posted on the general path.
    segs: [(u64, u32, u32); MAX_GATHER_SEGS],
    recovery: Recovery,
    /// The burst of one's poster for the way this queue rings ([`TxQueue::post_one`]), picked
    /// with the registers: the front jumps to it, in place of testing for a BF register, and
    /// the copy routine needs no dispatch.
    one: PostOne<B>,
}

/// [`TxQueue::post_one`] as the front calls it: the packet and the room less one, which the
/// front has (its sign said there is room).
type PostOne<B> = fn(&mut TxQueue<B>, &B, u32) -> usize;

/// Largest WQE we build: 63 DS in 16 TXBBs.
const MAX_WQE_TXBBS: u32 = 16;

impl<B: TxBuf> TxQueue<B> {
    /// A queue for `nb_desc` packets in flight, created on `dev`, for buffers in the
    /// registered regions `mrs`. Everything it keeps is plain data in `cfg.source` memory, so
    /// that another process can run it.
    ///
    /// # Safety
    /// Its rings live in memory `dev` owns, which the queue does not borrow: `dev` must outlive
    /// the queue, and the queue ends with [`TxQueue::destroy`] on that same `dev` before it
    /// drops.
    #[allow(unsafe_code)]
    pub unsafe fn new(
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
        // A quarter of either ring between requests keeps one outstanding whenever a ring
        // fills. Beyond that, the sparser the cheaper: the CQE poll, the walk of the marks and
        // the release are paid once per completion, and 128 WQEs spread them over four bursts
        // of 32 (the stamping is per TXBB whatever the cadence).
        let comp_every = 128.min(elts_n / 4).max(1);
        let comp_txbbs = (txbb_cnt / 4).max(MAX_WQE_TXBBS);
        // At most one mark per comp_every WQEs or comp_txbbs TXBBs in flight, plus slack.
        let marks_n = (txbb_cnt / comp_every.min(comp_txbbs) + 4).next_power_of_two();
        let nomem = || HwError::NoMemory("no memory for the TX queue's arrays".into());
        let src = cfg.source;
        let lkeys = Lkeys::new(mrs, src).ok_or_else(nomem)?;
        let elts = BufRing::new(elts_n, src).ok_or_else(nomem)?;
        let marks = DmaArray::new(marks_n as usize, CompMark::default(), src).ok_or_else(nomem)?;
        let hw = create_hw(dev, txbb_cnt, marks_n, &cfg)?;
        let one = Self::one_for(&hw);
        Ok(TxQueue {
            prod: Producer {
                lkeys,
                ..Producer::default()
            },
            comp: Completion {
                room_last: txbb_cnt - headroom - 1,
                full_left: FULL_PATIENCE,
                ..Completion::default()
            },
            hw,
            plain_inline_max: usize::from(cfg.inline_max).min(wqe::PLAIN_INLINE_MAX),
            avoid_packets: 0,
            avoid_cycles: 0,
            cfg,
            qid,
            name: FixedStr::new(name),
            usable: txbb_cnt - headroom,
            comp_every,
            comp_txbbs,
            elts,
            marks,
            done: BufBatch::default(),
            segs: [(0, 0, 0); MAX_GATHER_SEGS],
            recovery: Recovery::default(),
            one,
        })
    }

    pub fn qpn(&self) -> u32 {
        self.hw.sq.desc().qpn()
    }

    /// Turns doorbell avoidance on with these bounds, or off (the default). Off rings first
    /// for anything a skip left waiting.
    pub fn set_db_avoid(&mut self, avoid: Option<DbAvoid>) {
        if self.prod.unrung != 0 {
            self.ring_unrung();
        }
        (self.avoid_packets, self.avoid_cycles) = match avoid {
            Some(a) => (a.packets.max(1), a.cycles),
            None => (0, 0),
        };
        self.set_detour(match avoid {
            Some(_) => self.comp.detour | AVOIDING,
            None => self.comp.detour & !AVOIDING,
        });
    }

    /// Sets `detour` to `bits`, and what the front reads with it: `room_last`, and
    /// `full_left` held at 1 while a detour is set (see [`Completion::full_left`]).
    #[inline(always)]
    fn set_detour(&mut self, bits: u8) {
        let c = &mut self.comp;
        match (c.detour != 0, bits != 0) {
            (false, true) => (c.detour_left, c.full_left) = (c.full_left, 1),
            (true, false) => c.full_left = c.detour_left,
            _ => {}
        }
        c.detour = bits;
        self.sync_front();
    }

    /// Derives `room_last` from `cons` and `detour`, after either changed.
    #[inline(always)]
    fn sync_front(&mut self) {
        let c = &mut self.comp;
        let usable = if c.detour != 0 { 0 } else { self.usable };
        c.room_last = c.cons.wrapping_add(usable).wrapping_sub(1);
    }

    /// The count of looks without room left ([`Completion::full_left`]).
    #[inline(always)]
    fn looks_left(&mut self) -> &mut u32 {
        if self.comp.detour != 0 {
            &mut self.comp.detour_left
        } else {
            &mut self.comp.full_left
        }
    }

    /// Sets the count of looks without room left.
    #[inline(always)]
    fn set_full_left(&mut self, n: u32) {
        *self.looks_left() = n;
    }

    /// The bounds doorbell avoidance runs with, if on.
    pub fn db_avoid(&self) -> Option<DbAvoid> {
        (self.comp.detour & AVOIDING != 0).then_some(DbAvoid {
            packets: self.avoid_packets,
            cycles: self.avoid_cycles,
        })
    }

    /// Packets published that no doorbell announced yet (doorbell avoidance).
    pub fn unrung(&self) -> u32 {
        self.prod.unrung
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

    /// The counters, by the same word-by-word read as [`TxQueue::stats_raw`].
    #[allow(unsafe_code)]
    pub fn stats(&self) -> TxStats {
        // SAFETY: `self` is a live queue.
        unsafe { Self::stats_raw(self) }
    }

    #[allow(unsafe_code)]
    pub fn reset_stats(&mut self) {
        // SAFETY: `self` is a live queue, and this is its one user.
        unsafe { Self::reset_stats_raw(self) }
    }

    /// The counters, read beside the lcore that bursts (telemetry, `show port stats`, a
    /// secondary) word by word through `q`, never through a reference to the queue.
    ///
    /// # Safety
    /// `q` points to a live queue.
    #[allow(unsafe_code)]
    pub unsafe fn stats_raw(q: *const Self) -> TxStats {
        // SAFETY: the caller's live queue; its counters are one aligned TxStats.
        let mut s = unsafe { TxStats::read_volatile(std::ptr::addr_of!((*q).prod.stats)) };
        s.inline_packets = s.packets.wrapping_sub(s.gather_packets);
        s
    }

    /// Zeroes the counters from beside the lcore, as [`TxQueue::stats_raw`] reads them.
    ///
    /// # Safety
    /// `q` points to a live queue.
    #[allow(unsafe_code)]
    pub unsafe fn reset_stats_raw(q: *mut Self) {
        // SAFETY: as for stats_raw.
        unsafe {
            TxStats::write_volatile(std::ptr::addr_of_mut!((*q).prod.stats), TxStats::default())
        }
    }

    /// TXBBs in the send ring.
    pub fn txbb_cnt(&self) -> u32 {
        self.hw.sq.txbb_cnt()
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
        self.hw.sq.wqe_mut(start, 1).put_nop(1, true);
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
    /// the queue (sent, or dropped and counted in `errors` if they can never be sent), which
    /// releases them ([`TxBuf::free_bulk`]) once the device is done.
    ///
    /// # Safety
    /// The caller owns every buffer in `pkts` and each appears there once (for an mbuf:
    /// DPDK's contract for `tx_burst`); those taken (the first `n`, `n` returned) are the
    /// queue's from then on, and the caller neither uses nor releases them again. A buffer
    /// is `Copy`, so the queue cannot tell a second copy from the first.
    #[inline(always)]
    #[allow(unsafe_code)]
    pub unsafe fn burst(&mut self, pkts: &[B]) -> usize {
        self.post_burst(pkts)
    }

    /// [`TxQueue::burst`], under its contract.
    #[inline(always)]
    fn post_burst(&mut self, pkts: &[B]) -> usize {
        if pkts.is_empty() {
            return 0;
        }
        // Completions make the room, so they come first. With none waiting and the queue
        // healthy this is one load and a compare, and the front calls nothing but `post`.
        if self.hw.cq.has_cqe() {
            return self.burst_detour(pkts);
        }
        // No room, or a failed queue, or doorbell avoidance on (`room_last`).
        let room_less_one = self.comp.room_last.wrapping_sub(self.prod.prod);
        if (room_less_one as i32) < 0 {
            return self.full_front(pkts);
        }
        self.post_any::<false>(pkts, room_less_one + 1)
    }

    /// The front on no room: [`TxQueue::full`] with its look's countdown tested first (one
    /// decrement and its test), which a detour makes run out at once
    /// ([`Completion::full_left`]).
    #[inline(always)]
    fn full_front(&mut self, pkts: &[B]) -> usize {
        self.comp.full_left -= 1;
        if self.comp.full_left == 0 {
            return self.full_cold(pkts);
        }
        self.prod.stats.ring_full += 1;
        0
    }

    /// The countdown ran out, or a detour is set: the front's decrement undone, then the
    /// detour, or the look in full (which rings).
    #[cold]
    #[inline(never)]
    fn full_cold(&mut self, pkts: &[B]) -> usize {
        self.comp.full_left += 1;
        if self.comp.detour != 0 {
            return self.burst_detour(pkts);
        }
        self.full()
    }

    /// The front's way out: completions waiting, a failed queue, or doorbell avoidance on.
    #[inline(never)]
    fn burst_detour(&mut self, pkts: &[B]) -> usize {
        self.complete();
        if self.failed() {
            // The control path restarts the queue (`recover`), with the device in hand.
            return 0;
        }
        // `room()` spelled out: one subtraction whose flags say full.
        let used = self.prod.prod.wrapping_sub(self.comp.cons);
        if used >= self.usable {
            return self.full();
        }
        if self.comp.detour & AVOIDING != 0 {
            self.post_any::<true>(pkts, self.usable - used)
        } else {
            self.post_any::<false>(pkts, self.usable - used)
        }
    }

    /// A burst of one packet goes its own way: see [`TxQueue::post_one`]. `AVOID`: doorbell
    /// avoidance is on, and the burst's end decides it: that end is any burst's, which tests
    /// the register itself, so one poster serves every queue.
    #[inline(always)]
    fn post_any<const AVOID: bool>(&mut self, pkts: &[B], room: u32) -> usize {
        match pkts {
            [pkt] if AVOID => self.post_one::<true, RING_ANY>(pkt, room),
            [pkt] => (self.one)(self, pkt, room - 1),
            _ => self.post::<AVOID>(pkts, room),
        }
    }

    /// The burst of one's poster for the registers of `hw` ([`TxQueue::one`]).
    fn one_for(hw: &HwQueue) -> PostOne<B> {
        match hw.bf.as_ref().map(BfReg::copy) {
            None => Self::post_one::<false, RING_DB>,
            Some(Copy64::Movdir64b) => Self::post_one::<false, { ring_bf(Copy64::Movdir64b) }>,
            Some(Copy64::Avx512) => Self::post_one::<false, { ring_bf(Copy64::Avx512) }>,
            Some(Copy64::Sse) => Self::post_one::<false, { ring_bf(Copy64::Sse) }>,
            Some(Copy64::Qwords) => Self::post_one::<false, { ring_bf(Copy64::Qwords) }>,
        }
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
    // SAFETY: `dev` handed this descriptor out just now, and only this view is made of it;
    // the queue keeps the view until `destroy_hw` hands it back to `dev` for destroy, and the
    // device outlives its queues (`TxQueue::new`).
    #[allow(unsafe_code)]
    let sq = unsafe { SqRing::new(sq) };
    // SAFETY: as for the SQ.
    #[allow(unsafe_code)]
    let cq = unsafe { CqRing::new(cq) };
    let qpn = sq.desc().qpn();
    let bf = match cfg.path {
        TxPath::BlueFlame => sq.bf_reg(cfg.copy),
        TxPath::Doorbell => None,
    };
    Ok(HwQueue {
        doorbell: sq.doorbell(),
        bf,
        bf_qpn_be: ((qpn & 0x00ff_ffff) << 8).to_be(),
        sq,
        cq,
    })
}

/// Destroys the SQ, then its CQ; the registers go first, with the rings.
fn destroy_hw(dev: &dyn Device, hw: HwQueue) {
    let HwQueue { sq, cq, .. } = hw;
    let _ = dev.destroy_sq(sq.into_desc());
    let _ = dev.destroy_cq(cq.into_desc());
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
