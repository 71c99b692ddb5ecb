//! The device: queue contexts (what firmware would keep in ICM) and the device loop that executes
//! send WQEs, writes CQEs and delivers received frames, following `mlx4-prm.md` section 10.

use std::sync::Arc;

use mlx4_prm::{
    cqe_opcode, cqe_owner, fence_size, ins_vlan, opcode, owner_opcode, srcrb, syndrome, wqe_txbbs,
    Cqe, CtrlSeg, DataSeg, InlineHdr, CQE_SIZE, DS_SIZE, INLINE_ALIGN, INVALID_LKEY,
    SEND_DOORBELL_OFFSET, TXBB_SIZE,
};

use crate::dma::{DevPage, HostMem};
use crate::net;
use crate::rss::{RssFields, DEFAULT_RSS_KEY, RSS_KEY_LEN};
use crate::wire::{RxPort, TxOutcome, WirePort};
use crate::{Caps, Counters, HcaError, QueueState, SqInfo};

/// First QPN handed out: real adapters reserve the low QPNs, and a zero QPN would make a
/// BlueFlame copy's first qword indistinguishable from an untouched register.
pub(crate) const QPN_BASE: u32 = 0x40;
/// First CQN handed out.
pub(crate) const CQN_BASE: u32 = 0x80;
/// Largest frame the device assembles or accepts.
pub(crate) const MAX_FRAME: usize = 65536;
/// Received frames handled per poll, so TX doorbells are not starved by a receive flood.
const RX_BUDGET: usize = 64;
/// Times a BlueFlame copy is re-read while it still differs from ring memory, before the device
/// gives up on it as torn.
const BF_REREADS: u32 = 256;
/// Largest DS count (the 6-bit field).
const MAX_DS_BYTES: usize = 63 * DS_SIZE;

#[derive(Debug)]
struct Mr {
    lkey: u32,
    mem: HostMem,
}

#[derive(Debug)]
struct Cq {
    ring: HostMem,
    cnt: u32,
    ci_db: HostMem,
    /// Free-running producer count.
    pi: u32,
    users: u32,
}

impl Cq {
    fn has_room(&self) -> bool {
        let ci = self.ci_db.load_be32(0).unwrap_or(0) & 0x00ff_ffff;
        (self.pi.wrapping_sub(ci) & 0x00ff_ffff) < self.cnt
    }

    /// Write one CQE with this pass's owner bit, publishing the owner byte last.
    fn push(&mut self, mut cqe: [u8; CQE_SIZE], counters: &mut Counters) {
        let owner = if self.pi & self.cnt != 0 {
            cqe_owner::OWNER
        } else {
            0
        };
        cqe[CQE_SIZE - 1] = (cqe[CQE_SIZE - 1] & !cqe_owner::OWNER) | owner;
        let off = (self.pi & (self.cnt - 1)) as usize * CQE_SIZE;
        self.ring.write_publish_last(off, &cqe);
        self.pi = self.pi.wrapping_add(1);
        counters.cqes += 1;
        if cqe[CQE_SIZE - 1] & cqe_owner::OPCODE_MASK == cqe_opcode::ERROR {
            counters.error_cqes += 1;
        }
    }
}

/// How far the device should walk a send queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    Idle,
    /// A BlueFlame write: up to and including the WQE at this 16-bit counter.
    UpTo(u16),
    /// A UAR doorbell: until the first WQE the device does not own.
    All,
}

#[derive(Debug)]
struct Bf {
    page: usize,
    reg: usize,
    half_size: usize,
    halves: [HostMem; 2],
    /// First qword of the last arrival in each half (the device zeroes it in the register).
    first: [[u8; 8]; 2],
    /// Counter of a whole (WC) copy waiting in each half to be used for its WQE.
    pending: [Option<u16>; 2],
}

#[derive(Debug)]
struct Sq {
    qpn: u32,
    ring: HostMem,
    cnt: u32,
    cqn: u32,
    /// Free-running consumer, in TXBBs.
    ci: u32,
    state: QueueState,
    uar: usize,
    db: HostMem,
    bf: Option<Bf>,
    walk: Walk,
    stalled: bool,
    /// Per TXBB slot: a BlueFlame write announced the WQE starting there. Its control segment's
    /// bytes 4-6 are then the QPN (drivers write it into the ring copy too), not a VLAN request.
    bf_marks: Vec<bool>,
}

#[derive(Debug)]
struct Rq {
    qpn: u32,
    ring: HostMem,
    cnt: u32,
    sges: u32,
    cqn: u32,
    db: HostMem,
    /// Free-running consumer, in WQEs.
    ci: u32,
    state: QueueState,
    stalled: bool,
}

#[derive(Debug)]
enum Qp {
    Sq(Sq),
    Rq(Rq),
}

/// One piece of a frame as a send WQE describes it.
#[derive(Debug, Clone, Copy)]
enum Seg {
    /// Bytes inside the WQE.
    Inline { off: usize, len: usize },
    /// Bytes in a registered region (index into the MR table, offset in it).
    Data { mr: usize, off: usize, len: usize },
}

/// A validated send WQE.
#[derive(Debug, Clone, Copy)]
struct Send {
    srcrb: u32,
    /// TPID and TCI to insert after the MAC addresses.
    vlan: Option<(u16, u16)>,
    /// Large send: MSS and header template length (before any VLAN insert).
    lso: Option<(usize, usize)>,
    /// Frames this WQE puts on the wire.
    frames: usize,
    /// Bytes of those frames.
    len: usize,
    dma_len: usize,
}

