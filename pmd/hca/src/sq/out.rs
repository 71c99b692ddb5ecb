//! What executing a WQE puts out: its send completion (with the CQE faults) and its frames on
//! the wire, with the counts of the walk tallied locally and added to the device's once.

use super::*;

/// A send completion for the WQE at `counter`; `syndrome` and `vendor` only for an error CQE.
pub(super) fn tx_cqe(
    qpn: u32,
    counter: u16,
    owner_sr_opcode: u8,
    syn: u8,
    vendor: u8,
) -> [u8; CQE_SIZE] {
    let mut cqe = [0u8; CQE_SIZE];
    let mut w = Cqe::new_unchecked(&mut cqe[..]);
    w.set_qpn(qpn);
    w.set_wqe_index(counter);
    if syn != 0 {
        w.set_syndrome(syn);
        w.set_vendor_err(vendor);
    }
    w.set_owner_sr_opcode(owner_sr_opcode);
    cqe
}

/// Write the send completion `cqe` (its room taken from `credit`), unless it is `good` and the
/// `cqe_drop` fault loses it; a good one the `cqe_dup` fault picks is written again if the CQ
/// has room. Error completions are never lost nor repeated: the driver learns of the error
/// from them alone.
#[inline(always)]
pub(super) fn push_send_cqe(
    cqe: [u8; CQE_SIZE],
    solicited: bool,
    good: bool,
    credit: &mut CqCredit,
    t: &mut Tally,
    cx: &mut TxCtx<'_>,
) {
    if good && cx.faults.cqe_drop.tick() {
        t.cqe_drops += 1;
        return;
    }
    let mut write = |cq: &mut Cq| {
        if cq.push(cqe, solicited) {
            t.events += 1;
        }
        t.cqes += 1;
    };
    write(cx.cq);
    // Asked only now: a credit that re-reads the CQ's room must see the first copy in it.
    let dup = good && cx.faults.cqe_dup.tick() && credit.take(cx.cq);
    if dup {
        write(cx.cq);
    }
    t.cqe_dups += u64::from(dup);
}

/// What the port does with frames during one walk.
pub(super) struct Out {
    pub(super) link_up: bool,
    /// The wire wants the frames' bytes (every wire but null).
    pub(super) bytes: bool,
}

/// Counts of one walk, added to the device counters when it ends.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) fetched: u64,
    pub(super) fetch_bytes: u64,
    pub(super) from_bf: u64,
    pub(super) txbbs: u64,
    pub(super) stamps: u64,
    pub(super) frames: u64,
    pub(super) bytes: u64,
    pub(super) drops: u64,
    pub(super) dma: u64,
    pub(super) cqes: u64,
    pub(super) error_cqes: u64,
    pub(super) injected: u64,
    pub(super) cqe_drops: u64,
    pub(super) cqe_dups: u64,
    pub(super) events: u64,
    /// The port counters of the frames put on the wire.
    pub(super) mac: MacTally,
}

impl Tally {
    pub(super) fn add_to(&self, c: &mut Counters) {
        c.wqe_fetched += self.fetched;
        c.wqe_fetch_bytes += self.fetch_bytes;
        c.wqe_from_bf += self.from_bf;
        c.txbbs += self.txbbs;
        c.wqe_stamp_seen += self.stamps;
        c.tx_frames += self.frames;
        c.tx_bytes += self.bytes;
        c.tx_drops_wire += self.drops;
        c.dma_read_bytes += self.dma;
        c.cqes += self.cqes;
        c.error_cqes += self.error_cqes;
        c.inj_tx_errors += self.injected;
        c.inj_cqe_drops += self.cqe_drops;
        c.inj_cqe_dups += self.cqe_dups;
        c.cq_events += self.events;
        self.mac.add_tx(c);
    }
}

/// Put the frames of a valid SEND on the wire (its segments are in `scratch.segs`).
#[inline(always)]
pub(super) fn transmit(v: Verdict, bf_posted: bool, out: &Out, t: &mut Tally, cx: &mut TxCtx<'_>) {
    t.dma += u64::from(v.dma);
    if !out.link_up {
        t.drops += u64::from(v.frames);
    } else if !out.bytes {
        t.frames += u64::from(v.frames);
        t.bytes += u64::from(v.len);
        t.mac
            .sized((v.len / v.frames) as usize, u64::from(v.frames));
    } else {
        put_on_wire(bf_posted, t, cx);
    }
}

/// [`transmit`] of a recalled WQE of a [`Shape::plain`](crate::shape::Shape::plain) shape,
/// fetched into `scratch`: its frame is `spans` of it (its inline segments as they stand),
/// copied from the WQE straight into the receiving ring where the wire has one, not
/// assembled first.
#[inline(always)]
pub(super) fn transmit_inline(
    v: Verdict,
    spans: &[(u16, u16)],
    bf_posted: bool,
    out: &Out,
    t: &mut Tally,
    cx: &mut TxCtx<'_>,
) {
    if !out.link_up || !out.bytes {
        return transmit(v, bf_posted, out, t, cx);
    }
    let flat = cx.scratch.wqe.as_flattened();
    t.dma += u64::from(v.dma);
    match cx.wire.transmit_spans(cx.port, flat, spans, v.len as usize) {
        Some(TxOutcome::Sent) => {
            // A plain shape's first span holds the Ethernet header.
            let head = spans.first().map_or(&[][..], |&(off, len)| {
                let (off, len) = (usize::from(off), usize::from(len));
                flat.get(off..off + len).unwrap_or_default()
            });
            t.frames += 1;
            t.bytes += u64::from(v.len);
            t.mac.frame_of(head, v.len as usize);
        }
        Some(TxOutcome::Dropped) => t.drops += 1,
        None => put_on_wire(bf_posted, t, cx),
    }
}

/// Assemble the frame(s) of the WQE in `scratch` and hand them to the wire.
fn put_on_wire(bf_posted: bool, t: &mut Tally, cx: &mut TxCtx<'_>) {
    let s = &mut *cx.scratch;
    let lso = send::assemble(&s.wqe, &s.segs, cx.mrs, (bf_posted, cx.pro), &mut s.frame);
    let (wire, port) = (&mut *cx.wire, cx.port);
    let mut put = |frame: &[u8]| match wire.transmit(port, frame) {
        TxOutcome::Sent => {
            t.frames += 1;
            t.bytes += frame.len() as u64;
            t.mac.frame(frame);
        }
        TxOutcome::Dropped => t.drops += 1,
    };
    match lso {
        None => put(&s.frame),
        Some((mss, hdr)) => net::for_each_tso_segment(&s.frame, hdr, mss, &mut s.seg, put),
    }
}
