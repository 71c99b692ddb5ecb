//! RX queues: an RQ of scatter entries kept full of buffers, a CQ of received frames. Each burst
//! polls CQEs, hands the filled buffers up, re-posts fresh ones (allocated in bulk, once per
//! burst) in the same slots, then updates the RQ doorbell record and the CQ consumer index once.
//! When the pool runs dry the frames are dropped and counted and their buffers stay posted, so
//! no ring slot is ever lost.
//!
//! Generic over the buffer ([`RxBuf`]): mbufs under DPDK, plain buffers in tests.

use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;

use crate::hw::{Device, HwError};
use crate::mem::{DmaArray, Lkeys, MemSource, Mr};
use crate::ring::{CqRing, RqRing};
pub use crate::stats::RxStats;

mod entry;
mod meta;
mod poll;
mod recovery;

use entry::entry_head;

pub use meta::{
    parse_rx_cqe, with_tunnel, RxMeta, PTYPE_INNER_L2_ETHER, PTYPE_L2_ETHER,
    PTYPE_L3_IPV4_EXT_UNKNOWN, PTYPE_L3_IPV6_EXT_UNKNOWN, PTYPE_L3_MASK, PTYPE_L4_FRAG,
    PTYPE_L4_MASK, PTYPE_L4_TCP, PTYPE_L4_UDP, PTYPE_TUNNEL_VXLAN, RX_IP_CKSUM_BAD,
    RX_IP_CKSUM_GOOD, RX_L4_CKSUM_BAD, RX_L4_CKSUM_GOOD, RX_OUTER_IP_CKSUM_BAD,
    RX_OUTER_L4_CKSUM_BAD, RX_OUTER_L4_CKSUM_GOOD, RX_RSS_HASH,
};

/// What the RX path needs from a buffer and its pool.
///
/// # Safety
/// `alloc_bulk` returning true must have initialised every entry of `out` with a buffer the
/// caller then owns (the queue reads them as initialised); whatever it returns, it writes
/// nothing uninitialised into `out` (the queue allocates into slots that hold buffers).
#[allow(unsafe_code)]
pub unsafe trait RxBuf: Copy {
    type Pool: Copy;
    /// Fills `out` with fresh buffers: all, or none (and returns false).
    fn alloc_bulk(pool: Self::Pool, out: &mut [MaybeUninit<Self>]) -> bool;
    /// # Safety
    /// The caller owns every buffer in `bufs`, none appears twice, none is used afterwards.
    unsafe fn free_bulk(bufs: &[Self]);
    /// Address and size of the area the device may write.
    fn data_area(&self) -> (usize, u32);
    /// This buffer holds `len` bytes of a frame, followed by `next` (if any).
    fn set_segment(&mut self, len: u32, next: Option<Self>);
    /// This (first) buffer starts a frame of `pkt_len` bytes in `nb_segs` buffers.
    fn set_packet(&mut self, pkt_len: u32, nb_segs: u16, port: u16, meta: &RxMeta);
    /// This buffer holds a whole frame of `len` bytes: `set_segment(len, None)` then
    /// `set_packet(len, 1, port, meta)`, which a buffer may do in fewer stores.
    #[inline(always)]
    fn set_single(&mut self, len: u32, port: u16, meta: &RxMeta) {
        self.set_segment(len, None);
        self.set_packet(len, 1, port, meta);
    }
}

/// `n` fresh buffers from `pool`, or None if the pool cannot give them all.
#[allow(unsafe_code)]
pub fn alloc_dma<B: RxBuf>(pool: B::Pool, n: usize, source: MemSource) -> Option<DmaArray<B>> {
    let mut v: DmaArray<MaybeUninit<B>> = DmaArray::new(n, MaybeUninit::uninit(), source)?;
    if !B::alloc_bulk(pool, &mut v) {
        return None;
    }
    // SAFETY: alloc_bulk returned true, so every entry is initialised (RxBuf's contract).
    Some(unsafe { v.assume_init() })
}

/// Fills `out` with fresh buffers from `pool` and returns them, or None (and `out` untouched
/// as far as the caller can tell) if the pool cannot give them all.
#[allow(unsafe_code)]
pub fn alloc_into<B: RxBuf>(pool: B::Pool, out: &mut [MaybeUninit<B>]) -> Option<&mut [B]> {
    if !B::alloc_bulk(pool, out) {
        return None;
    }
    // SAFETY: as in alloc_dma.
    Some(unsafe { &mut *(out as *mut [MaybeUninit<B>] as *mut [B]) })
}

