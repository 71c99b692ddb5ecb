//! The shape cache: what makes the device cheap on a run of similar WQEs.
//!
//! Whether a send WQE is valid and what it puts on the wire depends only on its control segment
//! (opcode, VLAN request, DS, flags), the first words of the segments the decoder visits (inline
//! lengths, gather byte counts and lkeys) and, for gather entries, whether the address lies in
//! its region. Drivers post long runs of WQEs that agree on all of that and differ only in
//! payload bytes and addresses. So after a full decode the device remembers the WQE's shape:
//! the control segment (without OWNER, the BlueFlame counter and the completion request) and
//! every header it read. A later WQE whose control segment and headers are the same bytes, and
//! whose gather addresses lie in the remembered regions, has the same verdict; the device checks
//! those few words straight from ring memory instead of fetching and walking the whole WQE.
//!
//! This is a pure function of what is in memory, so it changes no result: a test decodes every
//! WQE both ways. The cache is per send queue and forgotten whenever memory regions are
//! deregistered (`MrTable::epoch`).

use mlx4_prm::{opcode, owner_opcode, srcrb, DS_SIZE, TXBB_SIZE};

use crate::dma::HostMem;
use crate::types::Verdict;

/// Headers a shape can hold: one per DS unit after the control segment.
const MAX_HEADS: usize = 62;

/// How a run compares a WQE's heads. A few inline headers (a 64-byte frame inline has two)
/// are words of one span, compared in a fixed number (the first repeated to fill them): how
/// far into the WQE they reach, and each one's offset and word.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Words {
    Two(usize, [(u16, u32); 2]),
    Four(usize, [(u16, u32); 4]),
    /// Any other shape: head by head.
    Heads,
}

impl Words {
    fn of(heads: &[Head]) -> Words {
        fn fill<const K: usize>(heads: &[Head]) -> (usize, [(u16, u32); K]) {
            let word = |h: &Head| (h.at, h.raw as u32);
            let mut w = [word(&heads[0]); K];
            for (slot, h) in w.iter_mut().zip(heads) {
                *slot = word(h);
            }
            let reach = heads.iter().map(|h| usize::from(h.at) + 4).max();
            (reach.unwrap_or(0), w)
        }
        if heads.is_empty() || heads.iter().any(|h| h.gather) {
            return Words::Heads;
        }
        match heads.len() {
            ..=2 => {
                let (reach, w) = fill(heads);
                Words::Two(reach, w)
            }
            3..=4 => {
                let (reach, w) = fill(heads);
                Words::Four(reach, w)
            }
            _ => Words::Heads,
        }
    }
}

/// A segment header the decoder read.
#[derive(Debug, Clone, Copy, Default)]
struct Head {
    /// Byte offset of the segment in the WQE.
    at: u16,
    /// A gather entry (whose first 8 bytes are compared and whose address is range-checked);
    /// otherwise an inline header (first 4 bytes compared).
    gather: bool,
    /// The bytes compared, in memory order.
    raw: u64,
    /// For a gather entry: the addresses its buffer may start at, `[lo, hi]`.
    lo: u64,
    hi: u64,
}

/// What a WQE of the remembered shape does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hit {
    pub(crate) verdict: Verdict,
    pub(crate) txbbs: u32,
    /// Bytes of WQE the device would have fetched (DS * 16).
    pub(crate) wqe_bytes: u32,
    pub(crate) opcode: u8,
    /// The WQE asks for a completion.
    pub(crate) signaled: bool,
}

/// The shape of the last WQE decoded in full.
#[derive(Debug)]
pub(crate) struct Shape {
    /// The control segment as compared (see [`key`]); `None` = nothing remembered.
    key: Option<[u64; 2]>,
    heads: [Head; MAX_HEADS],
    n: usize,
    /// Heads beyond `MAX_HEADS` were read: not cacheable.
    overflow: bool,
    /// TXBBs (after the first) a head starts, as a bit set: a WQE is recalled only when every
    /// TXBB starts with a compared header, so no stamp can hide in it.
    starts: u32,
    hit: Hit,
    /// `MrTable::epoch` when learnt.
    epoch: u64,
    /// How a run compares the heads, found when the shape is learnt.
    words: Words,
    /// Where the frame lies in a WQE of the shape, when it is all inline: `spans[..n]`
    /// ([`Shape::inline_spans`]); `None` when not known.
    spans: Option<usize>,
    span_list: [(u16, u16); MAX_SPANS],
    /// The frame is those spans as they stand, its Ethernet header in the first: no VLAN tag
    /// to insert, no checksum to fill ([`Shape::plain`]).
    plain: bool,
}

/// Inline segments a shape remembers the places of; a WQE with more is decoded in full when
/// its frame is wanted.
const MAX_SPANS: usize = 16;

