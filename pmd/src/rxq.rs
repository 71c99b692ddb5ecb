//! RX queues: an RQ of scatter entries kept full of buffers, a CQ of received frames. Each burst
//! polls CQEs, hands the filled buffers up, re-posts fresh ones (allocated in bulk, once per
//! burst) in the same slots, then updates the RQ doorbell record and the CQ consumer index once.
//! When the pool runs dry the frames are dropped and counted and their buffers stay posted, so
//! no ring slot is ever lost.
//!
//! Generic over the buffer ([`RxBuf`]): mbufs under DPDK, plain buffers in tests.

use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;

use mlx4_prm::{cqe_opcode, rx_status, Cqe, DataSeg};

use crate::hw::{Device, HwError, QueueState};
use crate::mem::{DmaArray, Lkeys, MemSource, Mr};
use crate::pmd_log;
use crate::ring::{CqRing, RqRing};
pub use crate::stats::RxStats;

/// Offload results of one received frame, in DPDK's terms.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RxMeta {
    pub ol_flags: u64,
    pub packet_type: u32,
    pub rss_hash: u32,
}

// mbuf flags and packet types (rte_mbuf_core.h, rte_mbuf_ptype.h), repeated here so that the
// CQE parsing below stays plain Rust that tests can check without DPDK.
pub const RX_RSS_HASH: u64 = 1 << 1;
pub const RX_L4_CKSUM_BAD: u64 = 1 << 3;
pub const RX_IP_CKSUM_BAD: u64 = 1 << 4;
pub const RX_IP_CKSUM_GOOD: u64 = 1 << 7;
pub const RX_L4_CKSUM_GOOD: u64 = 1 << 8;
pub const PTYPE_L2_ETHER: u32 = 0x1;
pub const PTYPE_L3_IPV4_EXT_UNKNOWN: u32 = 0x90;
pub const PTYPE_L3_IPV6_EXT_UNKNOWN: u32 = 0xe0;
pub const PTYPE_L4_TCP: u32 = 0x100;
pub const PTYPE_L4_UDP: u32 = 0x200;
pub const PTYPE_L4_FRAG: u32 = 0x300;
pub const PTYPE_L3_MASK: u32 = 0xf0;
pub const PTYPE_L4_MASK: u32 = 0xf00;
pub const PTYPE_TUNNEL_VXLAN: u32 = 0x3000;
pub const PTYPE_INNER_L2_ETHER: u32 = 0x1_0000;
pub const RX_OUTER_IP_CKSUM_BAD: u64 = 1 << 5;
pub const RX_OUTER_L4_CKSUM_BAD: u64 = 1 << 21;
pub const RX_OUTER_L4_CKSUM_GOOD: u64 = 1 << 22;

/// A ConnectX-3 Pro's VXLAN frame (`vlan_my_qpn` tunnel bits): the status word described the
/// inner packet, so its types move to the inner fields (inner L3 and L4 sit 16 bits above the
/// outer ones in DPDK's packet type) and the checksum verdicts stay the inner ones; the outer
/// headers come from the tunnel bits.
pub fn with_tunnel(mut m: RxMeta, vlan_my_qpn: u32, csum: bool) -> RxMeta {
    use mlx4_prm::cqe_vlan::{L2_TUNNEL, L2_TUNNEL_IPOK, L2_TUNNEL_IPV4, L2_TUNNEL_L4_CSUM};
    if vlan_my_qpn & L2_TUNNEL == 0 {
        return m;
    }
    let v4 = vlan_my_qpn & L2_TUNNEL_IPV4 != 0;
    let inner = (m.packet_type & (PTYPE_L3_MASK | PTYPE_L4_MASK)) << 16;
    m.packet_type = PTYPE_L2_ETHER
        | if v4 {
            PTYPE_L3_IPV4_EXT_UNKNOWN
        } else {
            PTYPE_L3_IPV6_EXT_UNKNOWN
        }
        | PTYPE_L4_UDP
        | PTYPE_TUNNEL_VXLAN
        | PTYPE_INNER_L2_ETHER
        | inner;
    if csum {
        if v4 && vlan_my_qpn & L2_TUNNEL_IPOK == 0 {
            m.ol_flags |= RX_OUTER_IP_CKSUM_BAD;
        }
        m.ol_flags |= if vlan_my_qpn & L2_TUNNEL_L4_CSUM != 0 {
            RX_OUTER_L4_CKSUM_GOOD
        } else {
            RX_OUTER_L4_CKSUM_BAD
        };
    }
    m
}

