//! The burst: CQEs polled, the filled buffers handed up, fresh ones posted in their slots.

use std::mem::MaybeUninit;

use mlx4_prm::{cqe_opcode, cqe_owner, Cqe, DataSeg};

use super::entry::{Posting, Region, ENTRY_HEAD};
use super::meta::{parse_rx_cqe, rx_meta, with_tunnel, Seen, RX_META};
use super::{alloc_in_place, alloc_into, release, RxBuf, RxConfig, RxQueue, CHUNK, FRESH};
use crate::mem::{DmaArray, Lkeys};
use crate::ring::RqRing;
use crate::stats::RxStats;
use std::cell::Cell;

impl<B: RxBuf> RxQueue<B> {
    /// Receives up to `out.len()` frames.
    ///
    /// Per burst, not per frame: a call with nothing waiting leaves after one load of the
    /// next CQE's owner byte; the CQEs ready are counted once, and their replacement buffers
    /// allocated with one bulk call; the lkey of the pool's region is looked up once; the
    /// counters are summed in registers; the CQ consumer record and the RQ doorbell record
    /// are written once, at the end. Per frame remain the CQE's fields, the buffer handed up
    /// and the fresh one posted in its slot.
    pub fn burst(&mut self, out: &mut [B]) -> usize {
        let got = match out {
            [one] if self.cfg.sges == 1 => match self.burst_one(one) {
                Some(got) => got,
                None => return 0,
            },
            _ => {
                if out.is_empty() || !self.cq.has_cqe() {
                    return 0;
                }
                if self.cfg.sges == 1 {
                    if self.cfg.rss || self.cfg.tunnel {
                        self.burst_single::<false>(out)
                    } else {
                        self.burst_single::<true>(out)
                    }
                } else {
                    self.burst_scattered(out)
                }
            }
        };
        self.cq.update_ci();
        self.post_all();
        got
    }

    /// A burst of one on a single-buffer queue: the CQE taken as its owner byte is checked,
    /// no count of the ready ones, no run, and a buffer allocated only for a frame. `None`
    /// when no CQE waits.
    fn burst_one(&mut self, out: &mut B) -> Option<usize> {
        let c = self.cq.next_view()?;
        let slot = (self.rq_ci & (self.wqe_cnt - 1)) as usize;
        self.rq_ci = self.rq_ci.wrapping_add(1);
        if c.opcode() == cqe_opcode::ERROR {
            let why = (c.syndrome(), c.vendor_err());
            self.stats.errors += 1;
            self.on_error_cqe(why.0, why.1);
            return Some(0);
        }
        let mut fresh_room = [MaybeUninit::uninit()];
        let Some(fresh) = alloc_into(self.pool, &mut fresh_room).map(|f| f[0]) else {
            // The pool ran dry: the frame is dropped and counted, and its buffer stays posted.
            self.stats.nombuf += 1;
            return Some(0);
        };
        let seen = Seen::of(&c);
        let len = c.byte_cnt();
        // One frame: building the entry template would cost more than it saves.
        let mut cx = Refill::new(
            &mut self.elts,
            &mut self.rq,
            &mut self.lkeys,
            self.cfg,
            None,
        );
        let (elt, entry) = (&mut cx.elts[slot], &mut cx.entries[slot]);
        *out = frame::<B, false>(&cx.ctx, elt, entry, &seen, fresh, cx.lkeys, &mut cx.errors);
        // Its entry is written apart from a template: telling whether it kept the ring's byte
        // count and lkey costs a burst of one more than it could save a later burst.
        self.entry_head = None;
        let errors = cx.errors;
        let st = &mut self.stats;
        st.packets += 1;
        st.bytes += u64::from(len);
        st.errors += errors;
        Some(1)
    }