/// Bits of the control segment's two qwords (memory order, read as little-endian) that one
/// shape shares: all but OWNER (bit 7 of byte 0), the BlueFlame counter (bytes 1-2) and the
/// completion request (C bits of byte 11).
pub(crate) const KEY_MASK: [u64; 2] = [!(0x80 | 0xffff << 8), !((srcrb::CQ_UPDATE as u64) << 24)];

/// Bytes 4-6 of the control segment in the key's first qword: `vlan_tag` and `ins_vlan`, or in
/// a BlueFlame-announced WQE the QPN.
const BF_QPN: u64 = 0xff_ffff << 32;
/// `ins_vlan` (byte 6) in the key's first qword.
const INS_VLAN: u64 = 0xff << 48;

#[inline(always)]
fn key(ctrl: &[u8; DS_SIZE]) -> [u64; 2] {
    let (lo, hi) = ctrl.split_at(8);
    let lo = u64::from_le_bytes(lo.try_into().expect("8 bytes"));
    let hi = u64::from_le_bytes(hi.try_into().expect("8 bytes"));
    [lo & KEY_MASK[0], hi & KEY_MASK[1]]
}

impl Shape {
    pub(crate) fn new() -> Shape {
        Shape {
            key: None,
            heads: [Head::default(); MAX_HEADS],
            n: 0,
            overflow: false,
            starts: 0,
            hit: Hit {
                verdict: Verdict::default(),
                txbbs: 0,
                wqe_bytes: 0,
                opcode: 0,
                signaled: false,
            },
            epoch: 0,
            words: Words::Heads,
            spans: None,
            span_list: [(0, 0); MAX_SPANS],
            plain: false,
        }
    }

    /// Start a full decode: forget the old shape and note headers afresh.
    pub(crate) fn forget(&mut self) {
        self.key = None;
        self.spans = None;
        self.n = 0;
        self.overflow = false;
        self.starts = 0;
    }

    fn note(&mut self, h: Head) {
        let at = usize::from(h.at);
        if at % TXBB_SIZE == 0 {
            self.starts |= 1 << (at / TXBB_SIZE);
        }
        match self.heads.get_mut(self.n) {
            Some(slot) => {
                *slot = h;
                self.n += 1;
            }
            None => self.overflow = true,
        }
    }

    /// The decoder read the inline header (or empty entry) starting DS unit `u`.
    #[inline(always)]
    pub(crate) fn note_inline(&mut self, u: usize, unit: &[u8; DS_SIZE]) {
        self.note(Head {
            at: (u * DS_SIZE) as u16,
            gather: false,
            raw: u64::from(u32::from_le_bytes([unit[0], unit[1], unit[2], unit[3]])),
            lo: 0,
            hi: 0,
        });
    }

    /// The decoder accepted the gather entry in DS unit `u`, whose buffer lies in a region of
    /// `len` bytes at `base`.
    #[inline(always)]
    pub(crate) fn note_gather(&mut self, u: usize, unit: &[u8; DS_SIZE], base: u64, len: u64) {
        let n = u64::from(u32::from_be_bytes([unit[0], unit[1], unit[2], unit[3]]));
        self.note(Head {
            at: (u * DS_SIZE) as u16,
            gather: true,
            raw: u64::from_le_bytes([
                unit[0], unit[1], unit[2], unit[3], unit[4], unit[5], unit[6], unit[7],
            ]),
            lo: base,
            hi: (base + len).saturating_sub(n),
        });
    }

    /// A full decode of a WQE with control segment `ctrl` succeeded with `verdict`: remember
    /// its shape if it is a plain SEND or NOP (a large send's template is not a header) whose
    /// every TXBB starts with a header the decode read.
    pub(crate) fn learn(&mut self, ctrl: &[u8; DS_SIZE], verdict: Verdict, epoch: u64) {
        let op = ctrl[3] & owner_opcode::OPCODE_MASK as u8;
        let ds = ctrl[7] & mlx4_prm::fence_size::DS_MASK;
        let txbbs = mlx4_prm::wqe_txbbs(ds);
        let all_starts = (1u32 << txbbs) - 2;
        if self.overflow
            || !(op == opcode::SEND || op == opcode::NOP)
            || self.starts & all_starts != all_starts
        {
            return;
        }
        self.key = Some(key(ctrl));
        self.hit = Hit {
            verdict,
            txbbs,
            wqe_bytes: u32::from(ds) * DS_SIZE as u32,
            opcode: op,
            signaled: false,
        };
        self.epoch = epoch;
        self.words = Words::of(&self.heads[..self.n.min(MAX_HEADS)]);
    }