/// Reads an RX CQE's status word and hash into mbuf metadata. Checksum flags only when the
/// application enabled RX checksum offload; the hash only with RSS.
pub const fn parse_rx_cqe(status: u32, hash: u32, csum: bool, rss: bool) -> RxMeta {
    let mut m = RxMeta {
        ol_flags: 0,
        packet_type: PTYPE_L2_ETHER,
        rss_hash: 0,
    };
    let v4 = status & rx_status::IPV4 != 0;
    let v6 = status & rx_status::IPV6 != 0;
    let frag = status & (rx_status::IPV4F | rx_status::IPV6F) != 0;
    if v4 {
        m.packet_type |= PTYPE_L3_IPV4_EXT_UNKNOWN;
    } else if v6 {
        m.packet_type |= PTYPE_L3_IPV6_EXT_UNKNOWN;
    }
    let l4 = status & (rx_status::TCP | rx_status::UDP) != 0;
    if (v4 || v6) && frag {
        m.packet_type |= PTYPE_L4_FRAG;
    } else if status & rx_status::TCP != 0 {
        m.packet_type |= PTYPE_L4_TCP;
    } else if status & rx_status::UDP != 0 {
        m.packet_type |= PTYPE_L4_UDP;
    }
    if csum {
        if v4 {
            m.ol_flags |= if status & rx_status::IP_HDR_CSUM_OK != 0 {
                RX_IP_CKSUM_GOOD
            } else {
                RX_IP_CKSUM_BAD
            };
        }
        if (v4 || v6) && l4 && !frag {
            m.ol_flags |= if status & rx_status::TCP_UDP_CSUM_OK != 0 {
                RX_L4_CKSUM_GOOD
            } else {
                RX_L4_CKSUM_BAD
            };
        }
    }
    if rss {
        m.ol_flags |= RX_RSS_HASH;
        m.rss_hash = hash;
    }
    m
}

/// The status bits [`parse_rx_cqe`] reads, packed into an index of [`RX_META`]: bits 22..=28
/// (IPv4, IPv4 fragment, IPv6, IPv4 options, TCP, UDP, IP checksum good) as they lie, the L4
/// checksum verdict (bit 2) above them, the IPv6 fragment bit (12) above that.
#[inline(always)]
const fn meta_index(status: u32) -> usize {
    (((status >> 22) & 0x7f)
        | ((status & rx_status::TCP_UDP_CSUM_OK) << 5)
        | ((status & rx_status::IPV6F) >> 4)) as usize
}

/// [`parse_rx_cqe`]'s packet type and flags for every index of [`meta_index`], with RX
/// checksum offload off (`[0]`) and on (`[1]`), computed by that very function at build
/// time: the burst loads a frame's answer instead of branching on each bit. The RSS hash and
/// tunnel fields stay per frame. `meta_table_matches_the_full_decode` checks every entry.
static RX_META: [[(u32, u32); 512]; 2] = {
    let mut t = [[(0u32, 0u32); 512]; 2];
    let mut i = 0;
    while i < 512 {
        let status = ((i as u32 & 0x7f) << 22)
            | (((i as u32 >> 7) & 1) << 2)
            | (((i as u32 >> 8) & 1) << 12);
        let off = parse_rx_cqe(status, 0, false, false);
        let on = parse_rx_cqe(status, 0, true, false);
        t[0][i] = (off.packet_type, off.ol_flags as u32);
        t[1][i] = (on.packet_type, on.ol_flags as u32);
        i += 1;
    }
    t
};

/// [`parse_rx_cqe`] through [`RX_META`] (`table` is its row for the queue's checksum setting).
#[inline(always)]
fn rx_meta(table: &[(u32, u32); 512], status: u32, hash: u32, rss: bool) -> RxMeta {
    let (packet_type, flags) = table[meta_index(status)];
    let mut m = RxMeta {
        ol_flags: u64::from(flags),
        packet_type,
        rss_hash: 0,
    };
    if rss {
        m.ol_flags |= RX_RSS_HASH;
        m.rss_hash = hash;
    }
    m
}

