//! A doorbell's walk when every WQE it finds is of the remembered shape, on a wire that
//! wants no frame bytes: what a driver's `tx_burst` of alike packets rings for, down to one
//! WQE a doorbell. It is the run of `run.rs` without the general walk around it: no fault
//! schedules, no walk tally, only the counts a run makes, added once. A BlueFlame write's
//! walk takes it too, up to the first WQE a BlueFlame write marked (the burst's last, whose
//! copy the general walk executes). Anything else it meets it leaves to the general walk,
//! from where it stopped.

use super::run::{scan_far, scan_near, signaled_ones, End, Key, Keys, Signals, OWNER_BYTE};
use super::span::Span;
use super::*;
use crate::shape::{Hit, Words};

impl Sq {
    /// Execute a doorbell's walk this way if it can be: returns the WQEs executed and whether
    /// the walk is over (it ended at a WQE the device does not own). If not, the general walk
    /// goes on from the consumer.
    #[inline(always)]
    pub(super) fn doorbell_run(&mut self, cx: &mut TxCtx<'_>) -> (usize, bool) {
        let stop = match self.walk {
            Walk::All => None,
            Walk::UpTo(c) => Some(c),
            Walk::Idle => return (0, false),
        };
        if self.inferred
            || self.state != QueueState::Ready
            || cx.wire.wants_bytes()
            || cx.faults.per_send_wqe()
        {
            return (0, false);
        }
        let Some((&[lo, hi], &words, &hit)) = self.shape.words(cx.mrs.epoch()) else {
            return (0, false);
        };
        let key = Key { lo, hi };
        // A doorbell's walk with no BlueFlame write in sight has its own copy of the loop,
        // which carries no stop and no marks.
        match (words, stop.is_some() || self.bf_marks.any()) {
            (Words::Two(_, ws), false) => self.doorbell_words::<2, false>(key, &ws, hit, None, cx),
            (Words::Two(_, ws), true) => self.doorbell_words::<2, true>(key, &ws, hit, stop, cx),
            (Words::Four(_, ws), false) => self.doorbell_words::<4, false>(key, &ws, hit, None, cx),
            (Words::Four(_, ws), true) => self.doorbell_words::<4, true>(key, &ws, hit, stop, cx),
            (Words::Heads, _) => (0, false),
        }
    }

