//! Building send WQEs in ring memory: inline WQEs (data copied into the descriptor, split at
//! 64-byte boundaries with a header per piece) and gather WQEs (one data segment per buffer).
//! Pure format work through the ring's [`WqeMut`]; the owner word is not written here.
//!
//! Two paths sit side by side, and the queue picks one per packet:
//! - the straight-line path, for a *plain* packet (one segment, no offload requested) whose
//!   length fits a class: [`write_plain_inline1`] (1..=[`FIRST_CHUNK`] bytes, one TXBB),
//!   [`write_plain_inline2`] (up to [`PLAIN_INLINE_MAX`], two TXBBs) and
//!   [`write_plain_gather`] (one data segment). Each writes into a `WqeMut` whose size is a
//!   compile-time constant, so its bounds checks fold away, and is a fixed sequence of
//!   stores: the control segment from constants and the size, the inline headers, and the
//!   copy by at most two overlapping fixed-size moves per chunk ([`WqeMut::put_small`]), with
//!   no loop over segments and no library call. This is where a packet's cost is decided, so
//!   it does nothing a plain packet does not need;
//! - the general path, for everything else (offloads, VLAN insertion, several segments,
//!   inline WQEs beyond two TXBBs): [`write_ctrl`], [`write_inline`] and [`write_gather`],
//!   which walk the segments and split them at every 64-byte boundary.
//!
//! Both produce the same bytes for a plain packet (tested below and in `tx_step`). The
//! straight-line writers serve a burst of one too (`TxQueue::post_one`), through a writer of
//! the same constant size made in place ([`crate::ring::SqRing::wqe_fixed`]).

use mlx4_prm::{
    fence_size, inline_header, ins_vlan, srcrb, CtrlSeg, DataSeg, DS_SIZE, INLINE_ALIGN,
    INLINE_SEG_FLAG, TXBB_SIZE,
};

use crate::mmio::io_wmb;
use crate::ring::WqeMut;

const CTRL_LEN: usize = CtrlSeg::<&[u8]>::LEN;
/// Inline bytes that fit in the first TXBB after the control segment and one header.
pub const FIRST_CHUNK: usize = TXBB_SIZE - CTRL_LEN - 4;
/// Inline bytes per later 64-byte chunk (one 4-byte header each).
pub const NEXT_CHUNK: usize = INLINE_ALIGN - 4;
/// Longest packet the straight-line inline path takes: two TXBBs, mlx4_en's `MAX_INLINE`.
pub const PLAIN_INLINE_MAX: usize = FIRST_CHUNK + NEXT_CHUNK;
/// The two-TXBB lengths whose second chunk is 16 to 32 bytes, copied by exactly two 16-byte
/// moves ([`WqeMut::put_small`]'s first case): every minimum-size Ethernet frame (60 bytes,
/// 64 with room for the FCS). A loop that knows a length is in this class needs no other
/// test to write it.
pub const PLAIN_SHORT2_MIN: usize = FIRST_CHUNK + 16;
pub const PLAIN_SHORT2_MAX: usize = FIRST_CHUNK + 32;
/// `PLAIN_SHORT2_MAX - PLAIN_SHORT2_MIN`: a length `len` is in the class when
/// `len.wrapping_sub(PLAIN_SHORT2_MIN) <= PLAIN_SHORT2_SPAN`, the test the class's writer
/// repeats (and a caller's identical one folds).
pub const PLAIN_SHORT2_SPAN: usize = PLAIN_SHORT2_MAX - PLAIN_SHORT2_MIN;
/// Data segments a WQE can hold (63 DS less the control segment).
pub const MAX_GATHER_SEGS: usize = mlx4_prm::MAX_WQE_DS as usize - 1;

/// Offloads requested for one packet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxOffloads {
    /// The IP header checksum (the outer one of a tunnelled packet).
    pub ip_csum: bool,
    pub l4_csum: bool,
    pub vlan: Option<u16>,
    /// TCP segmentation: an LSO WQE.
    pub tso: Option<Tso>,
    /// A tunnelled (VXLAN) packet's inner IP and L4 checksums: owner_opcode IIP and ILP.
    pub inner_ip_csum: bool,
    pub inner_l4_csum: bool,
}