/// What the RX path needs from a buffer and its pool.
///
/// # Safety
/// `alloc_bulk` returning true must have initialised every entry of `out` with a buffer the
/// caller then owns (the queue reads them as initialised).
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

/// Frames handled per bulk allocation.
const CHUNK: usize = 64;
/// Buffers one chunk may need (a chunk is cut shorter on queues with many scatter entries).
const FRESH: usize = CHUNK * 4;

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
    lkeys: Lkeys,
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
    pub fn new(
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
            lkeys,
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
    fn post_all_entries(&mut self) -> bool {
        let mut ok = true;
        for i in 0..self.elts.len() {
            if !self.post(i) {
                self.post_empty(i);
                ok = false;
            }
        }
        ok
    }

    /// Hands the device every WQE up to a full ring ahead of the consumer: the RQ doorbell
    /// record, written after the entries it covers.
    fn post_all(&self) {
        self.rq.db_rec().store(
            (self.rq_ci.wrapping_add(self.wqe_cnt) & 0xffff).to_be(),
            Ordering::Release,
        );
    }

    /// Device or queue stopped: start over with the same buffers on the same device queues,
    /// the RQ through reset to ready from WQE 0 and the completions it left skipped. Nothing
    /// is allocated or freed, so the rings live from setup to release; the RQ keeps its
    /// number. A device that cannot restart an RQ gets fresh queues instead; if it cannot
    /// make new ones, the old ones stay.
    pub fn reset(&mut self, dev: &dyn Device) -> Result<(), HwError> {
        // Until the ring is handed over again from WQE 0, the restarted RQ must find no WQE:
        // the old producer count means nothing against its new consumer.
        let posted = self.rq.db_rec().swap(0, Ordering::AcqRel);
        match dev.restart_rq(self.qpn) {
            Ok(()) => {}
            Err(HwError::Unsupported(_)) => {
                self.rq.db_rec().store(posted, Ordering::Release);
                return self.recreate(dev);
            }
            Err(e) => {
                self.rq.db_rec().store(posted, Ordering::Release);
                return Err(e);
            }
        }
        // Completions nobody polled: frames the device delivered that the restart drops. Their
        // buffers stay in their slots. No more than one per posted WQE can wait, and the RQ
        // finds no WQE now, so none comes after.
        let mut stale = 0;
        while stale < self.wqe_cnt && self.cq.next_view().is_some() {
            stale += 1;
        }
        self.cq.update_ci();
        self.stats.discarded += u64::from(stale);
        self.rq_ci = 0;
        self.error_seen = None;
        // Buffers outside registered memory never made it into the ring; they fail again here.
        self.post_all_entries();
        self.post_all();
        Ok(())
    }

    /// What [`RxQueue::reset`] does on a device that cannot restart an RQ: new device queues
    /// (new rings) for the old.
    fn recreate(&mut self, dev: &dyn Device) -> Result<(), HwError> {
        let (cq, rq) = create_hw(dev, self.wqe_cnt, &self.cfg)?;
        self.stats.discarded += self.cq.ready(self.wqe_cnt as usize) as u64;
        self.qpn = rq.desc().qpn();
        let old_cq = std::mem::replace(&mut self.cq, cq);
        let old_rq = std::mem::replace(&mut self.rq, rq);
        destroy_hw(dev, old_cq, old_rq);
        self.rq_ci = 0;
        self.error_seen = None;
        self.post_all_entries();
        self.post_all();
        Ok(())
    }

    /// Whether an error completion arrived since the last [`RxQueue::recover`] (one load: the
    /// burst glue asks after every burst).
    #[inline(always)]
    pub fn needs_recovery(&self) -> bool {
        self.error_seen.is_some()
    }

    /// After an error completion: if the device moved the RQ to the error state, restart it in
    /// place. Every slot still holds its buffer (an error completion hands none up and takes no
    /// fresh one), so the ring is handed over again whole from WQE 0, with the same buffers:
    /// nothing is allocated or freed, and the RQ keeps its number and so its place in
    /// the steering tables. Frames that reached it meanwhile were dropped and counted by the
    /// device (`imissed`). Returns whether the queue receives.
    #[cold]
    #[inline(never)]
    pub fn recover(&mut self, dev: &dyn Device) -> bool {
        let Some((syndrome, vendor_err)) = self.error_seen.take() else {
            return true;
        };
        let port = self.cfg.port_id;
        match dev.rq_state(self.qpn) {
            Ok(QueueState::Error) => {}
            Ok(_) => return true,
            Err(e) => {
                pmd_log!(ERR, "port {port}: RX queue {}: state: {e}", self.qid);
                return false;
            }
        }
        if !std::mem::replace(&mut self.error_logged, true) {
            pmd_log!(
                ERR,
                "port {port}: RX queue {}: error CQE syndrome {syndrome:#04x} vendor {vendor_err:#04x} stopped the queue; restarting it",
                self.qid
            );
        }
        // Until the ring is handed over again from WQE 0, the restarted RQ must find no WQE:
        // the old producer count means nothing against its new consumer.
        self.rq.db_rec().store(0, Ordering::Release);
        if let Err(e) = dev.restart_rq(self.qpn) {
            pmd_log!(
                ERR,
                "port {port}: RX queue {}: restart failed: {e}",
                self.qid
            );
            return false;
        }
        self.rq_ci = 0;
        self.post_all();
        self.stats.queue_resets += 1;
        true
    }

    /// Notes an error completion for [`RxQueue::recover`].
    #[cold]
    fn on_error_cqe(&mut self, syndrome: u8, vendor_err: u8) {
        self.stats.error_cqes += 1;
        self.error_seen = Some((syndrome, vendor_err));
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

    /// Writes scatter entry `i` for the buffer in `elts[i]`.
    fn post(&mut self, i: usize) -> bool {
        let (addr, room) = self.elts[i].data_area();
        let Some(lkey) = self.lkeys.lookup(addr, room as usize) else {
            return false;
        };
        // SAFETY: slot `i` is the driver's (its completion consumed, or never posted), and it
        // gets a buffer the queue took from its pool, inside the region of `lkey`.
        #[allow(unsafe_code)]
        let mut d = unsafe { self.rq.entry_mut(i) };
        d.set_addr(addr as u64);
        d.set_lkey(lkey);
        d.set_byte_count(room);
        true
    }

    /// Writes scatter entry `i` as one the device cannot use (no room, invalid key).
    fn post_empty(&mut self, i: usize) {
        // SAFETY: slot `i` is the driver's, and gets an entry the device cannot use.
        #[allow(unsafe_code)]
        let mut d = unsafe { self.rq.entry_mut(i) };
        d.set_addr(0);
        d.set_lkey(mlx4_prm::INVALID_LKEY);
        d.set_byte_count(0);
    }

    /// Receives up to `out.len()` frames.
    ///
    /// Per burst, not per frame: a call with nothing waiting leaves after one load of the
    /// next CQE's owner byte; the CQEs ready are counted once, and their replacement buffers
    /// allocated with one bulk call; the lkey of the pool's region is looked up once; the
    /// counters are summed in registers; the CQ consumer record and the RQ doorbell record
    /// are written once, at the end. Per frame remain the CQE's fields, the buffer handed up
    /// and the fresh one posted in its slot.
    pub fn burst(&mut self, out: &mut [B]) -> usize {
        let got = match out {
            [one] if self.cfg.sges == 1 => match self.burst_one(one) {
                Some(got) => got,
                None => return 0,
            },
            _ => {
                if out.is_empty() || !self.cq.has_cqe() {
                    return 0;
                }
                if self.cfg.sges == 1 {
                    self.burst_single(out)
                } else {
                    self.burst_scattered(out)
                }
            }
        };
        self.cq.update_ci();
        self.post_all();
        got
    }

    /// A burst of one on a single-buffer queue: the CQE taken as its owner byte is checked,
    /// no count of the ready ones, no run, and a buffer allocated only for a frame. `None`
    /// when no CQE waits.
    fn burst_one(&mut self, out: &mut B) -> Option<usize> {
        let c = self.cq.next_view()?;
        let slot = (self.rq_ci & (self.wqe_cnt - 1)) as usize;
        self.rq_ci = self.rq_ci.wrapping_add(1);
        if c.opcode() == cqe_opcode::ERROR {
            let why = (c.syndrome(), c.vendor_err());
            self.stats.errors += 1;
            self.on_error_cqe(why.0, why.1);
            return Some(0);
        }
        let mut fresh_room = [MaybeUninit::uninit()];
        let Some(fresh) = alloc_into(self.pool, &mut fresh_room).map(|f| f[0]) else {
            // The pool ran dry: the frame is dropped and counted, and its buffer stays posted.
            self.stats.nombuf += 1;
            return Some(0);
        };
        let len = c.byte_cnt();
        let mut errors = 0;
        // SAFETY: the refill writes only the slot of the completion consumed here, with
        // a fresh buffer from the pool inside its region.
        #[allow(unsafe_code)]
        let entries = unsafe { self.rq.scatter_entries() };
        let mut cx = Refill {
            region: self.lkeys.cached(),
            elts: &mut self.elts,
            entries,
            lkeys: &mut self.lkeys,
            cfg: self.cfg,
        };
        *out = cx.frame(&c, len, slot, fresh, &mut errors);
        let st = &mut self.stats;
        st.packets += 1;
        st.bytes += u64::from(len);
        st.errors += errors;
        Some(1)
    }

    /// One buffer per frame (RX scatter off): no segment arithmetic, CQEs read in place.
    fn burst_single(&mut self, out: &mut [B]) -> usize {
        let mask = self.wqe_cnt - 1;
        let (csum, rss, port) = (self.cfg.csum, self.cfg.rss, self.cfg.port_id);
        let tunnel = self.cfg.tunnel;
        let table = &RX_META[usize::from(csum)];
        let region = self.lkeys.cached();
        let (mut got, mut bytes, mut errors, mut nombuf) = (0usize, 0u64, 0u64, 0u64);
        let (mut error_cqes, mut why) = (0u64, None);
        let mut rq_ci = self.rq_ci;
        // A burst of more than FRESH frames takes them a chunk at a time; each chunk ends the
        // loop when the CQ had fewer than it asked for.
        while got < out.len() {
            let want = (out.len() - got).min(FRESH);
            let ready = self.cq.ready_run(want);
            let n = ready.len();
            if n == 0 {
                break;
            }
            let mut fresh_room = std::mem::take(&mut self.fresh);
            match alloc_into(self.pool, &mut fresh_room[..n]) {
                None => {
                    // The pool ran dry: the frames are dropped and counted, and their buffers
                    // stay posted.
                    self.cq.take_ready(ready, |c| {
                        if c.opcode() == cqe_opcode::ERROR {
                            errors += 1;
                            error_cqes += 1;
                            why = Some((c.syndrome(), c.vendor_err()));
                        } else {
                            nombuf += 1;
                        }
                    });
                    rq_ci = rq_ci.wrapping_add(n as u32);
                }
                Some(fresh) => {
                    let elts: &mut [B] = &mut self.elts;
                    // SAFETY: as in burst_one: only the slots of the CQEs taken, refilled.
                    #[allow(unsafe_code)]
                    let entries = unsafe { self.rq.scatter_entries() };
                    let lkeys = &mut self.lkeys;
                    let dst = &mut out[got..got + n];
                    let mut used = 0;
                    self.cq.take_ready(ready, |c| {
                        let slot = (rq_ci & mask) as usize;
                        rq_ci = rq_ci.wrapping_add(1);
                        if c.opcode() == cqe_opcode::ERROR {
                            // Too long for its buffer, or a bad one: the slot keeps it.
                            errors += 1;
                            error_cqes += 1;
                            why = Some((c.syndrome(), c.vendor_err()));
                            return;
                        }
                        let len = c.byte_cnt();
                        let mut meta = rx_meta(table, c.status(), c.immed_rss_invalid(), rss);
                        if tunnel {
                            meta = with_tunnel(meta, c.vlan_my_qpn(), csum);
                        }
                        let mut head = elts[slot];
                        head.set_segment(len, None);
                        head.set_packet(len, 1, port, &meta);
                        dst[used] = head;
                        bytes += u64::from(len);
                        let b = fresh[used];
                        used += 1;
                        elts[slot] = b;
                        let (addr, room) = b.data_area();
                        let e = &mut entries[slot];
                        let mut d = DataSeg::new_unchecked(&mut e[..]);
                        let lkey = match region {
                            // The pool's region, looked up once per burst.
                            Some(mr) if mr.contains(addr, room as usize) => Some(mr.lkey),
                            _ => lkeys.lookup(addr, room as usize),
                        };
                        match lkey {
                            Some(lkey) => {
                                d.set_addr(addr as u64);
                                d.set_lkey(lkey);
                                d.set_byte_count(room);
                            }
                            None => {
                                // See Refill::frame.
                                d.set_addr(0);
                                d.set_lkey(mlx4_prm::INVALID_LKEY);
                                d.set_byte_count(0);
                                errors += 1;
                            }
                        }
                    });
                    got += used;
                    if used < n {
                        release(&fresh[used..]);
                    }
                }
            }
            self.fresh = fresh_room;
            if n < want {
                break;
            }
        }
        self.rq_ci = rq_ci;
        if let Some((syndrome, vendor_err)) = why {
            self.stats.error_cqes += error_cqes - 1;
            self.on_error_cqe(syndrome, vendor_err);
        }
        let st = &mut self.stats;
        st.packets += got as u64;
        st.bytes += bytes;
        st.errors += errors;
        st.nombuf += nombuf;
        got
    }

    /// Frames that may take several buffers (scattered RX).
    fn burst_scattered(&mut self, out: &mut [B]) -> usize {
        let mut got = 0;
        while got < out.len() {
            // A chunk's replacements must fit `fresh`, whatever the frames' sizes.
            let want = (out.len() - got)
                .min(CHUNK)
                .min(FRESH / self.cfg.sges as usize)
                .max(1);
            // Take the chunk's CQEs first so one bulk allocation covers all its frames; an
            // error CQE (frame too long for the posted buffers) takes no buffer.
            let mut cqes = [(0u32, 0u32, 0u32, 0usize, 0u32); CHUNK];
            let mut n = 0;
            let mut need = 0usize;
            while n < want {
                let Some(c) = self.cq.poll() else { break };
                let len = c.byte_cnt();
                let k = if c.opcode() == cqe_opcode::ERROR {
                    self.on_error_cqe(c.syndrome(), c.vendor_err());
                    0
                } else {
                    self.segments_for(len)
                };
                need += k;
                cqes[n] = (len, c.status(), c.immed_rss_invalid(), k, c.vlan_my_qpn());
                n += 1;
            }
            if n == 0 {
                break;
            }
            let mut fresh_room = std::mem::take(&mut self.fresh);
            let fresh = alloc_into(self.pool, &mut fresh_room[..need]);
            let alloc_ok = fresh.is_some();
            let fresh = fresh.unwrap_or_default();
            let mut f = 0;
            for &(len, status, hash, k, vlan) in &cqes[..n] {
                let slot = (self.rq_ci & (self.wqe_cnt - 1)) as usize;
                self.rq_ci = self.rq_ci.wrapping_add(1);
                if k == 0 {
                    // The slot keeps its buffers.
                    self.stats.errors += 1;
                    continue;
                }
                if !alloc_ok {
                    self.stats.nombuf += 1;
                    continue;
                }
                let base = slot * self.cfg.sges as usize;
                // Chain from the last segment back, so each knows its successor.
                let mut next: Option<B> = None;
                for i in (0..k).rev() {
                    let seg_len = (len - i as u32 * self.room).min(self.room);
                    let mut b = self.elts[base + i];
                    b.set_segment(seg_len, next);
                    next = Some(b);
                }
                let mut head = next.expect("k >= 1");
                let mut meta = parse_rx_cqe(status, hash, self.cfg.csum, self.cfg.rss);
                if self.cfg.tunnel {
                    meta = with_tunnel(meta, vlan, self.cfg.csum);
                }
                head.set_packet(len, k as u16, self.cfg.port_id, &meta);
                out[got] = head;
                got += 1;
                self.stats.packets += 1;
                self.stats.bytes += u64::from(len);
                for i in 0..k {
                    self.elts[base + i] = fresh[f];
                    f += 1;
                    if !self.post(base + i) {
                        // A buffer outside registered memory (the pool grew into memory we
                        // never saw): the entry must no longer point at the buffer just
                        // handed up, so it becomes an empty one and its frames fail.
                        self.post_empty(base + i);
                        self.stats.errors += 1;
                    }
                }
            }
            self.fresh = fresh_room;
            if n < want {
                break;
            }
        }
        got
    }

    /// Buffers a frame of `len` bytes takes (at least 1).
    fn segments_for(&self, len: u32) -> usize {
        (len.div_ceil(self.room).max(1) as usize).min(self.cfg.sges as usize)
    }

    fn release_bufs(&mut self) {
        if !std::mem::replace(&mut self.released, true) {
            release(&self.elts);
        }
    }
}

/// What handing up one frame of a single-buffer queue touches, borrowed once per burst.
struct Refill<'a, B: RxBuf> {
    elts: &'a mut [B],
    entries: &'a mut [[u8; mlx4_prm::DS_SIZE]],
    lkeys: &'a mut Lkeys,
    /// The pool's region, looked up once per burst.
    region: Option<Mr>,
    cfg: RxConfig,
}