    /// One buffer per frame (RX scatter off), a chunk of CQEs at a time. A chunk whose last
    /// CQE is ready already takes one pass, its buffers allocated before it; any other
    /// (fewer CQEs ready, an error CQE, a pool short of the chunk) two: the first takes the
    /// CQEs, copying out what the second needs of each (the status word and byte count in
    /// one load), which then hands up the frames and posts their replacements, allocated in
    /// between with one bulk call for exactly the CQEs taken. No pass reads a CQE twice.
    /// `PLAIN`: neither RSS nor tunnel reports (the queue's settings say so), compiled
    /// without their loads and tests per frame.
    fn burst_single<const PLAIN: bool>(&mut self, out: &mut [B]) -> usize {
        debug_assert_eq!(self.elts.len(), self.wqe_cnt as usize);
        debug_assert!(!PLAIN || !(self.cfg.rss || self.cfg.tunnel));
        let (mut got, mut nombuf, mut bytes) = (0usize, 0u64, 0u64);
        let RxQueue {
            cq,
            rq,
            elts,
            lkeys,
            cfg,
            pool,
            fresh,
            seen,
            stats,
            error_seen,
            rq_ci,
            room,
            entry_head: head,
            ..
        } = self;
        let mut cx = Refill::new(elts, rq, lkeys, *cfg, Some(*room));
        // Entries that all hold the template's byte count and lkey get only their address.
        // Otherwise the template's whole entries make them differ (until the ring is posted
        // whole again), as does an entry written apart from the template.
        let addr_only = *head == Some(cx.ctx.posting.head());
        if !addr_only {
            *head = None;
        }
        // A burst of more than CHUNK frames takes them a chunk at a time; each chunk ends the
        // loop when the CQ had fewer than it asked for.
        while got < out.len() {
            let mut want = (out.len() - got).min(CHUNK);
            // The chunk's last CQE is software's already, so (the device completing in order)
            // the whole chunk most likely is: its frames are copied out of their slots, the
            // fresh buffers allocated straight into the slots, and one pass hands each frame
            // up as it takes its CQE. It stops before an error CQE, which the two passes below
            // take with the rest of the chunk; a pool that cannot give the whole chunk leaves
            // it to them too, which allocate for exactly the CQEs they take.
            // A run that reaches either ring's end stops there, and the next chunk goes on
            // from the ring's start: the pass then needs no test for a wrap.
            let at = *rq_ci as usize & cx.ring_mask;
            let run = want.min(cx.elts.len() - at).min(cq.to_end() as usize);
            if cq.owns_ahead(run as u32 - 1) {
                let dst = &mut out[got..got + run];
                let slots = &mut cx.elts[at..at + run];
                dst.copy_from_slice(slots);
                if alloc_in_place(*pool, slots, dst) {
                    let mut cqes = cq.owned();
                    // SAFETY: `take_placed` calls this at most once per frame of `dst`, `run`
                    // times, and `run` CQEs fit before the ring's end.
                    #[allow(unsafe_code)]
                    let next = || unsafe { cqes.next_frame_before_end() };
                    let entries = &mut cx.entries[at..at + run];
                    let (lk, errors) = (&mut *cx.lkeys, &mut cx.errors);
                    let k = if addr_only {
                        take_placed::<B, PLAIN, true>(
                            &cx.ctx, next, dst, slots, entries, lk, errors, &mut bytes,
                        )
                    } else {
                        take_placed::<B, PLAIN, false>(
                            &cx.ctx, next, dst, slots, entries, lk, errors, &mut bytes,
                        )
                    };
                    drop(cqes);
                    if k < run {
                        // The slots of the CQEs not taken keep the buffers they had.
                        release(&slots[k..]);
                        slots[k..].copy_from_slice(&dst[k..]);
                    }
                    *rq_ci = rq_ci.wrapping_add(k as u32);
                    got += k;
                    if k == run {
                        continue;
                    }
                    want -= k;
                }
            }
            // Bit i: the chunk's CQE i is an error one (too long for its buffer, or a bad
            // one), whose slot keeps its buffer. Rare: counted after the pass, so that the
            // loop calls nothing and keeps its values in registers.
            let (mut n, mut errs, mut chunk_bytes) = (0, 0u64, 0u64);
            let mut cqes = cq.owned();
            while n < want {
                let Some((op, c)) = cqes.next() else { break };
                let s = &mut seen[n];
                if op & cqe_owner::OPCODE_MASK == cqe_opcode::ERROR {
                    errs |= 1 << n;
                    s.status_len = u64::from(c.syndrome()) << 8 | u64::from(c.vendor_err());
                } else {
                    let (status, len) = c.status_byte_cnt();
                    s.status_len = u64::from(status) << 32 | u64::from(len);
                    chunk_bytes += u64::from(len);
                    if !PLAIN {
                        s.hash = c.immed_rss_invalid();
                        s.vlan = c.vlan_my_qpn();
                    }
                }
                n += 1;
            }
            drop(cqes);
            if n == 0 {
                break;
            }
            let taken = &seen[..n];
            if errs != 0 {
                error_cqes(stats, error_seen, taken, errs);
            }
            let ci = *rq_ci;
            *rq_ci = ci.wrapping_add(n as u32);
            let at = ci as usize & cx.ring_mask;
            if errs == 0 && n <= cx.elts.len() - at {
                // The common chunk, whole and short of the ring's end: its frames are
                // copied out of their slots in one go, the fresh buffers allocated straight
                // into the slots, and one loop describes each frame and posts its slot's
                // entry, with no buffer moved per frame.
                let dst = &mut out[got..got + n];
                let slots = &mut cx.elts[at..at + n];
                dst.copy_from_slice(slots);
                if !alloc_in_place(*pool, slots, dst) {
                    nombuf += n as u64;
                    if n < want {
                        break;
                    }
                    continue;
                }
                bytes += chunk_bytes;
                hand_up_placed::<B, PLAIN>(
                    &cx.ctx,
                    taken,
                    dst,
                    slots,
                    &mut cx.entries[at..at + n],
                    cx.lkeys,
                    &mut cx.errors,
                );
                got += n;
                if n < want {
                    break;
                }
                continue;
            }
            // As many fresh buffers as CQEs taken, error ones included: all, or the frames
            // are dropped and counted, and their buffers stay posted.
            let Some(fresh) = alloc_into(*pool, &mut fresh[..n]) else {
                nombuf += u64::from(n as u32 - errs.count_ones());
                if n < want {
                    break;
                }
                continue;
            };
            bytes += chunk_bytes;
            let dst = &mut out[got..got + n];
            let used = if errs == 0 {
                // The chunk's slots in at most two runs, to the ring's end and on from its
                // start, walked beside the CQEs, the frames and the fresh buffers.
                let at = ci as usize & cx.ring_mask;
                let head = n.min(cx.elts.len() - at);
                for (from, k, len) in [(at, 0, head), (0, head, n - head)] {
                    // Most chunks end before the ring does: no call for an empty run.
                    if len == 0 {
                        break;
                    }
                    let run = from..from + len;
                    let (elts, entries) = (&mut cx.elts[run.clone()], &mut cx.entries[run]);
                    let frames = k..k + len;
                    hand_up::<B, PLAIN>(
                        &cx.ctx,
                        &taken[frames.clone()],
                        &mut dst[frames.clone()],
                        &fresh[frames],
                        elts,
                        entries,
                        cx.lkeys,
                        &mut cx.errors,
                    );
                }
                n
            } else {
                let mut used = 0;
                for (i, s) in taken.iter().enumerate() {
                    if errs >> i & 1 != 0 {
                        continue;
                    }
                    let slot = ci.wrapping_add(i as u32) as usize & cx.ring_mask;
                    let (elt, entry) = (&mut cx.elts[slot], &mut cx.entries[slot]);
                    dst[used] = frame::<B, PLAIN>(
                        &cx.ctx,
                        elt,
                        entry,
                        s,
                        fresh[used],
                        cx.lkeys,
                        &mut cx.errors,
                    );
                    used += 1;
                }
                release(&fresh[used..]);
                used
            };
            got += used;
            if n < want {
                break;
            }
        }
        if cx.ctx.apart.get() {
            *head = None;
        }
        let errors = cx.errors;
        let st = stats;
        st.packets += got as u64;
        st.bytes += bytes;
        st.errors += errors;
        st.nombuf += nombuf;
        got
    }

