//! Every UAR doorbell the driver writes is one the software HCA takes and charges, as a card
//! takes every posted write: the soft backend hands the queue the UAR page's write count, and
//! the doorbell bumps it before its store, so that doorbells written between two polls of the
//! device are counted one by one instead of merging into one taken. The device's count
//! (xstat `hca_doorbells`) then equals the driver's (`tx_doorbells`), in both device modes a
//! port runs the model in, with doorbell avoidance on as well, where every burst either rang or
//! counted its skip. A BlueFlame copy is the device's own count (`hca_bf_bursts`): it does not
//! bump the write count, which the device takes only with a UAR doorbell.

mod traffic;

use std::time::{Duration, Instant};

use mlx4rs::devargs::{Devargs, DeviceLoop};
use mlx4rs::hw::Handles;
use mlx4rs::mem::{DmaRange, MemSource, Mr};
use mlx4rs::txq::{DbAvoid, TxPath, TxQueue};
use traffic::testkit::Plain;
use traffic::tx_config;

/// A port's device as the probe opens it (the null wire), started, and the queue on it.
struct Port {
    h: Handles,
    q: Option<TxQueue<Plain>>,
    pkts: Vec<Plain>,
    /// Packets handed to `tx_burst` and taken.
    sent: usize,
}

fn open(device_loop: DeviceLoop, doorbell_ns: u32, path: TxPath) -> Port {
    let args = Devargs {
        device_loop,
        doorbell_ns,
        ..Devargs::default()
    };
    let n = traffic::NAME.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let h = mlx4rs::hw::open(&format!("doorbell_count{n}"), &args, MemSource::Heap).unwrap();
    let frame: Vec<u8> = (0..60u8).collect();
    let (pkts, mem) = Plain::leak(frame.repeat(8192), 60);
    let start = mem.as_ptr() as usize;
    // SAFETY: leaked memory stays mapped for the process's life; the queue only reads it.
    let mr: Mr = h
        .dev
        .reg_mr(unsafe { DmaRange::new(start, start + mem.len()) })
        .unwrap();
    // SAFETY: the device (in `Port`, dropped after the queue is destroyed on it) outlives
    // the queue.
    let q: TxQueue<Plain> = unsafe {
        TxQueue::new(
            &*h.dev,
            "doorbell_count",
            0,
            512,
            tx_config(path, 104),
            &[mr],
        )
    }
    .unwrap();
    assert_eq!(q.path(), path);
    if let Some(l) = &h.lcore {
        // SAFETY: no burst runs on the queue yet.
        unsafe { l.set_sq(0, Some(q.sq_desc().qpn())) };
    }
    h.dev.start().unwrap();
    Port {
        h,
        q: Some(q),
        pkts,
        sent: 0,
    }
}

impl Port {
    fn q(&mut self) -> &mut TxQueue<Plain> {
        self.q
            .as_mut()
            .expect("the queue lives until the port goes")
    }

    /// One `tx_burst` of `n` packets, with no device poll after it; how many it took.
    fn burst(&mut self, n: usize) -> usize {
        let at = self.sent % (self.pkts.len() - n);
        let pkts = self.pkts[at..at + n].to_vec();
        // SAFETY: leaked test buffers; their release frees nothing.
        let taken = unsafe { self.q().burst(&pkts) };
        self.sent += taken;
        taken
    }

    /// What the burst glue does after a burst when the device runs in the polling lcore.
    fn poll(&self) {
        if let Some(l) = &self.h.lcore {
            l.after_tx(0);
        }
    }

    fn hca(&self, name: &str) -> u64 {
        let name = format!("hca_{name}");
        self.h
            .dev
            .counters()
            .into_iter()
            .find(|(k, _)| *k == name)
            .unwrap_or_else(|| panic!("no xstat {name}"))
            .1
    }

    /// Waits (polling the device where it runs in the lcore) until it sent every packet taken
    /// and took every doorbell the driver wrote; then the two counts must agree.
    fn settle(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            self.poll();
            let st = self.q().stats();
            let (frames, doorbells) = (self.hca("tx_frames"), self.hca("doorbells"));
            if frames == self.sent as u64 && doorbells >= st.doorbells {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "not all taken: {frames} frames of {}, {doorbells} doorbells of {}: {st:?}",
                self.sent,
                st.doorbells
            );
            std::thread::yield_now();
        }
        let st = self.q().stats();
        assert_eq!(st.packets, self.sent as u64);
        assert_eq!(
            self.hca("doorbells"),
            st.doorbells,
            "hca_doorbells against tx_doorbells: {st:?}"
        );
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        if let Some(q) = self.q.take() {
            if let Some(l) = &self.h.lcore {
                // SAFETY: no burst runs on the queue any more.
                unsafe { l.set_sq(0, None) };
            }
            self.h.dev.stop();
            q.destroy(&*self.h.dev);
        }
    }
}

