//! Every frame the device drops is counted where a NIC counts it: on the receiving port, as
//! missed (no RX WQE, receive buffer full or port down, CQ full for too long) or as the other
//! receive drops (MAC filter, MTU, too long for the buffers). A cabled pair conserves frames:
//! what one port sent is what the other received plus what it counted as dropped.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx4_hca::{Counters, Hca, HcaConfig, Wire};

const BUF: u32 = 2048;

/// An adapter with one SQ, one RQ of `rx_wqes` 2 KiB buffers (or `buf`-byte ones), packet
/// memory, and a software consumer for both CQs.
struct Port {
    hca: Hca,
    txcq: TestCq,
    sq: TestSq,
    rxcq: TestCq,
    rq: TestRq,
    pkts: Pkts,
    buf: u32,
    received: u64,
}

impl Port {
    fn new(cfg: HcaConfig, rx_wqes: u32, rx_cqes: u32) -> Port {
        let (hca, txcq, sq) = sq_rig(cfg, 256, 256);
        let rxcq = TestCq::new(&hca, rx_cqes);
        let rq = TestRq::new(&hca, rx_wqes, 1, rxcq.cqn);
        let pkts = Pkts::new(&hca, 1 << 20);
        Port {
            hca,
            txcq,
            sq,
            rxcq,
            rq,
            pkts,
            buf: BUF,
            received: 0,
        }
    }

    /// Post `n` RX buffers.
    fn post_rx(&mut self, n: u32) {
        for _ in 0..n {
            let i = u64::from(self.rq.prod % 128);
            let addr = self.pkts.mem.addr() + 65536 + i * u64::from(BUF);
            self.rq.post(&[(self.buf, self.pkts.lkey, addr)]);
        }
    }

    /// Post `frames` as one burst of gather WQEs (a completion on the last) and ring once.
    fn send(&mut self, frames: &[Vec<u8>]) {
        for (i, f) in frames.iter().enumerate() {
            let off = (self.sq.prod as usize % 32) * 2048;
            self.pkts.mem.put(off, f);
            let last = i + 1 == frames.len();
            let mut t = ctrl_tail(2, if last { SIGNALED } else { UNSIGNALED });
            t.extend(dseg(
                f.len() as u32,
                self.pkts.lkey,
                self.pkts.mem.addr() + off as u64,
            ));
            self.sq.write(SEND, &t);
        }
        self.sq.doorbell();
    }

    /// Consume completions as a driver's poll would; returns RX frames seen.
    fn reap(&mut self, repost: bool) -> u64 {
        self.txcq.drain();
        self.txcq.update_ci();
        let n = self.rxcq.drain().len() as u64;
        self.rxcq.update_ci();
        if repost {
            self.post_rx(n as u32);
        }
        self.received += n;
        n
    }
}

fn udp(len: usize, dst_last: u8) -> Vec<u8> {
    let mut f = hex("02000000000202000000000108004500");
    let ip_len = len - 14;
    f.extend((ip_len as u16).to_be_bytes());
    f.extend(hex("000040004011000001020304050607081234abcd"));
    f.extend(((ip_len - 20) as u16).to_be_bytes());
    f.extend([0, 0]);
    f.resize(len, 0x33);
    f[5] = dst_last;
    f
}

/// The conservation law of a cable from `tx` to `rx`, and that nothing is still in flight.
fn assert_conserved(tx: &Counters, rx: &Counters, what: &str) {
    assert_eq!(
        tx.tx_frames,
        rx.rx_frames + rx.rx_dropped(),
        "{what}: sent {} = received {} + dropped {} ({rx:?})",
        tx.tx_frames,
        rx.rx_frames,
        rx.rx_dropped()
    );
}

fn cabled(name: &str, a_cfg: HcaConfig, b_cfg: HcaConfig) -> (Port, Port) {
    let a = Port::new(
        HcaConfig {
            name: format!("{name}_a"),
            ..a_cfg
        },
        128,
        128,
    );
    let b = Port::new(
        HcaConfig {
            name: format!("{name}_b"),
            ..b_cfg
        },
        128,
        128,
    );
    a.hca.set_wire(Wire::Peer(format!("{name}_b"))).unwrap();
    b.hca.set_wire(Wire::Peer(format!("{name}_a"))).unwrap();
    (a, b)
}