    /// Frames that may take several buffers (scattered RX).
    fn burst_scattered(&mut self, out: &mut [B]) -> usize {
        // Its entries may point at buffers of any region.
        self.entry_head = None;
        let mut got = 0;
        while got < out.len() {
            // A chunk's replacements must fit `fresh`, whatever the frames' sizes.
            let want = (out.len() - got)
                .min(CHUNK)
                .min(FRESH / self.cfg.sges as usize)
                .max(1);
            // Take the chunk's CQEs first so one bulk allocation covers all its frames; an
            // error CQE (frame too long for the posted buffers) takes no buffer.
            let mut cqes = [(0u32, 0u32, 0u32, 0usize, 0u32); CHUNK];
            let mut n = 0;
            let mut need = 0usize;
            while n < want {
                let Some(c) = self.cq.poll() else { break };
                let len = c.byte_cnt();
                let k = if c.opcode() == cqe_opcode::ERROR {
                    self.on_error_cqe(c.syndrome(), c.vendor_err());
                    0
                } else {
                    self.segments_for(len)
                };
                need += k;
                cqes[n] = (len, c.status(), c.immed_rss_invalid(), k, c.vlan_my_qpn());
                n += 1;
            }
            if n == 0 {
                break;
            }
            let mut fresh_room = std::mem::take(&mut self.fresh);
            let fresh = alloc_into(self.pool, &mut fresh_room[..need]);
            let alloc_ok = fresh.is_some();
            let fresh = fresh.unwrap_or_default();
            let mut f = 0;
            for &(len, status, hash, k, vlan) in &cqes[..n] {
                let slot = (self.rq_ci & (self.wqe_cnt - 1)) as usize;
                self.rq_ci = self.rq_ci.wrapping_add(1);
                if k == 0 {
                    // The slot keeps its buffers.
                    self.stats.errors += 1;
                    continue;
                }
                if !alloc_ok {
                    self.stats.nombuf += 1;
                    continue;
                }
                let base = slot * self.cfg.sges as usize;
                // Chain from the last segment back, so each knows its successor.
                let mut next: Option<B> = None;
                for i in (0..k).rev() {
                    let seg_len = (len - i as u32 * self.room).min(self.room);
                    let mut b = self.elts[base + i];
                    b.set_segment(seg_len, next);
                    next = Some(b);
                }
                let mut head = next.expect("k >= 1");
                let mut meta = parse_rx_cqe(status, hash, self.cfg.csum, self.cfg.rss);
                if self.cfg.tunnel {
                    meta = with_tunnel(meta, vlan, self.cfg.csum);
                }
                head.set_packet(len, k as u16, self.cfg.port_id, &meta);
                out[got] = head;
                got += 1;
                self.stats.packets += 1;
                self.stats.bytes += u64::from(len);
                for i in 0..k {
                    self.elts[base + i] = fresh[f];
                    f += 1;
                    if self.post(base + i).is_none() {
                        // A buffer outside registered memory (the pool grew into memory we
                        // never saw): the entry must no longer point at the buffer just
                        // handed up, so it becomes an empty one and its frames fail.
                        self.post_empty(base + i);
                        self.stats.errors += 1;
                    }
                }
            }
            self.fresh = fresh_room;
            if n < want {
                break;
            }
        }
        got
    }

