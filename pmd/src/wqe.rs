//! Building send WQEs in ring memory: inline WQEs (data copied into the descriptor, split at
//! 64-byte boundaries with a header per piece) and gather WQEs (one data segment per buffer).
//! Pure byte work on the slice the ring hands out; the owner word is not written here.

use mlx4_prm::{
    fence_size, ins_vlan, srcrb, CtrlSeg, DataSeg, DS_SIZE, INLINE_ALIGN, INLINE_SEG_FLAG,
    TXBB_SIZE,
};

use crate::mmio::io_wmb;

/// Inline bytes that fit in the first TXBB after the control segment and one header.
pub const FIRST_CHUNK: usize = TXBB_SIZE - CtrlSeg::<&[u8]>::LEN - 4;
/// Inline bytes per later 64-byte chunk (one 4-byte header each).
pub const NEXT_CHUNK: usize = INLINE_ALIGN - 4;
/// Data segments a WQE can hold (63 DS less the control segment).
pub const MAX_GATHER_SEGS: usize = mlx4_prm::MAX_WQE_DS as usize - 1;

/// Offloads requested for one packet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxOffloads {
    pub ip_csum: bool,
    pub l4_csum: bool,
    pub vlan: Option<u16>,
}

/// Bytes of an inline WQE carrying `len` bytes of packet.
pub const fn inline_wqe_bytes(len: usize) -> usize {
    let chunks = if len <= FIRST_CHUNK {
        1
    } else {
        1 + (len - FIRST_CHUNK).div_ceil(NEXT_CHUNK)
    };
    CtrlSeg::<&[u8]>::LEN + len + 4 * chunks
}

/// Bytes of a gather WQE with `segs` data segments.
pub const fn gather_wqe_bytes(segs: usize) -> usize {
    CtrlSeg::<&[u8]>::LEN + segs * DS_SIZE
}

/// DS count (16-byte units) of a WQE of `bytes`.
pub const fn ds_of(bytes: usize) -> u8 {
    bytes.div_ceil(DS_SIZE) as u8
}

/// Fills the control segment except the owner word.
pub fn write_ctrl(wqe: &mut [u8], ds: u8, off: TxOffloads, signaled: bool) {
    let mut ctrl = CtrlSeg::new_unchecked(&mut wqe[..CtrlSeg::<&[u8]>::LEN]);
    // RAW_PACKET QPs take the solicit bit as "no ICRC"; every mlx4 driver sets it.
    let mut flags = srcrb::SOLICIT;
    if signaled {
        flags |= srcrb::CQ_UPDATE;
    }
    if off.ip_csum {
        flags |= srcrb::IP_CSUM;
    }
    if off.l4_csum {
        flags |= srcrb::TCP_UDP_CSUM;
    }
    match off.vlan {
        Some(tci) => {
            ctrl.set_vlan_tag(tci);
            ctrl.set_ins_vlan(ins_vlan::CVLAN);
        }
        None => {
            ctrl.set_vlan_tag(0);
            ctrl.set_ins_vlan(0);
        }
    }
    ctrl.set_fence_size(ds & fence_size::DS_MASK);
    ctrl.set_srcrb_flags(flags);
    ctrl.set_imm(0);
}

/// Copies the packet's segments into inline chunks. `wqe` spans the whole WQE (whole TXBBs);
/// `len` is the sum of the segment lengths.
pub fn write_inline<'a>(wqe: &mut [u8], len: usize, mut segs: impl Iterator<Item = &'a [u8]>) {
    let first_seg = segs.next().unwrap_or(&[]);
    if first_seg.len() == len {
        // One segment, the common case: whole chunks, the first one of a constant size.
        copy_chunks(wqe, first_seg);
    } else {
        copy_pieces(wqe, std::iter::once(first_seg).chain(segs));
    }
    write_inline_headers(wqe, len);
}

fn copy_chunks(wqe: &mut [u8], pkt: &[u8]) {
    let data = CtrlSeg::<&[u8]>::LEN + 4;
    if pkt.len() <= FIRST_CHUNK {
        wqe[data..data + pkt.len()].copy_from_slice(pkt);
        return;
    }
    wqe[data..TXBB_SIZE].copy_from_slice(&pkt[..FIRST_CHUNK]);
    for (i, piece) in pkt[FIRST_CHUNK..].chunks(NEXT_CHUNK).enumerate() {
        let at = TXBB_SIZE * (i + 1) + 4;
        wqe[at..at + piece.len()].copy_from_slice(piece);
    }
}

/// Any number of segments, split wherever a 64-byte chunk ends.
fn copy_pieces<'a>(wqe: &mut [u8], segs: impl Iterator<Item = &'a [u8]>) {
    // Position of the next data byte and the end of the current chunk.
    let mut pos = CtrlSeg::<&[u8]>::LEN + 4;
    let mut chunk_end = TXBB_SIZE;
    for mut s in segs {
        while !s.is_empty() {
            if pos == chunk_end {
                pos += 4; // the next chunk's header, written below
                chunk_end += INLINE_ALIGN;
            }
            let n = s.len().min(chunk_end - pos);
            wqe[pos..pos + n].copy_from_slice(&s[..n]);
            pos += n;
            s = &s[n..];
        }
    }
}

