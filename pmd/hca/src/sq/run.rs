//! The same-shape run: WQEs that share the layout of the last inline WQE (`shape.rs`) are
//! executed without being decoded, and on a wire that wants no frame bytes without being
//! fetched. On one that wants them, each WQE's frame is fetched from the places the shape
//! remembers before the completion that covers it is written.

use super::span::{Mark, Slot, Span, Step};
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
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum End {
    /// Every WQE of the stretch from where it started is of the shape.
    Stretch,
    /// The WQE it stopped at is not the device's.
    Unowned,
    /// The WQE it stopped at is the device's but not of the shape.
    Other,
    /// The WQE it stopped at is of the shape and asks for a completion, and the scan's
    /// [`Signals`] have no room left for it.
    Full,
}

/// Signaled WQEs a scan records before it stops: a doorbell's stretch of alike WQEs with a
/// completion every 32 then costs one scan per 256, not one per 32.
pub(super) const SIGNALS: usize = 8;

/// The WQEs of the shape asking for a completion that a scan passed, in order: where they are
/// in the span (as a [`Mark`], which the scan has at hand) and their `srcrb_flags` last
/// bytes. A scan passes them rather than stopping, as a stop costs a call, and the caller
/// writes their completions once it returns, before the WQEs it passed count as executed.
#[derive(Debug)]
pub(super) struct Signals {
    n: usize,
    at: [Mark; SIGNALS],
    flags: [u8; SIGNALS],
}

/// What [`Signals::complete`] wrote.
pub(super) struct Completed {
    pub(super) cqes: u64,
    pub(super) events: u64,
    /// The slot (in the span) of the first signaled WQE whose completion found the CQ full:
    /// it and the WQEs after it stay unexecuted.
    pub(super) full_at: Option<u32>,
}

impl Signals {
    pub(super) fn new() -> Signals {
        Signals {
            n: 0,
            at: [Mark::default(); SIGNALS],
            flags: [0; SIGNALS],
        }
    }

