//! A send queue's BlueFlame register as the device sees it: arrivals in either half, each a
//! doorbell up to its WQE and, with write combining, a copy of that WQE that the device latches
//! at once (checked against ring memory) and that the walk later executes in place of the ring
//! copy.

use super::*;

/// How long the device keeps re-reading a BlueFlame copy that still differs from ring memory
/// (the driver's stores may still be landing; a whole write lands in well under a microsecond)
/// before it calls the copy torn: only a writer stopped in the middle of a copy, by preemption
/// or an interrupt, leaves one incomplete that long.
const BF_PATIENCE: Duration = Duration::from_micros(100);

/// A send queue's BlueFlame register as the device sees it.
#[derive(Debug)]
pub(crate) struct Bf {
    pub(crate) slot: BfSlot,
    half_size: usize,
    pub(super) halves: [HostMem; 2],
    /// What the device keeps of the whole copy in each half, checked against ring memory when
    /// it arrived, until the walk reaches its WQE.
    pub(super) latch: [Latch; 2],
}

#[derive(Debug, Default)]
pub(super) struct Latch {
    /// The 16-bit counter of the WQE the copy is of; `None` = nothing waiting.
    pub(super) counter: Option<u16>,
    /// The copy's `srcrb_flags`: the one part of it that may differ from the ring WQE and
    /// still count (bytes 4-7 are the QPN and DS; the BF counter is in dword 0), and only by
    /// asking for a completion or an event the ring WQE does not (see `CopySrcrb`).
    srcrb: [u8; 4],
}

/// How the `srcrb_flags` of a BlueFlame copy that otherwise matches its ring WQE stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopySrcrb {
    /// The ring WQE's flags.
    Same([u8; 4]),
    /// The ring WQE's flags plus a completion or event request: what a copy may add (the WC
    /// self-test does), but also what an older write to the half leaves in the copy's second
    /// qword until this write's lands, for a writer that stores the first qword first.
    Asks([u8; 4]),
}

/// What became of a BlueFlame copy the device tried to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    /// It matches the WQE in ring memory: the walk will use it.
    Whole,
    /// A newer write to the same half began before the device had read it all.
    Superseded,
    /// It still differs from ring memory after the device re-read it, or its `srcrb_flags`
    /// drop a request of the ring WQE's.
    Torn,
}

impl Bf {
    /// Neither half holds an arrival not yet taken.
    #[inline]
    pub(super) fn quiet(&self) -> bool {
        self.halves
            .iter()
            .all(|h| h.load_bytes8(0).map_or(true, |q| q == [0; 8]))
    }

    pub(super) fn has_pending(&self) -> bool {
        self.latch.iter().any(|l| l.counter.is_some())
    }

    pub(crate) fn new(slot: BfSlot, halves: [HostMem; 2], half_size: usize) -> Bf {
        Bf {
            slot,
            half_size,
            halves,
            latch: Default::default(),
        }
    }
}

/// Bits of a WQE's first, second and later 8-byte words (memory order, read natively) that a
/// BlueFlame copy must share with the ring WQE: dword 0 but the BF counter, then bytes 12-15
/// (bytes 4-11, QPN/DS and `srcrb_flags`, may differ), then everything.
const CTRL_COMPARED: [u64; 3] = [
    u32::from_ne_bytes((!owner_opcode::BF_COUNTER_MASK).to_be_bytes()) as u64,
    u64::from_ne_bytes([0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]),
    !0,
];

/// The `srcrb_flags` of a copy's second qword `copy` against the ring WQE's `ring`: `None`
/// unless the copy's are the ring's, or the ring's plus completion or event requests.
fn compare_srcrb(ring: u64, copy: u64) -> Option<CopySrcrb> {
    let r: [u8; 8] = ring.to_ne_bytes();
    let c: [u8; 8] = copy.to_ne_bytes();
    let flags: [u8; 4] = c[..4].try_into().expect("four bytes");
    if r[..4] == c[..4] {
        return Some(CopySrcrb::Same(flags));
    }
    let added = c[3] & !r[3];
    let kept = r[3] & !c[3] == 0;
    (r[..3] == c[..3] && kept && added & !(CQ_UPDATE_BYTE | SOLICIT_BYTE) == 0)
        .then_some(CopySrcrb::Asks(flags))
}

