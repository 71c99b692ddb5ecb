//! What the TX step tests share beyond the traffic generator: plain cases, and sending cases
//! burst by burst with the device run between bursts, checking the wire.

use mlx4rs::txq::TxQueue;
use mlx4rs::wqe::TxOffloads;

use crate::traffic::{build, expected_wire, Case, Pkt, Rig, Rng};

/// Sends `cases` in bursts of `burst`, letting the device run between bursts; returns the
/// packets built (ids from `first_id`) and checks the wire, in order, byte for byte.
pub fn send_all(
    r: &mut Rig,
    q: &mut TxQueue<Pkt>,
    cases: &[Case],
    burst: usize,
    first_id: u32,
) -> Vec<Pkt> {
    let mut segtab = Vec::new();
    let mut arena = std::mem::take(&mut r.arena);
    let pkts = build(&mut arena, cases, &mut segtab, first_id);
    let wire_before = r.wire.lock().unwrap().len();
    let mut done = 0;
    while done < pkts.len() {
        let end = (done + burst).min(pkts.len());
        // SAFETY: test buffers; their release only records it.
        let taken = unsafe { q.burst(&pkts[done..end]) };
        done += taken;
        r.hca.step();
        q.complete();
    }
    r.hca.step();
    q.complete();
    let wire = r.wire.lock().unwrap()[wire_before..].to_vec();
    assert_eq!(wire.len(), cases.len(), "frames on the wire");
    for (i, (w, c)) in wire.iter().zip(cases).enumerate() {
        let e = expected_wire(&c.bytes, c.off);
        assert!(
            *w == e,
            "frame {i} ({} bytes, {} segments, {:?}) differs",
            c.bytes.len(),
            c.cuts.len() + 1,
            c.off
        );
    }
    r.arena = arena;
    drop(segtab);
    pkts
}

pub fn plain_case(rng: &mut Rng, len: usize) -> Case {
    Case {
        bytes: (0..len).map(|_| rng.next() as u8).collect(),
        cuts: vec![],
        off: TxOffloads::default(),
    }
}
