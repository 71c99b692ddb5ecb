//! Bursts that start with a packet above the inline threshold: the queue starts them with a
//! gather run of its own and hands the rest to the usual runs; and bursts that start inline,
//! whose run of two-TXBB WQEs one-TXBB runts break. Every frame must reach the
//! wire byte for byte and in order, every plain packet must take a straight-line path (none
//! counted on the general one but the first gather packet, which fills the lkey cache), and
//! each burst must end with one doorbell.

use std::sync::{Arc, Mutex};

use mlx4rs::hca::{HcaConfig, Wire};
use mlx4rs::txq::{TxPath, TxQueue};
use testkit::{tx_config, Plain, Scratch};

// The test kit's source, as `traffic` includes it (the crate is not a dev-dependency here).
#[path = "../testkit/src/lib.rs"]
#[allow(dead_code)]
mod testkit;

/// Frames of these sizes, each filled with its own pattern, as plain packets in one
/// registered region; with the device's wire and the queue.
fn send(sizes: &[usize], bursts: &[usize]) {
    let wire = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    let w = wire.clone();
    let sink = Wire::Sink(Box::new(move |f: &[u8]| w.lock().unwrap().push(f.to_vec())));
    let s = Scratch::open("tx_gather_first", HcaConfig::default(), sink).unwrap();
    let total: usize = sizes.iter().sum();
    let mut bytes = Vec::with_capacity(total);
    for (i, &n) in sizes.iter().enumerate() {
        bytes.extend((0..n).map(|k| (k * 13 + i * 7 + 1) as u8));
    }
    let mem: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    let mr = s.reg_mr(mem).unwrap();
    let mut pkts = Vec::new();
    let mut at = 0;
    for &n in sizes {
        pkts.push(Plain(&mem[at..at + n]));
        at += n;
    }
    // SAFETY: the scratch device outlives the queue, which is destroyed on it below.
    let mut q: TxQueue<Plain> = unsafe {
        s.txq(
            "tx_gather_first",
            256,
            tx_config(TxPath::Doorbell, 104),
            &[mr],
        )
    }
    .unwrap();
    let mut done = 0;
    for &b in bursts {
        // SAFETY: `Plain` borrows a leaked frame and its release frees nothing.
        let taken = unsafe { q.burst(&pkts[done..done + b]) };
        assert_eq!(taken, b, "a burst that fits is taken whole");
        done += b;
        s.step();
    }
    assert_eq!(done, sizes.len());
    assert_eq!(
        q.stats().doorbells,
        bursts.len() as u64,
        "one doorbell per burst"
    );
    // The last WQEs may have asked for no completion: the drain asks, and waits for it.
    assert!(q.drain(&s.dev, std::time::Duration::from_secs(10)));
    let st = q.stats();
    let gathers = sizes.iter().filter(|&&n| n > 104).count() as u64;
    assert_eq!(st.packets, sizes.len() as u64);
    assert_eq!(st.bytes, total as u64);
    assert_eq!(st.gather_packets, gathers, "{st:?}");
    assert_eq!(st.inline_packets, sizes.len() as u64 - gathers, "{st:?}");
    // The first gather packet looks its region up on the general path, which fills the lkey
    // cache the straight-line gather run reads.
    assert_eq!(st.general_gather, gathers.min(1), "{st:?}");
    assert_eq!(st.general_inline, 0, "{st:?}");
    assert_eq!(st.errors, 0);
    assert_eq!(q.outstanding(), 0, "every gather buffer completed");
    q.destroy(&s.dev);
    let wire = wire.lock().unwrap();
    assert_eq!(wire.len(), sizes.len(), "frames on the wire");
    for (i, (f, p)) in wire.iter().zip(&pkts).enumerate() {
        assert!(f.as_slice() == p.0, "frame {i} differs");
    }
}

#[test]
fn a_burst_of_gather_packets_only() {
    send(&[512; 32], &[32]);
}

#[test]
fn inline_packets_after_the_gather_run_take_the_inline_run() {
    // Gather first, then inline of both classes (one and two TXBBs), gather again, and so on.
    let sizes = [512, 64, 40, 600, 1514, 60, 104, 105, 200, 64, 1000, 44];
    send(&sizes, &[sizes.len()]);
}

#[test]
fn bursts_that_start_either_way_wrap_the_ring() {
    // Enough bursts to wrap the ring several times, starting with either kind.
    let mut sizes = Vec::new();
    let mut bursts = Vec::new();
    for i in 0..200 {
        let b = 1 + i % 9;
        for k in 0..b {
            sizes.push(if (i + k) % 3 == 0 { 64 } else { 300 + 17 * k });
        }
        bursts.push(b);
    }
    send(&sizes, &bursts);
}

#[test]
fn runts_between_two_txbb_inline_packets_break_and_restart_their_run() {
    // Bursts that start inline, the two-TXBB class (45 to 104 bytes) broken by one-TXBB runts
    // (44 bytes and less) at the start, in the middle, twice in a row and at the end, then
    // a gather packet; many bursts, so that runs start at every ring position.
    let pattern = [64, 60, 40, 64, 44, 1, 104, 45, 30, 30, 64, 500, 64, 64, 20];
    let mut sizes = Vec::new();
    let mut bursts = Vec::new();
    for i in 0..100 {
        let b = 1 + i % pattern.len();
        sizes.extend(pattern.iter().cycle().skip(i).take(b));
        bursts.push(b);
    }
    send(&sizes, &bursts);
}