    /// Buffers a frame of `len` bytes takes (at least 1).
    fn segments_for(&self, len: u32) -> usize {
        (len.div_ceil(self.room).max(1) as usize).min(self.cfg.sges as usize)
    }
}

/// Counts the error CQEs of a chunk (bit i of `errs`: `seen[i]`, which holds its syndrome and
/// vendor error) and notes the last for [`RxQueue::recover`].
#[cold]
#[inline(never)]
fn error_cqes(stats: &mut RxStats, error_seen: &mut Option<(u8, u8)>, seen: &[Seen], errs: u64) {
    for (i, s) in seen.iter().enumerate() {
        if errs >> i & 1 != 0 {
            error_cqe(
                stats,
                error_seen,
                (s.status_len >> 8) as u8,
                s.status_len as u8,
            );
        }
    }
}

/// Counts an error CQE of a burst and notes it for [`RxQueue::recover`].
#[cold]
#[inline(never)]
fn error_cqe(stats: &mut RxStats, error_seen: &mut Option<(u8, u8)>, syndrome: u8, vendor: u8) {
    stats.errors += 1;
    stats.error_cqes += 1;
    *error_seen = Some((syndrome, vendor));
}

/// What handing up frames of a single-buffer queue touches, borrowed once per burst, and the
/// count of entries that could not point at their fresh buffer.
struct Refill<'a, B: RxBuf> {
    elts: &'a mut [B],
    entries: &'a mut [[u8; mlx4_prm::DS_SIZE]],
    ring_mask: usize,
    lkeys: &'a mut Lkeys,
    ctx: FrameCtx,
    errors: u64,
}