/// Fills `slots` with fresh buffers from `pool` in place: all, or none, and then (false) they
/// hold `saved` again, the buffers they held, which the caller copied out before.
#[allow(unsafe_code)]
pub(super) fn alloc_in_place<B: RxBuf>(pool: B::Pool, slots: &mut [B], saved: &[B]) -> bool {
    assert_eq!(slots.len(), saved.len());
    // SAFETY: `MaybeUninit<B>` has `B`'s layout, and `B: Copy` has no drop to skip. What
    // `alloc_bulk` leaves in a slot is a buffer it wrote, or what the slot held (RxBuf's
    // contract: it writes nothing uninitialised), and on failure every slot is written again
    // from `saved` before `slots` is read as buffers.
    let raw = unsafe { &mut *(slots as *mut [B] as *mut [MaybeUninit<B>]) };
    if B::alloc_bulk(pool, raw) {
        return true;
    }
    slots.copy_from_slice(saved);
    false
}

/// Receive-queue settings fixed at setup.
#[derive(Debug, Clone, Copy)]
pub struct RxConfig {
    /// Scatter entries per WQE (a power of two): 1 unless scattered RX is on.
    pub sges: u32,
    pub csum: bool,
    pub rss: bool,
    /// The device leaves the 4-byte FCS after each frame (`KEEP_CRC`).
    pub keep_crc: bool,
    /// The device reports VXLAN frames (a ConnectX-3 Pro): inner packet types and verdicts.
    pub tunnel: bool,
    pub port_id: u16,
    pub source: MemSource,
}

/// Frames handled per bulk allocation (at most 64: a burst marks a chunk's error CQEs in a
/// `u64`).
pub(super) const CHUNK: usize = 64;
const _: () = assert!(CHUNK <= 64);
/// Buffers one chunk may need (a chunk is cut shorter on queues with many scatter entries).
pub(super) const FRESH: usize = CHUNK * 4;

pub struct RxQueue<B: RxBuf> {
    /// Next WQE expected to complete (free-running).
    rq_ci: u32,
    /// Written by the polling lcore only, in a struct the device never writes (its rings and
    /// records are allocated apart), so no line holds both sides' counters: `apps/lines`
    /// (`counters` rows) measures a shared line at twice the cycles per packet. A telemetry
    /// reader still pulls these lines when it reads; it reads rarely.
    stats: RxStats,
    cq: CqRing,
    rq: RqRing,
    wqe_cnt: u32,
    cfg: RxConfig,
    pool: B::Pool,
    /// `wqe_cnt * sges` posted buffers, WQE-major.
    elts: DmaArray<B>,
    /// `elts` went back to the pool (the queue is being dropped).
    released: bool,
    /// Room for the replacement buffers of one chunk (kept here rather than set up on every
    /// burst).
    fresh: DmaArray<MaybeUninit<B>>,
    /// What a burst's first pass copies out of each CQE of a chunk for the second.
    seen: [meta::Seen; CHUNK],
    lkeys: Lkeys,
    /// The byte count and lkey (an entry's first 8 bytes) every scatter entry holds, when
    /// they all hold the same: a burst then writes only the address of an entry whose fresh
    /// buffer shares them, as a card reads the rest unchanged. None once an entry may differ,
    /// until the ring is posted whole again.
    entry_head: Option<[u8; 8]>,
    /// Bytes each buffer takes (they all come from one pool).
    room: u32,
    qpn: u32,
    pub qid: u16,
    /// An error completion arrived since the last [`RxQueue::recover`]: the device may have
    /// stopped the RQ. Its syndrome and vendor error, for the log.
    error_seen: Option<(u8, u8)>,
    error_logged: bool,
}