    /// Nothing recorded.
    #[inline(always)]
    pub(super) fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Record the signaled WQE in `slot` with `srcrb_flags` last byte `flags`; `false` (and
    /// nothing recorded) when there is no room.
    #[inline(always)]
    fn record(&mut self, slot: Slot<'_>, flags: u8) -> bool {
        let n = self.n;
        if n >= SIGNALS {
            return false;
        }
        self.at[n] = slot.mark();
        self.flags[n] = flags;
        self.n = n + 1;
        true
    }

    /// The recorded slots of `span`, in order.
    pub(super) fn slots<'s>(&'s self, span: &'s Span<'_>) -> impl Iterator<Item = u32> + 's {
        self.at[..self.n].iter().map(|&m| span.index(m) as u32)
    }

    /// How many of the recorded completions, in order, the CQ has room for, their room taken
    /// from `credit`: the first that finds none, and its WQE and those after it, stay
    /// unexecuted.
    #[inline(always)]
    pub(super) fn grant(&self, credit: &mut CqCredit, cq: &Cq) -> usize {
        credit.take_up_to(cq, self.n as u32) as usize
    }

    /// The WQEs of `span` that writing the first `granted` recorded completions executes: up
    /// to the last of them, or up to the WQE of the first one not granted.
    #[inline(always)]
    pub(super) fn executed(&self, span: &Span<'_>, granted: usize) -> u32 {
        match self.at[..self.n].get(granted) {
            Some(&m) => span.index(m) as u32,
            None => self.at[..granted]
                .last()
                .map_or(0, |&m| span.index(m) as u32 + 1),
        }
    }

    /// Write the recorded WQEs' completions, in order, `span`'s first slot being at counter
    /// `ci`, their room taken from `credit` first ([`Signals::grant`]). The plain write of `push_send_cqe`:
    /// runs are off while a fault loses or repeats completions. Leaves nothing recorded.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn complete(
        &mut self,
        span: &Span<'_>,
        ci: u32,
        slots: u32,
        qpn: u32,
        op: u8,
        credit: &mut CqCredit,
        cq: &mut Cq,
    ) -> Completed {
        let granted = self.grant(credit, cq);
        self.write_granted(span, ci, slots, (qpn, op), granted, cq)
    }

    /// [`Signals::complete`] of the first `granted` completions, whose room was taken
    /// ([`Signals::grant`]).
    #[inline(always)]
    pub(super) fn write_granted(
        &mut self,
        span: &Span<'_>,
        ci: u32,
        slots: u32,
        (qpn, op): (u32, u8),
        granted: usize,
        cq: &mut Cq,
    ) -> Completed {
        let n = std::mem::take(&mut self.n);
        let mut done = Completed {
            cqes: granted as u64,
            events: 0,
            full_at: self.at[..n].get(granted).map(|&m| span.index(m) as u32),
        };
        for (&m, &flags) in self.at[..granted].iter().zip(&self.flags[..granted]) {
            let w = span.index(m) as u32;
            let counter = ci.wrapping_add(w * slots) as u16;
            done.events +=
                u64::from(cq.push(tx_cqe(qpn, counter, op, 0, 0), flags & SOLICIT_BYTE != 0));
        }
        done
    }
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
        // Frames wanted: only a shape whose frame lies in known places in the WQE.
        if out.bytes && self.shape.inline_spans().is_none() {
            return (0, false, false);
        }
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
        // With frame bytes wanted, each WQE's frame is read before a completion that covers
        // it is written: the completion gives its slot back to the driver, which may stamp it
        // and write the next pass's WQE there at once (a threaded device's driver does).
        let mut frames = match self.shape.inline_spans() {
            Some(spans) if out.bytes && hit.verdict.frames > 0 => {
                cx.scratch.segs.set_inline(spans);
                Some(RunFrames {
                    spans,
                    plain: self.shape.plain(),
                    from: ci,
                    geometry: (slots, slot_mask, shift),
                    wqe_bytes: hit.wqe_bytes as usize,
                    v: hit.verdict,
                    sent: 0,
                })
            }
            _ => None,
        };
        let sig = &mut self.signals;
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
            let keys = Keys::new(key, parity);
            let mut k = 0;
            while k < count as usize {
                // The heads compared as the shape says, the choice made once per stretch.
                let (j, end) = match words {
                    Words::Two(_, ws) => scan_far(&span, k, keys, &ws, sig),
                    Words::Four(_, ws) => scan_far(&span, k, keys, &ws, sig),
                    Words::Heads => {
                        let heads = ByHead {
                            plan: &plan,
                            ring: &ring,
                            span: &span,
                            base,
                        };
                        scan_far(&span, k, keys, &heads, sig)
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
                        same == (w < j || end == End::Full) || (w == j && end == End::Unowned)
                    }),
                    "the run's comparison disagrees with the checked one from slot {}",
                    first + k as u32 * slots
                );
                debug_assert!(
                    signaled_ones(&ring, base, stride, k..j).eq(sig.slots(&span)),
                    "the run's completions disagree with the WQEs' C bits from slot {}",
                    first + k as u32 * slots
                );
                if !sig.is_empty() {
                    let granted = sig.grant(credit, cx.cq);
                    if let Some(f) = frames.as_mut() {
                        f.put_upto(&ring, n + sig.executed(&span, granted), out, t, cx);
                    }
                    let c = sig.write_granted(&span, ci, slots, (qpn, op), granted, cx.cq);
                    t.cqes += c.cqes;
                    t.events += c.events;
                    if let Some(w) = c.full_at {
                        ci = ci.wrapping_add(w * slots);
                        n += w;
                        break 'run;
                    }
                }
                let j32 = j as u32;
                match end {
                    End::Stretch => break,
                    End::Unowned | End::Other => {
                        ci = ci.wrapping_add(j32 * slots);
                        n += j32;
                        unowned = end == End::Unowned;
                        break 'run;
                    }
                    // The WQE there is recorded afresh.
                    End::Full => k = j,
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
        if let Some(f) = frames.as_mut() {
            f.put_upto(&ring, n, out, t, cx);
        }
        if n > 0 {
            self.stalled = false;
            let n64 = u64::from(n);
            t.fetched += n64;
            t.fetch_bytes += n64 * u64::from(hit.wqe_bytes);
            t.txbbs += n64 * u64::from(hit.txbbs);
            // As `transmit` for each (NOPs have no frames and leave the wire alone).
            let v = hit.verdict;
            if v.frames > 0 && !out.bytes {
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

/// The frames of a run's WQEs of the remembered shape, put on the wire in order as the run
/// goes, each fetched and put out from the places the shape remembers.
struct RunFrames<'s> {
    spans: &'s [(u16, u16)],
    plain: bool,
    /// Counter of the run's first WQE.
    from: u32,
    /// Slots a WQE takes, the ring's slot mask and its TXBBs' shift per slot.
    geometry: (u32, u32, u32),
    /// Bytes of each WQE, whole before the ring's end as a run's WQEs are.
    wqe_bytes: usize,
    v: Verdict,
    /// WQEs of the run whose frames are on the wire.
    sent: u32,
}

impl RunFrames<'_> {
    /// Put the frames of the run's WQEs before its `n`th on the wire, those not put yet.
    fn put_upto(&mut self, ring: &HostMem, n: u32, out: &Out, t: &mut Tally, cx: &mut TxCtx<'_>) {
        let (slots, slot_mask, shift) = self.geometry;
        let (from, sent) = (self.from, self.sent);
        let at = move |i: u32| {
            let c = from.wrapping_add(i * slots);
            ((c & slot_mask) << shift) as usize * TXBB_SIZE
        };
        if n <= sent {
            return;
        }
        // A plain shape's frames on a wire into a receive buffer: copied from the ring into
        // their records in one batch, without the WQE's copy in scratch, the wire's dispatch
        // and the buffer's checks per frame.
        if self.plain && out.link_up {
            let v = self.v;
            if let Some(into) = cx.wire.run_into(cx.port) {
                let k = u64::from(n - sent);
                match into {
                    Some(p) => {
                        let (len, mac) = (v.len as usize, &mut t.mac);
                        // A plain shape's first span holds the Ethernet header.
                        let heads = p.push_run(ring, (sent..n).map(at), self.spans, len, |w| {
                            mac.dst_word(w)
                        });
                        if heads {
                            t.mac.sized(len, k);
                        } else {
                            // A frame shorter than 8 bytes, or one of many chunks.
                            let head = self.spans.first().filter(|&&(_, len)| len >= 6);
                            let head = head.map(|&(off, _)| usize::from(off));
                            let mut dst = [0u8; 6];
                            for i in sent..n {
                                let h = head.filter(|&h| ring.read_array(at(i) + h, &mut dst));
                                t.mac.frame_of(if h.is_some() { &dst } else { &[] }, len);
                            }
                        }
                        t.dma += k * u64::from(v.dma);
                        t.frames += k;
                        t.bytes += k * u64::from(v.len);
                    }
                    None => {
                        t.dma += k * u64::from(v.dma);
                        t.drops += k;
                    }
                }
                self.sent = n;
                return;
            }
        }
        for i in sent..n {
            let c = self.from.wrapping_add(i * slots);
            let at = ((c & slot_mask) << shift) as usize * TXBB_SIZE;
            let wqe = cx.scratch.wqe.as_flattened_mut();
            let len = self.wqe_bytes.min(wqe.len());
            ring.read(at, &mut wqe[..len]);
            if self.plain {
                transmit_inline(self.v, self.spans, false, out, t, cx);
            } else {
                transmit(self.v, false, out, t, cx);
            }
        }
        self.sent = self.sent.max(n);
    }
}

/// How a scan compares a slot's heads, once its control segment matched.
pub(super) trait Heads {
    fn hold(&self, slot: Slot<'_>) -> bool;
}

/// A few inline header words (offset in the slot, word in memory order read as
/// little-endian), all of them compared: a fixed count without a branch per word.
impl<const K: usize> Heads for [(u16, u32); K] {
    #[inline(always)]
    fn hold(&self, slot: Slot<'_>) -> bool {
        self.iter()
            .fold(true, |ok, &(at, v)| ok & (slot.word(usize::from(at)) == v))
    }
}

/// Any other shape's heads, head by head from ring memory (`span` starting at ring byte
/// `base`, its WQEs lying whole before the ring's end).
struct ByHead<'p, 'r, 's> {
    plan: &'p Plan<'p>,
    ring: &'r HostMem,
    span: &'s Span<'r>,
    base: usize,
}

impl Heads for ByHead<'_, '_, '_> {
    #[inline(always)]
    fn hold(&self, slot: Slot<'_>) -> bool {
        let off = self.base + self.span.offset(slot.mark());
        self.plan.heads_match(self.ring, off)
    }
}

