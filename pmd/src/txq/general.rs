//! The general poster: offloads, VLAN insertion, several segments, long inline WQEs, LSO,
//! buffers outside the lkey cache's region, and what a burst does once a straight-line run
//! stopped (`post_rest`).

use super::*;

/// What posting one packet came to.
pub(super) enum Step {
    /// An inline WQE of this many packet bytes; the packet is released with its chunk.
    Inline(u32),
    /// A gather WQE; the packet is held until its completion.
    Gather(u32),
    /// A gather WQE whose owner word is not a SEND's (LSO, inner checksums): held as
    /// `Gather`, and the burst ends with it ([`Poster::take_last`]).
    GatherLast(u32),
    /// It can never be sent (empty, too many segments, memory the device cannot reach, or
    /// malformed: see [`refuse`]): taken, released and counted, rather than retried forever.
    Dropped,
    /// No room for it: the burst ends before it.
    Full,
}

/// What [`post_rest`] needs of the queue besides the poster.
pub(super) struct Rest<'q, B: TxBuf> {
    pub(super) inline_max: usize,
    pub(super) plain_inline_max: usize,
    pub(super) elts_room: u32,
    pub(super) fast_free: bool,
    pub(super) prod: &'q mut Producer,
    pub(super) elts: &'q mut BufRing<B>,
    pub(super) done: &'q mut BufBatch<B, FREE_BATCH>,
    pub(super) segs: &'q mut [(u64, u32, u32); MAX_GATHER_SEGS],
}

/// The rest of a burst after a straight-line inline run stopped with `stop`: runs of plain
/// gather packets, the ring's end, and the general path, until the packets or the room end.
#[inline(never)]
pub(super) fn post_rest<'a, B: TxBuf>(
    mut poster: Poster<'a>,
    pkts: &[B],
    stop: Stop,
    mut t: Tally,
    mut q: Rest<'_, B>,
) -> (Poster<'a>, Tally) {
    rest_loop(&mut poster, pkts, stop, &mut t, &mut q);
    let p = q.prod;
    p.stats.ring_full += u64::from(t.full);
    p.stats.errors += u64::from(t.errors);
    p.stats.gather_packets += u64::from(t.gathers);
    (poster, t)
}

#[inline(always)]
pub(super) fn rest_loop<B: TxBuf>(
    poster: &mut Poster<'_>,
    pkts: &[B],
    mut stop: Stop,
    t: &mut Tally,
    q: &mut Rest<'_, B>,
) {
    loop {
        let n0 = t.n;
        if stop == Stop::Other {
            let before = t.n;
            stop = gather_run(
                poster,
                pkts,
                &mut t.n,
                q.inline_max,
                &q.prod.lkeys,
                q.elts,
                &mut t.bytes,
            );
            if t.n != before {
                stash(q.done, &pkts[t.kept..before], q.fast_free && t.single_seg);
                t.gathers += (t.n - before) as u32;
                t.kept = t.n;
            }
        }
        match stop {
            Stop::End => return,
            Stop::Full => {
                t.full = true;
                return;
            }
            // The ring's end, once per burst at most: one pad NOP, then the next pass.
            Stop::RunEnd(txbbs) => {
                if !poster.wrap(txbbs) {
                    t.full = true;
                    return;
                }
            }
            Stop::Other if t.n == n0 => {
                let pkt = pkts[t.n];
                let room = q.elts_room - t.gathers;
                let step = post_general(poster, pkt, q.inline_max, q.prod, q.segs, room);
                match step {
                    // It may have several segments: no fast free for what is released with it.
                    Step::Inline(len) => {
                        t.single_seg = false;
                        t.bytes += u64::from(len);
                        q.prod.stats.general_inline += 1;
                    }
                    Step::Dropped => {
                        t.single_seg = false;
                        t.errors += 1;
                    }
                    Step::Gather(len) | Step::GatherLast(len) => {
                        stash(q.done, &pkts[t.kept..t.n], q.fast_free && t.single_seg);
                        q.elts.push(pkt);
                        q.prod.chained_until = q.elts.head();
                        q.prod.stats.general_gather += 1;
                        t.gathers += 1;
                        t.bytes += u64::from(len);
                        t.kept = t.n + 1;
                        if matches!(step, Step::GatherLast(_)) {
                            t.n += 1;
                            t.last = true;
                            return;
                        }
                    }
                    Step::Full => {
                        t.full = true;
                        return;
                    }
                }
                t.n += 1;
                if t.n == pkts.len() {
                    return;
                }
            }
            Stop::Other => {}
        }
        stop = inline_run::<B, false>(poster, pkts, &mut t.n, q.plain_inline_max, &mut t.bytes);
    }
}

