//! Faults injected on purpose (doc/faults.md): error CQEs every N WQEs, RX buffer errors,
//! lost doorbells, link flaps, lost or repeated send completions; chosen in the configuration
//! or at run time, and counted.

mod common;

use common::*;
use mlx4_hca::{Faults, Hca, HcaConfig, QueueState, Wire, INJECTED_VENDOR_ERR};

const LOCAL_QP_OP: u8 = 0x02;
const LOCAL_PROT: u8 = 0x04;
const ERROR: u8 = 0x1e;

fn inline_tail(srcrb: u8) -> Vec<u8> {
    let mut t = ctrl_tail(4, srcrb);
    t.extend(inline_hdr(40));
    t.extend(hex(
        "020000000002020000000001080045000018000040004011000001020304050607",
    ));
    t.resize(60, 0x11);
    t
}

/// A step-mode adapter injecting `faults` (devarg form) from the start.
fn with_faults(faults: &str) -> Hca {
    Hca::open(HcaConfig {
        faults: faults.parse().unwrap(),
        ..step_cfg()
    })
    .unwrap()
}

#[test]
fn every_nth_send_wqe_completes_in_error_and_the_queue_recovers() {
    // The null wire, where WQEs of one shape skip the full decode: injection still hits.
    let hca = with_faults("tx_error:10");
    assert_eq!(hca.faults().tx_error_every, 10);
    let mut cq = TestCq::new(&hca, 64);
    let mut sq = TestSq::new(&hca, 64, cq.cqn);
    let mut posted = 0;
    for round in 0..3 {
        for _ in 0..12 {
            sq.write(SEND, &inline_tail(UNSIGNALED));
        }
        sq.doorbell();
        hca.step();
        // Only the injected error completes (unsignaled WQEs are silent); nothing after it runs.
        let cqes = cq.drain();
        cq.update_ci();
        assert_eq!(cqes.len(), 1, "round {round}");
        let e = &cqes[0];
        assert_eq!(
            (e[31] & 0x1f, e[27], e[26]),
            (ERROR, LOCAL_QP_OP, INJECTED_VENDOR_ERR)
        );
        assert_eq!(hca.sq_state(sq.info.qpn).unwrap(), QueueState::Error);
        // The error hit the 10th WQE of the adapter's count.
        let hit = 10 * (round + 1) - posted;
        // One TXBB per WQE, on a fresh queue each round: the WQE index is the count in it.
        assert_eq!(be16(e, 24), (hit - 1) as u16);
        posted += hit;
        hca.destroy_sq(sq.info.qpn).unwrap();
        let ring = std::mem::replace(&mut sq.ring, Mem::new(64));
        ring.fill(0);
        sq = TestSq::on(&hca, ring, 64, cq.cqn);
    }
    let c = hca.counters();
    assert_eq!((c.inj_tx_errors, c.error_cqes, c.tx_frames), (3, 3, 27));
    // Off at run time: nothing more is injected.
    hca.set_faults(Faults::default());
    for _ in 0..30 {
        sq.write(SEND, &inline_tail(UNSIGNALED));
    }
    sq.doorbell();
    hca.step();
    assert_eq!(hca.counters().tx_frames, 57);
    assert_eq!(hca.sq_state(sq.info.qpn).unwrap(), QueueState::Ready);
}

#[test]
fn rx_buffer_errors_put_the_rq_in_error_and_every_frame_is_counted() {
    let hca = Hca::open(step_cfg()).unwrap();
    hca.set_wire(Wire::Loop).unwrap();
    let txcq = TestCq::new(&hca, 64);
    let mut sq = TestSq::new(&hca, 64, txcq.cqn);
    let mut rxcq = TestCq::new(&hca, 64);
    let mut rq = TestRq::new(&hca, 64, 1, rxcq.cqn);
    let pkts = Pkts::new(&hca, 1 << 18);
    let post = |rq: &mut TestRq, n: u64| {
        for i in 0..n {
            rq.post(&[(2048, pkts.lkey, pkts.mem.addr() + 65536 + (i % 64) * 2048)]);
        }
    };
    post(&mut rq, 64);
    hca.set_faults(Faults {
        rx_error_every: 5,
        ..Faults::default()
    });
    for _ in 0..8 {
        sq.write(SEND, &inline_tail(UNSIGNALED));
    }
    sq.doorbell();
    hca.step();
    let cqes = rxcq.drain();
    rxcq.update_ci();
    // Four frames land, the fifth gets a buffer error, the rest find the RQ in error.
    assert_eq!(cqes.len(), 5);
    let e = &cqes[4];
    assert_eq!(
        (e[31] & 0x1f, e[27], e[26]),
        (ERROR, LOCAL_PROT, INJECTED_VENDOR_ERR)
    );
    assert_eq!(hca.rq_state(rq.qpn).unwrap(), QueueState::Error);
    let c = hca.counters();
    assert_eq!((c.rx_frames, c.inj_rx_errors, c.rx_drops_error), (4, 1, 4));
    assert_eq!(c.tx_frames, c.rx_frames + c.rx_dropped());
    // The driver recreates the RQ and receives again.
    hca.destroy_rq(rq.qpn).unwrap();
    rq = TestRq::new(&hca, 64, 1, rxcq.cqn);
    post(&mut rq, 64);
    hca.set_faults(Faults::default());
    for _ in 0..3 {
        sq.write(SEND, &inline_tail(UNSIGNALED));
    }
    sq.doorbell();
    hca.step();
    assert_eq!(rxcq.drain().len(), 3);
}

