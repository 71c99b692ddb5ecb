//! The same-shape run: WQEs that share the layout of the last inline WQE (`shape.rs`) on a
//! wire that wants no frame bytes are executed without being fetched or decoded.

use super::span::Span;
use super::*;
use crate::shape::{Plan, Words, KEY_MASK};

/// A shape's control segment as a run compares it: its two qwords (memory order, read as
/// little-endian) under [`KEY_MASK`].
#[derive(Clone, Copy)]
pub(super) struct Key {
    pub(super) lo: u64,
    pub(super) hi: u64,
}

/// Why a scan of a stretch stopped.
#[derive(Clone, Copy)]
pub(super) enum End {
    /// Every WQE of the stretch from where it started is of the shape and asks for no
    /// completion.
    Stretch,
    /// The WQE it stopped at is not the device's.
    Unowned,
    /// The WQE it stopped at is the device's but not of the shape.
    Other,
    /// The WQE it stopped at is of the shape and asks for a completion (its `srcrb_flags`
    /// last byte).
    Signaled(u8),
}

/// OWNER in byte 0 of the control segment.
pub(super) const OWNER_BYTE: u8 = (owner_opcode::OWNER >> 24) as u8;

impl Sq {
    /// Execute the run of WQEs of the remembered shape from the consumer on, on a wire
    /// that wants no frame bytes. Each WQE costs the checks of its ownership, control segment
    /// and headers: nothing is fetched or decoded, and the run's counts are added once. The run
    /// ends before the first WQE that needs more (not yet owned, of another shape, marked by a
    /// BlueFlame write, reaching past the ring's end, its completion not fitting), which the
    /// walk's per-WQE path then takes. Returns the WQEs executed, whether the last was the
    /// one the walk was to stop at, and whether the run ended at a WQE the device does not
    /// own (which the walk need not look at again).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn run(
        &mut self,
        stop: Option<u16>,
        epoch: u64,
        bf_live: bool,
        credit: &mut CqCredit,
        out: &Out,
        t: &mut Tally,
        cx: &mut TxCtx<'_>,
    ) -> (usize, bool, bool) {
        let Some(plan) = self.shape.plan(epoch) else {
            return (0, false, false);
        };
        let hit = plan.hit;
        let (slot_mask, shift, cnt) = (self.cnt - 1, self.txbb_shift, self.cnt);
        let slots = self.slots(hit.txbbs);
        // How many WQEs the walk's stop allows (the one at the stop included), and whether the
        // last of them is the one at the stop.
        let (max_n, stops_on_last) = match stop {
            Some(c) => {
                let d = u32::from(c.wrapping_sub(self.ci as u16));
                if d >= cnt {
                    return (0, false, false);
                }
                (d / slots + 1, d % slots == 0)
            }
            None => (u32::MAX, false),
        };
        // The run ends before a WQE would reach past the ring's end and before the first slot
        // a BlueFlame write marked (found once: the BlueFlame path has about one mark per
        // burst, and the run then stops at the ring's end, up to which it looked): a WQE
        // starting at `last_slot` or before, and not before `first` once marks are live, lies
        // before both.
        let first = self.ci & slot_mask;
        let (end, lowest) = if bf_live {
            (self.bf_marks.first_from(first, cnt), first)
        } else {
            (cnt, 0)
        };
        let Some(last_slot) = (end << shift).checked_sub(hit.txbbs) else {
            return (0, false, false);
        };
        let last_slot = last_slot >> shift;
        let op = cqe_owner::SEND | hit.opcode;
        let [key_lo, key_hi] = plan.key();
        let words = plan.words();
        // In locals: the loop stores nothing to the queue until it ends.
        let (ring, qpn) = (self.ring.clone(), self.qpn);
        let stride = (slots << shift) as usize * TXBB_SIZE;
        let key = Key {
            lo: key_lo,
            hi: key_hi,
        };
        let mut ci = self.ci;
        let mut n = 0u32;
        let mut unowned = false;
        // A stretch at a time: from the consumer to the last slot a whole WQE fits before, up
        // to the ring's end (then on from its start, in the next pass's parity) or the first
        // BlueFlame mark. Its bounds are checked once, and its ownership parity is one value.
        'run: loop {
            let first = ci & slot_mask;
            if n == max_n || first > last_slot || first < lowest {
                break;
            }
            let count = ((last_slot - first) / slots + 1).min(max_n - n);
            let base = (first << shift) as usize * TXBB_SIZE;
            let Some(span) = Span::new(&ring, base, stride, count as usize) else {
                break;
            };
            let parity = if ci & cnt != 0 { OWNER_BYTE } else { 0 };
            let mut k = 0;
            while k < count as usize {
                // The heads compared as the shape says, the choice made once per stretch.
                let (j, end) = match words {
                    Words::Two(_, ws) => scan_far(&span, k, parity, key, &ws),
                    Words::Four(_, ws) => scan_far(&span, k, parity, key, &ws),
                    Words::Heads => {
                        let heads = ByHead {
                            plan: &plan,
                            ring: &ring,
                            base,
                            stride,
                        };
                        scan_far(&span, k, parity, key, &heads)
                    }
                };
                // The span's reads against the checked loads of the full comparison, on every
                // WQE of every debug run that the scan passed or stopped at as of the shape
                // (the driver leaves an owned WQE alone).
                debug_assert!(
                    (k..j.min(count as usize - 1) + 1).all(|w| {
                        let same = ring
                            .load_guarded::<DS_SIZE>(base + w * stride)
                            .is_some_and(|c| plan.matches(&ring, base + w * stride, &c));
                        same == (w < j || matches!(end, End::Signaled(_)))
                            || (w == j && matches!(end, End::Unowned))
                    }),
                    "the run's comparison disagrees with the checked one from slot {}",
                    first + k as u32 * slots
                );
                let j32 = j as u32;
                match end {
                    End::Stretch => break,
                    End::Unowned | End::Other => {
                        ci = ci.wrapping_add(j32 * slots);
                        n += j32;
                        unowned = matches!(end, End::Unowned);
                        break 'run;
                    }
                    End::Signaled(flags) => {
                        if !credit.take(cx.cq) {
                            ci = ci.wrapping_add(j32 * slots);
                            n += j32;
                            break 'run;
                        }
                        // The plain write of `push_send_cqe`: runs are off while a fault loses
                        // or repeats completions.
                        let solicited = flags & SOLICIT_BYTE != 0;
                        let counter = ci.wrapping_add(j32 * slots) as u16;
                        if cx.cq.push(tx_cqe(qpn, counter, op, 0, 0), solicited) {
                            t.events += 1;
                        }
                        t.cqes += 1;
                        k = j + 1;
                    }
                }
            }
            ci = ci.wrapping_add(count * slots);
            n += count;
            if bf_live {
                // The stretch ended at a mark or the ring's end: the walk takes it from there.
                break;
            }
        }
        let at_stop = n == max_n && stops_on_last;
        self.ci = ci;
        if n > 0 {
            self.stalled = false;
            let n64 = u64::from(n);
            t.fetched += n64;
            t.fetch_bytes += n64 * u64::from(hit.wqe_bytes);
            t.txbbs += n64 * u64::from(hit.txbbs);
            // As `transmit` for each (NOPs have no frames and leave the wire alone).
            let v = hit.verdict;
            if v.frames > 0 {
                t.dma += n64 * u64::from(v.dma);
                if out.link_up {
                    t.frames += n64 * u64::from(v.frames);
                    t.bytes += n64 * u64::from(v.len);
                    t.mac
                        .sized((v.len / v.frames) as usize, n64 * u64::from(v.frames));
                } else {
                    t.drops += n64 * u64::from(v.frames);
                }
            }
        }
        (n as usize, at_stop, unowned)
    }
}