impl<B: RxBuf> Refill<'_, B> {
    /// Hands up the frame of CQE `c` (not an error one, `len` bytes) in `slot`'s buffer and posts `fresh`
    /// in its place; an entry that cannot point at `fresh` is counted in `errors`.
    #[inline(always)]
    fn frame(&mut self, c: &Cqe<&[u8]>, len: u32, slot: usize, fresh: B, errors: &mut u64) -> B {
        let cfg = self.cfg;
        let table = &RX_META[usize::from(cfg.csum)];
        let mut meta = rx_meta(table, c.status(), c.immed_rss_invalid(), cfg.rss);
        if cfg.tunnel {
            meta = with_tunnel(meta, c.vlan_my_qpn(), cfg.csum);
        }
        let mut head = self.elts[slot];
        head.set_segment(len, None);
        head.set_packet(len, 1, cfg.port_id, &meta);
        self.elts[slot] = fresh;
        let (addr, room) = fresh.data_area();
        let lkey = match self.region {
            Some(mr) if mr.contains(addr, room as usize) => Some(mr.lkey),
            _ => self.lkeys.lookup(addr, room as usize),
        };
        let mut d = DataSeg::new_unchecked(&mut self.entries[slot][..]);
        match lkey {
            Some(lkey) => {
                d.set_addr(addr as u64);
                d.set_lkey(lkey);
                d.set_byte_count(room);
            }
            None => {
                // A buffer outside registered memory (the pool grew into memory we never
                // saw): the entry must no longer point at the buffer just handed up, so it
                // becomes an empty one and its frames fail.
                d.set_addr(0);
                d.set_lkey(mlx4_prm::INVALID_LKEY);
                d.set_byte_count(0);
                *errors += 1;
            }
        }
        head
    }
}

