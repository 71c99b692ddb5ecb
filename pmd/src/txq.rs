//! TX queues: inline or gather WQEs in a TXBB ring, then one doorbell per burst, or a
//! BlueFlame copy of the burst's last WQE when that path is live.
//!
//! The queue is generic over the packet buffer ([`TxBuf`]): `rte_mbuf` chains under DPDK,
//! plain buffers in tests, so the whole path runs against the software HCA without EAL.
//! Nothing here allocates, locks or calls C per packet; buffers are released in bulk.

use mlx4_prm::{
    cqe_opcode, opcode, owner_opcode, CtrlSeg, SQ_HEADROOM_BYTES, TXBB_SHIFT, TXBB_SIZE,
};

use crate::hw::{Device, HwError};
use crate::mem::{DmaArray, FixedStr, Lkeys, MemSource, Mr};
use crate::mmio::{BfReg, Copy64, SendDoorbell, Txbb};
use crate::pmd_log;
use crate::ring::{txbbs_for, CqRing, SqRing};
pub use crate::stats::TxStats;
use crate::wqe::{self, TxOffloads, MAX_GATHER_SEGS};

/// What the TX path needs from a packet buffer.
pub trait TxBuf: Copy + Default {
    /// Total bytes over all segments.
    fn pkt_len(&self) -> u32;
    /// The segments' bytes, in order.
    fn segs(&self) -> impl Iterator<Item = &[u8]>;
    fn offloads(&self) -> TxOffloads;
    /// Returns buffers to their pools, once per batch.
    fn free_bulk(bufs: &[Self]);
    /// As `free_bulk`, under the application's promise of `MBUF_FAST_FREE` (one pool,
    /// reference count 1).
    fn free_bulk_fast(bufs: &[Self]) {
        Self::free_bulk(bufs)
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
    /// Next slot in `elts` (free-running).
    elts_head: u32,
    /// Next slot in `marks`.
    marks_head: u32,
    /// WQEs and TXBBs posted since the last one that asked for a completion.
    since_comp: u32,
    txbbs_since_comp: u32,
    lkeys: Lkeys,
    /// Every counter of the queue: the completion side updates its two on the same lcore.
    stats: TxStats,
}

/// Fields only the completion side writes: another cache line.
#[repr(C, align(64))]
#[derive(Default)]
struct Completion {
    /// First TXBB not yet completed (free-running).
    cons: u32,
    elts_tail: u32,
    marks_tail: u32,
    error_logged: bool,
    /// An error CQE arrived: the device queue is dead until recreated, which happens at the
    /// start of the next burst (never in the middle of one, with a WQE still unpublished).
    failed: bool,
}

/// Where a requested completion ends: everything before these counters is done when its CQE
/// arrives. CQEs come in order, one per signaled WQE.
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
    bf: Option<BfReg>,
}

/// The posted-but-not-yet-published last WQE of a burst: its owner word waits until we know
/// whether it goes out through BlueFlame (which changes the control segment).
#[derive(Clone, Copy)]
struct Pending {
    start: u32,
    txbbs: u32,
    ds: u8,
    bf_ok: bool,
}