impl Sq {
    /// BlueFlame arrivals in either half: each is a doorbell up to its WQE, and with write
    /// combining a copy of that WQE, which the device takes at once (checked against ring
    /// memory, where the driver wrote the WQE first) so that a newer write to the same half
    /// cannot spoil it later, as a real device latches a posted write when it lands.
    pub(super) fn take_bf_arrivals(&mut self, wc: bool, counters: &mut Counters) -> usize {
        // Two loads while nothing arrived (every doorbell-path poll), before the register's
        // state is moved out of the queue and back.
        if self.bf.as_ref().map_or(true, Bf::quiet) {
            return 0;
        }
        let Some(mut bf) = self.bf.take() else {
            return 0;
        };
        let mut work = 0;
        for h in 0..2 {
            // Read-only while nothing arrives.
            let Some(q) = bf.halves[h].load_bytes8(0) else {
                continue;
            };
            if q == [0; 8] {
                continue;
            }
            work += 1;
            counters.bf_bursts += 1;
            let ctrl = CtrlSeg::new_unchecked(&q[..]);
            let c = ctrl.bf_counter();
            let ahead = u32::from(c.wrapping_sub(self.ci as u16));
            if ctrl.bf_qpn() != self.qpn || ahead >= self.cnt || self.state != QueueState::Ready {
                counters.bf_ignored += 1;
            } else {
                if bf.latch[h].counter.take().is_some() {
                    // The walk never reached the copy this half held.
                    counters.bf_superseded += 1;
                }
                self.bf_marks.set(u32::from(c) & (self.cnt - 1));
                if wc {
                    match self.latch_copy(&mut bf, h, q, ahead) {
                        Taken::Whole => bf.latch[h].counter = Some(c),
                        Taken::Superseded => counters.bf_superseded += 1,
                        Taken::Torn => counters.bf_torn += 1,
                    }
                } else {
                    // Without write combining the copy trickles in as 8-byte stores; only its
                    // first qword (QPN and counter) is trusted, as a doorbell.
                    let bytes = wqe_txbbs(ctrl.ds().max(1)) as usize * TXBB_SIZE;
                    counters.bf_torn += 1;
                    counters.bf_pieces += (bytes.min(bf.half_size) / 8) as u64;
                }
                self.walk = self.walk.merge_bf(c, self.ci as u16, ahead);
            }
            // Consumed by zeroing its first qword, like the swap on the UAR doorbell word; a
            // newer write that already replaced it is found by the next look.
            bf.halves[h].clear_bytes8_if(0, q);
        }
        self.bf = Some(bf);
        work
    }

    /// Check the copy in half `h` (first qword `q`) against the WQE `ahead` TXBBs past the
    /// consumer in ring memory, in place, and latch its `srcrb_flags`. While it differs, the
    /// driver's stores may still be arriving: re-read for up to `BF_PATIENCE`; a first qword
    /// that changed means a newer write began.
    ///
    /// The copy's `srcrb_flags` are not checked against the ring, so the device cannot tell
    /// them landed: with 8-byte stores, first qword first, they are an older write's for as
    /// long as the writer takes to its second store. An older write's flags that lack the
    /// ring WQE's completion request would execute the WQE unsignaled and lose its CQE; ones
    /// that carry a request the WQE lacks would add a CQE the driver never asked for. Either
    /// way the driver's count of completions drifts from its ring, until its ring looks full
    /// for good (the txbench stall). So flags that drop a request never count (the ring's
    /// WQE runs, fetched), and flags that add one count only once they held for the whole
    /// patience, longer than any writer between two adjacent stores but a preempted one.
    fn latch_copy(&self, bf: &mut Bf, h: usize, q: [u8; 8], ahead: u32) -> Taken {
        let ds = CtrlSeg::new_unchecked(&q[..]).ds();
        let len = usize::from(ds) * DS_SIZE;
        if ds == 0 || len.next_multiple_of(TXBB_SIZE) > bf.half_size {
            return Taken::Torn;
        }
        // The WQE in ring memory, which the driver posted before writing the copy; its stores
        // may become visible after the copy's (x86 orders a `movdir64b` or WC store after
        // earlier stores only behind a fence), so it too is waited for, as briefly.
        let idx = self.ci.wrapping_add(ahead);
        let first = self.first_txbb(idx);
        let parity = idx & self.cnt != 0;
        let half = &bf.halves[h];
        let mut since = None;
        for n in 0u32.. {
            let posted = self
                .ring
                .load_be32(first as usize * TXBB_SIZE)
                .is_some_and(|w| (w & owner_opcode::OWNER != 0) == parity);
            let seen = if posted {
                self.copy_matches_ring(half, first, len)
            } else {
                None
            };
            // The copy just compared was the write announced by `q`, not part of a newer one.
            if half.load_bytes8(0) != Some(q) {
                return Taken::Superseded;
            }
            let waited =
                n % 16 == 15 && since.get_or_insert_with(Instant::now).elapsed() > BF_PATIENCE;
            match seen {
                Some(CopySrcrb::Same(srcrb)) => {
                    bf.latch[h].srcrb = srcrb;
                    return Taken::Whole;
                }
                // A request the ring WQE lacks counts only while no newer BlueFlame write is
                // known (the WC self-test makes one). Once the other half holds one, the
                // driver is posting on, and such flags are the write after that one landing in
                // this half under this write's head (a writer that stores the head last,
                // stopped between the two): taken, they would add a completion nobody asked
                // for.
                Some(CopySrcrb::Asks(_)) if waited && self.newer_bf_write(bf, h, ahead) => break,
                Some(CopySrcrb::Asks(srcrb)) if waited => {
                    bf.latch[h].srcrb = srcrb;
                    return Taken::Whole;
                }
                _ if waited => break,
                _ => std::hint::spin_loop(),
            }
        }
        // Still no posted WQE to be a copy of (the write is only a doorbell), or the copy
        // never became whole.
        Taken::Torn
    }

