//! What a send WQE asks for: decoding and validating its segments (doc/prm.md 1.2-1.5, section 10's
//! error rules) and assembling the frame(s) it puts on the wire.
//!
//! Decoding runs once per WQE and is most of the device's cost on the null wire, so it walks
//! the WQE in DS units (16 bytes, the unit every segment starts on) with fixed-size reads, and
//! keeps the rare large send (LSO) on a path of its own.

use mlx4_prm::{
    ins_vlan, opcode, owner_opcode, syndrome, DataSeg, InlineHdr, DS_SIZE, INLINE_ALIGN,
    INLINE_SEG_FLAG, MAX_WQE_DS,
};

use crate::net;
use crate::shape::Shape;
use crate::tables::MrTable;
use crate::types::{Verdict, MAX_FRAME};

/// DS units a WQE buffer holds: the 6-bit DS field's range, rounded up to whole TXBBs.
pub(crate) const WQE_UNITS: usize = 64;
const _: () = assert!(WQE_UNITS > MAX_WQE_DS as usize);

/// A WQE as the device holds it while executing it, in DS units.
pub(crate) type WqeBuf = [[u8; DS_SIZE]; WQE_UNITS];

/// `Seg::mr` of bytes inside the WQE.
pub(crate) const INLINE: u32 = u32::MAX;

/// One piece of a frame as a send WQE describes it: bytes inside the WQE (`mr` is [`INLINE`],
/// `off` a byte offset in the WQE) or in a registered region (MR slot, offset in it).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Seg {
    pub(crate) mr: u32,
    pub(crate) off: u32,
    pub(crate) len: u32,
}

/// The segments of the WQE being executed: at most one per DS unit.
pub(crate) struct Segs {
    list: [Seg; WQE_UNITS],
    n: usize,
}

impl Segs {
    pub(crate) fn new() -> Segs {
        Segs {
            list: [Seg::default(); WQE_UNITS],
            n: 0,
        }
    }

    #[inline]
    fn push(&mut self, s: Seg) {
        // At most one segment per DS unit after the control segment, so this never overflows.
        if let Some(slot) = self.list.get_mut(self.n) {
            *slot = s;
            self.n += 1;
        }
    }

    pub(crate) fn as_slice(&self) -> &[Seg] {
        &self.list[..self.n]
    }

    /// The segments of a WQE whose frame is all inline: `spans` of it (byte offset, length),
    /// as [`Shape::inline_spans`] gives them.
    pub(crate) fn set_inline(&mut self, spans: &[(u16, u16)]) {
        self.n = 0;
        for &(off, len) in spans {
            self.push(Seg {
                mr: INLINE,
                off: off.into(),
                len: len.into(),
            });
        }
    }
}

