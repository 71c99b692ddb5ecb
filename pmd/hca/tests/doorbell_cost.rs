//! `HcaConfig::doorbell_ns`: the device spends that long on every doorbell and BlueFlame burst
//! it takes, and on nothing else, and executes exactly what it executes without the charge.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx4_hca::{Hca, HcaConfig, UAR_WRITE_NS};

/// Long enough that no scheduling hiccup of an uncharged step comes near it.
const CHARGE_NS: u32 = 100_000_000;

fn frame() -> Vec<u8> {
    let mut f =
        hex("020000000002020000000001080045000032000040004011000001020304050607081234abcd001e0000");
    f.resize(64, 0x5a);
    f
}

/// A signaled 64-byte inline send, split at the 64-byte boundary as drivers lay it out.
fn inline_tail(f: &[u8]) -> Vec<u8> {
    let mut t = ctrl_tail(6, SIGNALED);
    t.extend(inline_hdr(44));
    t.extend(&f[..44]);
    t.extend(inline_hdr(f.len() - 44));
    t.extend(&f[44..]);
    t.resize(6 * 16 - 4, 0);
    t
}

fn timed_step(hca: &Hca) -> (usize, Duration) {
    let t = Instant::now();
    let work = hca.step();
    (work, t.elapsed())
}

/// Three sends: one announced by a doorbell, one by a BlueFlame copy, then an idle step.
/// Returns the frames on the wire, the completions, and each step's work and time.
fn run(doorbell_ns: u32) -> (Vec<Vec<u8>>, usize, [(usize, Duration); 3]) {
    let hca = Hca::open(HcaConfig {
        doorbell_ns,
        ..step_cfg()
    })
    .unwrap();
    let frames = sink(&hca);
    let mut cq = TestCq::new(&hca, 64);
    let mut sq = TestSq::new(&hca, 64, cq.cqn);
    let f = frame();
    sq.write(SEND, &inline_tail(&f));
    sq.doorbell();
    let by_doorbell = timed_step(&hca);
    let at = sq.write(SEND, &inline_tail(&f));
    let wqe = sq.wqe_bytes(at);
    sq.bf_copy(at, wqe);
    let by_bf = timed_step(&hca);
    let idle = timed_step(&hca);
    let c = hca.counters();
    assert_eq!((c.doorbells, c.bf_bursts, c.tx_frames), (1, 1, 2), "{c:?}");
    let cqes = cq.drain().len();
    let out = frames.lock().clone();
    (out, cqes, [by_doorbell, by_bf, idle])
}

#[test]
fn each_doorbell_and_bf_burst_costs_the_charge_and_nothing_else_does() {
    let (plain, plain_cqes, plain_steps) = run(0);
    let (charged, charged_cqes, [db, bf, idle]) = run(CHARGE_NS);
    // The same frames and completions either way: the charge is time, not behaviour.
    assert_eq!(plain, vec![frame(), frame()]);
    assert_eq!(charged, plain);
    assert_eq!((charged_cqes, plain_cqes), (2, 2));
    assert_eq!(
        [db.0, bf.0, idle.0],
        plain_steps.map(|s| s.0),
        "work per step"
    );
    let charge = Duration::from_nanos(u64::from(CHARGE_NS));
    assert!(db.1 >= charge, "a doorbell took {:?}", db.1);
    assert!(bf.1 >= charge, "a BlueFlame burst took {:?}", bf.1);
    assert!(idle.1 < charge, "an idle step took {:?}", idle.1);
    assert_eq!(idle.0, 0);
}

#[test]
fn the_default_charges_nothing_and_the_card_figure_is_the_cost_model_s() {
    assert_eq!(HcaConfig::default().doorbell_ns, 0);
    // txbench's t_db: (1/4.5 - 1/14.9) us * 8/7 per doorbell.
    let t_db: f64 = (1e3 / 4.5 - 1e3 / 14.9) * 8.0 / 7.0;
    assert_eq!(UAR_WRITE_NS, t_db.round() as u32);
}