    /// The frame of the WQE just learnt lies in `segs` (each an inline span's byte offset in
    /// the WQE and length, `None` for bytes elsewhere): remember where, if it is all inline.
    /// Each inline segment's length is in its header, which a recall compares, so a WQE
    /// recalled has its frame in the same places.
    /// `plain`: the control segment asks for no VLAN tag and no checksum.
    pub(crate) fn learn_spans(
        &mut self,
        segs: impl ExactSizeIterator<Item = Option<(u32, u32)>>,
        plain: bool,
    ) {
        if self.key.is_none() || segs.len() > MAX_SPANS {
            return;
        }
        let mut n = 0;
        for s in segs {
            let Some((off, len)) = s else {
                return;
            };
            let (Ok(off), Ok(len)) = (u16::try_from(off), u16::try_from(len)) else {
                return;
            };
            self.span_list[n] = (off, len);
            n += 1;
        }
        self.spans = Some(n);
        self.plain = plain && n != 0 && usize::from(self.span_list[0].1) >= 14;
    }

    /// Whether the frame of a WQE of the remembered shape is its inline spans as they stand
    /// ([`Shape::inline_spans`]), its Ethernet header in the first.
    #[inline(always)]
    pub(crate) fn plain(&self) -> bool {
        self.spans.is_some() && self.plain
    }

    /// Where the frame of a WQE of the remembered shape lies in it (byte offset, length), if
    /// it is all inline.
    #[inline(always)]
    pub(crate) fn inline_spans(&self) -> Option<&[(u16, u16)]> {
        self.spans.map(|n| &self.span_list[..n])
    }

    /// Whether the WQE whose first TXBB sits in ring slot `slot` (its control segment already
    /// read into `ctrl`) has the remembered shape, reading its headers from `ring` (`mask` =
    /// TXBBs - 1). In a WQE a BlueFlame write announced (`bf_posted`), bytes 4-6 are the QPN,
    /// not a VLAN request: they are not compared, and such a WQE has the shape only if the
    /// remembered one inserts no VLAN (as the full decode reads it).
    #[inline(always)]
    pub(crate) fn recall(
        &self,
        ring: &HostMem,
        slot: u32,
        mask: u32,
        ctrl: &[u8; DS_SIZE],
        bf_posted: bool,
        epoch: u64,
    ) -> Option<Hit> {
        let learnt = self.key?;
        let mut k = key(ctrl);
        if bf_posted {
            if learnt[0] & INS_VLAN != 0 {
                return None;
            }
            k[0] = k[0] & !BF_QPN | learnt[0] & BF_QPN;
        }
        if learnt != k || self.epoch != epoch {
            return None;
        }
        let base = slot as usize * TXBB_SIZE;
        let heads = &self.heads[..self.n.min(MAX_HEADS)];
        let same = if slot + self.hit.txbbs > mask + 1 {
            heads_match(heads, ring, |at| {
                let txbb = (slot + (at / TXBB_SIZE) as u32) & mask;
                txbb as usize * TXBB_SIZE + at % TXBB_SIZE
            })
        } else {
            heads_match(heads, ring, |at| base + at)
        };
        if !same {
            return None;
        }
        let mut hit = self.hit;
        hit.signaled = ctrl[11] & srcrb::CQ_UPDATE as u8 == srcrb::CQ_UPDATE as u8;
        Some(hit)
    }

    /// The remembered shape as a run of WQEs checks it (`Sq::run`), while memory regions are as
    /// at `epoch`; `None` if no shape is remembered.
    #[inline(always)]
    pub(crate) fn plan(&self, epoch: u64) -> Option<Plan<'_>> {
        let key = self.key.filter(|_| self.epoch == epoch)?;
        Some(Plan {
            key,
            heads: &self.heads[..self.n.min(MAX_HEADS)],
            words: self.words,
            hit: self.hit,
        })
    }
}

impl Shape {
    /// The remembered shape as a doorbell's run checks it (`Sq::doorbell_run`): its key
    /// ([`Plan::key`]), its heads when they are a few inline headers, and what each WQE of it
    /// does; `None` if nothing is remembered while memory regions are as at `epoch`.
    #[inline(always)]
    pub(crate) fn words(&self, epoch: u64) -> Option<(&[u64; 2], &Words, &Hit)> {
        match &self.key {
            Some(key) if self.epoch == epoch => Some((key, &self.words, &self.hit)),
            _ => None,
        }
    }
}

/// A remembered shape, taken once for a run of WQEs.
pub(crate) struct Plan<'a> {
    key: [u64; 2],
    heads: &'a [Head],
    words: Words,
    /// What each WQE of the shape does (its `signaled` aside).
    pub(crate) hit: Hit,
}

