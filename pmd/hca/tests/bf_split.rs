//! A BlueFlame copy the device looks at while its 8-byte stores are still landing, at every
//! point between two of them (the device stepped in this thread, so each split is exact).
//!
//! The half still holds the copy written to it two BF writes earlier. The device checks a copy
//! against ring memory, except its `srcrb_flags` (which a copy may change), so a copy whose
//! later pieces equal the older one's (frames alike, as in a benchmark) matches as soon as its
//! first qword lands, while its second qword, flags included, is still the older write's. A
//! stale flags word that lacked the completion request lost the WQE's CQE; the driver, which
//! matches CQEs to its requests in order, then drifted until its ring looked full for good
//! (txbench, `--copy qwords`, burst 1: 0.00 Mpps, re-rings without effect).

mod common;

use common::*;
use mlx4_hca::Counters;

const TXBBS: u32 = 64;
/// 8-byte pieces of the WQE below (DS 6: two TXBBs).
const PIECES: usize = 16;

/// A 64-byte frame inline, always the same bytes, as a benchmark sends them.
fn inline_frame(srcrb: u8) -> Vec<u8> {
    let mut t = ctrl_tail(6, srcrb);
    t.extend(inline_hdr(44));
    t.extend([0x5a; 44]);
    t.extend(inline_hdr(16));
    t.extend([0x5a; 16]);
    t.resize(92, 0);
    t
}

/// In which order a copy's pieces are stored.
#[derive(Debug, Clone, Copy)]
enum Order {
    /// Ascending, the first qword (BF counter, QPN: what makes it a doorbell) first.
    HeadFirst,
    /// The first qword last: once the device sees it, the rest has landed.
    HeadLast,
}

impl Order {
    fn pieces(self) -> Vec<usize> {
        match self {
            Order::HeadFirst => (0..PIECES).collect(),
            Order::HeadLast => (1..PIECES).chain([0]).collect(),
        }
    }
}

/// WQEs at 0, 2 and 4, each through BlueFlame; the one at 0 (flags `older`) leaves its copy in
/// the half the one at 4 (flags `newer`) is copied to, whose first `landed` pieces (in `order`)
/// are stored when the device looks. Returns the `wqe_index` of every CQE, the frames sent and
/// the counters.
fn run(older: u8, newer: u8, order: Order, landed: usize) -> (Vec<u16>, usize, Counters) {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), TXBBS, 64);
    let frames = sink(&hca);
    for srcrb in [older, SIGNALED] {
        let c = sq.write(SEND, &inline_frame(srcrb));
        sq.bf_copy(c, sq.wqe_bytes(c));
        hca.step();
    }
    let c = sq.write(SEND, &inline_frame(newer));
    let image = sq.bf_image(c, sq.wqe_bytes(c));
    sq.bf_copy_split(&image, &order.pieces(), landed, || {
        hca.step();
    });
    hca.step();
    let idx = cq.drain().iter().map(|q| be16(q, 24)).collect();
    let sent = frames.lock().len();
    (idx, sent, hca.counters())
}

/// Every WQE ran once, and completed if its ring copy asked.
fn assert_exact(older: u8, newer: u8, order: Order, landed: usize) {
    let (idx, sent, k) = run(older, newer, order, landed);
    let want: Vec<u16> = [(0, older), (2, SIGNALED), (4, newer)]
        .iter()
        .filter(|(_, f)| f & 0x0c == 0x0c)
        .map(|&(i, _)| i)
        .collect();
    let at = format!("{order:?}, {landed} of {PIECES} pieces landed: {k:?}");
    assert_eq!(idx, want, "CQEs: one per WQE asking, none more; {at}");
    assert_eq!(sent, 3, "{at}");
    assert_eq!(k.wqe_fetched + k.wqe_from_bf, 3, "each WQE once; {at}");
    assert_eq!(
        k.bf_bursts,
        k.wqe_from_bf + k.bf_torn + k.bf_superseded + k.bf_ignored,
        "every BF write accounted for; {at}"
    );
}

/// Head first, the way rdma-core and the driver's 8-byte routine stored: an older unsignaled
/// copy's flags under a signaled WQE's first qword must not cost the WQE its completion. The
/// device waits for the flags to become the ring's, and if the writer never gets there, runs
/// the ring's WQE.
#[test]
fn a_stale_flags_word_never_drops_the_ring_wqes_completion() {
    for landed in 1..=PIECES {
        assert_exact(UNSIGNALED, SIGNALED, Order::HeadFirst, landed);
    }
}

