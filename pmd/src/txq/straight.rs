//! The straight-line poster: bursts of plain packets in tight loops (`inline_run`, and
//! `gather_run` in its own module), a burst of one in place (`post_one`), and the end of every
//! burst: the completion request, doorbell avoidance, the BlueFlame copy or the doorbell.

use super::*;

/// [`TxQueue::post_one`]'s way of ringing, as a const parameter (an enum cannot be one): the
/// doorbell, BlueFlame by one copy routine ([`ring_bf`]), or whatever the queue has
/// (`RING_ANY`, for a burst whose end is any burst's).
pub(super) const RING_DB: u8 = 0;
pub(super) const RING_ANY: u8 = 5;

/// The way of ringing by BlueFlame with copy routine `c`.
pub(super) const fn ring_bf(c: Copy64) -> u8 {
    match c {
        Copy64::Movdir64b => 1,
        Copy64::Avx512 => 2,
        Copy64::Sse => 3,
        Copy64::Qwords => 4,
    }
}

/// The copy routine of a way of ringing by BlueFlame.
const fn bf_copy(ring: u8) -> Option<Copy64> {
    match ring {
        1 => Some(Copy64::Movdir64b),
        2 => Some(Copy64::Avx512),
        3 => Some(Copy64::Sse),
        4 => Some(Copy64::Qwords),
        _ => None,
    }
}

impl<B: TxBuf> TxQueue<B> {
    /// A burst of one packet, what a latency-bound application sends: a plain packet that
    /// fits a straight-line inline WQE before the ring's end is written in place, without
    /// the poster's set-up for a run (the run's end, the pending owner store, the loop and its
    /// tally), which a burst of one pays in full for nothing; the end of the burst is the
    /// same. Anything else is a burst like any other ([`TxQueue::post`]).
    ///
    /// `RING`: how the queue rings (`RING_DB`, [`ring_bf`]), chosen at setup
    /// ([`TxQueue::one`]), so that the doorbell path's copy holds no BlueFlame code, whose
    /// registers it would save and restore on every call, and BlueFlame's no dispatch on the
    /// copy routine.
    ///
    /// `room_arg`: the room, less one without `AVOID`: the front has that figure (its sign
    /// said there is room), the detour that avoidance takes has the room.
    #[inline(never)]
    pub(super) fn post_one<const AVOID: bool, const RING: u8>(
        &mut self,
        pkt: &B,
        room_arg: u32,
    ) -> usize {
        const { assert!(!AVOID || RING == RING_ANY) };
        let Some(data) = pkt.plain() else {
            return self.post_other::<AVOID>(pkt, room_arg);
        };
        // Every frame of 45 bytes or more (every Ethernet frame) takes two TXBBs: from here on
        // the size is a constant, and the length's class is not tested again.
        if data.len() > wqe::FIRST_CHUNK {
            return self.post_one_of::<AVOID, RING, 2>(pkt, data, room_arg);
        }
        std::hint::cold_path();
        self.post_one_of::<AVOID, RING, 1>(pkt, data, room_arg)
    }

    /// [`TxQueue::post_one`]'s way out to [`TxQueue::post`], for a packet it does not take:
    /// a jump with `post_one`'s own arguments, which then stay where they came.
    #[cold]
    #[inline(never)]
    fn post_other<const AVOID: bool>(&mut self, pkt: &B, room_arg: u32) -> usize {
        let room = if AVOID { room_arg } else { room_arg + 1 };
        self.post::<AVOID>(std::slice::from_ref(pkt), room)
    }