/// Gives buffers the queue owns back to their pool.
#[allow(unsafe_code)]
fn release<B: RxBuf>(bufs: &[B]) {
    // SAFETY: the queue allocated these buffers and holds them only in `elts` (each slot's
    // buffer once), which it gives up exactly once (`released`), or on the set-up path
    // before the queue exists.
    unsafe { B::free_bulk(bufs) }
}

/// Creates a CQ and an RQ of `wqe_cnt` WQEs completing into it.
fn create_hw(dev: &dyn Device, wqe_cnt: u32, cfg: &RxConfig) -> Result<(CqRing, RqRing), HwError> {
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
fn destroy_hw(dev: &dyn Device, cq: CqRing, rq: RqRing) {
    let _ = dev.destroy_rq(rq.into_desc());
    let _ = dev.destroy_cq(cq.into_desc());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cqe_status_to_flags() {
        let s = rx_status::IPV4
            | rx_status::TCP
            | rx_status::IP_HDR_CSUM_OK
            | rx_status::TCP_UDP_CSUM_OK;
        let m = parse_rx_cqe(s, 0xdead_beef, true, true);
        assert_eq!(
            m.packet_type,
            PTYPE_L2_ETHER | PTYPE_L3_IPV4_EXT_UNKNOWN | PTYPE_L4_TCP
        );
        assert_eq!(
            m.ol_flags,
            RX_IP_CKSUM_GOOD | RX_L4_CKSUM_GOOD | RX_RSS_HASH
        );
        assert_eq!(m.rss_hash, 0xdead_beef);

        let m = parse_rx_cqe(rx_status::IPV4 | rx_status::UDP, 0, true, false);
        assert_eq!(
            m.packet_type,
            PTYPE_L2_ETHER | PTYPE_L3_IPV4_EXT_UNKNOWN | PTYPE_L4_UDP
        );
        assert_eq!(m.ol_flags, RX_IP_CKSUM_BAD | RX_L4_CKSUM_BAD);

        let m = parse_rx_cqe(
            rx_status::IPV6 | rx_status::UDP | rx_status::TCP_UDP_CSUM_OK,
            0,
            true,
            false,
        );
        assert_eq!(
            m.packet_type,
            PTYPE_L2_ETHER | PTYPE_L3_IPV6_EXT_UNKNOWN | PTYPE_L4_UDP
        );
        assert_eq!(m.ol_flags, RX_L4_CKSUM_GOOD, "IPv6 has no header checksum");

        let m = parse_rx_cqe(
            rx_status::IPV4 | rx_status::IPV4F | rx_status::UDP | rx_status::IP_HDR_CSUM_OK,
            0,
            true,
            false,
        );
        assert_eq!(
            m.packet_type,
            PTYPE_L2_ETHER | PTYPE_L3_IPV4_EXT_UNKNOWN | PTYPE_L4_FRAG
        );
        assert_eq!(m.ol_flags, RX_IP_CKSUM_GOOD, "no L4 verdict on a fragment");

        let m = parse_rx_cqe(0, 7, true, false);
        assert_eq!(
            (m.packet_type, m.ol_flags),
            (PTYPE_L2_ETHER, 0),
            "non-IP: nothing to judge"
        );
        assert_eq!(
            parse_rx_cqe(s, 0, false, false).ol_flags,
            0,
            "offload off: no flags"
        );
    }

    #[test]
    fn meta_table_matches_the_full_decode() {
        // Every combination of the bits the decode reads, alone and with every other bit of
        // the status word set, each way of checksum and RSS.
        let read = rx_status::IPV4
            | rx_status::IPV4F
            | rx_status::IPV6
            | rx_status::IPV6F
            | rx_status::IPV4OPT
            | rx_status::TCP
            | rx_status::UDP
            | rx_status::IP_HDR_CSUM_OK
            | rx_status::TCP_UDP_CSUM_OK;
        let bits: Vec<u32> = (0..32)
            .map(|b| 1u32 << b)
            .filter(|b| read & b != 0)
            .collect();
        assert_eq!(bits.len(), 9);
        for combo in 0..512u32 {
            let status: u32 = (0..9)
                .filter(|k| combo >> k & 1 != 0)
                .map(|k| bits[k])
                .sum();
            for noise in [0, !read, 0x5555_5555 & !read] {
                for (csum, rss) in [(false, false), (true, false), (false, true), (true, true)] {
                    let s = status | noise;
                    assert_eq!(
                        rx_meta(&RX_META[usize::from(csum)], s, 0x1234_5678, rss),
                        parse_rx_cqe(s, 0x1234_5678, csum, rss),
                        "status {s:#010x} csum {csum} rss {rss}"
                    );
                }
            }
        }
    }

    #[test]
    fn flag_values_match_dpdk() {
        use dpdk_sys::bits;
        assert_eq!(RX_RSS_HASH, bits::RTE_MBUF_F_RX_RSS_HASH);
        assert_eq!(RX_IP_CKSUM_GOOD, bits::RTE_MBUF_F_RX_IP_CKSUM_GOOD);
        assert_eq!(RX_IP_CKSUM_BAD, bits::RTE_MBUF_F_RX_IP_CKSUM_BAD);
        assert_eq!(RX_L4_CKSUM_GOOD, bits::RTE_MBUF_F_RX_L4_CKSUM_GOOD);
        assert_eq!(RX_L4_CKSUM_BAD, bits::RTE_MBUF_F_RX_L4_CKSUM_BAD);
        assert_eq!(
            PTYPE_L3_IPV4_EXT_UNKNOWN,
            dpdk_sys::RTE_PTYPE_L3_IPV4_EXT_UNKNOWN
        );
        assert_eq!(
            PTYPE_L3_IPV6_EXT_UNKNOWN,
            dpdk_sys::RTE_PTYPE_L3_IPV6_EXT_UNKNOWN
        );
        assert_eq!(PTYPE_L4_FRAG, dpdk_sys::RTE_PTYPE_L4_FRAG);
        assert_eq!(PTYPE_L4_UDP, dpdk_sys::RTE_PTYPE_L4_UDP);
    }
}