/// Reused buffers, so steady-state traffic does not allocate.
struct Scratch {
    wqe: [u8; MAX_DS_BYTES],
    bf: Vec<u8>,
    /// A second read of the same copy: a copy is trusted only when two reads agree.
    bf_again: Vec<u8>,
    segs: Vec<Seg>,
    frame: Vec<u8>,
    /// One LSO segment being built.
    seg: Vec<u8>,
}

pub(crate) struct DevState {
    pub(crate) caps: Caps,
    wc: bool,
    mrs: Vec<Option<Mr>>,
    mr_gen: u8,
    cqs: Vec<Option<Cq>>,
    qps: Vec<Option<Qp>>,
    /// Where the next QPN search starts, so a destroyed queue's number is not reused at once.
    qp_cursor: usize,
    uar_pages: Vec<DevPage>,
    free_uars: Vec<usize>,
    bf_pages: Vec<DevPage>,
    free_bfs: Vec<(usize, usize)>,
    pub(crate) wire: WirePort,
    port: Arc<RxPort>,
    /// RX indirection table (RQ QPNs); empty = all RQs.
    steering: Vec<u32>,
    rss_key: [u8; RSS_KEY_LEN],
    rss_fields: RssFields,
    /// Destination-MAC filter; `None` = promiscuous.
    rx_filter: Option<RxFilter>,
    /// Largest L3 length received.
    mtu: u16,
    pub(crate) counters: Counters,
    scratch: Box<Scratch>,
}

/// What a non-promiscuous port accepts besides broadcast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RxFilter {
    mac: [u8; 6],
    allmulti: bool,
}

impl RxFilter {
    fn accepts(&self, dst: &[u8]) -> bool {
        // Broadcast is a multicast address too, but is accepted without allmulti.
        dst == self.mac || dst == [0xff; 6] || (self.allmulti && dst[0] & 1 != 0)
    }
}