impl TxOffloads {
    /// Bits the owner word carries besides OWNER, when they are not a plain SEND's.
    pub fn owner_bits(&self) -> Option<u32> {
        let mut bits = if self.tso.is_some() {
            u32::from(mlx4_prm::opcode::LSO) | mlx4_prm::owner_opcode::RR
        } else {
            u32::from(mlx4_prm::opcode::SEND)
        };
        if self.inner_ip_csum {
            bits |= mlx4_prm::owner_opcode::IIP;
        }
        if self.inner_l4_csum {
            bits |= mlx4_prm::owner_opcode::ILP;
        }
        (bits != u32::from(mlx4_prm::opcode::SEND)).then_some(bits)
    }
}

/// A large send: segments of `mss` payload bytes, each behind a copy of the first `hdr_len`
/// bytes (L2 to L4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tso {
    pub mss: u16,
    pub hdr_len: u16,
}

/// Bytes of an LSO WQE with a header of `hdr_len` and `segs` data segments.
pub const fn lso_wqe_bytes(hdr_len: usize, segs: usize) -> usize {
    CTRL_LEN + mlx4_prm::lso_seg_len(hdr_len) + segs * DS_SIZE
}

/// Writes the LSO segment (after the control segment) and the data segments after it. The
/// header's dwords that start a TXBB are written last, behind a barrier, as are byte counts:
/// a prefetching device never sees a TXBB's first dword valid before the rest of it.
pub fn write_lso(w: &mut WqeMut<'_>, tso: Tso, hdr: &[u8], segs: &[(u64, u32, u32)]) {
    let at = CTRL_LEN + 4;
    let starts_txbb = |pos: usize| pos.is_multiple_of(TXBB_SIZE);
    let mut deferred = [(0usize, [0u8; 4]); mlx4_prm::LSO_MAX_HEADER / TXBB_SIZE + 1];
    let mut n_def = 0;
    let mut i = 0;
    while i < hdr.len() {
        let pos = at + i;
        if starts_txbb(pos) {
            let mut d = [0u8; 4];
            let k = (hdr.len() - i).min(4);
            d[..k].copy_from_slice(&hdr[i..i + k]);
            deferred[n_def] = (pos, d);
            n_def += 1;
            i += 4;
            continue;
        }
        // Up to the next TXBB start.
        let next = (pos / TXBB_SIZE + 1) * TXBB_SIZE;
        let k = (next - pos).min(hdr.len() - i);
        w.put_bytes(pos, &hdr[i..i + k]);
        i += k;
    }
    write_gather_at(w, CTRL_LEN + mlx4_prm::lso_seg_len(hdr.len()), segs);
    w.put_be32(
        CTRL_LEN,
        mlx4_prm::lso_mss_hdr_size(tso.mss, hdr.len() as u16),
    );
    if n_def > 0 {
        io_wmb();
        for &(pos, d) in &deferred[..n_def] {
            w.put_bytes(pos, &d);
        }
    }
}

/// Bytes of an inline WQE carrying `len` bytes of packet.
pub const fn inline_wqe_bytes(len: usize) -> usize {
    let chunks = if len <= FIRST_CHUNK {
        1
    } else {
        1 + (len - FIRST_CHUNK).div_ceil(NEXT_CHUNK)
    };
    CTRL_LEN + len + 4 * chunks
}

/// Bytes of a gather WQE with `segs` data segments.
pub const fn gather_wqe_bytes(segs: usize) -> usize {
    CTRL_LEN + segs * DS_SIZE
}

/// DS count (16-byte units) of a WQE of `bytes` (at most 1008, so the sum cannot overflow).
// Not `div_ceil`: its overflow-safe form costs three more instructions on the straight-line
// path.
#[allow(clippy::manual_div_ceil)]
pub const fn ds_of(bytes: usize) -> u8 {
    ((bytes + DS_SIZE - 1) / DS_SIZE) as u8
}

/// The control segment's bytes (the owner word left zero).
#[inline(always)]
fn ctrl_bytes(ds: u8, off: TxOffloads, signaled: bool) -> [u8; 16] {
    let mut b = [0u8; 16];
    let mut ctrl = CtrlSeg::new_unchecked(&mut b[..]);
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
    if let Some(tci) = off.vlan {
        ctrl.set_vlan_tag(tci);
        ctrl.set_ins_vlan(ins_vlan::CVLAN);
    }
    ctrl.set_fence_size(ds & fence_size::DS_MASK);
    ctrl.set_srcrb_flags(flags);
    b
}

