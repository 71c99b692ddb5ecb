//! RX queues: an RQ of scatter entries kept full of buffers, a CQ of received frames. Each burst
//! polls CQEs, hands the filled buffers up, re-posts fresh ones (allocated in bulk, once per
//! burst) in the same slots, then updates the RQ doorbell record and the CQ consumer index once.
//! When the pool runs dry the frames are dropped and counted and their buffers stay posted, so
//! no ring slot is ever lost.
//!
//! Generic over the buffer ([`RxBuf`]): mbufs under DPDK, plain buffers in tests.

use std::sync::atomic::Ordering;

use mlx4_prm::{cqe_opcode, rx_status};

use crate::hw::{Device, HwError};
use crate::mem::{DmaArray, Lkeys, MemSource, Mr};
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

/// Reads an RX CQE's status word and hash into mbuf metadata. Checksum flags only when the
/// application enabled RX checksum offload; the hash only with RSS.
pub fn parse_rx_cqe(status: u32, hash: u32, csum: bool, rss: bool) -> RxMeta {
    let mut m = RxMeta {
        packet_type: PTYPE_L2_ETHER,
        ..RxMeta::default()
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

/// What the RX path needs from a buffer and its pool.
pub trait RxBuf: Copy + Default {
    type Pool: Copy;
    /// Fills `out` with fresh buffers: all, or none (and returns false).
    fn alloc_bulk(pool: Self::Pool, out: &mut [Self]) -> bool;
    fn free_bulk(bufs: &[Self]);
    /// Address and size of the area the device may write.
    fn data_area(&self) -> (usize, u32);
    /// This buffer holds `len` bytes of a frame, followed by `next` (if any).
    fn set_segment(&mut self, len: u32, next: Option<Self>);
    /// This (first) buffer starts a frame of `pkt_len` bytes in `nb_segs` buffers.
    fn set_packet(&mut self, pkt_len: u32, nb_segs: u16, port: u16, meta: &RxMeta);
}

/// Receive-queue settings fixed at setup.
#[derive(Debug, Clone, Copy)]
pub struct RxConfig {
    /// Scatter entries per WQE (a power of two): 1 unless scattered RX is on.
    pub sges: u32,
    pub csum: bool,
    pub rss: bool,
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
    stats: RxStats,
    cq: CqRing,
    rq: RqRing,
    wqe_cnt: u32,
    cfg: RxConfig,
    pool: B::Pool,
    /// `wqe_cnt * sges` posted buffers, WQE-major.
    elts: DmaArray<B>,
    /// Replacement buffers of one chunk (kept here rather than zeroed on every burst).
    fresh: DmaArray<B>,
    lkeys: Lkeys,
    /// Bytes each buffer takes (they all come from one pool).
    room: u32,
    qpn: u32,
    pub qid: u16,
}

impl<B: RxBuf> RxQueue<B> {
    /// A queue of `nb_desc` buffers from `pool`, created on `dev`.
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
        let mut elts = DmaArray::new(n, B::default(), src).ok_or_else(nomem)?;
        let fresh = DmaArray::new(FRESH, B::default(), src).ok_or_else(nomem)?;
        let (cq, rq) = create_hw(dev, wqe_cnt, &cfg)?;
        let fail = |cq: CqRing, rq: RqRing, e: HwError| {
            destroy_hw(dev, cq, rq);
            Err(e)
        };
        if !B::alloc_bulk(pool, &mut elts) {
            return fail(
                cq,
                rq,
                HwError::NoMemory(format!("the mempool cannot fill {n} RX buffers")),
            );
        }
        let room = elts[0].data_area().1;
        if room == 0 {
            B::free_bulk(&elts);
            return fail(
                cq,
                rq,
                HwError::Invalid("the mempool's buffers have no data room".into()),
            );
        }
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
            fresh,
            lkeys,
            room,
            qid,
        };
        if !q.post_all_entries() {
            q.release_bufs();
            let RxQueue { cq, rq, .. } = q;
            return fail(
                cq,
                rq,
                HwError::Invalid("an RX buffer lies outside registered memory".into()),
            );
        }
        q.post_all();
        Ok(q)
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    pub fn stats(&self) -> RxStats {
        self.stats
    }

    pub fn reset_stats(&mut self) {
        self.stats.reset();
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

    /// Device stopped: start over with the same buffers on fresh device queues. If the device
    /// cannot make new ones, the old ones stay.
    pub fn reset(&mut self, dev: &dyn Device) -> Result<(), HwError> {
        let (cq, rq) = create_hw(dev, self.wqe_cnt, &self.cfg)?;
        self.qpn = rq.desc().qpn();
        let old_cq = std::mem::replace(&mut self.cq, cq);
        let old_rq = std::mem::replace(&mut self.rq, rq);
        destroy_hw(dev, old_cq, old_rq);
        self.rq_ci = 0;
        // Buffers outside registered memory never made it into the ring; they fail again here.
        self.post_all_entries();
        self.post_all();
        Ok(())
    }

    /// Destroys the device queues, then frees the posted buffers. A queue dropped without this
    /// leaves its device queues (and their memory) to the backend, and leaks its buffers.
    pub fn destroy(self, dev: &dyn Device) {
        let RxQueue { cq, rq, elts, .. } = self;
        // The device must stop writing into the buffers before they go back to the pool.
        destroy_hw(dev, cq, rq);
        B::free_bulk(&elts);
    }

    /// Writes scatter entry `i` for the buffer in `elts[i]`.
    fn post(&mut self, i: usize) -> bool {
        let (addr, room) = self.elts[i].data_area();
        let Some(lkey) = self.lkeys.lookup(addr, room as usize) else {
            return false;
        };
        let mut d = self.rq.entry_mut(i);
        d.set_addr(addr as u64);
        d.set_lkey(lkey);
        d.set_byte_count(room);
        true
    }

    /// Writes scatter entry `i` as one the device cannot use (no room, invalid key).
    fn post_empty(&mut self, i: usize) {
        let mut d = self.rq.entry_mut(i);
        d.set_addr(0);
        d.set_lkey(mlx4_prm::INVALID_LKEY);
        d.set_byte_count(0);
    }

    /// Receives up to `out.len()` frames.
    pub fn burst(&mut self, out: &mut [B]) -> usize {
        let mut got = 0;
        let mut consumed = false;
        while got < out.len() {
            // A chunk's replacements must fit `fresh`, whatever the frames' sizes.
            let want = (out.len() - got)
                .min(CHUNK)
                .min(FRESH / self.cfg.sges as usize)
                .max(1);
            // Take the chunk's CQEs first so one bulk allocation covers all its frames; an
            // error CQE (frame too long for the posted buffers) takes no buffer.
            let mut cqes = [(0u32, 0u32, 0u32, 0usize); CHUNK];
            let mut n = 0;
            let mut need = 0usize;
            while n < want {
                let Some(c) = self.cq.poll() else { break };
                let len = c.byte_cnt();
                let k = if c.opcode() == cqe_opcode::ERROR {
                    0
                } else {
                    self.segments_for(len)
                };
                need += k;
                cqes[n] = (len, c.status(), c.immed_rss_invalid(), k);
                n += 1;
            }
            if n == 0 {
                break;
            }
            consumed = true;
            let mut fresh = std::mem::take(&mut self.fresh);
            let alloc_ok = B::alloc_bulk(self.pool, &mut fresh[..need]);
            let mut f = 0;
            for &(len, status, hash, k) in &cqes[..n] {
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
                let meta = parse_rx_cqe(status, hash, self.cfg.csum, self.cfg.rss);
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
            self.fresh = fresh;
            if n < want {
                break;
            }
        }
        if consumed {
            self.cq.update_ci();
            self.post_all();
        }
        got
    }

    /// Buffers a frame of `len` bytes takes (at least 1).
    fn segments_for(&self, len: u32) -> usize {
        (len.div_ceil(self.room).max(1) as usize).min(self.cfg.sges as usize)
    }

    fn release_bufs(&mut self) {
        B::free_bulk(&self.elts);
        self.elts.fill(B::default());
    }
}

/// Creates a CQ and an RQ of `wqe_cnt` WQEs completing into it.
fn create_hw(dev: &dyn Device, wqe_cnt: u32, cfg: &RxConfig) -> Result<(CqRing, RqRing), HwError> {
    let socket = cfg.source.socket();
    let cq = dev.create_cq(wqe_cnt, socket)?;
    match dev.create_rq(wqe_cnt, cfg.sges, &cq, socket) {
        Ok(rq) => Ok((CqRing::new(cq), RqRing::new(rq))),
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
