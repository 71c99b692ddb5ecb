//! BlueFlame on the send side of the device model, driven by hand-made WQEs (doc/prm.md
//! section 4): the halves alternate and are the doorbell, a copy runs the WQEs before it, a
//! torn or stray copy is not used, and the WC self-test sees a completion only with
//! write-combining.

mod common;

use common::*;
use mlx4_hca::{Hca, HcaConfig, QueueState};

#[test]
fn blueflame_halves_alternate_and_are_the_doorbell() {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 64, 64);
    let frames = sink(&hca);
    for i in 0..4u8 {
        let frame = vec![i; 60];
        let c = sq.write(SEND, &inline_wqe(&frame, SIGNALED));
        let wqe = sq.wqe_bytes(c);
        sq.bf_copy(c, wqe);
        hca.step();
        let cqe = cq.poll().expect("BF write acts as the doorbell");
        assert_eq!(be16(&cqe, 24), c as u16);
    }
    assert_eq!(frames.lock().len(), 4);
    let c = hca.counters();
    assert_eq!(c.doorbells, 0);
    assert_eq!(
        (c.bf_bursts, c.wqe_from_bf, c.wqe_fetched, c.bf_torn),
        (4, 4, 0, 0)
    );
}

#[test]
fn blueflame_runs_earlier_wqes_from_memory_and_stops_at_its_counter() {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 64, 64);
    sq.write(NOP, &ctrl_tail(1, SIGNALED));
    sq.write(NOP, &ctrl_tail(1, SIGNALED));
    let c = sq.write(NOP, &ctrl_tail(1, SIGNALED));
    let wqe = sq.wqe_bytes(c);
    sq.bf_copy(c, wqe);
    // Written after the BF copy and never doorbelled: must not run.
    sq.write(NOP, &ctrl_tail(1, SIGNALED));
    hca.step();
    let idx: Vec<u16> = cq.drain().iter().map(|q| be16(q, 24)).collect();
    assert_eq!(idx, [0, 1, 2]);
    let k = hca.counters();
    assert_eq!((k.wqe_fetched, k.wqe_from_bf), (2, 1));
}

#[test]
fn blueflame_for_another_qpn_or_a_consumed_wqe_is_ignored() {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 64, 64);
    let c = sq.write(NOP, &ctrl_tail(1, SIGNALED));
    sq.doorbell();
    hca.step();
    assert_eq!(cq.drain().len(), 1);
    // Late copy of the WQE already executed.
    let wqe = sq.wqe_bytes(c);
    sq.bf_copy(c, wqe.clone());
    // Copy naming another QPN.
    let real = sq.info.qpn;
    sq.info.qpn = real + 1;
    sq.write(NOP, &ctrl_tail(1, SIGNALED));
    sq.bf_copy(1, sq.wqe_bytes(1));
    sq.info.qpn = real;
    hca.step();
    assert!(cq.poll().is_none());
    assert_eq!(hca.counters().bf_ignored, 2);
}

/// The WC self-test: ring memory holds an unsignaled NOP, the BF copy the same NOP with
/// CQ_UPDATE. Only a device that used the copy writes a CQE.
fn wc_self_test(wc: bool) -> (usize, mlx4_hca::Counters) {
    let (hca, mut cq, mut sq) = sq_rig(HcaConfig { wc, ..step_cfg() }, 64, 64);
    let c = sq.write(NOP, &ctrl_tail(1, UNSIGNALED));
    let mut copy = sq.wqe_bytes(c);
    copy[11] = SIGNALED;
    sq.bf_copy(c, copy);
    hca.step();
    (cq.drain().len(), hca.counters())
}

#[test]
fn wc_self_test_sees_a_completion_only_with_write_combining() {
    let (n, c) = wc_self_test(true);
    assert_eq!(n, 1);
    assert_eq!(
        (c.bf_bursts, c.bf_torn, c.wqe_from_bf, c.wqe_fetched),
        (1, 0, 1, 0)
    );

    let (n, c) = wc_self_test(false);
    assert_eq!(n, 0, "without WC the copy is never executed");
    assert_eq!((c.bf_bursts, c.bf_torn, c.bf_pieces), (1, 1, 8));
    assert_eq!((c.wqe_from_bf, c.wqe_fetched, c.txbbs), (0, 1, 1));
}

