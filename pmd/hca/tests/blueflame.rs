//! BlueFlame under sustained load, on a threaded device: copies written the way the driver
//! writes them on this CPU (8-byte stores, AVX-512 64-byte stores, `movdir64b`) are taken
//! whenever the device keeps up, never counted torn when they were whole, and every write the
//! device saw is accounted for: executed from the copy, torn, superseded by a newer write
//! before the device could use it, or ignored.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx4_hca::{Counters, Hca, HcaConfig};

const TXBBS: u32 = 256;
/// WQEs per burst; the last is copied to BlueFlame, as the driver does.
const BURST: u32 = 8;

/// A 64-byte frame as an inline WQE (DS 6, two TXBBs).
fn inline_tail(i: u32, srcrb: u8) -> Vec<u8> {
    let mut t = ctrl_tail(6, srcrb);
    t.extend(inline_hdr(44));
    t.extend(i.to_be_bytes().repeat(11));
    t.extend(inline_hdr(20));
    t.extend(i.to_be_bytes().repeat(5));
    t.resize(92, 0);
    t
}

/// Post `bursts` bursts whose last WQE goes through BlueFlame (no doorbell at all), on a
/// threaded device. With `keep_up`, each burst waits for its completion, so the device always
/// keeps up; otherwise the driver posts as fast as the ring allows.
fn run(store: BfStore, bursts: u32, keep_up: bool) -> (Counters, u32) {
    let hca = Hca::open(HcaConfig {
        wc: true,
        ..HcaConfig::default()
    })
    .unwrap();
    let mut cq = TestCq::new(&hca, 256);
    let mut sq = TestSq::new(&hca, TXBBS, cq.cqn);
    hca.start().unwrap();
    let mut done = 0u32; // TXBBs completed
    let deadline = Instant::now() + Duration::from_secs(60);
    let reap = |cq: &mut TestCq, done: &mut u32| {
        while let Some(c) = cq.poll() {
            assert_eq!(c[31] & 0x1f, SEND, "not an error CQE: {c:x?}");
            // Each burst completes on its last WQE; WQEs are two TXBBs.
            let mut d = (*done & !0xffff) | u32::from(be16(&c, 24));
            if d < *done {
                d += 0x1_0000;
            }
            *done = d + 2;
        }
        cq.update_ci();
    };
    for b in 0..bursts {
        while sq.prod + 2 * BURST + 32 - done > TXBBS {
            assert!(Instant::now() < deadline, "the device stopped completing");
            reap(&mut cq, &mut done);
            std::hint::spin_loop();
        }
        let mut last = 0;
        for i in 0..BURST {
            let srcrb = if i + 1 == BURST { SIGNALED } else { UNSIGNALED };
            last = sq.write(SEND, &inline_tail(b * BURST + i, srcrb));
        }
        let wqe = sq.wqe_bytes(last);
        sq.bf_copy_with(store, last, wqe);
        if keep_up {
            while done != sq.prod {
                assert!(Instant::now() < deadline, "no completion for burst {b}");
                reap(&mut cq, &mut done);
                std::hint::spin_loop();
            }
        }
    }
    while done != sq.prod {
        assert!(Instant::now() < deadline, "the device stopped completing");
        reap(&mut cq, &mut done);
        std::thread::yield_now();
    }
    hca.stop();
    (hca.counters(), bursts)
}

/// Every BlueFlame write the device saw ends one way, and every WQE ran once.
fn assert_accounted(k: &Counters, bursts: u32, store: BfStore) {
    assert_eq!(k.tx_frames, u64::from(bursts * BURST), "{store:?}: {k:?}");
    assert_eq!(
        k.wqe_fetched + k.wqe_from_bf,
        u64::from(bursts * BURST),
        "{store:?}: every WQE once: {k:?}"
    );
    assert_eq!(
        k.bf_bursts,
        k.wqe_from_bf + k.bf_torn + k.bf_superseded + k.bf_ignored,
        "{store:?}: every BlueFlame write accounted for: {k:?}"
    );
    assert_eq!(k.doorbells, 0);
}

/// Each burst waits for its completion, so the device sees every write and has time for each:
/// every copy is taken. The one exception the device cannot tell from a broken write is a
/// writer preempted between two stores of one copy for longer than the device's patience;
/// on this shared 2-core machine that happens, rarely, so up to 1% is tolerated and shown.
#[test]
fn blueflame_copies_are_taken_whenever_the_device_keeps_up() {
    for store in BfStore::available() {
        let (k, bursts) = run(store, 1000, true);
        assert_accounted(&k, bursts, store);
        assert_eq!(
            (k.bf_bursts, k.bf_superseded, k.bf_ignored),
            (u64::from(bursts), 0, 0),
            "{store:?}: {k:?}"
        );
        assert!(
            k.wqe_from_bf + u64::from(bursts / 100) >= u64::from(bursts),
            "{store:?}: copies not taken: {k:?}"
        );
        println!(
            "{store:?}: {} of {bursts} copies taken, {} torn",
            k.wqe_from_bf, k.bf_torn
        );
    }
}

/// The driver posts as fast as the ring lets it. Copies a newer write replaced are superseded,
/// not torn; writes replaced before the device looked are not seen at all (the driver's count
/// minus `bf_bursts`). A copy is torn only if it stayed incomplete while the device re-read it,
/// which on this shared machine happens when the writing thread is preempted between two
/// 64-byte stores of one copy: then the write really did arrive in pieces. That must stay rare;
/// the old model counted whole copies torn by the thousand (issue 11).
#[test]
fn sustained_blueflame_counts_replaced_copies_as_superseded_not_torn() {
    for store in BfStore::available() {
        let (k, bursts) = run(store, 5_000, false);
        assert_accounted(&k, bursts, store);
        assert!(
            k.bf_torn * 100 <= k.bf_bursts.max(100),
            "{store:?}: whole copies counted torn: {k:?}"
        );
        assert!(
            k.wqe_from_bf * 2 >= k.bf_bursts,
            "{store:?}: most copies the device saw were used: {k:?}"
        );
        println!(
            "{store:?}: {bursts} BF writes, {} unseen, {} seen: {} used, {} superseded, {} torn, \
             {} ignored",
            u64::from(bursts) - k.bf_bursts,
            k.bf_bursts,
            k.wqe_from_bf,
            k.bf_superseded,
            k.bf_torn,
            k.bf_ignored
        );
    }
}
