//! The counters in device memory: the device loop publishes them a while after they change
//! (after many polls that change them, or once it has been quiet as long), and every read
//! through the adapter has them at once.

mod common;

use common::*;
use mlx4_hca::{Hca, Wire};

/// Polls (each `Hca::step` of an idle device is one) after which the device loop has
/// published what it changed; the device's own bound is lower.
const QUIET_BOUND: usize = 64;

fn send_one(sq: &mut TestSq) {
    let mut t = ctrl_tail(4, UNSIGNALED);
    t.extend(inline_hdr(40));
    t.extend([0x5a; 40]);
    t.resize(60, 0);
    sq.write(SEND, &t);
    sq.doorbell();
}

#[test]
fn device_memory_catches_up_once_the_device_is_quiet() {
    let hca = Hca::open(step_cfg()).unwrap();
    hca.set_wire(Wire::Null).unwrap();
    let bar = hca.bar();
    let cq = TestCq::new(&hca, 16);
    let mut sq = TestSq::new(&hca, 64, cq.cqn);
    let start = bar.counters();
    for _ in 0..3 {
        send_one(&mut sq);
        assert!(hca.step() > 0);
    }
    // Quiet polls until device memory shows the three frames; the adapter's own read is
    // taken last, since it publishes.
    let mut quiet = 0;
    while bar.counters().tx_frames != start.tx_frames + 3 {
        assert!(
            quiet < QUIET_BOUND,
            "device memory is stale after {quiet} quiet polls"
        );
        assert_eq!(hca.step(), 0);
        quiet += 1;
    }
    let seen = bar.counters();
    assert_eq!((seen.doorbells, seen.txbbs), (3, 3));
    assert_eq!(seen, hca.counters());
}

#[test]
fn device_memory_catches_up_while_the_device_stays_busy() {
    let hca = Hca::open(step_cfg()).unwrap();
    hca.set_wire(Wire::Null).unwrap();
    let bar = hca.bar();
    let cq = TestCq::new(&hca, 16);
    let mut sq = TestSq::new(&hca, 64, cq.cqn);
    // A doorbell per poll, never a quiet stretch: device memory still moves, at most a bound
    // of polls behind.
    let mut sent = 0u64;
    let mut lag_max = 0u64;
    for _ in 0..4 * QUIET_BOUND {
        send_one(&mut sq);
        // The poll that walks it and one idle poll, which is no quiet stretch.
        assert!(hca.step() > 0);
        sent += 1;
        lag_max = lag_max.max(sent - bar.counters().tx_frames);
    }
    assert!(
        lag_max <= QUIET_BOUND as u64,
        "device memory lagged {lag_max} doorbells"
    );
    // Through the adapter, always current.
    assert_eq!(hca.counters().tx_frames, sent);
    assert_eq!(bar.counters().tx_frames, sent);
}