/// What [`frame`] reads, the same for every frame of a burst.
struct FrameCtx {
    /// The pool's region, looked up once per burst.
    region: Region,
    /// The entries of buffers inside `region`.
    posting: Posting,
    table: &'static [(u32, u32); 512],
    cfg: RxConfig,
    /// An entry was written apart from `posting`'s template (its byte count and lkey may
    /// differ).
    apart: Cell<bool>,
}

impl<'a, B: RxBuf> Refill<'a, B> {
    /// Borrows what the hand-up touches of a queue.
    #[inline(always)]
    fn new(
        elts: &'a mut DmaArray<B>,
        rq: &'a mut RqRing,
        lkeys: &'a mut Lkeys,
        cfg: RxConfig,
        room: Option<u32>,
    ) -> Refill<'a, B> {
        let elts: &mut [B] = elts;
        // SAFETY: the refill writes only the slots of the completions a burst consumed, each
        // with a fresh buffer from the pool inside its region, or with an entry the device
        // cannot use.
        #[allow(unsafe_code)]
        let entries = unsafe { rq.scatter_entries() };
        // One buffer and one entry per WQE: a slot masked by the ring's size is inside both.
        let entries = &mut entries[..elts.len()];
        let region = Region::new(lkeys.cached());
        Refill {
            ring_mask: elts.len() - 1,
            elts,
            entries,
            ctx: FrameCtx {
                posting: room.map_or(Posting::NONE, |room| Posting::new(&region, room)),
                region,
                table: &RX_META[usize::from(cfg.csum)],
                cfg,
                apart: Cell::new(false),
            },
            lkeys,
            errors: 0,
        }
    }
}

/// [`frame`] for a run of frames without error CQEs and the run of slots they came in: one
/// call per run, so that the loop has the registers to itself.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn hand_up<B: RxBuf, const PLAIN: bool>(
    cx: &FrameCtx,
    taken: &[Seen],
    dst: &mut [B],
    fresh: &[B],
    elts: &mut [B],
    entries: &mut [[u8; mlx4_prm::DS_SIZE]],
    lkeys: &mut Lkeys,
    errors: &mut u64,
) {
    let frames = taken.iter().zip(dst).zip(fresh);
    for (((s, d), &b), (elt, entry)) in frames.zip(elts.iter_mut().zip(entries)) {
        *d = frame::<B, PLAIN>(cx, elt, entry, s, b, lkeys, errors);
    }
}

/// The frames of a chunk without error CQEs, already in `dst`, described as `taken` says,
/// and the entries of their slots posted for the fresh buffers `slots` now hold; an entry
/// that cannot point at its buffer is counted in `errors`.
#[inline(never)]
fn hand_up_placed<B: RxBuf, const PLAIN: bool>(
    cx: &FrameCtx,
    taken: &[Seen],
    dst: &mut [B],
    slots: &[B],
    entries: &mut [[u8; mlx4_prm::DS_SIZE]],
    lkeys: &mut Lkeys,
    errors: &mut u64,
) {
    let frames = taken.iter().zip(dst);
    for ((s, d), (b, entry)) in frames.zip(slots.iter().zip(entries)) {
        describe::<B, PLAIN>(cx, d, s);
        post_entry::<B, false>(cx, entry, b, lkeys, errors);
    }
}