/// Packets freed in one bulk call.
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
    /// TXBBs kept free so the device can prefetch past the producer (2 KB + one WQE).
    headroom: u32,
    comp_every: u32,
    comp_txbbs: u32,
    /// Buffers of gather WQEs, held until their completion.
    elts: DmaArray<B>,
    marks: DmaArray<CompMark>,
    /// Inline packets of the current burst, freed together at its end.
    done: DmaArray<B>,
    /// Data segments of the packet being posted.
    segs: DmaArray<(u64, u32, u32)>,
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
        let elts = DmaArray::new(elts_n as usize, B::default(), src).ok_or_else(nomem)?;
        let marks = DmaArray::new(marks_n as usize, CompMark::default(), src).ok_or_else(nomem)?;
        let done = DmaArray::new(FREE_BATCH, B::default(), src).ok_or_else(nomem)?;
        let segs = DmaArray::new(MAX_GATHER_SEGS, (0, 0, 0), src).ok_or_else(nomem)?;
        let hw = create_hw(dev, txbb_cnt, marks_n, &cfg)?;
        Ok(TxQueue {
            prod: Producer {
                lkeys,
                ..Producer::default()
            },
            comp: Completion::default(),
            hw,
            cfg,
            qid,
            name: FixedStr::new(name),
            txbb_cnt,
            headroom,
            comp_every,
            comp_txbbs,
            elts,
            marks,
            done,
            segs,
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
        self.elts.len() as u32
    }

    /// The configured path, unless the device gave this queue no BF register.
    pub fn path(&self) -> TxPath {
        match self.hw.bf {
            Some(_) => self.cfg.path,
            None => TxPath::Doorbell,
        }
    }

    pub fn stats(&self) -> TxStats {
        self.prod.stats
    }

    pub fn reset_stats(&mut self) {
        self.prod.stats.reset();
    }

    /// Buffers posted and not yet completed.
    pub fn outstanding(&self) -> u32 {
        self.prod.elts_head.wrapping_sub(self.comp.elts_tail)
    }

    fn room(&self, txbbs: u32, gather: bool) -> bool {
        let used = self.prod.prod.wrapping_sub(self.comp.cons);
        let elts_ok = !gather || self.outstanding() < self.elts.len() as u32;
        let marks_ok =
            self.prod.marks_head.wrapping_sub(self.comp.marks_tail) < self.marks.len() as u32;
        used + txbbs + self.headroom <= self.txbb_cnt && elts_ok && marks_ok
    }

    /// Posts as many of `pkts` as fit; returns how many were taken. Taken packets belong to
    /// the queue (sent, or dropped and counted in `errors` if they can never be sent).
    pub fn burst(&mut self, pkts: &[B]) -> usize {
        self.complete();
        if self.comp.failed {
            // The control path recreates the queue (`recover`), with the device in hand.
            return stopped();
        }
        // Scratch kept in the queue: zeroing ~1.5 KB per burst cost more than a small burst.
        let mut done_buf = std::mem::take(&mut self.done);
        let mut segs_buf = std::mem::take(&mut self.segs);
        // Fixed-size views: indexing them needs no length loads.
        let done: &mut [B; FREE_BATCH] = (&mut done_buf[..]).try_into().expect("sized at setup");
        let segs: &mut [(u64, u32, u32); MAX_GATHER_SEGS] =
            (&mut segs_buf[..]).try_into().expect("sized at setup");
        let mut n_done = 0;
        let mut pending: Option<Pending> = None;
        let mut taken = 0;
        for &pkt in pkts {
            let len = pkt.pkt_len() as usize;
            let off = pkt.offloads();
            let inline = len <= usize::from(self.cfg.inline_max) && len > 0;
            let mut nsegs = 0;
            let bytes = if inline {
                wqe::inline_wqe_bytes(len)
            } else {
                let mut ok = len > 0;
                for s in pkt.segs().filter(|s| !s.is_empty()) {
                    if nsegs == MAX_GATHER_SEGS {
                        ok = false;
                        break;
                    }
                    match self.prod.lkeys.lookup(s.as_ptr() as usize, s.len()) {
                        Some(lkey) => segs[nsegs] = (s.as_ptr() as u64, s.len() as u32, lkey),
                        None => {
                            ok = false;
                            break;
                        }
                    }
                    nsegs += 1;
                }
                if !ok {
                    // Empty, too many segments, or memory the device cannot reach: it can
                    // never go out, so it is dropped and counted rather than retried forever.
                    self.prod.stats.errors += 1;
                    push_done::<B>(done, &mut n_done, pkt, self.cfg.fast_free);
                    taken += 1;
                    continue;
                }
                wqe::gather_wqe_bytes(nsegs)
            };
            let txbbs = txbbs_for(bytes);
            let slot = self.prod.prod & (self.txbb_cnt - 1);
            let pad = if slot + txbbs > self.txbb_cnt {
                self.txbb_cnt - slot
            } else {
                0
            };
            if !self.room(pad + txbbs, !inline) {
                self.complete();
                if self.comp.failed || !self.room(pad + txbbs, !inline) {
                    self.prod.stats.ring_full += 1;
                    break;
                }
            }
            if let Some(p) = pending.take() {
                self.publish(p, false);
            }
            if pad > 0 {
                self.post_nop(pad, false);
            }
            let start = self.prod.prod;
            let signaled = self.prod.since_comp + 1 >= self.comp_every
                || self.prod.txbbs_since_comp + txbbs >= self.comp_txbbs;
            let ds = wqe::ds_of(bytes);
            {
                let w = self.hw.sq.wqe_mut(start, txbbs);
                wqe::write_ctrl(w, ds, off, signaled);
                if inline {
                    wqe::write_inline(w, len, pkt.segs());
                } else {
                    wqe::write_gather(w, &segs[..nsegs]);
                }
            }
            self.prod.prod = start.wrapping_add(txbbs);
            if inline {
                self.prod.stats.inline_packets += 1;
                push_done::<B>(done, &mut n_done, pkt, self.cfg.fast_free);
            } else {
                self.prod.stats.gather_packets += 1;
                let mask = self.elts.len() as u32 - 1;
                self.elts[(self.prod.elts_head & mask) as usize] = pkt;
                self.prod.elts_head = self.prod.elts_head.wrapping_add(1);
            }
            if signaled {
                self.push_mark(start);
            } else {
                self.prod.since_comp += 1;
                self.prod.txbbs_since_comp += txbbs;
            }
            self.prod.stats.packets += 1;
            self.prod.stats.bytes += len as u64;
            pending = Some(Pending {
                start,
                txbbs,
                ds,
                bf_ok: off.vlan.is_none(),
            });
            taken += 1;
        }
        if let Some(p) = pending {
            self.publish(p, true);
        }
        if n_done > 0 {
            free::<B>(&done[..n_done], self.cfg.fast_free);
        }
        self.done = done_buf;
        self.segs = segs_buf;
        taken
    }

    fn push_mark(&mut self, start: u32) {
        let mask = self.marks.len() as u32 - 1;
        self.marks[(self.prod.marks_head & mask) as usize] = CompMark {
            txbb_end: self.prod.prod,
            elts_end: self.prod.elts_head,
            wqe_index: start as u16,
        };
        self.prod.marks_head = self.prod.marks_head.wrapping_add(1);
        self.prod.since_comp = 0;
        self.prod.txbbs_since_comp = 0;
    }

    /// Publishes a NOP of `txbbs` TXBBs. Unsignaled, it pads the ring up to its end so that
    /// no WQE wraps (a wrapped WQE could not go through BlueFlame, and building it would need
    /// a bounce buffer); signaled, its completion covers everything posted before it.
    fn post_nop(&mut self, txbbs: u32, signaled: bool) {
        let start = self.prod.prod;
        let ds = (txbbs * 4).min(u32::from(mlx4_prm::MAX_WQE_DS)) as u8;
        wqe::write_ctrl(
            self.hw.sq.wqe_mut(start, 1),
            ds,
            TxOffloads::default(),
            signaled,
        );
        self.prod.prod = start.wrapping_add(txbbs);
        if signaled {
            self.push_mark(start);
        } else {
            self.prod.txbbs_since_comp += txbbs;
        }
        self.hw
            .sq
            .publish(start, self.hw.sq.owner_word(start, opcode::NOP));
    }

    /// Hands a WQE to the device. For the last WQE of a burst, also tells the device: a
    /// BlueFlame copy when that path is live and the WQE fits a half, else the doorbell.
    #[inline]
    fn publish(&mut self, p: Pending, last: bool) {
        let word = self.hw.sq.owner_word(p.start, opcode::SEND);
        if !last {
            self.hw.sq.publish(p.start, word);
            return;
        }
        if self.cfg.path == TxPath::BlueFlame && p.bf_ok {
            if let Some(bf) = self.hw.bf.as_mut() {
                if (p.txbbs as usize) * TXBB_SIZE <= bf.half_size() {
                    let counter = (p.start & 0xffff) << owner_opcode::BF_COUNTER_SHIFT;
                    self.hw.sq.publish(p.start, word | counter);
                    // The copy's first TXBB carries the QPN where the ring copy has the VLAN
                    // fields (which is why a VLAN-inserting WQE never goes through BF); the
                    // ring keeps a plain WQE for a device that falls back to fetching it.
                    let wqe = self.hw.sq.wqe(p.start, p.txbbs);
                    let mut first = Txbb([0; TXBB_SIZE]);
                    first.0.copy_from_slice(&wqe[..TXBB_SIZE]);
                    CtrlSeg::new_unchecked(&mut first.0[..]).set_bf_qpn_ds(self.hw.qpn, p.ds);
                    bf.write(&first, &wqe[TXBB_SIZE..]);
                    self.prod.stats.bf_writes += 1;
                    return;
                }
            }
        }
        self.hw.sq.publish(p.start, word);
        self.hw.doorbell.ring();
        self.prod.stats.doorbells += 1;
    }

    /// Consumes available CQEs: stamps the completed TXBBs and frees the completed buffers in
    /// bulk. Returns the number of buffers freed.
    pub fn complete(&mut self) -> usize {
        let mut freed = 0;
        let mut cqes = 0;
        while let Some(cqe) = self.hw.cq.poll() {
            if cqe.opcode() == cqe_opcode::ERROR {
                self.on_error_cqe(cqe.syndrome(), cqe.vendor_err(), cqe.wqe_index());
                break;
            }
            let mask = self.marks.len() as u32 - 1;
            let m = self.marks[(self.comp.marks_tail & mask) as usize];
            self.comp.marks_tail = self.comp.marks_tail.wrapping_add(1);
            debug_assert_eq!(cqe.wqe_index(), m.wqe_index, "CQEs arrive in WQE order");
            self.hw.sq.stamp(self.comp.cons, m.txbb_end);
            self.comp.cons = m.txbb_end;
            freed += self.free_elts(m.elts_end);
            cqes += 1;
        }
        if cqes > 0 {
            self.hw.cq.update_ci();
            self.prod.stats.completions += cqes;
        }
        freed
    }

    /// Frees `elts[tail..end)` in at most two contiguous bulk calls.
    fn free_elts(&mut self, end: u32) -> usize {
        let n = end.wrapping_sub(self.comp.elts_tail) as usize;
        if n == 0 {
            return 0;
        }
        let size = self.elts.len();
        let first = (self.comp.elts_tail as usize) & (size - 1);
        let run = n.min(size - first);
        free::<B>(&self.elts[first..first + run], self.cfg.fast_free);
        if run < n {
            free::<B>(&self.elts[..n - run], self.cfg.fast_free);
        }
        self.comp.elts_tail = end;
        n
    }

    /// An error CQE: the device moved the SQ to the error state. Count and log once per queue;
    /// the queue takes nothing more until [`TxQueue::recover`] recreates it.
    fn on_error_cqe(&mut self, syndrome: u8, vendor_err: u8, wqe_index: u16) {
        self.prod.stats.error_cqes += 1;
        self.prod.stats.errors += 1;
        self.comp.failed = true;
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
        destroy_hw(dev, std::mem::replace(&mut self.hw, fresh));
        self.free_elts(self.prod.elts_head);
        debug_assert_eq!(self.prod.elts_head, self.comp.elts_tail);
        (self.prod.prod, self.prod.marks_head, self.prod.since_comp) = (0, 0, 0);
        self.prod.txbbs_since_comp = 0;
        (self.comp.cons, self.comp.marks_tail) = (0, 0);
        self.comp.failed = false;
        Ok(())
    }

    /// Waits (at most `limit`) until the device has executed everything posted, asking for a
    /// completion with a NOP if the last WQEs did not. Used before the port stops, so that what
    /// `tx_burst` took reaches the wire rather than being discarded with the queue.
    pub fn drain(&mut self, dev: &dyn Device, limit: std::time::Duration) -> bool {
        let start = std::time::Instant::now();
        loop {
            self.complete();
            if self.comp.failed {
                // Nothing more will execute; the queue is recreated when the port stops.
                return false;
            }
            if self.comp.cons == self.prod.prod {
                return true;
            }
            let unsignaled = self.prod.since_comp > 0 || self.prod.txbbs_since_comp > 0;
            if unsignaled && self.room(1, false) {
                self.post_nop(1, true);
                self.hw.doorbell.ring();
                self.prod.stats.doorbells += 1;
            }
            if start.elapsed() >= limit {
                return false;
            }
            dev.poll();
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    /// `tx_done_cleanup`: reclaims completed buffers; returns how many were freed.
    pub fn done_cleanup(&mut self, _free_cnt: u32) -> usize {
        self.complete()
    }

    /// Destroys the device queue, then frees what was still in flight. A queue dropped without
    /// this leaves its device queue (and its memory) to the backend, and leaks its buffers.
    pub fn destroy(self, dev: &dyn Device) {
        let TxQueue {
            hw,
            elts,
            prod,
            comp,
            cfg,
            ..
        } = self;
        // The device must stop reading the ring and the buffers before either goes away.
        destroy_hw(dev, hw);
        let mask = elts.len() - 1;
        let (tail, n) = (
            comp.elts_tail as usize,
            prod.elts_head.wrapping_sub(comp.elts_tail),
        );
        for i in 0..n as usize {
            free::<B>(
                std::slice::from_ref(&elts[(tail + i) & mask]),
                cfg.fast_free,
            );
        }
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
    Ok(HwQueue {
        qpn: sq.desc().qpn(),
        doorbell: sq.doorbell(),
        bf: sq.bf_reg(cfg.copy),
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

/// A failed queue's burst, kept out of line as the rare case it is.
#[cold]
#[inline(never)]
fn stopped() -> usize {
    0
}

#[inline]
fn push_done<B: TxBuf>(done: &mut [B; FREE_BATCH], n: &mut usize, pkt: B, fast: bool) {
    done[*n] = pkt;
    *n += 1;
    if *n == FREE_BATCH {
        free::<B>(&done[..FREE_BATCH], fast);
        *n = 0;
    }
}

#[inline]
fn free<B: TxBuf>(bufs: &[B], fast: bool) {
    if fast {
        B::free_bulk_fast(bufs)
    } else {
        B::free_bulk(bufs)
    }
}
