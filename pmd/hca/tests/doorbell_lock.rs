//! The doorbell charge (`HcaConfig::doorbell_ns`) keeps the device busy, not its lock: while
//! the device thread spends a doorbell's charge, the control path (the lock) answers at once,
//! and the WQEs the doorbell announced are executed only once the charge is spent.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx4_hca::{Hca, HcaConfig};

/// Long enough that a lock held through it could not go unnoticed.
const CHARGE: Duration = Duration::from_millis(400);

#[test]
fn the_lock_is_free_while_a_doorbell_charge_is_spent() {
    let hca = Hca::open(HcaConfig {
        threaded: true,
        busy_poll: true,
        doorbell_ns: CHARGE.as_nanos() as u32,
        ..HcaConfig::default()
    })
    .unwrap();
    let mut cq = TestCq::new(&hca, 64);
    let mut sq = TestSq::new(&hca, 64, cq.cqn);
    hca.start().unwrap();
    let mut f =
        hex("020000000002020000000001080045000032000040004011000001020304050607081234abcd001e0000");
    f.resize(64, 0x5a);
    sq.write(SEND, &inline_wqe(&f, SIGNALED));
    let rung = Instant::now();
    sq.doorbell();
    // The device took the doorbell once device memory counts it (published before the charge).
    let deadline = rung + CHARGE / 2;
    while hca.bar().counters().doorbells == 0 {
        assert!(
            Instant::now() < deadline,
            "the device never took the doorbell"
        );
        std::hint::spin_loop();
    }
    let asked = Instant::now();
    let c = hca.counters();
    let answered = asked.elapsed();
    assert!(
        rung.elapsed() < CHARGE,
        "the charge was over before we looked"
    );
    assert_eq!((c.doorbells, c.tx_frames), (1, 0), "{c:?}");
    assert!(
        answered < CHARGE / 4,
        "the lock was held through the charge: {answered:?}"
    );
    // The WQE runs after the charge: its completion comes, not before CHARGE.
    let deadline = rung + 10 * CHARGE;
    let cqe = loop {
        if let Some(cqe) = cq.poll() {
            break cqe;
        }
        assert!(Instant::now() < deadline, "no completion");
        std::thread::yield_now();
    };
    assert!(
        rung.elapsed() >= CHARGE,
        "executed before the charge was spent"
    );
    assert_tx_cqe(&cqe, sq.info.qpn, SEND, 0);
    assert_eq!(hca.counters().tx_frames, 1);
    hca.stop();
}