/// Fills the control segment except the owner word.
#[inline]
pub fn write_ctrl<const T: usize>(w: &mut WqeMut<'_, T>, ds: u8, off: TxOffloads, signaled: bool) {
    w.put_ctrl(&ctrl_bytes(ds, off, signaled));
}

/// Turns on the completion request of a written WQE, keeping its other flags.
pub fn set_signaled(w: &mut WqeMut<'_>) {
    let at = CTRL_SRCRB;
    w.put_be32(at, w.get_be32(at) | srcrb::CQ_UPDATE);
}

/// Offset of `srcrb_flags` in the control segment (doc/prm.md 1.2), checked against the prm view
/// in the tests below.
const CTRL_SRCRB: usize = 8;

/// What a straight-line inline WQE of each packet length needs beyond constants, as stored
/// (big-endian): bytes 4-7 of its control segment (no VLAN, the size) and the one inline
/// header that depends on the length (the first chunk's for one TXBB, the second chunk's for
/// two). Two loads from one 8-byte entry in place of the size and header arithmetic. Checked
/// against [`write_ctrl`] and [`write_inline`] in the tests.
#[repr(C, align(8))]
struct PlainInline {
    dword1: [u8; 4],
    header: [u8; 4],
}

static PLAIN_INLINE: [PlainInline; PLAIN_INLINE_MAX + 1] = {
    let mut t = [const {
        PlainInline {
            dword1: [0; 4],
            header: [0; 4],
        }
    }; PLAIN_INLINE_MAX + 1];
    let mut len = 1;
    while len <= PLAIN_INLINE_MAX {
        t[len].dword1[3] = ds_of(inline_wqe_bytes(len));
        t[len].header = if len <= FIRST_CHUNK {
            inline_header(len).to_be_bytes()
        } else {
            short_inline_header((len - FIRST_CHUNK) as u8)
        };
        len += 1;
    }
    t
};

/// Bytes 8-15 of a straight-line WQE's control segment: the flags (no completion request, no
/// offload) and no immediate. Checked against [`ctrl_bytes`] in the tests.
const PLAIN_CTRL_8: [u8; 8] = {
    let f = srcrb::SOLICIT.to_be_bytes();
    [f[0], f[1], f[2], f[3], 0, 0, 0, 0]
};

/// Bytes 8-23 of a two-TXBB straight-line inline WQE before its data: [`PLAIN_CTRL_8`], the
/// first chunk's header (always a full chunk) and 4 bytes that the data then overwrites. One
/// 16-byte store of a constant that the loop keeps in a register.
const PLAIN_INLINE2_8: [u8; 16] = {
    let h = inline_header(FIRST_CHUNK).to_be_bytes();
    let c = PLAIN_CTRL_8;
    [
        c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], h[0], h[1], h[2], h[3], 0, 0, 0, 0,
    ]
};

/// Bytes 4-7 of a straight-line inline WQE's control segment, as [`WqeMut::put_dword1`] takes
/// them.
#[inline(always)]
fn plain_dword1(e: &PlainInline) -> u32 {
    u32::from_ne_bytes(e.dword1)
}

/// Bytes 4-7 of the control segment, as stored, that [`write_plain_inline1`] and
/// [`write_plain_inline2`] write for a packet of `len` bytes.
#[inline(always)]
pub fn plain_inline_dword1(len: usize) -> u32 {
    plain_dword1(&PLAIN_INLINE[len.min(PLAIN_INLINE_MAX)])
}

/// The straight-line inline WQE of a plain packet of 1..=[`FIRST_CHUNK`] bytes: one TXBB,
/// unsignaled, the layout [`write_inline`] makes, the data copied by at most two fixed-size
/// moves.
#[inline(always)]
pub fn write_plain_inline1(w: &mut WqeMut<'_, 1>, pkt: &[u8]) {
    let len = pkt.len().min(FIRST_CHUNK);
    let e = &PLAIN_INLINE[len];
    w.put_dword1(plain_dword1(e));
    w.put_array(CTRL_SRCRB, &PLAIN_CTRL_8);
    w.put_array(CTRL_LEN, &e.header);
    w.put_small(CTRL_LEN + 4, &pkt[..len]);
}