/// The chunk headers, the later ones behind a barrier.
fn write_inline_headers(wqe: &mut [u8], len: usize) {
    let ctrl = CtrlSeg::<&[u8]>::LEN;
    let first = len.min(FIRST_CHUNK);
    put_be32(wqe, ctrl, INLINE_SEG_FLAG | first as u32);
    // Later headers are the first dwords of their TXBBs: the device must never see one
    // valid before the data behind it.
    let mut rest = len - first;
    if rest > 0 {
        io_wmb();
        let mut at = TXBB_SIZE;
        while rest > 0 {
            let n = rest.min(NEXT_CHUNK);
            put_be32(wqe, at, INLINE_SEG_FLAG | n as u32);
            rest -= n;
            at += INLINE_ALIGN;
        }
    }
}

/// Writes data segments for `(addr, len, lkey)` buffers. Address and key first, then each
/// byte count behind a barrier, so a prefetching device never pairs a valid count with a stale
/// address.
pub fn write_gather(wqe: &mut [u8], segs: &[(u64, u32, u32)]) {
    let base = CtrlSeg::<&[u8]>::LEN;
    for (i, &(addr, _, lkey)) in segs.iter().enumerate() {
        let at = base + i * DS_SIZE;
        let mut d = DataSeg::new_unchecked(&mut wqe[at..at + DS_SIZE]);
        d.set_lkey(lkey);
        d.set_addr(addr);
    }
    io_wmb();
    for (i, &(_, len, _)) in segs.iter().enumerate() {
        let at = base + i * DS_SIZE;
        DataSeg::new_unchecked(&mut wqe[at..at + DS_SIZE]).set_byte_count(len);
    }
}

fn put_be32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_sizes_match_mlx4_en() {
        // One segment: ALIGN(len + 16 + 4, 16); two: ALIGN(len + 16 + 8, 16) (spec 1.4).
        assert_eq!(ds_of(inline_wqe_bytes(44)), 4);
        assert_eq!(ds_of(inline_wqe_bytes(17)), 3);
        assert_eq!(ds_of(inline_wqe_bytes(45)), 5);
        assert_eq!(ds_of(inline_wqe_bytes(104)), 8);
        assert_eq!(inline_wqe_bytes(104), 128);
        // The largest threshold fills 63 DS exactly.
        assert_eq!(
            ds_of(inline_wqe_bytes(crate::devargs::MAX_TXQ_INLINE as usize)),
            63
        );
        assert!(
            ds_of(inline_wqe_bytes(
                crate::devargs::MAX_TXQ_INLINE as usize + 1
            )) > 63
        );
    }

    #[test]
    fn inline_layout_bytes() {
        let pkt: Vec<u8> = (0..110u8).collect();
        let mut wqe = [0xeeu8; 192];
        write_inline(&mut wqe, 110, [&pkt[..30], &pkt[30..]].into_iter());
        assert_eq!(&wqe[16..20], &[0x80, 0, 0, 44]);
        assert_eq!(&wqe[20..64], &pkt[..44]);
        assert_eq!(&wqe[64..68], &[0x80, 0, 0, 60]);
        assert_eq!(&wqe[68..128], &pkt[44..104]);
        assert_eq!(&wqe[128..132], &[0x80, 0, 0, 6]);
        assert_eq!(&wqe[132..138], &pkt[104..]);
        assert_eq!(wqe[138], 0xee, "nothing written past the data");
    }

    #[test]
    fn one_segment_and_many_lay_out_the_same() {
        let pkt: Vec<u8> = (0..928u32).map(|i| (i * 31 + 7) as u8).collect();
        for len in 1..=928 {
            let bytes = inline_wqe_bytes(len).div_ceil(TXBB_SIZE) * TXBB_SIZE;
            let (mut one, mut many) = (vec![0xeeu8; bytes], vec![0xeeu8; bytes]);
            write_inline(&mut one, len, std::iter::once(&pkt[..len]));
            let cuts = [len / 3, len / 3 + len / 4, len];
            let pieces = [
                &pkt[..cuts[0]],
                &pkt[cuts[0]..cuts[1]],
                &pkt[cuts[1]..cuts[2]],
            ];
            write_inline(&mut many, len, pieces.into_iter());
            assert_eq!(one, many, "len {len}");
        }
    }

    #[test]
    fn ctrl_and_gather_bytes() {
        let mut wqe = [0u8; 64];
        write_ctrl(
            &mut wqe,
            3,
            TxOffloads {
                ip_csum: true,
                l4_csum: true,
                vlan: Some(0x0123),
            },
            true,
        );
        assert_eq!(
            &wqe[4..16],
            &[0x01, 0x23, 0x40, 3, 0, 0, 0, 0x3e, 0, 0, 0, 0]
        );
        write_gather(
            &mut wqe,
            &[(0x1122_3344_5566_7788, 1500, 0xabcd), (0x10, 7, 0x42)],
        );
        assert_eq!(
            &wqe[16..32],
            &[0, 0, 0x05, 0xdc, 0, 0, 0xab, 0xcd, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]
        );
        assert_eq!(&wqe[32..36], &[0, 0, 0, 7]);
    }
}