/// The MTU a port starts with (standard Ethernet).
pub(crate) const DEFAULT_MTU: u16 = 1500;

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl DevState {
    pub(crate) fn new(caps: Caps, wc: bool, port: Arc<RxPort>) -> Self {
        DevState {
            caps,
            wc,
            mrs: Vec::new(),
            mr_gen: 0,
            cqs: Vec::new(),
            qps: Vec::new(),
            qp_cursor: 0,
            uar_pages: Vec::new(),
            free_uars: Vec::new(),
            bf_pages: Vec::new(),
            free_bfs: Vec::new(),
            wire: WirePort::Null,
            port,
            steering: Vec::new(),
            rss_key: DEFAULT_RSS_KEY,
            rss_fields: RssFields::ALL,
            rx_filter: None,
            mtu: DEFAULT_MTU,
            counters: Counters::default(),
            scratch: Box::new(Scratch {
                wqe: [0; MAX_DS_BYTES],
                bf: Vec::with_capacity(4096),
                bf_again: Vec::with_capacity(4096),
                segs: Vec::with_capacity(64),
                frame: Vec::with_capacity(MAX_FRAME + 8),
                seg: Vec::with_capacity(MAX_FRAME + 8),
            }),
        }
    }

    // ---------------------------------------------------------------- control path ("firmware")

    pub(crate) fn reg_mr(&mut self, mem: HostMem) -> Result<u32, HcaError> {
        let slot = match self.mrs.iter().position(Option::is_none) {
            Some(s) => s,
            None if self.mrs.len() < 0xfffe => {
                self.mrs.push(None);
                self.mrs.len() - 1
            }
            None => return Err(HcaError::NoResources("memory regions")),
        };
        // The low byte is a generation so a stale lkey of a recycled slot is refused; never 0 so
        // slot 0 can never produce INVALID_LKEY (0x100).
        self.mr_gen = self.mr_gen.checked_add(1).unwrap_or(1);
        let lkey = ((slot as u32 + 1) << 8) | u32::from(self.mr_gen);
        debug_assert_ne!(lkey, INVALID_LKEY);
        self.mrs[slot] = Some(Mr { lkey, mem });
        Ok(lkey)
    }

    fn mr_slot(&self, lkey: u32) -> Option<usize> {
        mr_lookup(&self.mrs, lkey)
    }

    pub(crate) fn dereg_mr(&mut self, lkey: u32) -> Result<(), HcaError> {
        let slot = self
            .mr_slot(lkey)
            .ok_or(HcaError::NotFound("memory region", lkey))?;
        self.mrs[slot] = None;
        Ok(())
    }

    pub(crate) fn create_cq(
        &mut self,
        ring: HostMem,
        cnt: u32,
        ci_db: HostMem,
    ) -> Result<u32, HcaError> {
        let slot = match self.cqs.iter().position(Option::is_none) {
            Some(s) => s,
            None if (self.cqs.len() as u32) < self.caps.max_cqs => {
                self.cqs.push(None);
                self.cqs.len() - 1
            }
            None => return Err(HcaError::NoResources("CQs")),
        };
        // Pass 0 expects OWNER = 0 from the device, so every entry starts hardware-owned.
        let mut init = [0u8; CQE_SIZE];
        init[CQE_SIZE - 1] = cqe_owner::OWNER;
        for i in 0..cnt as usize {
            ring.write_publish_last(i * CQE_SIZE, &init);
        }
        self.cqs[slot] = Some(Cq {
            ring,
            cnt,
            ci_db,
            pi: 0,
            users: 0,
        });
        Ok(CQN_BASE + slot as u32)
    }

    fn cq_mut(&mut self, cqn: u32) -> Option<&mut Cq> {
        let slot = cqn.checked_sub(CQN_BASE)? as usize;
        self.cqs.get_mut(slot)?.as_mut()
    }

    pub(crate) fn destroy_cq(&mut self, cqn: u32) -> Result<(), HcaError> {
        let cq = self.cq_mut(cqn).ok_or(HcaError::NotFound("CQ", cqn))?;
        if cq.users > 0 {
            return Err(HcaError::Busy(cqn));
        }
        self.cqs[(cqn - CQN_BASE) as usize] = None;
        Ok(())
    }

    fn alloc_qp_slot(&mut self) -> Result<usize, HcaError> {
        let n = self.qps.len();
        if let Some(k) = (0..n)
            .map(|k| (self.qp_cursor + k) % n)
            .find(|&s| self.qps[s].is_none())
        {
            self.qp_cursor = k + 1;
            return Ok(k);
        }
        if (n as u32) < self.caps.max_qps {
            self.qps.push(None);
            self.qp_cursor = n + 1;
            return Ok(n);
        }
        Err(HcaError::NoResources("QPs"))
    }

    pub(crate) fn create_sq(
        &mut self,
        ring: HostMem,
        cnt: u32,
        cqn: u32,
    ) -> Result<SqInfo, HcaError> {
        self.cq_mut(cqn).ok_or(HcaError::NotFound("CQ", cqn))?;
        let slot = self.alloc_qp_slot()?;
        let qpn = QPN_BASE + slot as u32;
        let uar = self.free_uars.pop().unwrap_or_else(|| {
            self.uar_pages.push(DevPage::new());
            self.uar_pages.len() - 1
        });
        let page = &self.uar_pages[uar];
        page.clear();
        let db = page.view(SEND_DOORBELL_OFFSET, 4);
        let uar_ptr = page.as_ptr();
        let (bf, bf_reg) = if self.caps.bf_reg_size == 0 {
            (None, None)
        } else {
            let size = self.caps.bf_reg_size as usize;
            let (pg, reg) = self.free_bfs.pop().unwrap_or_else(|| {
                self.bf_pages.push(DevPage::new());
                let pg = self.bf_pages.len() - 1;
                let per = self.caps.bf_regs_per_page as usize;
                self.free_bfs.extend((1..per).rev().map(|r| (pg, r)));
                (pg, 0)
            });
            let page = &self.bf_pages[pg];
            let half = size / 2;
            let halves = [
                page.view(reg * size, half),
                page.view(reg * size + half, half),
            ];
            halves[0].fill(0, half, 0);
            halves[1].fill(0, half, 0);
            let reg_ptr = page.as_ptr().wrapping_add(reg * size);
            (
                Some(Bf {
                    page: pg,
                    reg,
                    half_size: half,
                    halves,
                    first: [[0; 8]; 2],
                    pending: [None; 2],
                }),
                Some(crate::BfReg {
                    reg: reg_ptr,
                    half_size: half,
                }),
            )
        };
        self.cq_mut(cqn).expect("checked above").users += 1;
        self.qps[slot] = Some(Qp::Sq(Sq {
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
        }));
        Ok(SqInfo {
            qpn,
            uar: uar_ptr,
            bf: bf_reg,
        })
    }

    pub(crate) fn create_rq(
        &mut self,
        ring: HostMem,
        cnt: u32,
        sges: u32,
        cqn: u32,
        db: HostMem,
    ) -> Result<u32, HcaError> {
        self.cq_mut(cqn).ok_or(HcaError::NotFound("CQ", cqn))?;
        let slot = self.alloc_qp_slot()?;
        self.cq_mut(cqn).expect("checked above").users += 1;
        let qpn = QPN_BASE + slot as u32;
        self.qps[slot] = Some(Qp::Rq(Rq {
            qpn,
            ring,
            cnt,
            sges,
            cqn,
            db,
            ci: 0,
            state: QueueState::Ready,
            stalled: false,
        }));
        Ok(qpn)
    }

    fn qp_slot(&self, qpn: u32) -> Option<usize> {
        let s = qpn.checked_sub(QPN_BASE)? as usize;
        self.qps.get(s)?.as_ref().map(|_| s)
    }

    pub(crate) fn destroy_sq(&mut self, qpn: u32) -> Result<(), HcaError> {
        let slot = self.qp_slot(qpn).ok_or(HcaError::NotFound("SQ", qpn))?;
        if !matches!(self.qps[slot], Some(Qp::Sq(_))) {
            return Err(HcaError::NotFound("SQ", qpn));
        }
        let Some(Qp::Sq(sq)) = self.qps[slot].take() else {
            unreachable!("checked above")
        };
        self.free_uars.push(sq.uar);
        if let Some(bf) = sq.bf {
            self.free_bfs.push((bf.page, bf.reg));
        }
        if let Some(cq) = self.cq_mut(sq.cqn) {
            cq.users -= 1;
        }
        Ok(())
    }

    pub(crate) fn destroy_rq(&mut self, qpn: u32) -> Result<(), HcaError> {
        let slot = self.qp_slot(qpn).ok_or(HcaError::NotFound("RQ", qpn))?;
        let Some(Qp::Rq(rq)) = &self.qps[slot] else {
            return Err(HcaError::NotFound("RQ", qpn));
        };
        let cqn = rq.cqn;
        self.qps[slot] = None;
        if let Some(cq) = self.cq_mut(cqn) {
            cq.users -= 1;
        }
        Ok(())
    }

    pub(crate) fn sq_state(&self, qpn: u32) -> Result<QueueState, HcaError> {
        match self.qp_slot(qpn).and_then(|s| self.qps[s].as_ref()) {
            Some(Qp::Sq(sq)) => Ok(sq.state),
            _ => Err(HcaError::NotFound("SQ", qpn)),
        }
    }

    pub(crate) fn rq_state(&self, qpn: u32) -> Result<QueueState, HcaError> {
        match self.qp_slot(qpn).and_then(|s| self.qps[s].as_ref()) {
            Some(Qp::Rq(rq)) => Ok(rq.state),
            _ => Err(HcaError::NotFound("RQ", qpn)),
        }
    }

    // ---------------------------------------------------------------- device loop

    /// One pass over every doorbell word, BlueFlame half and the receive inbox; returns the work
    /// items done (0 = idle).
    pub(crate) fn poll(&mut self) -> usize {
        let mut work = 0;
        for slot in 0..self.qps.len() {
            if !matches!(self.qps[slot], Some(Qp::Sq(_))) {
                continue;
            }
            let Some(Qp::Sq(mut sq)) = self.qps[slot].take() else {
                unreachable!("checked above")
            };
            work += self.poll_sq(&mut sq);
            self.qps[slot] = Some(Qp::Sq(sq));
        }
        work += self.poll_rx();
        if work > 0 {
            self.wire.flush();
        }
        work
    }

    fn poll_sq(&mut self, sq: &mut Sq) -> usize {
        let mut work = 0;
        // Read-only until something is there, so the driver's cache line is not stolen per poll.
        if sq.db.load_be32(0).unwrap_or(0) != 0 {
            let v = sq.db.take_be32(0).unwrap_or(0);
            work += 1;
            self.counters.doorbells += 1;
            if mlx4_prm::doorbell_qpn(v.to_be_bytes()) == sq.qpn {
                sq.walk = Walk::All;
            } else {
                self.counters.doorbells_bad_qpn += 1;
            }
        }
        if let Some(bf) = sq.bf.as_mut() {
            for h in 0..2 {
                // Read-only while nothing arrives; an arrival is consumed by zeroing its first
                // qword (only if unchanged), like the swap on the UAR doorbell word.
                let Some(q) = bf.halves[h].load_bytes8(0) else {
                    continue;
                };
                if q == [0; 8] || !bf.halves[h].clear_bytes8_if(0, q) {
                    continue;
                }
                bf.first[h] = q;
                work += 1;
                self.counters.bf_bursts += 1;
                let ctrl = CtrlSeg::new_unchecked(&q[..]);
                let c = ctrl.bf_counter();
                let ahead = u32::from(c.wrapping_sub(sq.ci as u16));
                if ctrl.bf_qpn() != sq.qpn || ahead >= sq.cnt {
                    self.counters.bf_ignored += 1;
                    continue;
                }
                sq.bf_marks[usize::from(c) & (sq.cnt as usize - 1)] = true;
                if self.wc {
                    bf.pending[h] = Some(c);
                } else {
                    // Without write combining the copy trickles in as 8-byte stores; only its
                    // first qword (QPN and counter) is trusted, as a doorbell.
                    let bytes = wqe_txbbs(ctrl.ds().max(1)) as usize * TXBB_SIZE;
                    self.counters.bf_torn += 1;
                    self.counters.bf_pieces += (bytes.min(bf.half_size) / 8) as u64;
                    bf.pending[h] = None;
                }
                sq.walk = match sq.walk {
                    Walk::All => Walk::All,
                    Walk::UpTo(old) if u32::from(old.wrapping_sub(sq.ci as u16)) > ahead => {
                        Walk::UpTo(old)
                    }
                    _ => Walk::UpTo(c),
                };
            }
        }
        if sq.walk != Walk::Idle {
            work += self.walk_sq(sq);
        }
        work
    }

    /// Execute WQEs from the consumer on, as far as `sq.walk` allows and the device owns them.
    fn walk_sq(&mut self, sq: &mut Sq) -> usize {
        let mut done = 0;
        loop {
            if sq.state == QueueState::Error {
                sq.walk = Walk::Idle;
                break;
            }
            let counter = sq.ci as u16;
            match sq.walk {
                Walk::Idle => break,
                Walk::UpTo(c) if u32::from(c.wrapping_sub(counter)) >= sq.cnt => {
                    sq.walk = Walk::Idle;
                    break;
                }
                _ => {}
            }
            let off = (sq.ci & (sq.cnt - 1)) as usize * TXBB_SIZE;
            let dw0 = sq.ring.load_be32(off).unwrap_or(0);
            let parity = sq.ci & sq.cnt != 0;
            let fence_size = sq.ring.load_be32(off + 4).unwrap_or(0) as u8;
            let ds = fence_size & fence_size::DS_MASK;
            if (dw0 & owner_opcode::OWNER != 0) != parity || ds == 0 {
                // Not (yet) handed to the device: the doorbell is used up.
                sq.walk = Walk::Idle;
                break;
            }
            let len = usize::from(ds) * DS_SIZE;
            let txbbs = wqe_txbbs(ds);
            let cqn = sq.cqn;
            let oversized = len > self.caps.max_wqe_size as usize || txbbs > sq.cnt;
            if !oversized {
                read_ring(&sq.ring, sq.cnt, off, &mut self.scratch.wqe[..len]);
            }
            // A whole BlueFlame copy of this WQE may replace the fetch from ring memory.
            let bf_half = sq
                .bf
                .as_ref()
                .and_then(|bf| (0..2).find(|&h| bf.pending[h] == Some(counter)));
            let mut from_bf = false;
            if let (Some(h), false) = (bf_half, oversized) {
                let bf = sq.bf.as_mut().expect("bf_half implies bf");
                from_bf = self.take_bf_copy(bf, h, len);
                if !from_bf {
                    // Torn is a fact about the burst: decided (and counted) once.
                    bf.pending[h] = None;
                }
            }
            let slot = (sq.ci & (sq.cnt - 1)) as usize;
            let bf_posted = sq.bf_marks[slot];
            let result = if oversized {
                Err(syndrome::LOCAL_QP_OP)
            } else {
                self.decode(len, bf_posted)
            };
            let wants_cqe = match result {
                Err(_) => true,
                Ok((_, srcrb_flags)) => srcrb_flags & srcrb::CQ_UPDATE == srcrb::CQ_UPDATE,
            };
            if wants_cqe && !self.cq_mut(cqn).is_some_and(|cq| cq.has_room()) {
                if !sq.stalled {
                    sq.stalled = true;
                    self.counters.cq_full_stalls += 1;
                }
                break;
            }
            sq.stalled = false;
            if let Some(h) = bf_half {
                sq.bf.as_mut().expect("bf_half implies bf").pending[h] = None;
            }
            if !oversized
                && len > TXBB_SIZE
                && self.scratch.wqe[TXBB_SIZE..len]
                    .chunks(TXBB_SIZE)
                    .any(|b| b.len() >= 4 && matches!(be32(b, 0) & 0x7fff_ffff, 0x7fff_ffff))
            {
                self.counters.wqe_stamp_seen += 1;
            }
            if from_bf {
                self.counters.wqe_from_bf += 1;
            } else {
                self.counters.wqe_fetched += 1;
                self.counters.wqe_fetch_bytes += len as u64;
            }
            let op = (dw0 & owner_opcode::OPCODE_MASK) as u8;
            let mut cqe = [0u8; CQE_SIZE];
            match result {
                Ok((send, _)) => {
                    if let Some(send) = send {
                        self.transmit(&send);
                    }
                    cqe[CQE_SIZE - 1] = cqe_owner::SEND | op;
                }
                Err(syn) => {
                    cqe[27] = syn;
                    cqe[CQE_SIZE - 1] = cqe_owner::SEND | cqe_opcode::ERROR;
                    sq.state = QueueState::Error;
                }
            }
            if wants_cqe {
                let mut w = Cqe::new_unchecked(&mut cqe[..]);
                w.set_qpn(sq.qpn);
                w.set_wqe_index(counter);
                let counters = &mut self.counters;
                let cq = self
                    .cqs
                    .get_mut((cqn - CQN_BASE) as usize)
                    .and_then(Option::as_mut)
                    .expect("room checked above");
                cq.push(cqe, counters);
            }
            // Every slot the WQE covered loses its mark, so a stale announcement (one naming a
            // slot inside a WQE) cannot apply to a later WQE starting there.
            for k in 0..txbbs.min(sq.cnt) {
                sq.bf_marks[(sq.ci.wrapping_add(k) & (sq.cnt - 1)) as usize] = false;
            }
            sq.ci = sq.ci.wrapping_add(txbbs);
            self.counters.txbbs += u64::from(txbbs);
            done += 1;
            if sq.walk == Walk::UpTo(counter) {
                sq.walk = Walk::Idle;
                break;
            }
        }
        // Copies for WQEs the walk has passed are of no further use.
        if let Some(bf) = sq.bf.as_mut() {
            for p in &mut bf.pending {
                if matches!(*p, Some(c) if u32::from(c.wrapping_sub(sq.ci as u16)) >= sq.cnt) {
                    *p = None;
                }
            }
        }
        done
    }

    /// Compare the copy in BlueFlame half `h` with the ring WQE in `scratch.wqe[..len]`; when it
    /// is whole, take its `srcrb_flags` (a copy may ask for a completion the ring copy does not:
    /// the WC self-test relies on it) and return true. A copy still differing after a bounded
    /// re-read is torn and ignored.
    fn take_bf_copy(&mut self, bf: &Bf, h: usize, len: usize) -> bool {
        let bytes = len.div_ceil(TXBB_SIZE) * TXBB_SIZE;
        if bytes > bf.half_size {
            self.counters.bf_torn += 1;
            return false;
        }
        let Scratch {
            bf: copy,
            bf_again: again,
            wqe,
            ..
        } = &mut *self.scratch;
        copy.resize(bytes, 0);
        again.resize(bytes, 0);
        let ring = &wqe[..len];
        for _ in 0..BF_REREADS {
            // A real BF write lands whole; here the driver's stores may still be arriving, or
            // (if the device fell behind) a newer copy may be overwriting this half. Two equal
            // reads rule out the first; the first qword, zeroed at arrival and written first
            // by any newer copy, still being zero rules out the second (stores and loads are
            // ordered on the platforms we model).
            let whole = bf.halves[h].read_qwords(0, copy)
                && bf.halves[h].read_qwords(0, again)
                && copy[8..] == again[8..]
                && bf.halves[h].load_bytes8(0) == Some([0; 8]);
            if whole && {
                // The first qword was consumed from the register at arrival; use what arrived.
                copy[..8].copy_from_slice(&bf.first[h]);
                bf_copy_matches(ring, &copy[..len])
            } {
                let flags = [copy[8], copy[9], copy[10], copy[11]];
                wqe[8..12].copy_from_slice(&flags);
                return true;
            }
            std::hint::spin_loop();
        }
        self.counters.bf_torn += 1;
        false
    }

    /// Validate the WQE in `scratch.wqe[..len]`; for a SEND, the segments land in
    /// `scratch.segs`. Returns the send (None for a NOP) and the srcrb flags, or a syndrome.
    /// `bf_posted`: a BlueFlame write announced this WQE, so bytes 4-6 hold its QPN (`bf_qpn`)
    /// and there is no VLAN request to honour or reject.
    fn decode(&mut self, len: usize, bf_posted: bool) -> Result<(Option<Send>, u32), u8> {
        let Scratch { wqe, segs, .. } = &mut *self.scratch;
        let wqe = &wqe[..len];
        let mrs = &self.mrs;
        let ctrl = CtrlSeg::new_unchecked(wqe);
        let srcrb_flags = ctrl.srcrb_flags();
        let op = ctrl.opcode();
        match op {
            opcode::NOP => return Ok((None, srcrb_flags)),
            opcode::SEND | opcode::LSO => {}
            _ => return Err(syndrome::LOCAL_QP_OP),
        }
        let vlan = match ctrl.ins_vlan() {
            _ if bf_posted => None,
            0 => None,
            ins_vlan::CVLAN => Some((0x8100, ctrl.vlan_tag())),
            ins_vlan::SVLAN => Some((0x88a8, ctrl.vlan_tag())),
            _ => return Err(syndrome::LOCAL_QP_OP),
        };
        segs.clear();
        let mut off = CtrlSeg::<&[u8]>::LEN;
        let mut total = 0usize;
        let mut dma_len = 0usize;
        let mut lso = None;
        if op == opcode::LSO {
            // mss_hdr_size (mss << 16 | header length), then the header template, padded to 16.
            if len < off + 4 {
                return Err(syndrome::LOCAL_LENGTH);
            }
            let mss_hdr = be32(wqe, off);
            let (mss, hdr) = ((mss_hdr >> 16) as usize, (mss_hdr & 0xffff) as usize);
            let end = off + 4 + hdr;
            if end > len {
                return Err(syndrome::LOCAL_LENGTH);
            }
            if mss == 0 || net::tso_template(&wqe[off + 4..end]).is_none() {
                return Err(syndrome::LOCAL_QP_OP);
            }
            segs.push(Seg::Inline {
                off: off + 4,
                len: hdr,
            });
            total = hdr;
            lso = Some((mss, hdr));
            off = end.next_multiple_of(DS_SIZE);
        }
        while off < len {
            let hdr = InlineHdr(be32(wqe, off));
            if hdr.is_inline() {
                let n = hdr.len();
                if n == 0 {
                    // Zero-length gather entry, or an empty inline segment: 16 bytes, no data.
                    off += DS_SIZE;
                    continue;
                }
                let end = off
                    .checked_add(InlineHdr::LEN + n)
                    .ok_or(syndrome::LOCAL_LENGTH)?;
                if end > len {
                    return Err(syndrome::LOCAL_LENGTH);
                }
                if off / INLINE_ALIGN != (end - 1) / INLINE_ALIGN {
                    return Err(syndrome::LOCAL_QP_OP);
                }
                segs.push(Seg::Inline {
                    off: off + InlineHdr::LEN,
                    len: n,
                });
                total += n;
                off = end.next_multiple_of(DS_SIZE);
            } else {
                let d = DataSeg::new_unchecked(&wqe[off..off + DataSeg::<&[u8]>::LEN]);
                // A zero byte_count with bit 31 clear means 2 GiB, which no frame can be.
                let n = match d.byte_count() {
                    0 => return Err(syndrome::LOCAL_LENGTH),
                    n => n as usize,
                };
                if total + n > MAX_FRAME {
                    return Err(syndrome::LOCAL_LENGTH);
                }
                let mr = mr_lookup(mrs, d.lkey()).ok_or(syndrome::LOCAL_PROT)?;
                let mem = &mrs[mr].as_ref().expect("looked up").mem;
                let rel = d.addr().wrapping_sub(mem.base() as u64);
                if d.addr() < mem.base() as u64 || rel.saturating_add(n as u64) > mem.len() as u64 {
                    return Err(syndrome::LOCAL_PROT);
                }
                segs.push(Seg::Data {
                    mr,
                    off: rel as usize,
                    len: n,
                });
                total += n;
                dma_len += n;
                off += DataSeg::<&[u8]>::LEN;
            }
            if total > MAX_FRAME {
                return Err(syndrome::LOCAL_LENGTH);
            }
        }
        if total == 0 || (vlan.is_some() && total < 12) {
            return Err(syndrome::LOCAL_LENGTH);
        }
        let tag = if vlan.is_some() { 4 } else { 0 };
        let (frames, bytes) = match lso {
            Some((mss, hdr)) => {
                let n = net::tso_segments(total - hdr, mss);
                (n, total + (n - 1) * hdr + n * tag)
            }
            None => (1, total + tag),
        };
        Ok((
            Some(Send {
                srcrb: srcrb_flags,
                vlan,
                lso,
                frames,
                len: bytes,
                dma_len,
            }),
            srcrb_flags,
        ))
    }

    /// Put a validated SEND on the wire.
    fn transmit(&mut self, send: &Send) {
        self.counters.dma_read_bytes += send.dma_len as u64;
        if !self.port.up.load(std::sync::atomic::Ordering::Relaxed) {
            self.counters.tx_drops_wire += 1;
            return;
        }
        if !self.wire.wants_bytes() {
            self.counters.tx_frames += send.frames as u64;
            self.counters.tx_bytes += send.len as u64;
            return;
        }
        let outcome = {
            let s = &mut *self.scratch;
            s.frame.clear();
            for seg in &s.segs {
                match *seg {
                    Seg::Inline { off, len } => s.frame.extend_from_slice(&s.wqe[off..off + len]),
                    Seg::Data { mr, off, len } => {
                        let at = s.frame.len();
                        s.frame.resize(at + len, 0);
                        let mr = self.mrs[mr].as_ref().expect("validated in decode");
                        mr.mem.read(off, &mut s.frame[at..]);
                    }
                }
            }
            if let Some((tpid, tci)) = send.vlan {
                let n = s.frame.len();
                s.frame.resize(n + 4, 0);
                s.frame.copy_within(12..n, 16);
                s.frame[12..14].copy_from_slice(&tpid.to_be_bytes());
                s.frame[14..16].copy_from_slice(&tci.to_be_bytes());
            }
            if let Some((mss, hdr)) = send.lso {
                let hdr = hdr + if send.vlan.is_some() { 4 } else { 0 };
                let (wire, port, counters) = (&mut self.wire, &self.port, &mut self.counters);
                net::for_each_tso_segment(&s.frame, hdr, mss, &mut s.seg, |seg| {
                    match wire.transmit(port, seg) {
                        TxOutcome::Sent => {
                            counters.tx_frames += 1;
                            counters.tx_bytes += seg.len() as u64;
                        }
                        TxOutcome::Dropped => counters.tx_drops_wire += 1,
                    }
                });
                return;
            }
            let ip = send.srcrb & srcrb::IP_CSUM != 0;
            let l4 = send.srcrb & srcrb::TCP_UDP_CSUM != 0;
            if ip || l4 {
                net::fill_tx_checksums(&mut s.frame, ip, l4);
            }
            self.wire.transmit(&self.port, &s.frame)
        };
        match outcome {
            TxOutcome::Sent => {
                self.counters.tx_frames += 1;
                self.counters.tx_bytes += send.len as u64;
            }
            TxOutcome::Dropped => self.counters.tx_drops_wire += 1,
        }
    }

    fn poll_rx(&mut self) -> usize {
        let mut work = self.wire.poll_rx(&self.port, RX_BUDGET);
        let port = self.port.clone();
        let mut n = 0;
        while n < RX_BUDGET && port.has_pending() {
            match port.with_front(|frame| self.receive(frame)) {
                Some(true) => n += 1,
                _ => break,
            }
        }
        work += n;
        work
    }

    /// Deliver one frame to a receive queue; false = keep it for later (the CQ is full).
    fn receive(&mut self, frame: &[u8]) -> bool {
        if let Some(f) = &self.rx_filter {
            if frame.len() < 6 || !f.accepts(&frame[..6]) {
                self.counters.rx_drops_filter += 1;
                return true;
            }
        }
        if net::l3_len(frame) > usize::from(self.mtu) {
            self.counters.rx_drops_mtu += 1;
            return true;
        }
        let hash = net::rss_hash(frame, &self.rss_key, self.rss_fields);
        let slot = if self.steering.is_empty() {
            let rqs = self
                .qps
                .iter()
                .filter(|q| matches!(q, Some(Qp::Rq(_))))
                .count();
            if rqs == 0 {
                self.counters.rx_drops_no_wqe += 1;
                return true;
            }
            self.qps
                .iter()
                .enumerate()
                .filter(|(_, q)| matches!(q, Some(Qp::Rq(_))))
                .nth(hash as usize % rqs)
                .map(|(s, _)| s)
        } else {
            let qpn = self.steering[hash as usize % self.steering.len()];
            self.qp_slot(qpn)
                .filter(|&s| matches!(self.qps[s], Some(Qp::Rq(_))))
        };
        let Some(slot) = slot else {
            self.counters.rx_drops_no_wqe += 1;
            return true;
        };
        let Some(Qp::Rq(mut rq)) = self.qps[slot].take() else {
            unreachable!("filtered above")
        };
        let consumed = self.receive_on(&mut rq, frame, hash);
        self.qps[slot] = Some(Qp::Rq(rq));
        consumed
    }

    /// Receive queues the flow hash spreads frames over, in indirection-table order; empty =
    /// every RQ in QPN order.
    pub(crate) fn set_steering(&mut self, qpns: &[u32]) -> Result<(), HcaError> {
        for &q in qpns {
            if !matches!(
                self.qp_slot(q).and_then(|s| self.qps[s].as_ref()),
                Some(Qp::Rq(_))
            ) {
                return Err(HcaError::NotFound("RQ", q));
            }
        }
        self.steering = qpns.to_vec();
        Ok(())
    }

    pub(crate) fn set_rss(&mut self, key: [u8; RSS_KEY_LEN], fields: RssFields) {
        self.rss_key = key;
        self.rss_fields = fields;
    }

    pub(crate) fn rss(&self) -> ([u8; RSS_KEY_LEN], RssFields) {
        (self.rss_key, self.rss_fields)
    }

    /// `None` = promiscuous; otherwise the port's MAC and whether all multicast is accepted.
    pub(crate) fn set_rx_filter(&mut self, filter: Option<([u8; 6], bool)>) {
        self.rx_filter = filter.map(|(mac, allmulti)| RxFilter { mac, allmulti });
    }

    pub(crate) fn set_mtu(&mut self, mtu: u16) {
        self.mtu = mtu;
    }

    pub(crate) fn mtu(&self) -> u16 {
        self.mtu
    }

    fn receive_on(&mut self, rq: &mut Rq, frame: &[u8], hash: u32) -> bool {
        if rq.state == QueueState::Error {
            self.counters.rx_drops_error += 1;
            return true;
        }
        let prod = rq.db.load_be32(0).unwrap_or(0) & 0xffff;
        if rq.ci & 0xffff == prod {
            self.counters.rx_drops_no_wqe += 1;
            return true;
        }
        if !self.cq_mut(rq.cqn).is_some_and(|cq| cq.has_room()) {
            if !rq.stalled {
                rq.stalled = true;
                self.counters.cq_full_stalls += 1;
            }
            return false;
        }
        rq.stalled = false;
        let stride = rq.sges as usize * DataSeg::<&[u8]>::LEN;
        let base = (rq.ci & (rq.cnt - 1)) as usize * stride;
        let mut entries = [0u8; 32 * 16];
        let entries = &mut entries[..stride];
        rq.ring.read(base, entries);

        // Check every buffer the frame needs before writing any, so a bad entry leaves memory as
        // it was.
        let mut segs = std::mem::take(&mut self.scratch.segs);
        segs.clear();
        let mut room = 0usize;
        let mut syn = None;
        for e in entries.chunks_exact(DataSeg::<&[u8]>::LEN) {
            if room >= frame.len() {
                break;
            }
            let d = DataSeg::new_unchecked(e);
            if d.lkey() == INVALID_LKEY {
                break;
            }
            let cap = (d.byte_count() & 0x7fff_ffff) as usize;
            if cap == 0 {
                continue;
            }
            let Some(mr) = self.mr_slot(d.lkey()) else {
                syn = Some(syndrome::LOCAL_PROT);
                break;
            };
            let mem = &self.mrs[mr].as_ref().expect("looked up").mem;
            let rel = d.addr().wrapping_sub(mem.base() as u64);
            if d.addr() < mem.base() as u64 || rel.saturating_add(cap as u64) > mem.len() as u64 {
                syn = Some(syndrome::LOCAL_PROT);
                break;
            }
            let take = cap.min(frame.len() - room);
            segs.push(Seg::Data {
                mr,
                off: rel as usize,
                len: take,
            });
            room += take;
        }
        if syn.is_none() && room < frame.len() {
            syn = Some(syndrome::LOCAL_LENGTH);
        }
        let mut cqe = [0u8; CQE_SIZE];
        {
            let mut w = Cqe::new_unchecked(&mut cqe[..]);
            w.set_qpn(rq.qpn);
            w.set_wqe_index(rq.ci as u16);
        }
        match syn {
            None => {
                let mut at = 0;
                for seg in &segs {
                    if let Seg::Data { mr, off, len } = *seg {
                        let mem = &self.mrs[mr].as_ref().expect("looked up").mem;
                        mem.write(off, &frame[at..at + len]);
                        at += len;
                    }
                }
                let (status, csum) = net::rx_status(frame);
                let mut w = Cqe::new_unchecked(&mut cqe[..]);
                w.set_immed_rss_invalid(hash);
                w.set_status(status);
                w.set_byte_cnt(frame.len() as u32);
                w.set_checksum(csum);
                w.set_owner_sr_opcode(cqe_opcode::RX_SEND);
                self.counters.rx_frames += 1;
                self.counters.rx_bytes += frame.len() as u64;
                self.counters.dma_write_bytes += frame.len() as u64;
            }
            Some(s) => {
                cqe[27] = s;
                cqe[CQE_SIZE - 1] = cqe_opcode::ERROR;
                if s == syndrome::LOCAL_LENGTH {
                    self.counters.rx_drops_too_long += 1;
                } else {
                    self.counters.rx_drops_error += 1;
                    rq.state = QueueState::Error;
                }
            }
        }
        self.scratch.segs = segs;
        let counters = &mut self.counters;
        let cq = self
            .cqs
            .get_mut((rq.cqn - CQN_BASE) as usize)
            .and_then(Option::as_mut)
            .expect("room checked above");
        cq.push(cqe, counters);
        rq.ci = rq.ci.wrapping_add(1);
        true
    }
}

