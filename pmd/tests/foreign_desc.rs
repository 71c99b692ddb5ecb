//! A queue descriptor handed to a device that did not make it: every software HCA numbers its
//! queues from the same base, so the number is live on the wrong device too. Destroying it there
//! must be refused, and leave both devices' queues as they were.

use mlx4rs::hca::{Hca, HcaConfig};
use mlx4rs::hw::soft::Soft;
use mlx4rs::hw::{Device, HwError};
use mlx4rs::mem::MemSource;

fn device(name: &str) -> Soft {
    let hca = Hca::open(HcaConfig {
        name: name.into(),
        threaded: false,
        ..HcaConfig::default()
    })
    .unwrap();
    Soft::new(hca, MemSource::Heap)
}

fn refused(r: Result<(), HwError>) {
    match r {
        Err(HwError::Invalid(m)) => assert!(m.contains("not a queue of this device"), "{m}"),
        other => panic!("another device's descriptor was taken: {other:?}"),
    }
}

#[test]
fn another_devices_descriptors_are_refused_and_free_nothing() {
    let (a, b) = (device("foreign_a"), device("foreign_b"));
    let (cq_a, cq_b) = (a.create_cq(64, -1).unwrap(), b.create_cq(64, -1).unwrap());
    assert_eq!(
        cq_a.cqn(),
        cq_b.cqn(),
        "the case this test is about: the same number"
    );
    let (sq_a, sq_b) = (
        a.create_sq(64, &cq_a, -1).unwrap(),
        b.create_sq(64, &cq_b, -1).unwrap(),
    );
    let (rq_a, rq_b) = (
        a.create_rq(64, 1, &cq_a, -1).unwrap(),
        b.create_rq(64, 1, &cq_b, -1).unwrap(),
    );
    assert_eq!((sq_a.qpn(), rq_a.qpn()), (sq_b.qpn(), rq_b.qpn()));

    // B's descriptors through A: refused. Each is consumed, and its queue stays B's until B
    // closes.
    refused(a.destroy_rq(rq_b));
    refused(a.destroy_sq(sq_b));
    refused(a.destroy_cq(cq_b));

    // A's queues are still A's: each destroys once, in order.
    a.destroy_rq(rq_a).unwrap();
    a.destroy_sq(sq_a).unwrap();
    a.destroy_cq(cq_a).unwrap();
}