impl Plan<'_> {
    /// The control segment as compared: its two qwords (memory order, little-endian) under
    /// [`KEY_MASK`].
    #[inline(always)]
    pub(crate) fn key(&self) -> [u64; 2] {
        self.key
    }

    /// How the heads are compared.
    #[inline(always)]
    pub(crate) fn words(&self) -> Words {
        self.words
    }

    /// Whether ring memory holds the heads, for the WQE at ring byte `base` lying whole
    /// before the ring's end (the head-by-head comparison of [`Words::Heads`]).
    #[inline(always)]
    pub(crate) fn heads_match(&self, ring: &HostMem, base: usize) -> bool {
        heads_match(self.heads, ring, |at| base + at)
    }

    /// [`Shape::recall`] for a run: the WQE at ring byte `base`, control segment `ctrl`, lies
    /// whole before the ring's end and no BlueFlame write announced it.
    #[inline(always)]
    pub(crate) fn matches(&self, ring: &HostMem, base: usize, ctrl: &[u8; DS_SIZE]) -> bool {
        if self.key != key(ctrl) {
            return false;
        }
        match &self.words {
            Words::Two(reach, words) => ring.words_match(base, *reach, words),
            Words::Four(reach, words) => ring.words_match(base, *reach, words),
            Words::Heads => heads_match(self.heads, ring, |at| base + at),
        }
    }
}

/// Whether ring memory holds `heads`, the one at WQE byte `at` being at ring byte `off(at)`.
#[inline(always)]
fn heads_match(heads: &[Head], ring: &HostMem, off: impl Fn(usize) -> usize) -> bool {
    heads.iter().all(|h| {
        let off = off(usize::from(h.at));
        if h.gather {
            let mut e = [0u8; DS_SIZE];
            if !ring.read_array(off, &mut e) {
                return false;
            }
            let (raw, addr) = e.split_at(8);
            let addr = u64::from_be_bytes(addr.try_into().expect("8 bytes"));
            u64::from_le_bytes(raw.try_into().expect("8 bytes")) == h.raw
                && addr >= h.lo
                && addr <= h.hi
        } else {
            let mut w = [0u8; 4];
            ring.read_array(off, &mut w) && u64::from(u32::from_le_bytes(w)) == h.raw
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dma::DevPage;
    use crate::send::{decode, Segs, WqeBuf, WQE_UNITS};
    use crate::tables::MrTable;

    /// A 64-byte inline SEND (DS 6) at ring slot `slot` of an 8-TXBB ring in `page`, with
    /// payload byte `fill` and completion request `signaled`.
    fn post(page: &DevPage, slot: usize, fill: u8, signaled: bool) -> WqeBuf {
        let mut w: WqeBuf = [[0; DS_SIZE]; WQE_UNITS];
        let flat = w.as_flattened_mut();
        flat[3] = opcode::SEND;
        flat[7] = 6;
        flat[11] = if signaled { 0x0e } else { 0x02 };
        flat[16..20].copy_from_slice(&(0x8000_0000u32 | 44).to_be_bytes());
        flat[20..64].fill(fill);
        flat[64..68].copy_from_slice(&(0x8000_0000u32 | 20).to_be_bytes());
        flat[68..88].fill(fill);
        let ring = page.view(0, 8 * TXBB_SIZE);
        for k in 0..2 {
            let at = ((slot + k) % 8) * TXBB_SIZE;
            ring.write(at, &flat[k * TXBB_SIZE..(k + 1) * TXBB_SIZE]);
        }
        w
    }

    #[test]
    fn a_wqe_of_the_learnt_shape_is_recalled_from_ring_memory() {
        let page = DevPage::new();
        let ring = page.view(0, 8 * TXBB_SIZE);
        let mrs = MrTable::default();
        let mut segs = Segs::new();
        let mut shape = Shape::new();
        let w = post(&page, 0, 0xaa, false);
        let v = decode::<false>(&w, 6, false, &mrs, &mut segs, &mut shape).unwrap();
        assert_eq!((v.frames, v.len, v.dma), (1, 64, 0));
        // Same shape, other payload, signaled: recalled, also when it wraps the ring.
        let w2 = post(&page, 2, 0x55, true);
        let hit = shape
            .recall(&ring, 2, 7, &w2[0], false, mrs.epoch())
            .expect("recalled");
        assert_eq!((hit.verdict, hit.txbbs, hit.signaled), (v, 2, true));
        let w3 = post(&page, 7, 0x11, false);
        assert!(shape
            .recall(&ring, 7, 7, &w3[0], false, mrs.epoch())
            .is_some());
        // A different second header is not the same shape.
        ring.write(3 * TXBB_SIZE + 3, &[21]);
        assert!(shape
            .recall(&ring, 2, 7, &w2[0], false, mrs.epoch())
            .is_none());
        // Nor is anything after the regions changed.
        assert!(shape
            .recall(&ring, 7, 7, &w3[0], false, mrs.epoch() + 1)
            .is_none());
    }
}