/// The general path: offloads, VLAN insertion, several segments, long inline WQEs, buffers
/// outside the lkey cache's region. `gathers_left` is the room in the gather ring.
#[inline(never)]
pub(super) fn post_general<B: TxBuf>(
    poster: &mut Poster<'_>,
    pkt: B,
    inline_max: usize,
    prod: &mut Producer,
    segs: &mut [(u64, u32, u32); MAX_GATHER_SEGS],
    gathers_left: u32,
) -> Step {
    // The one look at the buffer's shape; from here on its lengths hold.
    let Some(len) = pkt.check() else {
        return refuse(prod, pkt);
    };
    let lkeys = &mut prod.lkeys;
    let off = pkt.offloads();
    if let Some(bits) = off.owner_bits() {
        return post_last(poster, pkt, len, off, bits, prod, segs, gathers_left);
    }
    let len = len as usize;
    if len > 0 && len <= inline_max {
        let bytes = wqe::inline_wqe_bytes(len);
        let Some(mut w) = poster.take_dyn(txbbs_for(bytes)) else {
            return Step::Full;
        };
        wqe::write_ctrl(&mut w, wqe::ds_of(bytes), off, false);
        wqe::write_inline(&mut w, len, pkt.segs());
        return Step::Inline(len as u32);
    }
    let Some(nsegs) = data_segs(pkt.segs(), MAX_GATHER_SEGS, lkeys, segs) else {
        return Step::Dropped;
    };
    if gathers_left == 0 {
        return Step::Full;
    }
    let bytes = wqe::gather_wqe_bytes(nsegs);
    let Some(mut w) = poster.take_dyn(txbbs_for(bytes)) else {
        return Step::Full;
    };
    wqe::write_ctrl(&mut w, wqe::ds_of(bytes), off, false);
    wqe::write_gather(&mut w, &segs[..nsegs]);
    Step::Gather(len as u32)
}

/// The gather entries (address, length, lkey) of a packet's non-empty pieces, at most `max`:
/// their count, or `None` when the packet cannot be sent (nothing to send, too many pieces, or
/// a piece outside registered memory).
#[inline]
pub(super) fn data_segs<'a>(
    pieces: impl Iterator<Item = &'a [u8]>,
    max: usize,
    lkeys: &mut Lkeys,
    segs: &mut [(u64, u32, u32); MAX_GATHER_SEGS],
) -> Option<usize> {
    let mut n = 0;
    for s in pieces.filter(|s| !s.is_empty()) {
        if n == max {
            return None;
        }
        let lkey = lkeys.lookup(s.as_ptr() as usize, s.len())?;
        segs[n] = (s.as_ptr() as u64, s.len() as u32, lkey);
        n += 1;
    }
    (n > 0).then_some(n)
}

/// A packet whose WQE is not a plain SEND: an LSO WQE (the header copied into it, the rest
/// gathered) or a gather WQE with inner checksums. Its owner word differs from the run's, so
/// it ends the burst.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(super) fn post_last<B: TxBuf>(
    poster: &mut Poster<'_>,
    pkt: B,
    len: u32,
    off: TxOffloads,
    bits: u32,
    prod: &mut Producer,
    segs: &mut [(u64, u32, u32); MAX_GATHER_SEGS],
    gathers_left: u32,
) -> Step {
    let hdr_len = off.tso.map_or(0, |t| usize::from(t.hdr_len));
    let mut all = pkt.segs();
    let first = all.next().unwrap_or(&[]);
    // What a card refuses (an error completion that stops the queue): no segment size, no
    // header, a header it cannot copy, or beyond the first segment, or nothing after it.
    if off.tso.is_some_and(|t| t.mss == 0 || t.hdr_len == 0)
        || hdr_len > mlx4_prm::LSO_MAX_HEADER
        || hdr_len > first.len()
        || hdr_len == len as usize
    {
        return refuse(prod, pkt);
    }
    let lkeys = &mut prod.lkeys;
    let (hdr, rest) = first.split_at(hdr_len);
    // The LSO segment (its header copy) takes DS slots from the gather entries.
    let max = MAX_GATHER_SEGS - mlx4_prm::lso_seg_len(hdr_len) / mlx4_prm::DS_SIZE;
    let Some(nsegs) = data_segs(std::iter::once(rest).chain(all), max, lkeys, segs) else {
        return Step::Dropped;
    };
    if gathers_left == 0 {
        return Step::Full;
    }
    let bytes = match off.tso {
        Some(_) => wqe::lso_wqe_bytes(hdr_len, nsegs),
        None => wqe::gather_wqe_bytes(nsegs),
    };
    let Some(mut w) = poster.take_last(txbbs_for(bytes), bits) else {
        return Step::Full;
    };
    wqe::write_ctrl(&mut w, wqe::ds_of(bytes), off, false);
    match off.tso {
        Some(t) => wqe::write_lso(&mut w, t, hdr, &segs[..nsegs]),
        None => wqe::write_gather(&mut w, &segs[..nsegs]),
    }
    Step::GatherLast(len)
}

/// A malformed buffer ([`TxBuf::check`], or a TSO request a card refuses): made safe to
/// release ([`TxBuf::refuse`]), counted in `bad_mbufs`, and dropped as any packet that can
/// never be sent (`errors`). Done here, out of the burst's loop: a step of its own there cost
/// the straight-line gather path 3 instructions a packet.
#[cold]
#[inline(never)]
#[allow(unsafe_code)]
pub(super) fn refuse<B: TxBuf>(prod: &mut Producer, pkt: B) -> Step {
    // SAFETY: `Dropped` makes the burst take this packet and release it with the burst, and
    // nothing else uses it.
    unsafe { pkt.refuse() };
    prod.stats.bad_mbufs += 1;
    Step::Dropped
}