    /// [`TxQueue::post_one`] for a packet of the length class of `T` TXBBs (`data`, its bytes,
    /// more than `FIRST_CHUNK` for two).
    #[inline(always)]
    fn post_one_of<const AVOID: bool, const RING: u8, const T: u32>(
        &mut self,
        pkt: &B,
        data: &[u8],
        room_arg: u32,
    ) -> usize {
        let bf = bf_copy(RING);
        let pkts = std::slice::from_ref(pkt);
        let len = data.len();
        let start = self.prod.prod;
        // The class's lower bound is the caller's: only one of two TXBBs can be empty.
        let too_long = if T == 2 {
            len > self.plain_inline_max
        } else {
            len.wrapping_sub(1) >= self.plain_inline_max
        };
        // Before the ring's end: the writer's own bound check then folds away.
        let cnt = self.hw.sq.txbb_cnt();
        let slot = start & (cnt - 1);
        let no_room = if AVOID {
            T > room_arg
        } else {
            T - 1 > room_arg
        };
        if too_long || no_room || slot + T > cnt {
            return self.post_other::<AVOID>(pkt, room_arg);
        }
        // SAFETY: 1 <= len <= plain_inline_max <= PLAIN_INLINE_MAX, from the compares above
        // and the clamp at setup; the hint tells the compiler the second chunk's size, in
        // place of a compare.
        #[allow(unsafe_code)]
        unsafe {
            std::hint::assert_unchecked(len <= wqe::PLAIN_INLINE_MAX)
        };
        // On the doorbell path the WQE is written once the burst's end is decided and booked,
        // so that only its address and owner word live across the copy, in registers the call
        // need not save (113.1 -> 107.2 instructions). The BlueFlame path, whose copy needs
        // more of them, keeps the first order (it measured 0.9 more the other way).
        let late = !AVOID && bf.is_none();
        if !late {
            self.write_one::<T>(start, data);
        }
        if AVOID {
            // Every burst decides a doorbell skip and most ask for a completion: the end of
            // any burst, in place (a call to `end_one` would be paid on each).
            return self.end_one_inline::<AVOID>(pkts, len);
        }
        // The end of the burst, `end_burst`'s for one WQE that asks for no completion and
        // decides no doorbell skip, in place; the others go out of line.
        let p = &mut self.prod;
        let (since, since_txbbs) = (p.since_comp + 1, p.txbbs_since_comp + T);
        if since >= self.comp_every || since_txbbs >= self.comp_txbbs {
            if late {
                self.write_one::<T>(start, data);
            }
            return self.end_one::<AVOID>(pkts, len);
        }
        (p.since_comp, p.txbbs_since_comp) = (since, since_txbbs);
        p.prod = start.wrapping_add(T);
        p.stats.bytes += len as u64;
        let last = LastWqe {
            start,
            txbbs: T,
            send_be: self.hw.sq.owner_word(start, opcode::SEND).to_be(),
        };
        if late {
            self.write_one_published::<T>(start, data, u32::from_be(last.send_be));
            self.ring_published();
        } else if bf.is_some() {
            // The control segment's size word is the one just written: no read of the ring,
            // and a plain WQE has no VLAN tag to keep it off BlueFlame.
            self.ring_for_with::<true>(last, wqe::plain_inline_dword1(len), bf);
        } else {
            self.ring_doorbell(last);
        }
        release(pkts, self.cfg.fast_free);
        self.prod.stats.packets += 1;
        1
    }

    /// [`TxQueue::write_one`], then the WQE published with `owner` (host order) through its
    /// writer.
    #[inline(always)]
    fn write_one_published<const T: u32>(&mut self, start: u32, data: &[u8], owner: u32) {
        if T == 1 {
            let mut w = self.hw.sq.wqe_fixed::<1>(start);
            wqe::write_plain_inline1(&mut w, data);
            w.publish(owner);
        } else {
            let mut w = self.hw.sq.wqe_fixed::<2>(start);
            // The short class's writer (every minimum-size frame) copies the second chunk
            // with both moves addressed from the WQE and the packet, no pointer derived.
            wqe::write_plain_inline2_short(&mut w, data);
            w.publish(owner);
        }
    }

    /// [`TxQueue::post_one`]'s WQE of `T` TXBBs: `data` (of that class) inline at `start`,
    /// which has `T` TXBBs before the ring's end.
    #[inline(always)]
    fn write_one<const T: u32>(&mut self, start: u32, data: &[u8]) {
        if T == 1 {
            wqe::write_plain_inline1(&mut self.hw.sq.wqe_fixed::<1>(start), data);
        } else {
            // Not the short class's writer here: the BlueFlame copy then measured 4.0 more.
            wqe::write_plain_inline2(&mut self.hw.sq.wqe_fixed::<2>(start), data);
        }
    }

