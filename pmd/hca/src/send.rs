//! What a send WQE asks for: decoding and validating its segments (spec 1.2-1.5, section 10's
//! error rules) and assembling the frame(s) it puts on the wire.

use mlx4_prm::{ins_vlan, opcode, syndrome, CtrlSeg, DataSeg, InlineHdr, DS_SIZE, INLINE_ALIGN};

use crate::net;
use crate::tables::MrTable;

/// Largest frame the device assembles or accepts.
pub(crate) const MAX_FRAME: usize = 65536;

/// One piece of a frame as a send WQE describes it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Seg {
    /// Bytes inside the WQE.
    Inline { off: usize, len: usize },
    /// Bytes in a registered region (MR slot, offset in it).
    Data { mr: usize, off: usize, len: usize },
}

/// A validated SEND or LSO WQE.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Send {
    pub(crate) srcrb: u32,
    /// TPID and TCI to insert after the MAC addresses.
    pub(crate) vlan: Option<(u16, u16)>,
    /// Large send: MSS and header template length (before any VLAN insert).
    pub(crate) lso: Option<(usize, usize)>,
    /// Frames this WQE puts on the wire.
    pub(crate) frames: usize,
    /// Bytes of those frames.
    pub(crate) len: usize,
    /// Bytes gathered from host memory.
    pub(crate) dma_len: usize,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Validate `wqe` (its DS bytes); for a SEND or LSO the segments land in `segs`. Returns the
/// send (`None` for a NOP), or the syndrome of the error CQE it earns. `bf_posted`: a BlueFlame
/// write announced this WQE, so bytes 4-6 hold its QPN (`bf_qpn`), not a VLAN request.
pub(crate) fn decode(
    wqe: &[u8],
    bf_posted: bool,
    mrs: &MrTable,
    segs: &mut Vec<Seg>,
) -> Result<Option<Send>, u8> {
    let ctrl = CtrlSeg::new_unchecked(wqe);
    let srcrb = ctrl.srcrb_flags();
    let op = ctrl.opcode();
    match op {
        opcode::NOP => return Ok(None),
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
    let len = wqe.len();
    let mut off = CtrlSeg::<&[u8]>::LEN;
    let mut total = 0usize;
    let mut lso = None;
    if op == opcode::LSO {
        let (mss, hdr, end) = lso_header(wqe, off)?;
        segs.push(Seg::Inline {
            off: off + 4,
            len: hdr,
        });
        total = hdr;
        lso = Some((mss, hdr));
        off = end.next_multiple_of(DS_SIZE);
    }
    let mut dma_len = 0usize;
    while off < len {
        let seg = if InlineHdr(be32(wqe, off)).is_inline() {
            inline_segment(wqe, &mut off)?
        } else {
            data_segment(wqe, &mut off, total, mrs)?
        };
        match seg {
            Some(s @ Seg::Inline { len, .. }) => {
                segs.push(s);
                total += len;
            }
            Some(s @ Seg::Data { len, .. }) => {
                segs.push(s);
                total += len;
                dma_len += len;
            }
            None => {}
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
    Ok(Some(Send {
        srcrb,
        vlan,
        lso,
        frames,
        len: bytes,
        dma_len,
    }))
}

/// The LSO segment at `off`: `mss_hdr_size` (mss << 16 | header length), then the header
/// template. Returns MSS, header length and where the template ends.
fn lso_header(wqe: &[u8], off: usize) -> Result<(usize, usize, usize), u8> {
    if wqe.len() < off + 4 {
        return Err(syndrome::LOCAL_LENGTH);
    }
    let mss_hdr = be32(wqe, off);
    let (mss, hdr) = ((mss_hdr >> 16) as usize, (mss_hdr & 0xffff) as usize);
    let end = off + 4 + hdr;
    if end > wqe.len() {
        return Err(syndrome::LOCAL_LENGTH);
    }
    if mss == 0 || net::tso_template(&wqe[off + 4..end]).is_none() {
        return Err(syndrome::LOCAL_QP_OP);
    }
    Ok((mss, hdr, end))
}

/// The inline segment at `*off` (advanced past it); `None` for an empty one.
fn inline_segment(wqe: &[u8], off: &mut usize) -> Result<Option<Seg>, u8> {
    let at = *off;
    let n = InlineHdr(be32(wqe, at)).len();
    if n == 0 {
        // A zero-length gather entry, or an empty inline segment: 16 bytes, no data.
        *off += DS_SIZE;
        return Ok(None);
    }
    let end = at
        .checked_add(InlineHdr::LEN + n)
        .ok_or(syndrome::LOCAL_LENGTH)?;
    if end > wqe.len() {
        return Err(syndrome::LOCAL_LENGTH);
    }
    if at / INLINE_ALIGN != (end - 1) / INLINE_ALIGN {
        return Err(syndrome::LOCAL_QP_OP);
    }
    *off = end.next_multiple_of(DS_SIZE);
    Ok(Some(Seg::Inline {
        off: at + InlineHdr::LEN,
        len: n,
    }))
}

/// The gather entry at `*off` (advanced past it), checked against the registered memory.
fn data_segment(
    wqe: &[u8],
    off: &mut usize,
    total: usize,
    mrs: &MrTable,
) -> Result<Option<Seg>, u8> {
    let at = *off;
    let end = at + DataSeg::<&[u8]>::LEN;
    if end > wqe.len() {
        return Err(syndrome::LOCAL_LENGTH);
    }
    let d = DataSeg::new_unchecked(&wqe[at..end]);
    // A zero byte_count with bit 31 clear means 2 GiB, which no frame can be.
    let n = match d.byte_count() {
        0 => return Err(syndrome::LOCAL_LENGTH),
        n => n as usize,
    };
    if total + n > MAX_FRAME {
        return Err(syndrome::LOCAL_LENGTH);
    }
    let (mr, rel) = mrs
        .resolve(d.lkey(), d.addr(), n)
        .ok_or(syndrome::LOCAL_PROT)?;
    *off = end;
    Ok(Some(Seg::Data {
        mr,
        off: rel,
        len: n,
    }))
}

/// Assemble the frame `segs` describe (inline bytes from `wqe`, gather bytes from registered
/// memory) into `frame`, with the VLAN tag inserted and checksums filled as `send` asks.
/// LSO payloads are left whole for [`net::for_each_tso_segment`].
pub(crate) fn assemble(wqe: &[u8], segs: &[Seg], mrs: &MrTable, send: &Send, frame: &mut Vec<u8>) {
    frame.clear();
    for seg in segs {
        match *seg {
            Seg::Inline { off, len } => frame.extend_from_slice(&wqe[off..off + len]),
            Seg::Data { mr, off, len } => {
                let at = frame.len();
                frame.resize(at + len, 0);
                mrs.mem(mr).read(off, &mut frame[at..]);
            }
        }
    }
    if let Some((tpid, tci)) = send.vlan {
        let n = frame.len();
        frame.resize(n + 4, 0);
        frame.copy_within(12..n, 16);
        frame[12..14].copy_from_slice(&tpid.to_be_bytes());
        frame[14..16].copy_from_slice(&tci.to_be_bytes());
    }
    if send.lso.is_none() {
        let ip = send.srcrb & mlx4_prm::srcrb::IP_CSUM != 0;
        let l4 = send.srcrb & mlx4_prm::srcrb::TCP_UDP_CSUM != 0;
        if ip || l4 {
            net::fill_tx_checksums(frame, ip, l4);
        }
    }
}
