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

/// How the driver posts: `burst` WQEs per burst, the last copied to BlueFlame, as the driver
/// does; the last of every `every`th burst asks for a completion.
#[derive(Debug, Clone, Copy)]
struct Pace {
    burst: u32,
    every: u32,
    /// The device thread never sleeps: it looks at each write as it lands.
    spin: bool,
}

/// Each burst asks for its completion.
const BURSTS_OF_8: Pace = Pace {
    burst: 8,
    every: 1,
    spin: false,
};

/// A 64-byte frame as an inline WQE (DS 6, two TXBBs), its bytes `i`.
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
/// threaded device, at `pace`. With `keep_up`, each burst waits for its completion, so the
/// device always keeps up; otherwise the driver posts as fast as the ring allows. Every CQE
/// must be the next one asked for: one lost or one never asked for fails.
fn run(store: BfStore, bursts: u32, keep_up: bool, pace: Pace) -> (Counters, u32) {
    let Pace { burst, every, spin } = pace;
    // TXBBs from one completion request to the next.
    let period = 2 * burst * every;
    let hca = Hca::open(HcaConfig {
        wc: true,
        busy_poll: spin,
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
            // A completion covers the WQEs up to its own; WQEs are two TXBBs.
            let mut d = (*done & !0xffff) | u32::from(be16(&c, 24));
            if d < *done {
                d += 0x1_0000;
            }
            assert_eq!(
                d + 2 - *done,
                period,
                "{store:?} {pace:?}: the CQE after TXBB {} is for WQE {d}",
                *done
            );
            *done = d + 2;
        }
        cq.update_ci();
    };
    for b in 0..bursts {
        while sq.prod + 2 * burst + 32 - done > TXBBS {
            assert!(Instant::now() < deadline, "the device stopped completing");
            reap(&mut cq, &mut done);
            std::hint::spin_loop();
        }
        let mut last = 0;
        let asks = (b + 1) % every == 0;
        for i in 0..burst {
            let srcrb = if asks && i + 1 == burst {
                SIGNALED
            } else {
                UNSIGNALED
            };
            // Bursts of one send one frame over and over, as a benchmark does: a half's
            // older copy then differs from the new one in its flags alone.
            let bytes = if burst == 1 { 0 } else { b * burst + i };
            last = sq.write(SEND, &inline_tail(bytes, srcrb));
        }
        let wqe = sq.wqe_bytes(last);
        sq.bf_copy_with(store, last, wqe);
        if keep_up && asks {
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
fn assert_accounted(k: &Counters, wqes: u32, store: BfStore) {
    assert_eq!(k.tx_frames, u64::from(wqes), "{store:?}: {k:?}");
    assert_eq!(
        k.wqe_fetched + k.wqe_from_bf,
        u64::from(wqes),
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
        let (k, bursts) = run(store, 1000, true, BURSTS_OF_8);
        assert_accounted(&k, bursts * BURSTS_OF_8.burst, store);
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
/// an earlier model counted whole copies torn by the thousand under sustained load.
#[test]
fn sustained_blueflame_counts_replaced_copies_as_superseded_not_torn() {
    for store in BfStore::available() {
        let (k, bursts) = run(store, 5_000, false, BURSTS_OF_8);
        assert_accounted(&k, bursts * BURSTS_OF_8.burst, store);
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

/// Bursts of one, one in four asking for a completion, one frame over and over (txbench's
/// bf-wc burst 1), the device spinning: the half a copy goes to holds an older copy that
/// differs only in its flags, half the time. Every completion must be exactly the one asked
/// for, none lost and none added (the driver counts on it). The window in which the device
/// could take an older copy's flags is a few cycles wide here, so this rarely caught the old
/// model; `bf_split.rs` steps through it. The copies are stored as the driver stores them,
/// the head last: a writer that stores the head first and is preempted before the flags for
/// longer than the device's patience cannot be told from the WC self-test's copy
/// (`bf_split.rs`), and got one completion too many here about once in ten runs on a loaded
/// 2-core machine.
#[test]
fn bursts_of_one_complete_exactly_what_they_asked_for() {
    let pace = Pace {
        burst: 1,
        every: 4,
        spin: true,
    };
    for store in BfStore::available().into_iter().map(BfStore::as_the_driver) {
        let (k, bursts) = run(store, 40_000, false, pace);
        assert_accounted(&k, bursts, store);
        assert_eq!(k.cqes, u64::from(bursts / pace.every), "{store:?}: {k:?}");
        println!(
            "{store:?}: {bursts} BF writes, {} seen: {} used, {} superseded, {} torn",
            k.bf_bursts, k.wqe_from_bf, k.bf_superseded, k.bf_torn
        );
    }
}