    /// [`TxQueue::post_one`]'s end when its WQE asks for a completion or doorbell avoidance
    /// is on: the end of any burst. The WQE is derived again from the producer and the
    /// length, so that the call takes few enough arguments to be a jump.
    #[inline(never)]
    fn end_one<const AVOID: bool>(&mut self, pkts: &[B], len: usize) -> usize {
        self.end_one_inline::<AVOID>(pkts, len)
    }

    /// [`TxQueue::end_one`]'s body.
    #[inline(always)]
    fn end_one_inline<const AVOID: bool>(&mut self, pkts: &[B], len: usize) -> usize {
        let start = self.prod.prod;
        let txbbs = wqe::plain_inline_txbbs(len);
        let last = LastWqe {
            start,
            txbbs,
            send_be: self.hw.sq.owner_word(start, opcode::SEND).to_be(),
        };
        let posted = Posted {
            end: start.wrapping_add(txbbs),
            last: Some(last),
        };
        self.end_burst::<AVOID>(posted, start, pkts, Tally::straight(1, len as u64))
    }

    /// The burst proper, with `room` TXBBs (more than none) to fill. A burst of plain packets
    /// that fit inline WQEs (the common one) is one straight-line run; anything else continues
    /// in [`post_rest`].
    #[inline(never)]
    pub(super) fn post<const AVOID: bool>(&mut self, pkts: &[B], room: u32) -> usize {
        self.post_from::<AVOID, false>(pkts, room)
    }

    /// A burst whose first packet is above the inline threshold (of large frames, the common
    /// other burst): a straight-line gather run first, without the inline loop's set-up and
    /// `post_rest`'s for packets they would only hand on.
    #[inline(never)]
    fn post_gather<const AVOID: bool>(&mut self, pkts: &[B], room: u32) -> usize {
        self.post_from::<AVOID, true>(pkts, room)
    }

    /// [`TxQueue::post`] and [`TxQueue::post_gather`]: `GATHER`, which run comes first.
    #[inline(always)]
    fn post_from<const AVOID: bool, const GATHER: bool>(&mut self, pkts: &[B], room: u32) -> usize {
        let inline_max = usize::from(self.cfg.inline_max);
        if !GATHER && matches!(pkts[0].plain(), Some(d) if d.len() > inline_max) {
            return self.post_gather::<AVOID>(pkts, room);
        }
        let start = self.prod.prod;
        let sink = AtomicU32::new(0);
        let mut poster = self.hw.sq.poster(start, start.wrapping_add(room), &sink);
        let (mut n, mut bytes) = (0, 0);
        let (stop, t) = if GATHER {
            let stop = gather_run(
                &mut poster,
                pkts,
                &mut n,
                inline_max,
                &self.prod.lkeys,
                &mut self.elts,
                &mut bytes,
            );
            let mut t = Tally::gathered(n, bytes);
            if stop == Stop::End {
                self.prod.stats.gather_packets += n as u64;
                let posted = poster.finish();
                return self.end_burst::<AVOID>(posted, start, pkts, t);
            }
            // What `post_rest` does after a gather run: the packet that stopped it is for
            // the inline run or the general path, and the inline run comes first.
            let stop = match stop {
                Stop::Other => inline_run::<B, false>(
                    &mut poster,
                    pkts,
                    &mut t.n,
                    self.plain_inline_max,
                    &mut t.bytes,
                ),
                s => s,
            };
            (stop, t)
        } else {
            let stop =
                inline_run::<B, true>(&mut poster, pkts, &mut n, self.plain_inline_max, &mut bytes);
            if stop == Stop::End {
                // Every packet went the straight-line way: the tally is two registers, and
                // the end of the burst a copy of its own with the rest folded away.
                let posted = poster.finish();
                return self.end_burst::<AVOID>(posted, start, pkts, Tally::straight(n, bytes));
            }
            (stop, Tally::straight(n, bytes))
        };
        let rest = Rest {
            inline_max,
            plain_inline_max: self.plain_inline_max,
            // Gather packets already in the tally are held already: the room subtracts them.
            elts_room: self.elts.capacity() - self.elts.len() + t.gathers,
            fast_free: self.cfg.fast_free,
            prod: &mut self.prod,
            elts: &mut self.elts,
            done: &mut self.done,
            segs: &mut self.segs,
        };
        // The poster goes in and out by value, so that it need not live in memory on the
        // straight-line path.
        let (poster, t) = post_rest(poster, pkts, stop, t, rest);
        let posted = poster.finish();
        let taken = self.end_burst::<AVOID>(posted, start, pkts, t);
        if t.last && taken < pkts.len() {
            // A WQE that had to be the last went out with its doorbell: the rest continue
            // as a burst of their own.
            return taken + self.post_burst(&pkts[taken..]);
        }
        if taken == 0 {
            // Too little room for the first packet: as for a full ring (see `full`).
            self.look_without_room();
        }
        taken
    }