/// The other way round (an older signaled copy under an unsignaled WQE), a head-first writer
/// stopped before its second store looks exactly like the WC self-test's copy, which asks for a
/// completion the ring WQE does not; the device takes such flags only after its whole patience.
/// Stopped for that long, nothing tells them apart, which is why the driver stores the head
/// last: then at every split point the device sees either nothing new or the whole copy, and
/// both directions complete exactly.
#[test]
fn a_copy_stored_head_last_is_exact_at_every_split_point() {
    for (older, newer) in [(UNSIGNALED, SIGNALED), (SIGNALED, UNSIGNALED)] {
        for landed in 0..=PIECES {
            assert_exact(older, newer, Order::HeadLast, landed);
        }
    }
}

/// One WQE with `ring` flags, copied whole with `copy` flags: the `wqe_index` of every CQE
/// and the counters.
fn copy_with_flags(ring: u8, copy: u8) -> (Vec<u16>, Counters) {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), TXBBS, 64);
    let c = sq.write(SEND, &inline_frame(ring));
    let mut wqe = sq.wqe_bytes(c);
    wqe[11] = copy;
    sq.bf_copy(c, wqe);
    hca.step();
    let idx = cq.drain().iter().map(|q| be16(q, 24)).collect();
    (idx, hca.counters())
}

/// A copy whose flags ask for what the ring WQE does not (the WC self-test) still counts, once
/// they held: the device used it, so the WQE completes.
#[test]
fn a_copy_may_still_add_a_completion_request() {
    let (idx, k) = copy_with_flags(UNSIGNALED, SIGNALED);
    assert_eq!(idx, [0]);
    assert_eq!((k.wqe_from_bf, k.bf_torn), (1, 0), "{k:?}");
}

/// A copy whose flags drop the ring WQE's request is never taken: the ring's WQE runs, fetched.
#[test]
fn a_copy_never_drops_a_completion_request() {
    let (idx, k) = copy_with_flags(SIGNALED, UNSIGNALED);
    assert_eq!(idx, [0]);
    assert_eq!(
        (k.wqe_fetched, k.wqe_from_bf, k.bf_torn),
        (1, 0, 1),
        "{k:?}"
    );
}

/// A writer that stores the head last, stopped before the head of its copy of WQE 4, has left
/// that copy's flags (signaled) under the head of the copy of WQE 0 (unsignaled), which the
/// device had not taken yet: alike frames, so the half matches WQE 0 but for a completion
/// request. The copy of WQE 2 in the other half says the driver posted on, so that is a newer
/// write landing, not the WC self-test's copy: WQE 0 runs unsignaled and only WQE 4 completes. (The model took such
/// flags after its patience, and a loaded machine's preempted writer then got one CQE too
/// many in `blueflame.rs`, about once in ten runs.)
#[test]
fn a_newer_copys_flags_under_an_older_head_add_no_completion() {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), TXBBS, 64);
    let frames = sink(&hca);
    let c0 = sq.write(SEND, &inline_frame(UNSIGNALED));
    sq.bf_copy(c0, sq.wqe_bytes(c0));
    let c2 = sq.write(SEND, &inline_frame(UNSIGNALED));
    sq.bf_copy(c2, sq.wqe_bytes(c2));
    let c4 = sq.write(SEND, &inline_frame(SIGNALED));
    let image = sq.bf_image(c4, sq.wqe_bytes(c4));
    sq.bf_copy_split(&image, &Order::HeadLast.pieces(), PIECES - 1, || {
        hca.step();
    });
    hca.step();
    let idx: Vec<u16> = cq.drain().iter().map(|q| be16(q, 24)).collect();
    let k = hca.counters();
    assert_eq!(idx, [4], "CQEs: only the WQE that asked; {k:?}");
    assert_eq!(frames.lock().len(), 3, "{k:?}");
    assert_eq!(k.wqe_fetched + k.wqe_from_bf, 3, "each WQE once; {k:?}");
    assert_eq!(
        k.bf_bursts,
        k.wqe_from_bf + k.bf_torn + k.bf_superseded + k.bf_ignored,
        "every BF write accounted for; {k:?}"
    );
}