/// What a scan compares a WQE's control segment with: the parity's owner bit and the key's
/// first qword in its first two dwords, the second qword, which a WQE of the shape matches
/// with both C bits clear.
#[derive(Clone, Copy)]
pub(super) struct Keys {
    dw0: u32,
    dw1: u32,
    hi: u64,
}

impl Keys {
    #[inline(always)]
    pub(super) fn new(key: Key, parity: u8) -> Keys {
        debug_assert_eq!(key.hi & C_BITS, 0, "a key has no C bits");
        debug_assert_eq!(
            KEY_MASK[0] >> 32,
            u64::from(u32::MAX),
            "bytes 4-7 compared whole"
        );
        Keys {
            dw0: key.lo as u32 | u32::from(parity),
            dw1: (key.lo >> 32) as u32,
            hi: key.hi,
        }
    }

    fn parity(self) -> u8 {
        self.dw0 as u8 & OWNER_BYTE
    }

    /// The key's first qword.
    fn lo(self) -> u64 {
        u64::from(self.dw0 & !u32::from(OWNER_BYTE)) | u64::from(self.dw1) << 32
    }

    /// Whether a first qword `lo`, whose owner bit was found to be the parity's, is the
    /// key's: compared as the quick compares do, with nothing more to keep in registers.
    fn lo_holds(self, lo: u64) -> bool {
        lo as u32 & DW0_MASK == self.dw0 && (lo >> 32) as u32 == self.dw1
    }
}