    /// Once per burst: the completion request, the BlueFlame copy or the doorbell, the
    /// release of what was copied inline, the counters.
    #[inline(always)]
    pub(super) fn end_burst<const AVOID: bool>(
        &mut self,
        posted: Posted,
        start: u32,
        pkts: &[B],
        t: Tally,
    ) -> usize {
        let end = posted.end;
        let p = &mut self.prod;
        p.prod = end;
        // Apart from `packets` (below, past the doorbell's branches): two adjacent counters
        // added together are merged into one vector add, which costs three instructions more.
        p.stats.bytes += t.bytes;
        if let Some(last) = posted.last {
            let posted_n = (t.n as u32) - t.errors;
            // Before the completion request, which it may force.
            let skip = AVOID && self.may_skip(end, posted_n);
            self.ask_if_due(last, start, end, posted_n);
            if skip {
                self.hw.sq.publish(last.start, u32::from_be(last.send_be));
                self.prod.stats.doorbells_avoided += 1;
            } else {
                self.ring_for(last);
            }
        }
        // Inline and dropped packets go back to their pools now (an inline packet's bytes
        // are in its WQE): straight from the caller's array unless gather packets came
        // between them.
        let fast = self.cfg.fast_free && t.single_seg;
        if t.kept == 0 && t.n == pkts.len() {
            release(pkts, fast);
        } else if self.done.is_empty() {
            release(&pkts[t.kept..t.n], fast);
        } else {
            stash(&mut self.done, &pkts[t.kept..t.n], fast);
            release(self.done.take(), fast);
        }
        self.prod.stats.packets += (t.n - t.errors as usize) as u64;
        t.n
    }

    /// The completion request of a burst's last WQE: when enough went unsignaled, if the
    /// bookkeeping has room.
    #[inline(always)]
    pub(super) fn ask_if_due(&mut self, last: LastWqe, start: u32, end: u32, n: u32) {
        let p = &mut self.prod;
        p.since_comp += n;
        p.txbbs_since_comp += end.wrapping_sub(start);
        if p.since_comp >= self.comp_every || p.txbbs_since_comp >= self.comp_txbbs {
            self.ask_completion_for(last, end);
        }
    }

    /// [`TxQueue::ask_if_due`]'s request, if the bookkeeping has room: out of line, as it is
    /// made once per many WQEs, and its registers would otherwise be saved on every burst.
    #[inline(never)]
    pub(super) fn ask_completion_for(&mut self, last: LastWqe, end: u32) {
        let p = &mut self.prod;
        if p.marks_head.wrapping_sub(self.comp.marks_tail) < self.marks.len() as u32 {
            wqe::set_signaled(&mut self.hw.sq.wqe_mut(last.start, last.txbbs));
            let mask = self.marks.len() as u32 - 1;
            self.marks[(p.marks_head & mask) as usize] = CompMark {
                txbb_end: end,
                elts_end: self.elts.head(),
                wqe_index: last.start as u16,
            };
            p.marks_head = p.marks_head.wrapping_add(1);
            (p.since_comp, p.txbbs_since_comp) = (0, 0);
        }
    }