/// How a scan compares a slot's heads, once its control segment matched.
pub(super) trait Heads {
    fn hold(&self, span: &Span<'_>, w: usize) -> bool;
}

/// A few inline header words (offset in the slot, word in memory order read as
/// little-endian), all of them compared: a fixed count without a branch per word.
impl<const K: usize> Heads for [(u16, u32); K] {
    #[inline(always)]
    fn hold(&self, span: &Span<'_>, w: usize) -> bool {
        self.iter().fold(true, |ok, &(at, v)| {
            ok & (span.word(w, usize::from(at)) == v)
        })
    }
}

/// Any other shape's heads, head by head from ring memory (the WQE at ring byte `base + w *
/// stride` lies whole before the ring's end).
struct ByHead<'p, 'r> {
    plan: &'p Plan<'p>,
    ring: &'r HostMem,
    base: usize,
    stride: usize,
}

impl Heads for ByHead<'_, '_> {
    #[inline(always)]
    fn hold(&self, _: &Span<'_>, w: usize) -> bool {
        self.plan
            .heads_match(self.ring, self.base + w * self.stride)
    }
}

/// The WQEs of `span` from slot `from` on, before slot `to`, that are the device's, of the
/// shape (`key` and `heads`, the latter asked of a slot only once its control segment
/// matched) and ask for no completion: how many slots it passed, and what the one it stopped
/// at is ([`End::Stretch`]: it reached `to`). No WQE's lines past its owner word are read
/// before that word says the device owns it, so a WQE the driver is still writing keeps its
/// lines on the driver's core.
#[inline(always)]
pub(super) fn scan<const LONG: bool>(
    span: &Span<'_>,
    (from, to): (usize, usize),
    parity: u8,
    key: Key,
    heads: &impl Heads,
) -> (usize, End) {
    let to = to.min(span.len());
    // The C bits join the compare of the second qword, which `key.hi` passes only with both
    // clear. `LONG` (a stretch expected to run on): a WQE that continues it passes three
    // compares, its ownership word (acquired) with the owner bit and the opcode, bytes 4-7,
    // and the second qword. Else (the two slots after a doorbell, where the second is most
    // often not posted yet) ownership first, then one compare of each qword. The WQE that
    // fails them is sorted out below, as the compares one by one would have.
    let c_bits = u64::from(CQ_UPDATE_BYTE) << 24;
    let hi_mask = KEY_MASK[1] | c_bits;
    debug_assert_eq!(key.hi & c_bits, 0, "a key has no C bits");
    let dw0_mask = KEY_MASK[0] as u32 | u32::from(OWNER_BYTE);
    let dw0_key = key.lo as u32 | u32::from(parity);
    let dw1_key = (key.lo >> 32) as u32;
    debug_assert_eq!(
        KEY_MASK[0] >> 32,
        u64::from(u32::MAX),
        "bytes 4-7 compared whole"
    );
    let mut w = from;
    while w < to {
        if LONG
            && u32::from_le_bytes(span.owner(w)) & dw0_mask == dw0_key
            && span.dword1(w) == dw1_key
            && span.ctrl(w)[1] & hi_mask == key.hi
            && heads.hold(span, w)
        {
            w += 1;
            continue;
        }
        if span.owner(w)[0] & OWNER_BYTE != parity {
            return (w, End::Unowned);
        }
        let [lo, hi] = span.ctrl(w);
        if !LONG && lo & KEY_MASK[0] == key.lo && hi & hi_mask == key.hi && heads.hold(span, w) {
            w += 1;
            continue;
        }
        if lo & KEY_MASK[0] != key.lo || hi & KEY_MASK[1] != key.hi || !heads.hold(span, w) {
            return (w, End::Other);
        }
        // Both C bits ask for a completion; one alone does not.
        if !hi & c_bits == 0 {
            return (w, End::Signaled((hi >> 24) as u8));
        }
        w += 1;
    }
    (to, End::Stretch)
}

/// [`scan`] from `from` to the span's end, out of line: the loop has the registers to
/// itself, its invariants in them (about 15 instructions a WQE of two inline headers).
#[inline(never)]
pub(super) fn scan_far(
    span: &Span<'_>,
    from: usize,
    parity: u8,
    key: Key,
    heads: &impl Heads,
) -> (usize, End) {
    scan::<true>(span, (from, span.len()), parity, key, heads)
}