impl<B: RxBuf> RxQueue<B> {
    /// A queue of `nb_desc` buffers from `pool`, created on `dev`. Everything it keeps is
    /// plain data in `cfg.source` memory, so that another process can run it.
    ///
    /// # Safety
    /// Its rings live in memory `dev` owns, which the queue does not borrow: `dev` must outlive
    /// the queue, and the queue ends with [`RxQueue::destroy`] on that same `dev` before it
    /// drops.
    #[allow(unsafe_code)]
    pub unsafe fn new(
        dev: &dyn Device,
        qid: u16,
        nb_desc: u16,
        cfg: RxConfig,
        pool: B::Pool,
        mrs: &[Mr],
    ) -> Result<RxQueue<B>, HwError> {
        // As in mlx4, descriptors count buffers: a scattered queue has nb_desc / sges WQEs.
        let bufs = u32::from(nb_desc).clamp(64, 1 << 15).next_power_of_two();
        let wqe_cnt = (bufs / cfg.sges).max(16);
        let n = (wqe_cnt * cfg.sges) as usize;
        let nomem = || HwError::NoMemory("no memory for the RX queue's arrays".into());
        let src = cfg.source;
        let lkeys = Lkeys::new(mrs, src).ok_or_else(nomem)?;
        let fresh = DmaArray::new(FRESH, MaybeUninit::uninit(), src).ok_or_else(nomem)?;
        let elts = alloc_dma::<B>(pool, n, src)
            .ok_or_else(|| HwError::NoMemory(format!("the mempool cannot fill {n} RX buffers")))?;
        let room = elts[0].data_area().1;
        if room == 0 {
            release(&elts);
            return Err(HwError::Invalid(
                "the mempool's buffers have no data room".into(),
            ));
        }
        let (cq, rq) = match create_hw(dev, wqe_cnt, &cfg) {
            Ok(hw) => hw,
            Err(e) => {
                release(&elts);
                return Err(e);
            }
        };
        let mut q = RxQueue {
            rq_ci: 0,
            stats: RxStats::default(),
            qpn: rq.desc().qpn(),
            cq,
            rq,
            wqe_cnt,
            cfg,
            pool,
            elts,
            released: false,
            fresh,
            seen: [meta::Seen::default(); CHUNK],
            lkeys,
            entry_head: None,
            room,
            qid,
            error_seen: None,
            error_logged: false,
        };
        if !q.post_all_entries() {
            q.release_bufs();
            let RxQueue { cq, rq, .. } = q;
            destroy_hw(dev, cq, rq);
            return Err(HwError::Invalid(
                "an RX buffer lies outside registered memory".into(),
            ));
        }
        q.post_all();
        Ok(q)
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// What the device handed over for the receive ring (ring, doorbell record, QPN).
    pub fn rq_desc(&self) -> &crate::hw::RqDesc {
        self.rq.desc()
    }

    /// The CQ and its consumer counter: where an arm for the next completion points.
    pub fn cq_arm_point(&self) -> (&crate::hw::CqDesc, u32) {
        (self.cq.desc(), self.cq.ci())
    }

    pub fn stats(&self) -> RxStats {
        self.stats
    }

    pub fn reset_stats(&mut self) {
        self.stats.reset();
    }

    /// The counters, read beside the lcore that bursts, through `q` rather than a reference.
    ///
    /// # Safety
    /// `q` points to a live queue.
    #[allow(unsafe_code)]
    pub unsafe fn stats_raw(q: *const Self) -> RxStats {
        // SAFETY: the caller's live queue.
        unsafe { RxStats::read_volatile(std::ptr::addr_of!((*q).stats)) }
    }

    /// Zeroes the counters from beside the lcore.
    ///
    /// # Safety
    /// `q` points to a live queue.
    #[allow(unsafe_code)]
    pub unsafe fn reset_stats_raw(q: *mut Self) {
        // SAFETY: the caller's live queue.
        unsafe { RxStats::write_volatile(std::ptr::addr_of_mut!((*q).stats), RxStats::default()) }
    }

    /// Descriptors as setup counts them: posted buffers (WQEs times scatter entries).
    pub fn nb_desc(&self) -> u32 {
        self.elts.len() as u32
    }

    pub fn sges(&self) -> u32 {
        self.cfg.sges
    }

    pub fn pool(&self) -> B::Pool {
        self.pool
    }

    /// Writes a scatter entry for every buffer of the ring: false if one lies outside
    /// registered memory (its entry is then an empty one).
    pub(super) fn post_all_entries(&mut self) -> bool {
        let (mut ok, mut same, mut head) = (true, true, None);
        for i in 0..self.elts.len() {
            match self.post(i) {
                Some(h) => same &= *head.get_or_insert(h) == h,
                None => {
                    self.post_empty(i);
                    ok = false;
                }
            }
        }
        self.entry_head = head.filter(|_| ok && same);
        ok
    }

    /// Hands the device every WQE up to a full ring ahead of the consumer: the RQ doorbell
    /// record, written after the entries it covers.
    pub(super) fn post_all(&self) {
        self.rq.db_rec().store(
            (self.rq_ci.wrapping_add(self.wqe_cnt) & 0xffff).to_be(),
            Ordering::Release,
        );
    }

    /// Destroys the device queues, then frees the posted buffers. A queue dropped without this
    /// leaves its device queues (and their memory) to the backend, and leaks its buffers.
    pub fn destroy(self, dev: &dyn Device) {
        let RxQueue {
            cq,
            rq,
            elts,
            released,
            ..
        } = self;
        // The device must stop writing into the buffers before they go back to the pool.
        destroy_hw(dev, cq, rq);
        if !released {
            release(&elts);
        }
    }

    /// Writes scatter entry `i` for the buffer in `elts[i]`, and returns the entry's first
    /// 8 bytes (byte count and lkey); None if the buffer lies outside registered memory (and
    /// the entry is left as it was). Inlined into the burst loop, whichever codegen unit each
    /// lands in.
    #[inline]
    pub(super) fn post(&mut self, i: usize) -> Option<[u8; 8]> {
        let (addr, room) = self.elts[i].data_area();
        let lkey = self.lkeys.lookup(addr, room as usize)?;
        let mut e = [0u8; mlx4_prm::DS_SIZE];
        let mut d = mlx4_prm::DataSeg::new_unchecked(&mut e[..]);
        d.set_addr(addr as u64);
        d.set_lkey(lkey);
        d.set_byte_count(room);
        // SAFETY: slot `i` is the driver's (its completion consumed, or never posted), and it
        // gets a buffer the queue took from its pool, inside the region of `lkey`.
        #[allow(unsafe_code)]
        let entry = unsafe { self.rq.scatter_entry(i) };
        *entry = e;
        Some(entry_head(&e))
    }

    /// Writes scatter entry `i` as one the device cannot use (no room, invalid key).
    pub(super) fn post_empty(&mut self, i: usize) {
        // SAFETY: slot `i` is the driver's, and gets an entry the device cannot use.
        #[allow(unsafe_code)]
        let mut d = unsafe { self.rq.entry_mut(i) };
        d.set_addr(0);
        d.set_lkey(mlx4_prm::INVALID_LKEY);
        d.set_byte_count(0);
    }

    fn release_bufs(&mut self) {
        if !std::mem::replace(&mut self.released, true) {
            release(&self.elts);
        }
    }
}

/// Gives buffers the queue owns back to their pool.
#[allow(unsafe_code)]
pub(super) fn release<B: RxBuf>(bufs: &[B]) {
    // SAFETY: the queue allocated these buffers and holds them only in `elts` (each slot's
    // buffer once), which it gives up exactly once (`released`), or on the set-up path
    // before the queue exists.
    unsafe { B::free_bulk(bufs) }
}

/// Creates a CQ and an RQ of `wqe_cnt` WQEs completing into it.
pub(super) fn create_hw(
    dev: &dyn Device,
    wqe_cnt: u32,
    cfg: &RxConfig,
) -> Result<(CqRing, RqRing), HwError> {
    let socket = cfg.source.socket();
    let cq = dev.create_cq(wqe_cnt, socket)?;
    let rq = dev
        .create_rq(wqe_cnt, cfg.sges, &cq, socket)
        .and_then(|rq| {
            if !cfg.keep_crc {
                return Ok(rq);
            }
            match dev.set_rq_keep_crc(rq.qpn(), true) {
                Ok(()) => Ok(rq),
                Err(e) => {
                    let _ = dev.destroy_rq(rq);
                    Err(e)
                }
            }
        });
    match rq {
        // SAFETY: `dev` handed these descriptors out just now, one view each; the queue keeps
        // them until `destroy_hw` hands them back to `dev`, which outlives its queues.
        #[allow(unsafe_code)]
        Ok(rq) => Ok(unsafe { (CqRing::new(cq), RqRing::new(rq)) }),
        Err(e) => {
            let _ = dev.destroy_cq(cq);
            Err(e)
        }
    }
}

/// Destroys the RQ, then its CQ.
pub(super) fn destroy_hw(dev: &dyn Device, cq: CqRing, rq: RqRing) {
    let _ = dev.destroy_rq(rq.into_desc());
    let _ = dev.destroy_cq(cq.into_desc());
}