/// As [`write_plain_inline1`] for FIRST_CHUNK + 1..=[`PLAIN_INLINE_MAX`] bytes: two TXBBs, the
/// control segment's constant bytes and the first header by one store, the first chunk by
/// constant-size moves, the second by at most two.
#[inline(always)]
pub fn write_plain_inline2(w: &mut WqeMut<'_, 2>, pkt: &[u8]) {
    let len = pkt.len().min(PLAIN_INLINE_MAX);
    let e = &PLAIN_INLINE[len];
    let (head, tail) = pkt[..len].split_at(FIRST_CHUNK);
    w.put_dword1(plain_dword1(e));
    w.put_array(CTRL_SRCRB, &PLAIN_INLINE2_8);
    w.put_array::<FIRST_CHUNK>(CTRL_LEN + 4, head.try_into().expect("split at FIRST_CHUNK"));
    w.put_small(TXBB_SIZE + 4, tail);
    // The second header is the first dword of its TXBB: never valid before its data.
    io_wmb();
    w.put_array(TXBB_SIZE, &e.header);
}

/// [`write_plain_inline2`] for a length of the short class ([`PLAIN_SHORT2_MIN`] to
/// [`PLAIN_SHORT2_MAX`]): the second chunk by two 16-byte moves, no test of its length. A
/// length outside the class takes [`write_plain_inline2`]; a caller that tested the class
/// with [`PLAIN_SHORT2_SPAN`] pays nothing for that.
#[inline(always)]
pub fn write_plain_inline2_short(w: &mut WqeMut<'_, 2>, pkt: &[u8]) {
    let len = pkt.len();
    if len.wrapping_sub(PLAIN_SHORT2_MIN) > PLAIN_SHORT2_SPAN {
        return write_plain_inline2(w, pkt);
    }
    let e = &PLAIN_INLINE[len];
    let (head, tail) = pkt.split_at(FIRST_CHUNK);
    w.put_dword1(plain_dword1(e));
    w.put_array(CTRL_SRCRB, &PLAIN_INLINE2_8);
    w.put_array::<FIRST_CHUNK>(CTRL_LEN + 4, head.try_into().expect("split at FIRST_CHUNK"));
    w.put_16_to_32(TXBB_SIZE + 4, tail);
    // The second header is the first dword of its TXBB: never valid before its data.
    io_wmb();
    w.put_array(TXBB_SIZE, &e.header);
}

/// `inline_header(len)`, big-endian, for a length below 256.
#[inline(always)]
const fn short_inline_header(len: u8) -> [u8; 4] {
    [(INLINE_SEG_FLAG >> 24) as u8, 0, 0, len]
}

/// TXBBs of the straight-line inline WQE for a packet of `len` (1..=[`PLAIN_INLINE_MAX`]).
#[inline(always)]
pub const fn plain_inline_txbbs(len: usize) -> u32 {
    if len <= FIRST_CHUNK {
        1
    } else {
        2
    }
}

/// The straight-line gather WQE of a plain packet: one data segment, unsignaled.
#[inline(always)]
pub fn write_plain_gather(w: &mut WqeMut<'_, 1>, addr: u64, len: u32, lkey: u32) {
    w.put_ctrl(&ctrl_bytes(
        ds_of(gather_wqe_bytes(1)),
        TxOffloads::default(),
        false,
    ));
    put_data_seg(w, CTRL_LEN, addr, len, lkey);
}

/// Address and key first, then the byte count behind a barrier, so a prefetching device
/// never pairs a valid count with a stale address.
#[inline(always)]
fn put_data_seg<const T: usize>(w: &mut WqeMut<'_, T>, at: usize, addr: u64, len: u32, lkey: u32) {
    let mut seg = [0u8; DataSeg::<&[u8]>::LEN];
    let mut d = DataSeg::new_unchecked(&mut seg[..]);
    d.set_lkey(lkey);
    d.set_addr(addr);
    d.set_byte_count(len);
    // The byte count is the segment's first dword (doc/prm.md 1.3).
    w.put_bytes(at + 4, &seg[4..]);
    io_wmb();
    w.put_bytes(at, &seg[..4]);
}

/// Copies the packet's segments into inline chunks. `w` spans the whole WQE (whole TXBBs);
/// `len` is the sum of the segment lengths (the queue checked it). Were it not, at most `len`
/// bytes would be copied and the rest of the WQE left as it is: never a write past it.
pub fn write_inline<'a>(w: &mut WqeMut<'_>, len: usize, mut segs: impl Iterator<Item = &'a [u8]>) {
    let first_seg = segs.next().unwrap_or(&[]);
    if first_seg.len() == len {
        copy_chunks(w, first_seg);
    } else {
        copy_pieces(w, len, std::iter::once(first_seg).chain(segs));
    }
    write_inline_headers(w, len);
}