/// The single pass of a chunk whose CQEs are ready: takes CQEs from `next` one by one (it
/// has none for an error CQE or one the device still owns), and for each describes its
/// frame, already in `dst`, and posts its slot's entry for the fresh buffer in `slots`.
/// Calls `next` at most once per frame of `dst`. Returns the frames handed up, and adds
/// their bytes to `bytes`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn take_placed<'c, B: RxBuf, const PLAIN: bool, const ADDR_ONLY: bool>(
    cx: &FrameCtx,
    mut next: impl FnMut() -> Option<Cqe<&'c [u8]>>,
    dst: &mut [B],
    slots: &[B],
    entries: &mut [[u8; mlx4_prm::DS_SIZE]],
    lkeys: &mut Lkeys,
    errors: &mut u64,
    bytes: &mut u64,
) -> usize {
    let (mut k, mut sum) = (0, 0u64);
    let frames = dst.iter_mut();
    for (d, (b, entry)) in frames.zip(slots.iter().zip(entries)) {
        let Some(c) = next() else { break };
        let (status, len) = c.status_byte_cnt();
        let s = Seen {
            status_len: u64::from(status) << 32 | u64::from(len),
            hash: if PLAIN { 0 } else { c.immed_rss_invalid() },
            vlan: if PLAIN { 0 } else { c.vlan_my_qpn() },
        };
        describe::<B, PLAIN>(cx, d, &s);
        post_entry::<B, ADDR_ONLY>(cx, entry, b, lkeys, errors);
        sum += u64::from(len);
        k += 1;
    }
    *bytes += sum;
    k
}

/// Sets what `s` says of its frame (not an error one) in `head`, the buffer that holds it.
#[inline(always)]
fn describe<B: RxBuf, const PLAIN: bool>(cx: &FrameCtx, head: &mut B, s: &Seen) {
    let cfg = cx.cfg;
    let (status, len) = ((s.status_len >> 32) as u32, s.status_len as u32);
    let mut meta = rx_meta(cx.table, status, s.hash, !PLAIN && cfg.rss);
    if !PLAIN && cfg.tunnel {
        meta = with_tunnel(meta, s.vlan, cfg.csum);
    }
    head.set_single(len, cfg.port_id, &meta);
}

/// Hands up the frame `s` describes (not an error one) in the buffer `elt` of a slot and
/// posts `fresh` there, in `elt` and the slot's scatter entry; an entry that cannot point at
/// `fresh` is counted in `errors`. `PLAIN` as for [`RxQueue::burst_single`].
#[inline(always)]
fn frame<B: RxBuf, const PLAIN: bool>(
    cx: &FrameCtx,
    elt: &mut B,
    entry: &mut [u8; mlx4_prm::DS_SIZE],
    s: &Seen,
    fresh: B,
    lkeys: &mut Lkeys,
    errors: &mut u64,
) -> B {
    let mut head = std::mem::replace(elt, fresh);
    describe::<B, PLAIN>(cx, &mut head, s);
    post_entry::<B, false>(cx, entry, &fresh, lkeys, errors);
    head
}

/// Posts `fresh` in a slot's scatter entry; an entry that cannot point at it becomes one the
/// device cannot use, counted in `errors`. `ADDR_ONLY`: the entry holds the template's byte
/// count and lkey already, so a buffer the template fits changes only its address. An entry
/// written apart from the template is noted in [`FrameCtx::apart`].
#[inline(always)]
fn post_entry<B: RxBuf, const ADDR_ONLY: bool>(
    cx: &FrameCtx,
    entry: &mut [u8; mlx4_prm::DS_SIZE],
    fresh: &B,
    lkeys: &mut Lkeys,
    errors: &mut u64,
) {
    let (addr, room) = fresh.data_area();
    if let Some(e) = cx.posting.entry(addr, room) {
        if ADDR_ONLY {
            entry[ENTRY_HEAD..].copy_from_slice(&e[ENTRY_HEAD..]);
        } else {
            *entry = e;
        }
        return;
    }
    cx.apart.set(true);
    let lkey = if cx.region.covers(addr, room) {
        Some(cx.region.lkey)
    } else {
        lkeys.lookup(addr, room as usize)
    };
    let mut d = DataSeg::new_unchecked(&mut entry[..]);
    match lkey {
        Some(lkey) => {
            d.set_addr(addr as u64);
            d.set_lkey(lkey);
            d.set_byte_count(room);
        }
        None => {
            // A buffer outside registered memory (the pool grew into memory we never saw):
            // the entry must no longer point at the buffer just handed up, so it becomes an
            // empty one and its frames fail.
            d.set_addr(0);
            d.set_lkey(mlx4_prm::INVALID_LKEY);
            d.set_byte_count(0);
            *errors += 1;
        }
    }
}