/// The C bits of `srcrb_flags` in the second qword.
const C_BITS: u64 = (CQ_UPDATE_BYTE as u64) << 24;
/// The second qword's bits a WQE of the shape matches with both C bits clear.
const HI_MASK: u64 = KEY_MASK[1] | C_BITS;
/// The first dword's bits compared: the owner bit and the key's.
const DW0_MASK: u32 = KEY_MASK[0] as u32 | OWNER_BYTE as u32;

/// The WQE in `slot` compared as the compares one by one would: `None` if it is the device's,
/// of the shape and asks for no completion or (then recorded in `sig`) asks for one; else why
/// the scan stops there.
#[inline(always)]
fn sort<const FAR: bool>(
    slot: Slot<'_>,
    k: Keys,
    heads: &impl Heads,
    sig: &mut Signals,
) -> Option<End> {
    if slot.owner()[0] & OWNER_BYTE != k.parity() {
        return Some(End::Unowned);
    }
    let [lo, hi] = slot.ctrl();
    // A far scan's loop keeps only the quick compares' values in registers.
    let lo_holds = if FAR {
        k.lo_holds(lo)
    } else {
        lo & KEY_MASK[0] == k.lo()
    };
    if !lo_holds || hi & KEY_MASK[1] != k.hi || !heads.hold(slot) {
        return Some(End::Other);
    }
    // Both C bits ask for a completion; one alone does not.
    if !hi & C_BITS == 0 && !sig.record(slot, (hi >> 24) as u8) {
        return Some(End::Full);
    }
    None
}