#[test]
fn torn_blueflame_copy_is_not_used() {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 64, 64);
    let frames = sink(&hca);
    let frame = vec![0x5a; 60];
    let c = sq.write(SEND, &inline_wqe(&frame, SIGNALED));
    let mut copy = sq.wqe_bytes(c);
    copy[40] ^= 0xff; // the rest of the burst never matched ring memory
    sq.bf_copy(c, copy);
    hca.step();
    assert_eq!(cq.drain().len(), 1);
    assert_eq!(
        frames.lock().as_slice(),
        &[frame],
        "ring memory, not the copy"
    );
    let k = hca.counters();
    assert_eq!(
        (k.bf_bursts, k.bf_torn, k.wqe_from_bf, k.wqe_fetched),
        (1, 1, 0, 1)
    );
}

#[test]
fn blueflame_keeps_working_when_the_16_bit_counter_wraps() {
    // With 1-TXBB WQEs and alternating halves, the copy written 65536 posts later into the same
    // half has the very same first qword; the device must still see it as a new arrival.
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 2, 4);
    let n = 65536 + 4;
    for i in 0..n {
        let c = sq.write(NOP, &ctrl_tail(1, SIGNALED));
        let wqe = sq.wqe_bytes(c);
        sq.bf_copy(c, wqe);
        hca.step();
        let cqe = cq
            .poll()
            .unwrap_or_else(|| panic!("no completion for BF post {i}"));
        assert_eq!(be16(&cqe, 24), i as u16);
        cq.update_ci();
    }
    let k = hca.counters();
    assert_eq!((k.bf_bursts, k.wqe_from_bf), (n as u64, n as u64));
}

/// A WQE as mlx4_en and rdma-core leave it in the ring when they post through BlueFlame: the
/// QPN (`bf_qpn`) in bytes 4-6, over vlan_tag and ins_vlan.
fn inline_wqe_with_bf_qpn(frame: &[u8], srcrb: u8, qpn: u32) -> Vec<u8> {
    let mut t = inline_wqe(frame, srcrb);
    t[0..3].copy_from_slice(&[(qpn >> 16) as u8, (qpn >> 8) as u8, qpn as u8]);
    t
}

#[test]
fn blueflame_wqe_carrying_bf_qpn_in_the_ring_goes_out_untagged() {
    for wc in [true, false] {
        let hca = Hca::open(HcaConfig { wc, ..step_cfg() }).unwrap();
        let mut cq = TestCq::new(&hca, 64);
        // 0x40 reads as ins_vlan = C-VLAN, 0x41 as an ins_vlan value no device knows: neither is
        // a VLAN request in a BlueFlame-posted WQE.
        let mut sqs = [TestSq::new(&hca, 64, cq.cqn), TestSq::new(&hca, 64, cq.cqn)];
        assert_eq!(
            sqs.iter().map(|s| s.info.qpn & 0xff).collect::<Vec<_>>(),
            [0x40, 0x41]
        );
        let frames = sink(&hca);
        for (i, sq) in sqs.iter_mut().enumerate() {
            let frame = vec![0x30 + i as u8; 60];
            let c = sq.write(SEND, &inline_wqe_with_bf_qpn(&frame, SIGNALED, sq.info.qpn));
            let wqe = sq.wqe_bytes(c);
            sq.bf_copy(c, wqe);
            hca.step();
            let cqe = cq.poll().expect("a completion");
            assert_tx_cqe(&cqe, sq.info.qpn, SEND, c as u16);
            assert_eq!(hca.sq_state(sq.info.qpn).unwrap(), QueueState::Ready);
            assert_eq!(frames.lock().pop(), Some(frame), "wc={wc}: sent as posted");
        }
        let k = hca.counters();
        assert_eq!(k.error_cqes, 0);
        let (bf, ring) = if wc { (2, 0) } else { (0, 2) };
        assert_eq!((k.wqe_from_bf, k.wqe_fetched), (bf, ring), "wc={wc}");

        // The same bytes rung through the doorbell are a VLAN request again: C-VLAN 0x0000 on
        // the first queue, an unknown ins_vlan (an error) on the second.
        let frame = vec![0x50; 60];
        let sq = &mut sqs[0];
        sq.write(SEND, &inline_wqe_with_bf_qpn(&frame, SIGNALED, sq.info.qpn));
        sq.doorbell();
        hca.step();
        assert_eq!(cq.poll().unwrap()[31] & 0x1f, SEND);
        let mut tagged = frame[..12].to_vec();
        tagged.extend([0x81, 0x00, 0x00, 0x00]);
        tagged.extend(&frame[12..]);
        assert_eq!(frames.lock().pop(), Some(tagged));
        let sq = &mut sqs[1];
        sq.write(SEND, &inline_wqe_with_bf_qpn(&frame, SIGNALED, sq.info.qpn));
        sq.doorbell();
        hca.step();
        let cqe = cq.poll().unwrap();
        assert_eq!((cqe[31] & 0x1f, cqe[27]), (0x1e, 0x02), "LOCAL_QP_OP");
        assert_eq!(hca.sq_state(sq.info.qpn).unwrap(), QueueState::Error);
    }
}