#[test]
fn a_cabled_pair_conserves_frames_through_every_kind_of_drop() {
    let (mut a, mut b) = cabled(
        "conserve",
        step_cfg(),
        HcaConfig {
            rx_inbox_frames: 48,
            ..step_cfg()
        },
    );
    b.hca.set_mtu(1000).unwrap();
    b.hca.set_rx_filter([0x02, 0, 0, 0, 0, 0x02], false, false);
    a.post_rx(128);
    b.post_rx(40);
    let mut rng = 0x1234_5678u32;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 17;
        rng ^= rng << 5;
        rng
    };
    for round in 0..200 {
        // Mostly good frames; some to another MAC, some over the MTU, some over the buffers.
        let burst: Vec<Vec<u8>> = (0..1 + next() % 32)
            .map(|_| match next() % 16 {
                0 => udp(64, 0x09),
                1 => udp(1400, 0x02),
                2 => udp(900, 0x02),
                _ => udp(60 + (next() % 200) as usize, 0x02),
            })
            .collect();
        if round % 50 == 20 {
            b.hca.set_port_up(false);
        }
        if round % 50 == 30 {
            b.hca.set_port_up(true);
        }
        if round % 40 == 0 {
            // Buffers smaller than some frames: those complete in error and count.
            b.buf = if b.buf == BUF { 512 } else { BUF };
        }
        a.send(&burst);
        b.send(&burst[..burst.len() / 2]);
        a.hca.step();
        // The receiver sometimes lags: its buffer fills and it runs out of RX WQEs.
        if round % 3 != 0 {
            b.hca.step();
            b.reap(round % 7 != 0);
        }
        a.reap(true);
    }
    for p in [&mut a, &mut b] {
        p.post_rx(64);
    }
    for _ in 0..10 {
        a.hca.step();
        b.hca.step();
        a.reap(true);
        b.reap(true);
    }
    let (ca, cb) = (a.hca.counters(), b.hca.counters());
    assert_conserved(&ca, &cb, "a to b");
    assert_conserved(&cb, &ca, "b to a");
    // Too-long frames complete in error: the driver sees them, as CQEs, but not as frames.
    assert_eq!(b.received, cb.rx_frames + cb.rx_drops_too_long);
    // Every cause happened, and the missed ones are what a NIC calls missed.
    for (what, n) in [
        ("no RX WQE", cb.rx_drops_no_wqe),
        ("buffer full or port down", cb.rx_drops_wire),
        ("MAC filter", cb.rx_drops_filter),
        ("MTU", cb.rx_drops_mtu),
        ("too long", cb.rx_drops_too_long),
    ] {
        assert!(n > 0, "no drop for {what}: {cb:?}");
    }
    assert_eq!(
        cb.rx_missed(),
        cb.rx_drops_no_wqe + cb.rx_drops_wire + cb.rx_drops_cq_full + cb.rx_drops_error
    );
    assert_eq!(ca.tx_drops_wire, 0, "the sender lost nothing itself");
}

#[test]
fn an_unpolled_receiver_counts_missed_frames_and_receives_again() {
    let (mut a, mut b) = cabled("unpolled", step_cfg(), step_cfg());
    // b posts nothing at first: like a port nobody polls, every frame is missed.
    for _ in 0..20 {
        a.send(&vec![udp(64, 2); 16]);
        a.hca.step();
        b.hca.step();
        a.reap(false);
    }
    let cb = b.hca.counters();
    assert_eq!((cb.rx_frames, cb.rx_missed()), (0, 320));
    assert_eq!(cb.rx_drops_no_wqe, 320);
    b.post_rx(64);
    a.send(&vec![udp(64, 2); 16]);
    a.hca.step();
    b.hca.step();
    assert_eq!(b.reap(true), 16, "receive resumes once buffers are posted");
    assert_conserved(&a.hca.counters(), &b.hca.counters(), "a to b");
}

#[test]
fn a_cq_that_stays_full_makes_the_port_drop_after_a_while() {
    // 8 RX WQEs but a CQ of 4 the test does not drain: 4 complete, the rest wait, then drop.
    let mut p = Port::new(step_cfg(), 8, 4);
    p.hca.set_wire(Wire::Loop).unwrap();
    p.post_rx(8);
    p.send(&vec![udp(64, 2); 6]);
    p.hca.step();
    let c = p.hca.counters();
    assert_eq!(
        (c.rx_frames, c.cq_full_stalls, c.rx_drops_cq_full),
        (4, 1, 0)
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.hca.counters().rx_drops_cq_full < 2 {
        assert!(
            Instant::now() < deadline,
            "frames waited forever on a full CQ"
        );
        p.hca.step();
        std::thread::yield_now();
    }
    let c = p.hca.counters();
    assert_eq!((c.rx_frames, c.rx_drops_cq_full, c.rx_missed()), (4, 2, 2));
    assert_eq!(c.tx_frames, c.rx_frames + c.rx_dropped());
    // Drained, the CQ takes frames again at once.
    assert_eq!(p.reap(false), 4);
    p.send(&vec![udp(64, 2); 2]);
    p.hca.step();
    assert_eq!(p.reap(false), 2);
}

#[test]
fn a_cabled_pair_conserves_frames_with_threaded_devices() {
    let threaded = HcaConfig {
        threaded: true,
        ..HcaConfig::default()
    };
    let (mut a, mut b) = cabled(
        "threaded",
        threaded.clone(),
        HcaConfig {
            rx_inbox_frames: 64,
            ..threaded
        },
    );
    a.post_rx(128);
    b.post_rx(128);
    a.hca.start().unwrap();
    b.hca.start().unwrap();
    for round in 0..300 {
        a.send(&vec![udp(64 + round % 100, 2); 32]);
        // Between two reaps 256 frames arrive for b's 128 buffers and 64-frame inbox: some
        // must drop, however the two device threads are scheduled.
        if round % 8 == 0 {
            b.reap(true);
        }
        a.reap(true);
        // Keep the SQ from overrunning: wait until the device consumed this burst.
        let deadline = Instant::now() + Duration::from_secs(10);
        while a.hca.counters().tx_frames < 32 * (round as u64 + 1) {
            assert!(Instant::now() < deadline, "the device stopped sending");
            std::thread::yield_now();
        }
    }
    // Frames still in b's buffer arrive or drop; wait until the books balance.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        b.reap(true);
        let (ca, cb) = (a.hca.counters(), b.hca.counters());
        if ca.tx_frames == cb.rx_frames + cb.rx_dropped() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not conserved: sent {} received {} dropped {}",
            ca.tx_frames,
            cb.rx_frames,
            cb.rx_dropped()
        );
        std::thread::yield_now();
    }
    let cb = b.hca.counters();
    assert!(cb.rx_frames > 0 && cb.rx_missed() > 0, "{cb:?}");
    a.hca.stop();
    b.hca.stop();
}