    /// Publishes the burst's last WQE and tells the device: the BlueFlame copy when the path
    /// is live and the WQE fits a half, else the doorbell.
    #[inline(always)]
    pub(super) fn ring_for(&mut self, last: LastWqe) {
        self.ring_for_with::<false>(last, 0, None);
    }

    /// [`TxQueue::ring_for`]. `PLAIN`: the WQE is a straight-line one, which carries no VLAN
    /// tag, and bytes 4-7 of its control segment, as stored, are `plain_dword1_be`, so the
    /// ring is not read back for them. `copy`: the register's copy routine, if the caller
    /// knows it.
    #[inline(always)]
    fn ring_for_with<const PLAIN: bool>(
        &mut self,
        last: LastWqe,
        plain_dword1_be: u32,
        copy: Option<Copy64>,
    ) {
        let p = &mut self.prod;
        let word = u32::from_be(last.send_be);
        let hw = &mut self.hw;
        // A caller that knows the copy routine takes BlueFlame only with it (a queue keeps
        // its routine, so the doorbell is never taken for that), in one compare.
        let bf = hw
            .bf
            .as_mut()
            .filter(|bf| copy.is_none_or(|c| bf.copy() == c));
        if let Some(half) = bf.and_then(|bf| bf.reserve(last.txbbs)) {
            // As stored (big-endian), so that neither it nor the head is swapped.
            let dword1_be = if PLAIN {
                plain_dword1_be
            } else {
                hw.sq.ctrl_dword1(last.start).to_be()
            };
            // The copy's bytes 4-6 carry the QPN where a VLAN-inserting WQE has its tag: such
            // a WQE never goes through BF. The ring keeps a plain WQE for a device that falls
            // back to fetching it.
            if PLAIN || dword1_be & (0xff_u32 << 8).to_be() == 0 {
                let word = word | (last.start & 0xffff) << owner_opcode::BF_COUNTER_SHIFT;
                let mut head = [0u8; 8];
                head[..4].copy_from_slice(&word.to_be_bytes());
                let size_be = dword1_be & 0xff_u32.to_be();
                head[4..].copy_from_slice(&(hw.bf_qpn_be | size_be).to_ne_bytes());
                let wqe = hw.sq.publish_blocks(last.start, last.txbbs, word);
                match copy {
                    Some(how) => half.write_as(how, head, wqe),
                    None => half.write(head, wqe),
                }
                p.stats.bf_writes += 1;
                return;
            }
        }
        hw.sq.publish(last.start, word);
        hw.doorbell.ring();
        p.stats.doorbells += 1;
    }

    /// [`TxQueue::ring_doorbell`] for a WQE published already.
    #[inline(always)]
    fn ring_published(&mut self) {
        debug_assert!(self.hw.bf.is_none());
        self.hw.doorbell.ring();
        self.prod.stats.doorbells += 1;
    }

    /// [`TxQueue::ring_for`] on a queue without a BF register.
    #[inline(always)]
    fn ring_doorbell(&mut self, last: LastWqe) {
        debug_assert!(self.hw.bf.is_none());
        self.hw.sq.publish(last.start, u32::from_be(last.send_be));
        self.ring_published();
    }

    /// With doorbell avoidance on: whether the burst ending at `end`, of `n` packets, may
    /// leave its doorbell to a later call (see [`DbAvoid`] for the conditions); if so, counts
    /// its packets against the bound. If not, the burst rings: this records it, and makes its
    /// last WQE ask for a completion, so that the next burst can tell when the device caught
    /// up.
    #[inline(always)]
    pub(super) fn may_skip(&mut self, end: u32, n: u32) -> bool {
        if self.skip_allowed(end, n) {
            return true;
        }
        let p = &mut self.prod;
        (p.bell, p.unrung) = (end, 0);
        // `ask_if_due` adds the burst's packets to this, and asks.
        p.since_comp = p.since_comp.max(self.comp_every);
        false
    }