#[test]
fn blueflame_write_keeps_vlan_semantics_of_the_earlier_wqes_it_runs() {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 64, 64);
    let frames = sink(&hca);
    // Not announced by the BF write (it names the next WQE): its VLAN request stands.
    let a = vec![0xaa; 60];
    let mut t = inline_wqe(&a, SIGNALED);
    t[0..3].copy_from_slice(&[0x00, 0x64, 0x40]);
    sq.write(SEND, &t);
    let b = vec![0xbb; 60];
    let c = sq.write(SEND, &inline_wqe_with_bf_qpn(&b, SIGNALED, sq.info.qpn));
    sq.bf_copy(c, sq.wqe_bytes(c));
    hca.step();
    assert_eq!(cq.drain().len(), 2);
    let mut tagged = a[..12].to_vec();
    tagged.extend([0x81, 0x00, 0x00, 0x64]);
    tagged.extend(&a[12..]);
    assert_eq!(frames.lock().as_slice(), &[tagged, b]);
    // The announcement is used up: the slot's next occupant (after a wrap) rung through the
    // doorbell gets its VLAN again.
    for _ in 0..62 {
        sq.write(NOP, &ctrl_tail(1, UNSIGNALED));
    }
    sq.doorbell();
    hca.step();
    frames.lock().clear();
    let d = vec![0xdd; 60];
    let mut t = inline_wqe(&d, SIGNALED);
    t[0..3].copy_from_slice(&[0x00, 0x07, 0x40]);
    // a and b took 2 TXBBs each, the NOPs 62: this is counter 66, the slot of `c`.
    let f = sq.write(SEND, &t);
    assert_eq!((f, f % 64), (66, c % 64));
    sq.doorbell();
    hca.step();
    let got = frames.lock();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0][12..16], [0x81, 0x00, 0x00, 0x07]);
}

/// A BlueFlame write names the WQEs up to its own as posted. On x86 the copy (a `movdir64b`
/// or write-combining store) can become visible before the ring stores that came first, so a
/// device that finds the WQE not yet in ring memory must come back to it, not forget it: no
/// other doorbell will come.
#[test]
fn a_blueflame_copy_that_overtakes_its_ring_write_is_not_lost() {
    for wc in [false, true] {
        let (hca, mut cq, mut sq) = sq_rig(HcaConfig { wc, ..step_cfg() }, 64, 64);
        let frames = sink(&hca);
        let frame = vec![0x42; 60];
        let tail = inline_wqe(&frame, SIGNALED);
        // The copy the driver will write, made from what the ring will hold.
        let c = sq.write(SEND, &tail);
        let wqe = sq.wqe_bytes(c);
        // Undo the ring write's visibility: the owner word still says "not yours".
        let owner = be32(&wqe, 0);
        sq.ring.put32(0, owner ^ 0x8000_0000);
        sq.bf_copy(c, wqe);
        hca.step();
        assert!(cq.poll().is_none(), "wc={wc}: not in ring memory yet");
        // The ring store lands; no further doorbell or BlueFlame write.
        sq.ring.put32(0, owner);
        hca.step();
        let cqe = cq
            .poll()
            .unwrap_or_else(|| panic!("wc={wc}: the WQE was forgotten"));
        assert_eq!((be16(&cqe, 24), cqe[31] & 0x1f), (c as u16, SEND));
        assert_eq!(frames.lock().as_slice(), std::slice::from_ref(&frame));
        let k = hca.counters();
        assert_eq!((k.bf_bursts, k.tx_frames), (1, 1), "wc={wc}");
    }
}