    /// Whether the half other than `h` holds a write, arrived or latched, for a WQE past the
    /// one `ahead` slots past the consumer. Heads land in the order they were written, so a
    /// newer write whose head is visible is seen here no later than the older one's.
    fn newer_bf_write(&self, bf: &Bf, h: usize, ahead: u32) -> bool {
        let other = 1 - h;
        let newer = |c: u16| {
            let a = u32::from(c.wrapping_sub(self.ci as u16));
            a < self.cnt && a > ahead
        };
        let arrived = bf.halves[other]
            .load_bytes8(0)
            .filter(|q| *q != [0; 8])
            .map(|q| CtrlSeg::new_unchecked(&q[..]).bf_counter());
        arrived.is_some_and(newer) || bf.latch[other].counter.is_some_and(newer)
    }

    /// Whether the first `len` bytes of the BlueFlame copy in `half` are the WQE starting at
    /// ring TXBB `first`, allowing for what a copy legitimately changes (the BF counter in
    /// dword 0, QPN and DS in dword 1, requests added to `srcrb_flags`): how the copy's
    /// `srcrb_flags` stand if so. Both are read a TXBB at a time, 8 bytes per load, as the
    /// copy lands, and neither is copied.
    fn copy_matches_ring(&self, half: &HostMem, first: u32, len: usize) -> Option<CopySrcrb> {
        let mut srcrb = CopySrcrb::Same([0; 4]);
        for k in 0..len.div_ceil(TXBB_SIZE) {
            let txbb = first.wrapping_add(k as u32) & self.txbb_mask();
            let r: [u64; TXBB_SIZE / 8] = self.ring.load_qwords(txbb as usize * TXBB_SIZE)?;
            let c: [u64; TXBB_SIZE / 8] = half.load_qwords(k * TXBB_SIZE)?;
            let qwords = (len - k * TXBB_SIZE) / 8;
            let mut diff = 0;
            for (i, (r, c)) in r.iter().zip(&c).enumerate().take(qwords) {
                let care = if k == 0 { CTRL_COMPARED[i.min(2)] } else { !0 };
                diff |= (r ^ c) & care;
            }
            if diff != 0 {
                return None;
            }
            if k == 0 {
                srcrb = compare_srcrb(r[1], c[1])?;
            }
        }
        Some(srcrb)
    }

    /// The BlueFlame half holding a whole copy of the WQE at `counter`, if any.
    #[inline(always)]
    pub(super) fn pending_copy(&self, counter: u16) -> Option<usize> {
        let bf = self.bf.as_ref()?;
        (0..2).find(|&h| bf.latch[h].counter == Some(counter))
    }

    /// Take the copy latched in half `h` for the WQE fetched into `scratch.wqe` (`len` bytes):
    /// it equals ring memory except for what a copy may change, of which the device honours
    /// its `srcrb_flags` (a copy may ask for a completion the ring copy does not: the WC
    /// self-test relies on it; never for less, see `latch_copy`). The latch is cleared once
    /// the WQE runs.
    pub(super) fn use_bf_copy(&mut self, h: usize, len: usize, cx: &mut TxCtx<'_>) -> bool {
        let Some(bf) = self.bf.as_ref() else {
            return false;
        };
        if len > bf.half_size {
            return false;
        }
        cx.scratch.wqe[0][8..12].copy_from_slice(&bf.latch[h].srcrb);
        true
    }

    /// Put the `srcrb_flags` of the copy latched in half `h` into the control segment `ctrl`.
    #[inline(always)]
    pub(super) fn bf_srcrb(&self, h: usize, ctrl: &mut [u8; DS_SIZE]) {
        if let Some(bf) = self.bf.as_ref() {
            ctrl[8..12].copy_from_slice(&bf.latch[h].srcrb);
        }
    }

    /// Copies for WQEs the walk has passed are of no further use.
    pub(super) fn drop_stale_copies(&mut self, counters: &mut Counters) {
        let ci = self.ci as u16;
        let cnt = self.cnt;
        if let Some(bf) = self.bf.as_mut() {
            for l in &mut bf.latch {
                if matches!(l.counter, Some(c) if u32::from(c.wrapping_sub(ci)) >= cnt) {
                    l.counter = None;
                    counters.bf_superseded += 1;
                }
            }
        }
    }
}