    #[inline(always)]
    pub(super) fn skip_allowed(&mut self, end: u32, n: u32) -> bool {
        let cons = self.comp.cons;
        let p = &mut self.prod;
        // The device finished what the last doorbell announced: nothing would ring for us.
        if p.bell.wrapping_sub(cons) as i32 <= 0 {
            return false;
        }
        let unrung = p.unrung + n;
        if unrung > self.avoid_packets {
            return false;
        }
        // Room for the largest WQE before the ring's end or after it, and a gather slot.
        let used = end.wrapping_sub(cons);
        if used + 2 * MAX_WQE_TXBBS > self.usable || self.elts.len() >= self.elts.capacity() {
            return false;
        }
        let now = crate::mmio::tsc();
        if p.unrung == 0 {
            p.unrung_deadline = now.wrapping_add(self.avoid_cycles);
        } else if now.wrapping_sub(p.unrung_deadline) as i64 >= 0 {
            return false;
        }
        p.unrung = unrung;
        true
    }

    /// Rings for what doorbell avoidance left waiting, asking for a completion first if the
    /// last WQE did not, so that the next burst can tell when the device caught up.
    #[cold]
    #[inline(never)]
    pub(super) fn ring_unrung(&mut self) {
        self.ask_completion();
        self.hw.doorbell.ring();
        let p = &mut self.prod;
        p.stats.doorbells += 1;
        (p.bell, p.unrung) = (p.prod, 0);
    }
}

/// Why a straight-line run stopped.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// Every packet of the chunk is posted.
    End,
    /// No room for the next packet.
    Full,
    /// The next packet, of this many TXBBs, does not fit before the current run's end.
    RunEnd(u32),
    /// The next packet is not for this run.
    Other,
}

/// Posts plain packets that fit an inline WQE of one or two TXBBs, from `pkts[*n]` on, until
/// one does not; adds their bytes to `bytes`. With `HOIST`, when the run has room for all of
/// them at two TXBBs each (nearly every burst), the room is checked once, not per packet;
/// without (a run that continues a burst of other packets), each WQE checks it, so that the
/// general path carries one copy of the loop, not two.
#[inline(always)]
pub(super) fn inline_run<B: TxBuf, const HOIST: bool>(
    poster: &mut Poster<'_>,
    pkts: &[B],
    n: &mut usize,
    plain_inline_max: usize,
    bytes: &mut u64,
) -> Stop {
    let mut poster = poster.cursor();
    let todo = &pkts[*n..];
    // The threshold is clamped to PLAIN_INLINE_MAX at setup; said again so that the one
    // compare per packet bounds both length classes for the compiler.
    let max = plain_inline_max.min(wqe::PLAIN_INLINE_MAX);
    let (i, sum, stop) = if HOIST && poster.room() >= todo.len() * 2 {
        inline_loop::<B, false>(&mut poster, todo, max)
    } else {
        inline_loop::<B, true>(&mut poster, todo, max)
    };
    *n += i;
    *bytes += sum;
    stop
}