/// The MR table slot of `lkey`, if it is live.
fn mr_lookup(mrs: &[Option<Mr>], lkey: u32) -> Option<usize> {
    let slot = (lkey >> 8).checked_sub(1)? as usize;
    match mrs.get(slot)? {
        Some(mr) if mr.lkey == lkey => Some(slot),
        _ => None,
    }
}

/// Copy `dst.len()` bytes of the ring from byte offset `off`, wrapping at the end: a WQE's later
/// TXBBs may sit at the start of the ring.
fn read_ring(ring: &HostMem, cnt: u32, off: usize, dst: &mut [u8]) {
    let size = cnt as usize * TXBB_SIZE;
    let first = dst.len().min(size - off);
    let (a, b) = dst.split_at_mut(first);
    ring.read(off, a);
    if !b.is_empty() {
        ring.read(0, b);
    }
}

/// Whether a BlueFlame copy is the ring WQE, allowing for what the copy legitimately changes:
/// the counter in dword 0, QPN/DS in dword 1, and the srcrb flags.
fn bf_copy_matches(ring: &[u8], copy: &[u8]) -> bool {
    let mask = !owner_opcode::BF_COUNTER_MASK;
    be32(ring, 0) & mask == be32(copy, 0) & mask && ring[12..] == copy[12..]
}