/// One segment: whole chunks, the first one of a constant size.
fn copy_chunks(w: &mut WqeMut<'_>, pkt: &[u8]) {
    let data = CTRL_LEN + 4;
    if pkt.len() <= FIRST_CHUNK {
        w.put_small(data, pkt);
        return;
    }
    let (head, rest) = pkt.split_at(FIRST_CHUNK);
    w.put_array::<FIRST_CHUNK>(data, head.try_into().expect("split at FIRST_CHUNK"));
    // Whole chunks by constant-size moves, the last part by at most two.
    let mut chunks = rest.chunks_exact(NEXT_CHUNK);
    let mut at = TXBB_SIZE + 4;
    for piece in &mut chunks {
        w.put_array::<NEXT_CHUNK>(at, piece.try_into().expect("chunks_exact"));
        at += INLINE_ALIGN;
    }
    let last = chunks.remainder();
    if !last.is_empty() {
        w.put_small(at, last);
    }
}

/// Any number of segments, split wherever a 64-byte chunk ends; `len` bytes at most.
fn copy_pieces<'a>(w: &mut WqeMut<'_>, len: usize, segs: impl Iterator<Item = &'a [u8]>) {
    // Position of the next data byte and the end of the current chunk.
    let mut pos = CTRL_LEN + 4;
    let mut chunk_end = TXBB_SIZE;
    let mut left = len;
    for s in segs {
        let mut s = &s[..s.len().min(left)];
        left -= s.len();
        while !s.is_empty() {
            if pos == chunk_end {
                pos += 4; // the next chunk's header, written below
                chunk_end += INLINE_ALIGN;
            }
            let n = s.len().min(chunk_end - pos);
            w.put_bytes(pos, &s[..n]);
            pos += n;
            s = &s[n..];
        }
    }
}

/// The chunk headers, the later ones behind a barrier.
fn write_inline_headers(w: &mut WqeMut<'_>, len: usize) {
    let first = len.min(FIRST_CHUNK);
    w.put_be32(CTRL_LEN, inline_header(first));
    // Later headers are the first dwords of their TXBBs: the device must never see one
    // valid before the data behind it.
    let mut rest = len - first;
    if rest > 0 {
        io_wmb();
        let mut at = TXBB_SIZE;
        while rest > 0 {
            let n = rest.min(NEXT_CHUNK);
            w.put_be32(at, inline_header(n));
            rest -= n;
            at += INLINE_ALIGN;
        }
    }
}

/// Writes data segments for `(addr, len, lkey)` buffers. Addresses and keys first, then each
/// byte count behind a barrier, so a prefetching device never pairs a valid count with a stale
/// address.
pub fn write_gather(w: &mut WqeMut<'_>, segs: &[(u64, u32, u32)]) {
    write_gather_at(w, CTRL_LEN, segs);
}