/// [`inline_run`]'s loop: how many packets it posted, their bytes, and why it stopped.
/// `CHECK`: whether each WQE checks the room; without, the caller made sure of two TXBBs for
/// every packet of `todo`.
///
/// The two-TXBB class comes first, as the loop's straight line: an Ethernet frame is at least
/// 60 bytes, longer than the one-TXBB class's 44, so only runts take that branch. The index
/// is derived from the iterator on the way out, not counted per packet.
#[inline(always)]
fn inline_loop<B: TxBuf, const CHECK: bool>(
    poster: &mut Cursor<'_, '_>,
    todo: &[B],
    max: usize,
) -> (usize, u64, Stop) {
    if !CHECK {
        // With a threshold that takes the whole short class, its test is one compare with a
        // constant.
        return if max >= wqe::PLAIN_SHORT2_MAX {
            inline_loop_hoisted::<B, true>(poster, todo, max)
        } else {
            inline_loop_hoisted::<B, false>(poster, todo, max)
        };
    }
    let mut sum = 0u64;
    let base = todo.as_ptr() as usize;
    for pkt in todo {
        let i = (pkt as *const B as usize - base) / std::mem::size_of::<B>();
        let Some(data) = pkt.plain() else {
            return (i, sum, Stop::Other);
        };
        let len = data.len();
        if len.wrapping_sub(1) >= max {
            return (i, sum, Stop::Other);
        }
        // SAFETY: 1 <= len <= max <= PLAIN_INLINE_MAX, from the compare above and the clamp;
        // the hint lets the writers' own clamps and table bounds fold away.
        #[allow(unsafe_code)]
        unsafe {
            std::hint::assert_unchecked(len <= wqe::PLAIN_INLINE_MAX)
        };
        // Each length class with its own constant WQE size.
        if len > wqe::FIRST_CHUNK {
            let mut w = if CHECK {
                let Some(w) = poster.take::<2>() else {
                    return (i, sum, Stop::RunEnd(2));
                };
                w
            } else {
                // SAFETY: the caller found room for two TXBBs per packet of `todo`, and
                // each packet takes at most two.
                #[allow(unsafe_code)]
                unsafe {
                    poster.take_unchecked::<2>()
                }
            };
            wqe::write_plain_inline2(&mut w, data);
        } else {
            std::hint::cold_path();
            let mut w = if CHECK {
                let Some(w) = poster.take::<1>() else {
                    return (i, sum, Stop::RunEnd(1));
                };
                w
            } else {
                // SAFETY: as above.
                #[allow(unsafe_code)]
                unsafe {
                    poster.take_unchecked::<1>()
                }
            };
            wqe::write_plain_inline1(&mut w, data);
        }
        sum += len as u64;
    }
    (todo.len(), sum, Stop::End)
}

