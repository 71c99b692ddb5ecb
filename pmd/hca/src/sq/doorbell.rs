//! A doorbell's walk when every WQE it finds is of the remembered shape, on a wire that
//! wants no frame bytes: what a driver's `tx_burst` of alike packets rings for, down to one
//! WQE a doorbell. It is the run of `run.rs` without the general walk around it: no
//! BlueFlame copies or marks, no fault schedules, no walk tally, only the counts a run makes,
//! added once. Anything else it meets it leaves to the general walk, from where it stopped.

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
        if self.walk != Walk::All
            || self.inferred
            || self.state != QueueState::Ready
            || self.bf_marks.any()
            || self.bf.as_ref().is_some_and(Bf::has_pending)
            || cx.wire.wants_bytes()
            || cx.faults.per_send_wqe()
        {
            return (0, false);
        }
        let Some((&[lo, hi], &words, &hit)) = self.shape.words(cx.mrs.epoch()) else {
            return (0, false);
        };
        let key = Key { lo, hi };
        match words {
            Words::Two(_, ws) => self.doorbell_words(key, &ws, hit, cx),
            Words::Four(_, ws) => self.doorbell_words(key, &ws, hit, cx),
            Words::Heads => (0, false),
        }
    }

    /// [`Sq::doorbell_run`] for a shape of `K` inline header words `ws`. Out of line: the
    /// loop keeps its registers to itself.
    #[inline(never)]
    fn doorbell_words<const K: usize>(
        &mut self,
        key: Key,
        ws: &[(u16, u32); K],
        hit: Hit,
        cx: &mut TxCtx<'_>,
    ) -> (usize, bool) {
        let (slot_mask, shift, cnt) = (self.cnt - 1, self.txbb_shift, self.cnt);
        let slots = self.slots(hit.txbbs);
        // The last slot a whole WQE starts at before the ring's end.
        let Some(last_slot) = (cnt << shift).checked_sub(hit.txbbs) else {
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
            if first > last_slot {
                // A WQE would reach past the ring's end: the general walk's.
                break false;
            }
            let count = (last_slot - first) / slots + 1;
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
        if over {
            self.walk = Walk::Idle;
        }
        let c = &mut *cx.counters;
        c.cqes += cqes;
        c.cq_events += events;
        if n > 0 {
            self.stalled = false;
            let (n64, v) = (u64::from(n), hit.verdict);
            c.wqe_fetched += n64;
            c.wqe_fetch_bytes += n64 * u64::from(hit.wqe_bytes);
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
        (n as usize, over)
    }
}