#[inline(always)]
fn be32(b: &[u8; DS_SIZE], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The VLAN tag the control segment asks to insert (TPID << 16 | TCI, 0 = none), or `None` for
/// an unknown `ins_vlan`. In a WQE a BlueFlame write announced (`bf_posted`) bytes 4-6 are the
/// QPN (`bf_qpn`), not a VLAN request.
#[inline(always)]
fn vlan_insert(ctrl: &[u8; DS_SIZE], bf_posted: bool) -> Option<u32> {
    if bf_posted {
        return Some(0);
    }
    let tci = u32::from(u16::from_be_bytes([ctrl[4], ctrl[5]]));
    match ctrl[6] {
        0 => Some(0),
        ins_vlan::CVLAN => Some(0x8100 << 16 | tci),
        ins_vlan::SVLAN => Some(0x88a8 << 16 | tci),
        _ => None,
    }
}

/// Validate the `ds`-unit WQE in `wqe`; for a SEND or LSO the segments land in `segs` if `KEEP`
/// (the null wire needs only the lengths). Returns what it puts on the wire, or the syndrome of
/// the error CQE it earns.
#[inline(always)]
pub(crate) fn decode<const KEEP: bool>(
    wqe: &WqeBuf,
    ds: u8,
    bf_posted: bool,
    mrs: &MrTable,
    segs: &mut Segs,
    shape: &mut Shape,
) -> Result<Verdict, u8> {
    shape.forget();
    let v = decode_segments::<KEEP>(wqe, ds, bf_posted, mrs, segs, shape)?;
    if !bf_posted {
        shape.learn(&wqe[0], v, mrs.epoch());
        if KEEP {
            let ctrl = &wqe[0];
            let offloads = owner_opcode::IIP | owner_opcode::ILP;
            let csums = mlx4_prm::srcrb::IP_CSUM | mlx4_prm::srcrb::TCP_UDP_CSUM;
            let plain = vlan_insert(ctrl, false) == Some(0)
                && be32(ctrl, 0) & offloads == 0
                && be32(ctrl, 8) & csums == 0;
            let spans = segs.as_slice().iter();
            let spans = spans.map(|s| (s.mr == INLINE).then_some((s.off, s.len)));
            shape.learn_spans(spans, plain);
        }
    }
    Ok(v)
}

/// Every segment read and checked; the headers read are noted in `shape` (which forgets
/// everything for a large send).
#[inline(always)]
fn decode_segments<const KEEP: bool>(
    wqe: &WqeBuf,
    ds: u8,
    bf_posted: bool,
    mrs: &MrTable,
    segs: &mut Segs,
    shape: &mut Shape,
) -> Result<Verdict, u8> {
    let ctrl = &wqe[0];
    let op = (be32(ctrl, 0) & owner_opcode::OPCODE_MASK) as u8;
    if op == opcode::NOP {
        return Ok(Verdict::default());
    }
    let vlan = vlan_insert(ctrl, bf_posted).ok_or(syndrome::LOCAL_QP_OP)?;
    let ds = usize::from(ds).min(WQE_UNITS - 1);
    if KEEP {
        segs.n = 0;
    }
    let (first, lso) = match op {
        opcode::SEND => (1, None),
        opcode::LSO => {
            shape.forget();
            let l = lso_header(wqe, ds)?;
            segs.n = 0;
            segs.push(Seg {
                mr: INLINE,
                off: (DS_SIZE + 4) as u32,
                len: l.hdr,
            });
            (l.next_unit, Some(l))
        }
        _ => return Err(syndrome::LOCAL_QP_OP),
    };
    let hdr = lso.map_or(0, |l| l.hdr);
    let (total, dma) = gather::<KEEP>(wqe, first, ds, hdr, mrs, segs, shape)?;
    if total == 0 || (vlan != 0 && total < 12) {
        return Err(syndrome::LOCAL_LENGTH);
    }
    let tag = if vlan != 0 { 4 } else { 0 };
    Ok(match lso {
        None => Verdict {
            frames: 1,
            len: total + tag,
            dma,
        },
        Some(l) => {
            let n = net::tso_segments((total - l.hdr) as usize, l.mss as usize) as u32;
            Verdict {
                frames: n,
                len: total + (n - 1) * l.hdr + n * tag,
                dma,
            }
        }
    })
}

/// The inline and gather segments from DS unit `u` to `ds`, after `total` bytes already in the
/// frame: (frame bytes, bytes gathered from host memory).
#[inline(always)]
fn gather<const KEEP: bool>(
    wqe: &WqeBuf,
    mut u: usize,
    ds: usize,
    mut total: u32,
    mrs: &MrTable,
    segs: &mut Segs,
    shape: &mut Shape,
) -> Result<(u32, u32), u8> {
    let len = ds * DS_SIZE;
    let mut dma = 0u32;
    while u < ds {
        let unit = &wqe[u];
        let hdr = be32(unit, 0);
        if hdr & INLINE_SEG_FLAG != 0 {
            shape.note_inline(u, unit);
            let n = (hdr & !INLINE_SEG_FLAG) as usize;
            if n == 0 {
                // A zero-length gather entry, or an empty inline segment: 16 bytes, no data.
                u += 1;
                continue;
            }
            let start = u * DS_SIZE + InlineHdr::LEN;
            let end = start + n;
            if end > len {
                return Err(syndrome::LOCAL_LENGTH);
            }
            // Header and data must lie in one 64-byte block of the WQE.
            if (u * DS_SIZE) ^ (end - 1) >= INLINE_ALIGN {
                return Err(syndrome::LOCAL_QP_OP);
            }
            if KEEP {
                segs.push(Seg {
                    mr: INLINE,
                    off: start as u32,
                    len: n as u32,
                });
            }
            total += n as u32;
            u = end.div_ceil(DS_SIZE);
        } else {
            let d = DataSeg::new_unchecked(&unit[..]);
            // A zero byte_count with bit 31 clear means 2 GiB, which no frame can be.
            if hdr == 0 || total as usize + hdr as usize > MAX_FRAME {
                return Err(syndrome::LOCAL_LENGTH);
            }
            let (mr, off) = mrs
                .resolve(d.lkey(), d.addr(), hdr as usize)
                .ok_or(syndrome::LOCAL_PROT)?;
            let mem = mrs.mem(mr);
            shape.note_gather(u, unit, mem.base() as u64, mem.len() as u64);
            if KEEP {
                segs.push(Seg {
                    mr: mr as u32,
                    off: off as u32,
                    len: hdr,
                });
            }
            total += hdr;
            dma += hdr;
            u += 1;
        }
    }
    Ok((total, dma))
}

#[derive(Debug, Clone, Copy)]
struct Lso {
    mss: u32,
    hdr: u32,
    /// The DS unit after the header template.
    next_unit: usize,
}

/// The LSO segment after the control segment: `mss_hdr_size` (mss << 16 | header length), then
/// the header template, padded to 16 bytes.
#[cold]
fn lso_header(wqe: &WqeBuf, ds: usize) -> Result<Lso, u8> {
    let flat = wqe.as_flattened();
    let len = ds * DS_SIZE;
    let off = DS_SIZE;
    if len < off + 4 {
        return Err(syndrome::LOCAL_LENGTH);
    }
    let mss_hdr = be32(&wqe[1], 0);
    let (mss, hdr) = (mss_hdr >> 16, mss_hdr & 0xffff);
    let end = off + 4 + hdr as usize;
    if end > len {
        return Err(syndrome::LOCAL_LENGTH);
    }
    if mss == 0 || net::tso_template(&flat[off + 4..end]).is_none() {
        return Err(syndrome::LOCAL_QP_OP);
    }
    Ok(Lso {
        mss,
        hdr,
        next_unit: end.div_ceil(DS_SIZE),
    })
}

/// Assemble the frame `segs` of a validated WQE describe (inline bytes from `wqe`, gather bytes
/// from registered memory) into `frame`, with the VLAN tag inserted and checksums filled as the
/// control segment asks. For a large send, returns MSS and header length (VLAN tag included)
/// with the payload left whole for [`net::for_each_tso_segment`].
pub(crate) fn assemble(
    wqe: &WqeBuf,
    segs: &Segs,
    mrs: &MrTable,
    (bf_posted, pro): (bool, bool),
    frame: &mut Vec<u8>,
) -> Option<(usize, usize)> {
    let flat = wqe.as_flattened();
    frame.clear();
    for s in segs.as_slice() {
        let (off, len) = (s.off as usize, s.len as usize);
        if s.mr == INLINE {
            frame.extend_from_slice(&flat[off..off + len]);
        } else {
            let at = frame.len();
            frame.resize(at + len, 0);
            mrs.mem(s.mr as usize).read(off, &mut frame[at..]);
        }
    }
    let ctrl = &wqe[0];
    let vlan = vlan_insert(ctrl, bf_posted).unwrap_or(0);
    if vlan != 0 {
        let n = frame.len();
        frame.resize(n + 4, 0);
        frame.copy_within(12..n, 16);
        frame[12..16].copy_from_slice(&vlan.to_be_bytes());
    }
    let tag = if vlan != 0 { 4 } else { 0 };
    if be32(ctrl, 0) & owner_opcode::OPCODE_MASK == u32::from(opcode::LSO) {
        let mss_hdr = be32(&wqe[1], 0);
        return Some(((mss_hdr >> 16) as usize, (mss_hdr & 0xffff) as usize + tag));
    }
    // A ConnectX-3 Pro fills a VXLAN frame's inner checksums first (IIP/ILP), then the outer
    // ones the srcrb flags ask for, which cover the inner bytes. Other adapters ignore IIP/ILP.
    let dw0 = be32(ctrl, 0);
    let (iip, ilp) = (dw0 & owner_opcode::IIP != 0, dw0 & owner_opcode::ILP != 0);
    if pro && (iip || ilp) {
        net::fill_inner_checksums(frame, iip, ilp);
    }
    let srcrb = be32(ctrl, 8);
    let ip = srcrb & mlx4_prm::srcrb::IP_CSUM != 0;
    let l4 = srcrb & mlx4_prm::srcrb::TCP_UDP_CSUM != 0;
    if ip || l4 {
        net::fill_tx_checksums(frame, ip, l4);
    }
    None
}