/// [`inline_loop`] without a room check, which the caller made for two TXBBs per packet of
/// `todo`. A run of two-TXBB WQEs (every frame of 45 to 104 bytes) publishes each WQE where
/// it is, the two TXBBs before the next one, so that no WQE pointer is carried from one
/// packet to the next; a runt's one-TXBB WQE breaks the run, and the next starts another.
/// `SHORT`: the threshold takes the whole short class (`wqe::PLAIN_SHORT2_MIN` to
/// `wqe::PLAIN_SHORT2_MAX`, every minimum-size frame), so that a burst that starts with a
/// run of it writes that run first, each packet told by one compare with a constant and
/// written with no other test; the rest of the burst takes the loop for any length.
#[inline(always)]
fn inline_loop_hoisted<B: TxBuf, const SHORT: bool>(
    poster: &mut Cursor<'_, '_>,
    todo: &[B],
    max: usize,
) -> (usize, u64, Stop) {
    // The packet's bytes if it is for this loop, its length bounded for the writers.
    #[inline(always)]
    fn fits<B: TxBuf>(pkt: &B, max: usize) -> Option<&[u8]> {
        let data = pkt.plain()?;
        let len = data.len();
        if len.wrapping_sub(1) >= max {
            return None;
        }
        // SAFETY: 1 <= len <= max <= PLAIN_INLINE_MAX, from the compare above and the clamp;
        // the hint lets the writers' own clamps and table bounds fold away.
        #[allow(unsafe_code)]
        unsafe {
            std::hint::assert_unchecked(len <= wqe::PLAIN_INLINE_MAX)
        };
        Some(data)
    }
    let mut sum = 0u64;
    let mut i = 0;
    #[inline(always)]
    fn short<B: TxBuf>(pkt: &B) -> Option<&[u8]> {
        pkt.plain()
            .filter(|d| d.len().wrapping_sub(wqe::PLAIN_SHORT2_MIN) <= wqe::PLAIN_SHORT2_SPAN)
    }
    if let Some(data) = todo.first().and_then(|p| short(p).filter(|_| SHORT)) {
        // SAFETY: the caller found room for two TXBBs per packet of `todo`.
        #[allow(unsafe_code)]
        let mut w = unsafe { poster.take_unchecked::<2>() };
        wqe::write_plain_inline2_short(&mut w, data);
        sum += data.len() as u64;
        let mut rest = todo[1..].iter();
        while let Some(data) = rest.as_slice().first().and_then(short) {
            rest.next();
            // SAFETY: room for two TXBBs per packet of `todo`; the two TXBBs before the
            // cursor are the WQE of the packet before, taken from this cursor and not
            // published.
            #[allow(unsafe_code)]
            let mut w = unsafe { poster.take_after_unchecked::<2>() };
            wqe::write_plain_inline2_short(&mut w, data);
            sum += data.len() as u64;
        }
        // SAFETY: the run's first WQE came from `take_unchecked`, every one is of two TXBBs.
        #[allow(unsafe_code)]
        unsafe {
            poster.last_is_pending::<2>()
        };
        i = todo.len() - rest.as_slice().len();
    }
    while let Some(pkt) = todo.get(i) {
        let Some(data) = fits(pkt, max) else {
            return (i, sum, Stop::Other);
        };
        if data.len() <= wqe::FIRST_CHUNK {
            std::hint::cold_path();
            // SAFETY: the caller found room for two TXBBs per packet of `todo`.
            #[allow(unsafe_code)]
            let mut w = unsafe { poster.take_unchecked::<1>() };
            wqe::write_plain_inline1(&mut w, data);
            sum += data.len() as u64;
            i += 1;
            continue;
        }
        // SAFETY: as above.
        #[allow(unsafe_code)]
        let mut w = unsafe { poster.take_unchecked::<2>() };
        wqe::write_plain_inline2(&mut w, data);
        sum += data.len() as u64;
        i += 1;
        // The run of two-TXBB WQEs after it.
        let mut stop = None;
        while let Some(pkt) = todo.get(i) {
            let Some(data) = fits(pkt, max) else {
                stop = Some(Stop::Other);
                break;
            };
            if data.len() <= wqe::FIRST_CHUNK {
                // The outer loop takes it.
                break;
            }
            // SAFETY: room for two TXBBs per packet of `todo`; the two TXBBs before the
            // cursor are the WQE of the packet before, taken from this cursor and not
            // published.
            #[allow(unsafe_code)]
            let mut w = unsafe { poster.take_after_unchecked::<2>() };
            wqe::write_plain_inline2(&mut w, data);
            sum += data.len() as u64;
            i += 1;
        }
        // SAFETY: the run's first WQE came from `take_unchecked`, every one is of two TXBBs.
        #[allow(unsafe_code)]
        unsafe {
            poster.last_is_pending::<2>()
        };
        if let Some(stop) = stop {
            return (i, sum, stop);
        }
    }
    (todo.len(), sum, Stop::End)
}

/// What a burst came to.
#[derive(Clone, Copy)]
pub(super) struct Tally {
    /// Packets taken (posted or dropped).
    pub(super) n: usize,
    pub(super) bytes: u64,
    pub(super) gathers: u32,
    pub(super) errors: u32,
    /// Packets before this are held for gather WQEs or kept in `done`; from it up to `n`,
    /// they are released straight from the caller's array.
    pub(super) kept: usize,
    /// No packet released with this burst's may have several segments (fast free allowed).
    pub(super) single_seg: bool,
    /// The burst stopped for want of room.
    pub(super) full: bool,
    /// The burst ended with a WQE that must be its last ([`Step::GatherLast`]).
    pub(super) last: bool,
}

impl Tally {
    /// `n` packets of `bytes` in all, every one posted by the straight-line path.
    #[inline(always)]
    fn straight(n: usize, bytes: u64) -> Tally {
        Tally {
            n,
            bytes,
            gathers: 0,
            errors: 0,
            kept: 0,
            single_seg: true,
            full: false,
            last: false,
        }
    }

    /// `n` packets of `bytes` in all, every one a gather WQE of the straight-line path,
    /// held until its completion.
    #[inline(always)]
    fn gathered(n: usize, bytes: u64) -> Tally {
        Tally {
            gathers: n as u32,
            kept: n,
            ..Tally::straight(n, bytes)
        }
    }
}