    /// [`Sq::doorbell_run`] for a shape of `K` inline header words `ws`, up to the WQE at
    /// counter `stop` if a BlueFlame write set one. `BF`: a BlueFlame write set the stop or
    /// marked slots (without, `stop` is `None` and no slot is marked). Out of line: the loop
    /// keeps its registers to itself.
    #[inline(never)]
    fn doorbell_words<const K: usize, const BF: bool>(
        &mut self,
        key: Key,
        ws: &[(u16, u32); K],
        hit: Hit,
        stop: Option<u16>,
        cx: &mut TxCtx<'_>,
    ) -> (usize, bool) {
        let (slot_mask, shift, cnt) = (self.cnt - 1, self.txbb_shift, self.cnt);
        let slots = self.slots(hit.txbbs);
        // How many WQEs the stop allows (the one at it included), and whether the last of
        // them is the one at it.
        let (max_n, stops_on_last) = match stop.filter(|_| BF) {
            Some(c) => {
                let d = u32::from(c.wrapping_sub(self.ci as u16));
                if d >= cnt {
                    return (0, false);
                }
                (d / slots + 1, d % slots == 0)
            }
            None => (u32::MAX, false),
        };
        // A marked slot, and what follows it, is the general walk's: it holds the WQE a
        // BlueFlame write announced, whose copy that walk executes. The run then ends at the
        // first mark from the consumer, or at the ring's end, up to which it looked.
        let marks = BF && self.bf_marks.any();
        let end = if marks {
            self.bf_marks.first_from(self.ci & slot_mask, cnt)
        } else {
            cnt
        };
        // The last slot a whole WQE starts at before the ring's end (or the first mark).
        let Some(last_slot) = (end << shift).checked_sub(hit.txbbs) else {
            return (0, false);
        };
        let last_slot = last_slot >> shift;
        let stride = (slots << shift) as usize * TXBB_SIZE;
        let op = cqe_owner::SEND | hit.opcode;
        let mut credit = CqCredit::default();
        let txbb_mask = self.txbb_mask();
        let sig = &mut self.signals;
        let (mut ci, mut n, mut cqes, mut events) = (self.ci, 0u32, 0u64, 0u64);
        // A stretch at a time, to the ring's end and on from its start in the next pass's
        // parity, as in `run`.
        let over = 'run: loop {
            let first = ci & slot_mask;
            if n == max_n || first > last_slot || marks && n > 0 {
                // At the stop; a WQE would reach past the ring's end or a mark; or on from
                // the ring's start, where the marks were not looked for: the general walk's.
                break false;
            }
            let count = ((last_slot - first) / slots + 1).min(max_n - n);
            let base = (first << shift) as usize * TXBB_SIZE;
            let Some(span) = Span::new(&self.ring, base, stride, count as usize) else {
                break false;
            };
            let parity = if ci & cnt != 0 { OWNER_BYTE } else { 0 };
            let keys = Keys::new(key, parity);
            // The span's reads against the checked loads of the full comparison, on every WQE
            // of every debug run that a scan from `k` passed or stopped at as of the shape, and
            // the completions it noted against the WQEs' C bits.
            let agrees = |k: usize, (j, end): (usize, End), sig: &Signals| {
                (k..j.min(count as usize - 1) + 1).all(|w| {
                    let slot = (first + w as u32 * slots) << shift;
                    let mut ctrl = [0u8; DS_SIZE];
                    let epoch = cx.mrs.epoch();
                    let same = self.ring.read_array(slot as usize * TXBB_SIZE, &mut ctrl)
                        && self
                            .shape
                            .recall(&self.ring, slot, txbb_mask, &ctrl, false, epoch)
                            .is_some();
                    same == (w < j || end == End::Full) || (w == j && end == End::Unowned)
                }) && signaled_ones(&self.ring, base, stride, k..j).eq(sig.slots(&span))
            };
            // The first two slots in line: a doorbell of one WQE ends at the second, and needs
            // no call; nor, most often, anything but the way out.
            let (j, end) = match scan_near(&span, (0, 2), keys, ws, sig) {
                (2, End::Stretch) if span.len() > 2 => scan_far(&span, 2, keys, ws, sig),
                stopped => stopped,
            };
            if end == End::Unowned && sig.is_empty() {
                debug_assert!(
                    agrees(0, (j, end), sig),
                    "the doorbell run disagrees with the checked reads from slot {first}"
                );
                ci = ci.wrapping_add(j as u32 * slots);
                n += j as u32;
                break true;
            }
            let (mut k, mut scanned) = (0, (j, end));
            loop {
                let (j, end) = scanned;
                debug_assert!(
                    agrees(k, (j, end), sig),
                    "the doorbell run disagrees with the checked reads from slot {}",
                    first + k as u32 * slots
                );
                if !sig.is_empty() {
                    let c = sig.complete(&span, ci, slots, self.qpn, op, &mut credit, cx.cq);
                    cqes += c.cqes;
                    events += c.events;
                    if let Some(w) = c.full_at {
                        ci = ci.wrapping_add(w * slots);
                        n += w;
                        break 'run false;
                    }
                }
                let j32 = j as u32;
                match end {
                    End::Stretch => break,
                    End::Unowned | End::Other => {
                        ci = ci.wrapping_add(j32 * slots);
                        n += j32;
                        break 'run end == End::Unowned;
                    }
                    // The WQE there is recorded afresh.
                    End::Full => {
                        k = j;
                        scanned = scan_far(&span, k, keys, ws, sig);
                    }
                }
            }
            ci = ci.wrapping_add(count * slots);
            n += count;
        };
        self.ci = ci;
        // The run ended at a marked slot: the burst's last WQE, most often, whose copy a
        // BlueFlame write latched; executed here, the burst needs no general walk.
        let mut from_bf = 0;
        if marks && !over && n < max_n && self.bf_marks.get(ci & slot_mask) {
            if let Some(event) = self.latched_wqe(&mut credit, cx) {
                from_bf = 1;
                cqes += u64::from(event.is_some());
                events += u64::from(event == Some(true));
            }
        }
        let all = n + from_bf;
        // Ending where nothing more is owned finishes a doorbell's walk; a BlueFlame write's
        // stays for its WQEs, whose ring stores the copy may have overtaken. Reaching the stop
        // finishes either.
        let over = over && !(BF && stop.is_some()) || all == max_n && stops_on_last;
        if over {
            self.walk = Walk::Idle;
        }
        if BF && all > 0 && self.bf.as_ref().is_some_and(Bf::has_pending) {
            self.drop_stale_copies(cx.counters);
        }
        let c = &mut *cx.counters;
        c.cqes += cqes;
        c.cq_events += events;
        if BF {
            c.wqe_from_bf += u64::from(from_bf);
        }
        if all > 0 {
            self.stalled = false;
            let (n64, v) = (u64::from(n), hit.verdict);
            c.wqe_fetched += n64;
            c.wqe_fetch_bytes += n64 * u64::from(hit.wqe_bytes);
            let n64 = u64::from(all);
            c.txbbs += n64 * u64::from(hit.txbbs);
            // As `transmit` for each (NOPs have no frames).
            if v.frames > 0 {
                let frames = n64 * u64::from(v.frames);
                c.dma_read_bytes += n64 * u64::from(v.dma);
                if cx.port.up() {
                    c.tx_frames += frames;
                    c.tx_bytes += n64 * u64::from(v.len);
                    *c.tx_size((v.len / v.frames) as usize) += frames;
                } else {
                    c.tx_drops_wire += frames;
                }
            }
        }
        (all as usize, over)
    }

    /// Execute the WQE at the consumer, which a BlueFlame write marked, from the copy latched
    /// for it, as the general walk does on a wire that wants no frame bytes: if it is owned,
    /// of the remembered shape (the copy's `srcrb_flags` and the QPN in its bytes 4-6 as a
    /// BlueFlame-posted WQE carries it) and its completion, if it asks for one, fits. `None`
    /// (nothing done) otherwise; else whether it wrote a completion, and whether that raised
    /// an event. Its frames and TXBBs are the caller's to count.
    fn latched_wqe(&mut self, credit: &mut CqCredit, cx: &mut TxCtx<'_>) -> Option<Option<bool>> {
        let counter = self.ci as u16;
        let first = self.first_txbb(self.ci);
        let off = first as usize * TXBB_SIZE;
        let dw0 = self.ring.load_be32(off)?;
        if (dw0 & owner_opcode::OWNER != 0) != (self.ci & self.cnt != 0) {
            return None;
        }
        let h = self.pending_copy(counter)?;
        let mut ctrl = [0u8; DS_SIZE];
        if !self.ring.read_array(off, &mut ctrl) {
            return None;
        }
        self.bf_srcrb(h, &mut ctrl);
        let epoch = cx.mrs.epoch();
        let hit = self
            .shape
            .recall(&self.ring, first, self.txbb_mask(), &ctrl, true, epoch)?;
        if hit.signaled && !credit.take(cx.cq) {
            return None;
        }
        if let Some(bf) = self.bf.as_mut() {
            bf.latch[h].counter = None;
        }
        let written = hit.signaled.then(|| {
            let cqe = tx_cqe(self.qpn, counter, cqe_owner::SEND | hit.opcode, 0, 0);
            cx.cq.push(cqe, ctrl[11] & SOLICIT_BYTE != 0)
        });
        self.advance(hit.txbbs, true);
        Some(written)
    }
}