/// The WQEs of `span` from slot `from` on, before slot `to`, that are the device's and of the
/// shape (`key` and `heads`, the latter asked of a slot only once its control segment
/// matched), those asking for a completion recorded in `sig`: how many slots it passed, and
/// what the one it stopped at is ([`End::Stretch`]: it reached `to`). No WQE's lines past its
/// owner word are read before that word says the device owns it, so a WQE the driver is still
/// writing keeps its lines on the driver's core. For the two slots after a doorbell, where the
/// second is most often not posted yet: ownership first, then one compare of each qword.
#[inline(always)]
pub(super) fn scan_near(
    span: &Span<'_>,
    (from, to): (usize, usize),
    k: Keys,
    heads: &impl Heads,
    sig: &mut Signals,
) -> (usize, End) {
    let to = to.min(span.len());
    for w in from..to {
        let slot = span.at(w);
        if slot.owner()[0] & OWNER_BYTE != k.parity() {
            return (w, End::Unowned);
        }
        let [lo, hi] = slot.ctrl();
        if lo & KEY_MASK[0] == k.lo() && hi & HI_MASK == k.hi && heads.hold(slot) {
            continue;
        }
        if let Some(end) = sort::<false>(slot, k, heads, sig) {
            return (w, end);
        }
    }
    (to, End::Stretch)
}

/// [`scan_near`] from `from` to the span's end, a stretch expected to run on: where it
/// stopped. Out of line, the loop has the registers to itself, its invariants in them, and
/// one pointer for the slot and the loop's end (about 14 instructions a WQE of two inline
/// headers).
#[inline(never)]
fn scan_far_at(
    span: &Span<'_>,
    from: usize,
    k: Keys,
    heads: &impl Heads,
    sig: &mut Signals,
) -> (Mark, End) {
    let (at, end) = span.pass(from, &mut Far { k, heads, sig });
    (at, end.unwrap_or(End::Stretch))
}

/// A far scan's look at each slot. A WQE that continues a stretch passes three compares: its
/// ownership word (acquired) with the owner bit and the opcode, bytes 4-7, and the second
/// qword with the C bits, then the heads. A signaled WQE of the shape differs from the key by
/// its C bits alone; any other WQE that fails them is sorted out by [`sort`].
struct Far<'h, 's, H> {
    k: Keys,
    heads: &'h H,
    sig: &'s mut Signals,
}

impl<H: Heads> Step for Far<'_, '_, H> {
    type Out = End;

    #[inline(always)]
    fn step(&mut self, slot: Slot<'_>) -> Option<End> {
        let (k, heads) = (self.k, self.heads);
        if u32::from_le_bytes(slot.owner()) & DW0_MASK == k.dw0 && slot.dword1() == k.dw1 {
            if slot.ctrl()[1] & HI_MASK == k.hi && heads.hold(slot) {
                return None;
            }
            // Noted from here, not after `sort`'s compares again: one signaled WQE in 32.
            let hi = slot.ctrl_hi_again();
            if hi ^ k.hi == C_BITS && heads.hold(slot) {
                return (!self.sig.record(slot, (hi >> 24) as u8)).then_some(End::Full);
            }
        }
        sort::<true>(slot, k, heads, self.sig)
    }
}

/// [`scan_far_at`], as [`scan_near`] answers.
#[inline(always)]
pub(super) fn scan_far(
    span: &Span<'_>,
    from: usize,
    k: Keys,
    heads: &impl Heads,
    sig: &mut Signals,
) -> (usize, End) {
    let (at, end) = scan_far_at(span, from, k, heads, sig);
    (span.index(at), end)
}

/// The slots among `slots` of the span at ring byte `base` (`stride` apart) whose WQE asks for
/// a completion (both C bits), read checked: what a scan's [`Signals`] are compared against.
pub(super) fn signaled_ones(
    ring: &HostMem,
    base: usize,
    stride: usize,
    slots: std::ops::Range<usize>,
) -> impl Iterator<Item = u32> + '_ {
    slots.filter_map(move |w| {
        let c = ring.load_guarded::<DS_SIZE>(base + w * stride)?;
        (c[11] & CQ_UPDATE_BYTE == CQ_UPDATE_BYTE).then_some(w as u32)
    })
}