/// As [`write_gather`], the first data segment at byte `at` of the WQE.
fn write_gather_at(w: &mut WqeMut<'_>, at: usize, segs: &[(u64, u32, u32)]) {
    let mut seg = [0u8; DataSeg::<&[u8]>::LEN];
    for (i, &(addr, len, lkey)) in segs.iter().enumerate() {
        let mut d = DataSeg::new_unchecked(&mut seg[..]);
        d.set_lkey(lkey);
        d.set_addr(addr);
        d.set_byte_count(len);
        w.put_bytes(at + i * DS_SIZE + 4, &seg[4..]);
    }
    io_wmb();
    for (i, &(_, len, _)) in segs.iter().enumerate() {
        w.put_be32(at + i * DS_SIZE, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::SqDesc;
    use crate::mem::{DmaBuf, MemSource};
    use crate::ring::SqRing;

    /// Runs `f` on a writer over `txbbs` TXBBs pre-filled with 0xee; returns the bytes.
    #[allow(unsafe_code)]
    fn built(txbbs: u32, f: impl FnOnce(WqeMut<'_>)) -> Vec<u8> {
        let mem = DmaBuf::new(16 * TXBB_SIZE, MemSource::Heap).unwrap();
        let doorbell = std::ptr::NonNull::from(Box::leak(Box::new(0u32)));
        // SAFETY: 16 page-aligned TXBBs that live until the end of this function, past the
        // ring view; a leaked word stands in for the doorbell (never rung here).
        let desc = unsafe { SqDesc::new(mem.non_null(), 16, doorbell, None, 0x40) };
        // SAFETY: as above: the memory outlives the view, which is the only one.
        let mut sq = unsafe { SqRing::new(desc) };
        {
            let mut w = sq.wqe_mut(0, txbbs);
            let fill = vec![0xeeu8; txbbs as usize * TXBB_SIZE - 8];
            w.put_bytes(8, &fill);
            f(w);
        }
        sq.wqe_blocks(0, txbbs)
            .iter()
            .flat_map(|b| b.0.iter().copied())
            .collect()
    }

    #[test]
    fn inline_sizes_match_mlx4_en() {
        // One segment: ALIGN(len + 16 + 4, 16); two: ALIGN(len + 16 + 8, 16) (doc/prm.md 1.4).
        assert_eq!(ds_of(inline_wqe_bytes(44)), 4);
        assert_eq!(ds_of(inline_wqe_bytes(17)), 3);
        assert_eq!(ds_of(inline_wqe_bytes(45)), 5);
        assert_eq!(ds_of(inline_wqe_bytes(104)), 8);
        assert_eq!(inline_wqe_bytes(104), 128);
        assert_eq!(PLAIN_INLINE_MAX, 104);
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
        let wqe = built(3, |mut w| {
            write_inline(&mut w, 110, [&pkt[..30], &pkt[30..]].into_iter())
        });
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
            let txbbs = inline_wqe_bytes(len).div_ceil(TXBB_SIZE) as u32;
            let one = built(txbbs, |mut w| {
                write_inline(&mut w, len, std::iter::once(&pkt[..len]))
            });
            let cuts = [len / 3, len / 3 + len / 4, len];
            let pieces = [
                &pkt[..cuts[0]],
                &pkt[cuts[0]..cuts[1]],
                &pkt[cuts[1]..cuts[2]],
            ];
            let many = built(txbbs, |mut w| write_inline(&mut w, len, pieces.into_iter()));
            assert_eq!(one, many, "len {len}");
        }
    }

    #[test]
    fn straight_line_inline_matches_the_general_path() {
        let pkt: Vec<u8> = (0..PLAIN_INLINE_MAX as u32)
            .map(|i| (i * 13 + 5) as u8)
            .collect();
        for len in 1..=PLAIN_INLINE_MAX {
            let txbbs = plain_inline_txbbs(len);
            assert_eq!(txbbs, inline_wqe_bytes(len).div_ceil(TXBB_SIZE) as u32);
            let fast = built(txbbs, |w| match txbbs {
                1 => write_plain_inline1(&mut w.fixed::<1>(), &pkt[..len]),
                _ => write_plain_inline2(&mut w.fixed::<2>(), &pkt[..len]),
            });
            let general = built(txbbs, |mut w| {
                write_ctrl(
                    &mut w,
                    ds_of(inline_wqe_bytes(len)),
                    TxOffloads::default(),
                    false,
                );
                write_inline(&mut w, len, std::iter::once(&pkt[..len]));
            });
            assert_eq!(fast, general, "len {len}");
            // The size word the BlueFlame copy's head takes without reading the ring back.
            assert_eq!(
                plain_inline_dword1(len).to_ne_bytes(),
                fast[4..8],
                "len {len}"
            );
            // Only the data and its headers were written past the control segment.
            let end = if len <= FIRST_CHUNK {
                20 + len
            } else {
                68 + len - FIRST_CHUNK
            };
            assert!(fast[end..].iter().all(|&b| b == 0xee), "len {len}");
        }
    }

    #[test]
    fn the_short_class_writer_is_the_two_txbb_writer() {
        let pkt: Vec<u8> = (0..PLAIN_INLINE_MAX as u32)
            .map(|i| (i * 29 + 3) as u8)
            .collect();
        assert_eq!((PLAIN_SHORT2_MIN, PLAIN_SHORT2_MAX), (60, 76));
        // The class and, through the fallback, every other two-TXBB length.
        for len in FIRST_CHUNK + 1..=PLAIN_INLINE_MAX {
            let short = built(2, |w| {
                write_plain_inline2_short(&mut w.fixed::<2>(), &pkt[..len])
            });
            let two = built(2, |w| write_plain_inline2(&mut w.fixed::<2>(), &pkt[..len]));
            assert_eq!(short, two, "len {len}");
            assert!(
                short[68 + len - FIRST_CHUNK..].iter().all(|&b| b == 0xee),
                "len {len}"
            );
        }
    }

    #[test]
    fn straight_line_gather_matches_the_general_path() {
        let fast = built(1, |w| {
            write_plain_gather(&mut w.fixed::<1>(), 0x1122_3344_5566_7788, 1500, 0xabcd)
        });
        let general = built(1, |mut w| {
            write_ctrl(&mut w, 2, TxOffloads::default(), false);
            write_gather(&mut w, &[(0x1122_3344_5566_7788, 1500, 0xabcd)]);
        });
        assert_eq!(fast, general);
        assert_eq!(
            &fast[8..32],
            &[
                0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0x05, 0xdc, 0, 0, 0xab, 0xcd, 0x11, 0x22, 0x33,
                0x44, 0x55, 0x66, 0x77, 0x88
            ]
        );
    }

    #[test]
    fn ctrl_and_gather_bytes() {
        let off = TxOffloads {
            ip_csum: true,
            l4_csum: true,
            vlan: Some(0x0123),
            ..TxOffloads::default()
        };
        let wqe = built(1, |mut w| {
            write_ctrl(&mut w, 3, off, true);
            write_gather(
                &mut w,
                &[(0x1122_3344_5566_7788, 1500, 0xabcd), (0x10, 7, 0x42)],
            );
        });
        assert_eq!(
            &wqe[..4],
            &[0xff; 4],
            "owner word untouched (as the ring starts)"
        );
        assert_eq!(
            &wqe[4..16],
            &[0x01, 0x23, 0x40, 3, 0, 0, 0, 0x3e, 0, 0, 0, 0]
        );
        assert_eq!(
            &wqe[16..32],
            &[0, 0, 0x05, 0xdc, 0, 0, 0xab, 0xcd, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]
        );
        assert_eq!(&wqe[32..36], &[0, 0, 0, 7]);
    }

    #[test]
    fn the_length_table_is_the_general_wqe() {
        for (len, e) in PLAIN_INLINE.iter().enumerate().skip(1) {
            let ds = ds_of(inline_wqe_bytes(len));
            let ctrl = ctrl_bytes(ds, TxOffloads::default(), false);
            assert_eq!(e.dword1, ctrl[4..8], "len {len}");
            assert_eq!(PLAIN_CTRL_8, ctrl[8..16], "len {len}");
            let pkt: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let general = built(crate::ring::txbbs_for(inline_wqe_bytes(len)), |mut w| {
                write_inline(&mut w, len, std::iter::once(&pkt[..]));
            });
            let header_at = if len <= FIRST_CHUNK {
                CTRL_LEN
            } else {
                TXBB_SIZE
            };
            assert_eq!(e.header, general[header_at..header_at + 4], "len {len}");
            if len > FIRST_CHUNK {
                assert_eq!(PLAIN_INLINE2_8[8..12], general[16..20], "len {len}");
            }
        }
    }

    #[test]
    fn short_inline_header_is_the_header() {
        for n in 0..=255u8 {
            assert_eq!(
                short_inline_header(n),
                inline_header(usize::from(n)).to_be_bytes()
            );
        }
    }

    #[test]
    fn the_ring_nop_is_a_plain_control_segment() {
        for (txbbs, ds) in [(1, 4), (2, 8), (16, 63), (40, 63)] {
            for signaled in [false, true] {
                let nop = built(1, |mut w| w.put_nop(txbbs, signaled));
                let ctrl = built(1, |mut w| {
                    write_ctrl(&mut w, ds, TxOffloads::default(), signaled)
                });
                assert_eq!(nop, ctrl, "{txbbs} TXBBs, signaled {signaled}");
            }
        }
    }

    #[test]
    fn signaling_keeps_the_other_flags() {
        let off = TxOffloads {
            ip_csum: true,
            ..TxOffloads::default()
        };
        let wqe = built(1, |mut w| {
            write_ctrl(&mut w, 2, off, false);
            set_signaled(&mut w);
        });
        let c = CtrlSeg::new_unchecked(&wqe[..16]);
        assert_eq!(
            c.srcrb_flags(),
            srcrb::SOLICIT | srcrb::IP_CSUM | srcrb::CQ_UPDATE
        );
        assert_eq!(c.ds(), 2);
    }
}