#[test]
fn a_lost_doorbell_leaves_its_wqes_for_the_next_one() {
    let hca = Hca::open(HcaConfig {
        faults: Faults {
            doorbell_drop_every: 2,
            ..Faults::default()
        },
        ..step_cfg()
    })
    .unwrap();
    let mut cq = TestCq::new(&hca, 64);
    let mut sq = TestSq::new(&hca, 64, cq.cqn);
    let mut ring = |n: usize| {
        for _ in 0..n {
            sq.write(NOP, &ctrl_tail(1, SIGNALED));
        }
        sq.doorbell();
        hca.step();
        let got = cq.drain().len();
        cq.update_ci();
        got
    };
    assert_eq!(ring(3), 3);
    assert_eq!(ring(2), 0, "the second doorbell is lost");
    assert_eq!(ring(1), 3, "the third runs what the second announced too");
    let c = hca.counters();
    assert_eq!((c.doorbells, c.inj_doorbells_dropped, c.txbbs), (3, 1, 6));
}

/// Posts `n` signaled SENDs on a new SQ completing into `cq`, rings once and lets the device
/// run. The SQ is returned: its ring must outlive WQEs still to run.
fn send_signaled(hca: &Hca, cq: &TestCq, n: usize) -> TestSq {
    let mut sq = TestSq::new(hca, 64, cq.cqn);
    for _ in 0..n {
        sq.write(SEND, &inline_tail(SIGNALED));
    }
    sq.doorbell();
    hca.step();
    sq
}

/// The WQE index of each CQE waiting in `cq`, which are consumed.
fn consume_indexes(cq: &mut TestCq) -> Vec<u16> {
    let got = cq.drain().iter().map(|c| be16(c, 24)).collect();
    cq.update_ci();
    got
}

#[test]
fn send_completions_are_lost_or_repeated_as_scheduled() {
    // The null wire (WQEs of one shape skip the full decode) and a sink (the full path).
    for with_sink in [false, true] {
        let hca = with_faults("cqe_drop:3/cqe_dup:4");
        let frames = with_sink.then(|| sink(&hca));
        let mut cq = TestCq::new(&hca, 64);
        let _sq = send_signaled(&hca, &cq, 12);
        let got = consume_indexes(&mut cq);
        // Every 3rd completion is lost; every 4th of those written comes twice.
        assert_eq!(got, [0, 1, 3, 4, 4, 6, 7, 9, 10, 10], "sink {with_sink}");
        let c = hca.counters();
        let what = format!("sink {with_sink}: {c:?}");
        assert_eq!((c.tx_frames, c.txbbs), (12, 12), "{what}");
        assert_eq!(
            (c.inj_cqe_drops, c.inj_cqe_dups, c.cqes),
            (4, 2, 10),
            "{what}"
        );
        if let Some(f) = frames {
            assert_eq!(f.lock().len(), 12);
        }
    }
}

#[test]
fn a_repeated_completion_waits_for_room_like_any_other() {
    // The 4th completion fills the CQ: its copy finds no room and is not written.
    let hca = with_faults("cqe_dup:4");
    let mut cq = TestCq::new(&hca, 4);
    let _sq = send_signaled(&hca, &cq, 6);
    assert_eq!(consume_indexes(&mut cq), [0, 1, 2, 3]);
    hca.step();
    assert_eq!(consume_indexes(&mut cq), [4, 5]);
    let c = hca.counters();
    assert_eq!((c.cqes, c.inj_cqe_dups, c.tx_frames), (6, 0, 6), "{c:?}");
}

#[test]
fn the_link_flaps_down_and_up_as_scheduled() {
    let hca = with_faults("flap:10+5");
    let frames = sink(&hca);
    let mut cq = TestCq::new(&hca, 64);
    let mut sq = TestSq::new(&hca, 64, cq.cqn);
    let mut downs = Vec::new();
    for i in 0..40 {
        sq.write(SEND, &inline_tail(SIGNALED));
        sq.doorbell();
        hca.step();
        assert_eq!(cq.drain().len(), 1, "every WQE completes, link or not");
        cq.update_ci();
        if !hca.port_up() {
            downs.push(i);
        }
    }
    // Up for 10 frames, down for the next 5 (which are lost), and so on.
    let expect: Vec<i32> = (9..14).chain(24..29).chain(39..40).collect();
    assert_eq!(downs, expect);
    let c = hca.counters();
    assert_eq!(
        (c.tx_frames, c.tx_drops_wire, c.inj_link_downs),
        (30, 10, 3)
    );
    assert_eq!(frames.lock().len(), 30);
    // Set explicitly, the link is up and the flap over.
    hca.set_port_up(true);
    assert!(hca.port_up());
}