/// Long enough that no scheduling hiccup of an uncharged poll comes near it.
const CHARGE_NS: u32 = 2_000_000;

fn charge() -> Duration {
    Duration::from_nanos(u64::from(CHARGE_NS))
}

#[test]
fn lcore_doorbells_written_back_to_back_are_each_taken_and_charged() {
    let mut p = open(DeviceLoop::Lcore, CHARGE_NS, TxPath::Doorbell);
    let mut rung = 0;
    for n in [4usize, 1, 3] {
        for _ in 0..n {
            assert_eq!(p.burst(1), 1);
        }
        rung += n as u64;
        assert_eq!(p.q().stats().doorbells, rung, "a doorbell per burst");
        assert_eq!(
            p.hca("doorbells"),
            rung - n as u64,
            "the device has not polled"
        );
        let t = Instant::now();
        p.poll();
        let took = t.elapsed();
        assert_eq!(p.hca("doorbells"), rung, "every write taken in one poll");
        assert_eq!(p.hca("tx_frames"), rung);
        assert!(
            took >= n as u32 * charge(),
            "{n} doorbells were charged {took:?}"
        );
    }
    p.settle();
}

#[test]
fn port_doorbells_written_while_the_device_is_busy_are_each_taken_and_charged() {
    // The device thread spends the first doorbell's charge while the driver writes the rest:
    // they land between two of its polls, on the word it has not taken yet.
    let mut p = open(DeviceLoop::PortThread, CHARGE_NS, TxPath::Doorbell);
    const N: u32 = 8;
    let t = Instant::now();
    for _ in 0..N {
        assert_eq!(p.burst(1), 1);
    }
    p.settle();
    let took = t.elapsed();
    assert_eq!(p.q().stats().doorbells, u64::from(N));
    // Each is charged before the walk it asked for, but the last frame may leave with the walk
    // of an earlier doorbell (its WQE was published before its write): all charges but one.
    // Merged into one taken, the writes would have cost two charges.
    assert!(
        took >= (N - 1) * charge(),
        "{N} doorbells were charged {took:?}"
    );
}

/// Bursts of 1 to 4 with doorbell avoidance on, `polls_every` bursts between two device polls
/// (0: the device thread runs by itself), then a `tx_burst` without packets for what waits.
/// Every burst that took packets rang (doorbell or BlueFlame copy) or counted its skip; the
/// device took every doorbell the driver wrote.
fn avoided_and_rung_account_for_every_burst(p: &mut Port, bursts: u32, polls_every: u32) {
    p.q().set_db_avoid(Some(DbAvoid {
        packets: 32,
        cycles: mlx4rs::mmio::tsc_hz() / 250_000,
    }));
    let mut rng = traffic::Rng(0x5eed);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut posting = 0u64;
    for i in 1..=bursts {
        let n = 1 + rng.below(4) as usize;
        loop {
            if p.burst(n) > 0 {
                posting += 1;
                break;
            }
            // The ring is full: the device must catch up.
            p.poll();
            assert!(Instant::now() < deadline, "stuck: {:?}", p.q().stats());
            std::thread::yield_now();
        }
        if polls_every != 0 && i % polls_every == 0 {
            p.poll();
        }
    }
    let st = p.q().stats();
    let unrung_rings = u64::from(p.q().unrung() != 0);
    if unrung_rings != 0 {
        assert!(p.q().kick(), "a burst without packets rings for what waits");
    }
    assert_eq!(p.q().unrung(), 0);
    p.settle();
    let after = p.q().stats();
    assert_eq!(
        after.doorbells,
        st.doorbells + unrung_rings,
        "the kick rang once: {after:?}"
    );
    assert!(after.doorbells_avoided > 0, "no skip: {after:?}");
    let burst_rings = after.doorbells + after.bf_writes - after.doorbell_rerings - unrung_rings;
    assert_eq!(
        burst_rings + after.doorbells_avoided,
        posting,
        "{posting} bursts that took packets: {after:?}"
    );
    assert!(
        p.hca("bf_bursts") <= after.bf_writes,
        "BlueFlame copies seen, at most those written"
    );
}

#[test]
fn lcore_avoided_and_rung_account_for_every_burst() {
    for path in [TxPath::Doorbell, TxPath::BlueFlame] {
        let mut p = open(DeviceLoop::Lcore, 0, path);
        avoided_and_rung_account_for_every_burst(&mut p, 2000, 7);
    }
}

#[test]
fn port_avoided_and_rung_account_for_every_burst() {
    for path in [TxPath::Doorbell, TxPath::BlueFlame] {
        // A doorbell costs the device 2 us, so that it lags and bursts find theirs outstanding.
        let mut p = open(DeviceLoop::PortThread, 2000, path);
        avoided_and_rung_account_for_every_burst(&mut p, 2000, 0);
    }
}
