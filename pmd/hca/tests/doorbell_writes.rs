//! Each UAR write is a doorbell a card takes and pays for, even when several land between two
//! polls of the model: a writer that bumps the page's write count
//! (`UAR_DB_WRITES_OFFSET`) before each store is counted and charged per write, and a plain
//! store merges as before.

mod common;

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::*;
use mlx4_hca::{Hca, HcaConfig, UAR_DB_WRITES_OFFSET};

/// Long enough that no scheduling hiccup of an uncharged step comes near it.
const CHARGE_NS: u32 = 20_000_000;

fn frame(n: u8) -> Vec<u8> {
    let mut f =
        hex("020000000002020000000001080045000032000040004011000001020304050607081234abcd001e0000");
    f.resize(60, n);
    f
}

/// A signaled inline send of `f` (at most 44 bytes in the first TXBB, the rest in the next).
fn inline_tail(f: &[u8]) -> Vec<u8> {
    let mut t = ctrl_tail(6, SIGNALED);
    t.extend(inline_hdr(44));
    t.extend(&f[..44]);
    t.extend(inline_hdr(f.len() - 44));
    t.extend(&f[44..]);
    t.resize(6 * 16 - 4, 0);
    t
}

/// Ring `sq`'s doorbell as a counting writer does: the count first, then the store.
fn counted_doorbell(sq: &TestSq) {
    // SAFETY: the UAR page is 4 KiB of device memory valid while the Hca lives; the count is a
    // 4-aligned word in it that only writers touch atomically and the device swaps.
    let count = unsafe { AtomicU32::from_ptr(sq.info.uar.add(UAR_DB_WRITES_OFFSET) as *mut u32) };
    count.fetch_add(1, Ordering::Release);
    fence(Ordering::Release);
    sq.doorbell();
}

struct Setup {
    hca: Hca,
    frames: Frames,
    cq: TestCq,
    sq: TestSq,
    sent: u8,
}

fn setup(doorbell_ns: u32) -> Setup {
    let hca = Hca::open(HcaConfig {
        doorbell_ns,
        ..step_cfg()
    })
    .unwrap();
    let frames = sink(&hca);
    let cq = TestCq::new(&hca, 64);
    let sq = TestSq::new(&hca, 64, cq.cqn);
    Setup {
        hca,
        frames,
        cq,
        sq,
        sent: 0,
    }
}

impl Setup {
    /// Post `n` sends, each followed by its doorbell (`counted` or a plain store), with no
    /// poll in between, then one step; its time.
    fn burst(&mut self, n: usize, counted: bool) -> Duration {
        for _ in 0..n {
            self.sent += 1;
            let f = frame(self.sent);
            self.sq.write(SEND, &inline_tail(&f));
            if counted {
                counted_doorbell(&self.sq);
            } else {
                self.sq.doorbell();
            }
        }
        let t = Instant::now();
        self.hca.step();
        t.elapsed()
    }

    fn check_sent(&mut self) {
        let want: Vec<_> = (1..=self.sent).map(frame).collect();
        assert_eq!(
            *self.frames.lock(),
            want,
            "the frames on the wire, in order"
        );
        assert_eq!(
            self.cq.drain().len(),
            usize::from(self.sent),
            "one CQE per send"
        );
    }
}

#[test]
fn counted_writes_between_two_polls_are_each_counted_and_charged() {
    let mut s = setup(CHARGE_NS);
    let charge = Duration::from_nanos(u64::from(CHARGE_NS));
    let t = s.burst(4, true);
    assert_eq!(s.hca.counters().doorbells, 4);
    assert!(t >= 4 * charge, "4 doorbells written took {t:?}");
    // Conserved across takes: 3 more, then one.
    let t = s.burst(3, true);
    assert!(t >= 3 * charge, "3 doorbells written took {t:?}");
    let t = s.burst(1, true);
    assert!(t >= charge, "1 doorbell written took {t:?}");
    assert_eq!(s.hca.counters().doorbells, 8);
    s.check_sent();
}

#[test]
fn plain_stores_between_two_polls_merge_into_one_doorbell() {
    let mut s = setup(0);
    s.burst(4, false);
    assert_eq!(s.hca.counters().doorbells, 1);
    s.burst(1, false);
    assert_eq!(s.hca.counters().doorbells, 2);
    s.check_sent();
}

#[test]
fn a_counting_writer_is_counted_exactly_without_a_charge_too() {
    let mut s = setup(0);
    for n in [1, 5, 2, 7] {
        s.burst(n, true);
    }
    let c = s.hca.counters();
    assert_eq!((c.doorbells, c.tx_frames), (15, 15), "{c:?}");
    s.check_sent();
}

#[test]
fn against_the_device_thread_every_counted_write_is_counted_once() {
    // The device thread takes doorbells while they are written: some land between its polls
    // and merge, some are taken alone, and a bump may be swapped out before its store lands.
    let hca = Hca::open(HcaConfig {
        busy_poll: true,
        ..HcaConfig::default()
    })
    .unwrap();
    let frames = sink(&hca);
    const N: u64 = 200;
    // Room for every WQE (two TXBBs each) and every completion: nothing waits for the driver.
    let mut cq = TestCq::new(&hca, 256);
    let mut sq = TestSq::new(&hca, 512, cq.cqn);
    hca.start().unwrap();
    for i in 0..N {
        sq.write(SEND, &inline_tail(&frame(i as u8)));
        counted_doorbell(&sq);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let c = hca.counters();
        if c.tx_frames == N && c.doorbells == N {
            break;
        }
        assert!(c.doorbells <= N, "more doorbells than writes: {c:?}");
        assert!(Instant::now() < deadline, "not all taken: {c:?}");
        std::thread::yield_now();
    }
    hca.stop();
    let c = hca.counters();
    assert_eq!((c.doorbells, c.tx_frames), (N, N), "{c:?}");
    assert_eq!(frames.lock().len() as u64, N);
    assert_eq!(cq.drain().len() as u64, N);
}
