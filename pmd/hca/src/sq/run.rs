//! The same-shape run: WQEs that share the layout of the last inline WQE (`shape.rs`) on a
//! wire that wants no frame bytes are executed without being fetched or decoded.

use super::*;

impl Sq {
    /// Execute the run of WQEs of the remembered shape from the consumer on, on a wire
    /// that wants no frame bytes. Each WQE costs the checks of its ownership, control segment
    /// and headers: nothing is fetched or decoded, and the run's counts are added once. The run
    /// ends before the first WQE that needs more (not yet owned, of another shape, marked by a
    /// BlueFlame write, reaching past the ring's end, its completion not fitting), which the
    /// walk's per-WQE path then takes. Returns the WQEs executed, and whether the last was the
    /// one the walk was to stop at.
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
    ) -> (usize, bool) {
        let Some(plan) = self.shape.plan(epoch) else {
            return (0, false);
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
                    return (0, false);
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
            return (0, false);
        };
        let last_slot = last_slot >> shift;
        let op = cqe_owner::SEND | hit.opcode;
        // In locals: the loop stores nothing to the queue until it ends.
        let (ring, qpn) = (self.ring.clone(), self.qpn);
        let mut ci = self.ci;
        let mut n = 0u32;
        loop {
            let slot = ci & slot_mask;
            if n == max_n || slot > last_slot || slot < lowest {
                break;
            }
            let off = (slot << shift) as usize * TXBB_SIZE;
            // The control segment, its owner word acquire-loaded first.
            let Some(ctrl) = ring.load_guarded::<DS_SIZE>(off) else {
                break;
            };
            let dw0 = u32::from_be_bytes([ctrl[0], ctrl[1], ctrl[2], ctrl[3]]);
            if (dw0 & owner_opcode::OWNER != 0) != (ci & cnt != 0)
                || !plan.matches(&ring, off, &ctrl)
            {
                break;
            }
            if ctrl[11] & CQ_UPDATE_BYTE == CQ_UPDATE_BYTE {
                if !credit.take(cx.cq) {
                    break;
                }
                // The plain write of `push_send_cqe`: runs are off while a fault loses or
                // repeats completions, and its fault checks here cost the loop registers.
                let solicited = ctrl[11] & SOLICIT_BYTE != 0;
                if cx.cq.push(tx_cqe(qpn, ci as u16, op, 0, 0), solicited) {
                    t.events += 1;
                }
                t.cqes += 1;
            }
            ci = ci.wrapping_add(slots);
            n += 1;
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
        (n as usize, at_stop)
    }
}
