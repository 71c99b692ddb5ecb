//! The ways the device runs: polled by the lcore that polls the port (runners the ethdev burst
//! glue calls after `tx_burst` and before `rx_burst`), a thread per adapter, or one thread for
//! every adapter of the process. A cabled pair conserves frames in each.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use mlx4_hca::{Hca, HcaConfig, RxRunner, SqRunner, Wire};

const BUF: u64 = 2048;

fn udp(len: usize) -> Vec<u8> {
    let mut f = hex("02000000000202000000000108004500");
    f.extend(((len - 14) as u16).to_be_bytes());
    f.extend(hex("000040004011000001020304050607081234abcd"));
    f.extend(((len - 34) as u16).to_be_bytes());
    f.extend([0, 0]);
    f.resize(len, 0x77);
    f
}

/// A port as a driver would keep it, with the runners its burst glue would call.
struct Port {
    hca: Hca,
    txcq: TestCq,
    sq: TestSq,
    rxcq: TestCq,
    rq: TestRq,
    pkts: Pkts,
    sq_run: SqRunner,
    rx_run: RxRunner,
    sent: u64,
    received: u64,
    /// TXBBs whose completion the driver has seen.
    done_tx: u32,
}

impl Port {
    fn new(cfg: HcaConfig) -> Port {
        let (hca, txcq, sq) = sq_rig(cfg, 256, 256);
        let rxcq = TestCq::new(&hca, 256);
        let rq = TestRq::new(&hca, 256, 1, rxcq.cqn);
        let pkts = Pkts::new(&hca, 1 << 20);
        let sq_run = hca.sq_runner(sq.info.qpn).unwrap();
        let rx_run = hca.rx_runner();
        let mut p = Port {
            hca,
            txcq,
            sq,
            rxcq,
            rq,
            pkts,
            sq_run,
            rx_run,
            sent: 0,
            received: 0,
            done_tx: 0,
        };
        p.post_rx(256);
        p
    }

    fn post_rx(&mut self, n: u64) {
        for _ in 0..n {
            let i = u64::from(self.rq.prod % 256);
            let addr = self.pkts.mem.addr() + 65536 + i * BUF;
            self.rq.post(&[(BUF as u32, self.pkts.lkey, addr)]);
        }
    }

    /// `tx_burst`: post `n` gather WQEs of `f` (a completion on the last), one doorbell, as
    /// long as the ring has room (completions are reaped first, as drivers do).
    fn tx_burst(&mut self, f: &[u8], n: usize) -> usize {
        self.reap_tx();
        let room = 256 - (self.sq.prod - self.done_tx) as usize;
        let n = n.min(room.saturating_sub(8));
        if n == 0 {
            return 0;
        }
        self.pkts.mem.put(0, f);
        for i in 0..n {
            let srcrb = if i + 1 == n { SIGNALED } else { UNSIGNALED };
            let mut t = ctrl_tail(2, srcrb);
            t.extend(dseg(f.len() as u32, self.pkts.lkey, self.pkts.mem.addr()));
            self.sq.write(SEND, &t);
        }
        self.sq.doorbell();
        self.sent += n as u64;
        n
    }

    fn reap_tx(&mut self) {
        while let Some(c) = self.txcq.poll() {
            // The CQE names the WQE's 16-bit counter; one-TXBB WQEs, so done = that + 1.
            let mut d = (self.done_tx & !0xffff) | u32::from(be16(&c, 24));
            if d < self.done_tx {
                d += 0x1_0000;
            }
            self.done_tx = d + 1;
        }
        self.txcq.update_ci();
    }

    /// `rx_burst`: take completions, repost their buffers.
    fn rx_burst(&mut self) -> u64 {
        let n = self.rxcq.drain().len() as u64;
        self.rxcq.update_ci();
        self.post_rx(n);
        self.received += n;
        n
    }
}

fn polled() -> HcaConfig {
    HcaConfig {
        threaded: false,
        ..HcaConfig::default()
    }
}

#[test]
fn runners_do_what_the_device_would_and_nothing_when_idle() {
    let mut p = Port::new(polled());
    p.hca.set_wire(Wire::Loop).unwrap();
    assert_eq!((p.sq_run.run(), p.rx_run.run()), (0, 0), "nothing to do");
    let f = udp(80);
    p.tx_burst(&f, 10);
    // The receive side sees nothing before the send side ran: the device has not sent yet.
    assert_eq!(p.rx_run.run(), 0);
    assert!(p.sq_run.run() >= 10, "the doorbell and ten WQEs");
    assert_eq!(p.sq_run.run(), 0, "the doorbell is used up");
    assert_eq!(p.rx_run.run(), 10);
    assert_eq!(p.rx_burst(), 10);
    let c = p.hca.counters();
    assert_eq!((c.tx_frames, c.rx_frames, c.doorbells), (10, 10, 1));
    // A runner outliving its queue does nothing.
    let old = p.sq_run.clone();
    p.hca.destroy_sq(p.sq.info.qpn).unwrap();
    assert_eq!(old.run(), 0);
    assert!(p.hca.sq_runner(p.sq.info.qpn).is_err());
}

#[test]
fn a_runner_comes_back_to_a_queue_that_waited_for_its_cq() {
    let (hca, mut cq, mut sq) = sq_rig(polled(), 64, 2);
    let run = hca.sq_runner(sq.info.qpn).unwrap();
    for _ in 0..5 {
        sq.write(NOP, &ctrl_tail(1, SIGNALED));
    }
    sq.doorbell();
    run.run();
    assert_eq!(cq.drain().len(), 2);
    cq.update_ci();
    // No new doorbell: the runner knows the walk was unfinished.
    run.run();
    assert_eq!(cq.drain().len(), 2);
    cq.update_ci();
    run.run();
    assert_eq!(cq.drain().len(), 1);
    assert_eq!(run.run(), 0);
}

/// Drive a cabled pair through `rounds` bursts each way with the runners (polled) or just the
/// queues (threaded), and check that every frame is received or counted as dropped.
fn cable_conserves(name: &str, cfg: HcaConfig, polled: bool) {
    let mut a = Port::new(HcaConfig {
        name: format!("{name}_a"),
        ..cfg.clone()
    });
    let mut b = Port::new(HcaConfig {
        name: format!("{name}_b"),
        rx_inbox_frames: 64,
        ..cfg
    });
    a.hca.set_wire(Wire::Peer(format!("{name}_b"))).unwrap();
    b.hca.set_wire(Wire::Peer(format!("{name}_a"))).unwrap();
    a.hca.start().unwrap();
    b.hca.start().unwrap();
    let f = udp(64);
    for round in 0..2000 {
        // One lcore forwarding both ports, as testpmd io does: rx_burst, tx_burst, per port.
        for (p, q) in [(&mut a, true), (&mut b, false)] {
            if polled {
                p.rx_run.run();
            }
            // b falls behind now and then: it misses frames, which it must count.
            if q || round % 50 >= 10 {
                p.rx_burst();
            }
            p.tx_burst(&f, 32);
            if polled {
                p.sq_run.run();
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for p in [&mut a, &mut b] {
            if polled {
                p.sq_run.run();
                p.rx_run.run();
            }
            p.rx_burst();
            p.reap_tx();
        }
        let (ca, cb) = (a.hca.counters(), b.hca.counters());
        let ok = ca.tx_frames == a.sent
            && cb.tx_frames == b.sent
            && ca.tx_frames == cb.rx_frames + cb.rx_dropped()
            && cb.tx_frames == ca.rx_frames + ca.rx_dropped();
        if ok {
            // Nothing is in flight any more; completions written after the last drain come in
            // with the next.
            while (a.received, b.received) != (ca.rx_frames, cb.rx_frames) {
                assert!(Instant::now() < deadline, "completions missing");
                a.rx_burst();
                b.rx_burst();
            }
            assert!(cb.rx_missed() > 0, "b fell behind and counted it: {cb:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: not conserved: a sent {} ({}), b got {} + {} dropped; b sent {} ({}), a got {} + {}\n{ca:?}\n{cb:?}",
            a.sent,
            ca.tx_frames,
            cb.rx_frames,
            cb.rx_dropped(),
            b.sent,
            cb.tx_frames,
            ca.rx_frames,
            ca.rx_dropped()
        );
        std::thread::yield_now();
    }
    a.hca.stop();
    b.hca.stop();
}

#[test]
fn a_cable_conserves_frames_when_the_polling_lcore_runs_the_device() {
    cable_conserves("polled", polled(), true);
}

#[test]
fn a_cable_conserves_frames_with_a_thread_per_adapter() {
    cable_conserves("own_thread", HcaConfig::default(), false);
}

#[test]
fn a_cable_conserves_frames_with_one_thread_for_every_adapter() {
    cable_conserves(
        "shared_thread",
        HcaConfig {
            shared_thread: true,
            ..HcaConfig::default()
        },
        false,
    );
}

#[test]
fn the_shared_thread_serves_every_adapter_until_each_stops() {
    let cfg = HcaConfig {
        shared_thread: true,
        ..HcaConfig::default()
    };
    let ports: Vec<Port> = (0..3).map(|_| Port::new(cfg.clone())).collect();
    let mut ports = ports;
    for p in &ports {
        p.hca.start().unwrap();
        p.hca.start().unwrap();
    }
    let f = udp(64);
    let wait_sent = |p: &Port| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while p.hca.counters().tx_frames < p.sent {
            assert!(
                Instant::now() < deadline,
                "the shared thread did not run a port"
            );
            std::thread::yield_now();
        }
    };
    for p in &mut ports {
        p.tx_burst(&f, 8);
    }
    for p in &ports {
        wait_sent(p);
    }
    // Port 0 leaves; the others are still served, and port 0's doorbell is not taken.
    ports[0].hca.stop();
    ports[0].tx_burst(&f, 8);
    for p in &mut ports[1..] {
        p.tx_burst(&f, 8);
    }
    for p in &ports[1..] {
        wait_sent(p);
    }
    assert_eq!(
        ports[0].hca.counters().tx_frames,
        8,
        "a stopped adapter is not run"
    );
    // Back in, it catches up.
    ports[0].hca.start().unwrap();
    wait_sent(&ports[0]);
    drop(ports);
}

#[test]
fn runners_on_several_threads_share_an_adapter_safely() {
    // Two send queues of one looped adapter, each posted and run by its own "lcore", and a
    // third running the receive side: every frame arrives or is counted.
    let hca = Hca::open(HcaConfig {
        rx_inbox_frames: 256,
        ..polled()
    })
    .unwrap();
    hca.set_wire(Wire::Loop).unwrap();
    let rxcq = Arc::new(parking_lot::Mutex::new(TestCq::new(&hca, 1024)));
    let rq = Arc::new(parking_lot::Mutex::new(TestRq::new(
        &hca,
        1024,
        1,
        rxcq.lock().cqn,
    )));
    let pkts = Arc::new(Pkts::new(&hca, 4 << 20));
    pkts.mem.put(0, &udp(64));
    for i in 0..1024u64 {
        rq.lock()
            .post(&[(BUF as u32, pkts.lkey, pkts.mem.addr() + 65536 + i * BUF)]);
    }
    let done = Arc::new(AtomicBool::new(false));
    let receiver = {
        let (hca, rxcq, rq, pkts, done) = (
            hca.clone(),
            rxcq.clone(),
            rq.clone(),
            pkts.clone(),
            done.clone(),
        );
        std::thread::spawn(move || {
            let run = hca.rx_runner();
            let mut got = 0u64;
            loop {
                let finished = done.load(Ordering::Acquire);
                run.run();
                let mut cq = rxcq.lock();
                let n = cq.drain().len() as u64;
                cq.update_ci();
                let mut rq = rq.lock();
                for _ in 0..n {
                    let i = u64::from(rq.prod % 1024);
                    rq.post(&[(BUF as u32, pkts.lkey, pkts.mem.addr() + 65536 + i * BUF)]);
                }
                got += n;
                if finished && run.run() == 0 && n == 0 {
                    return got;
                }
                std::thread::yield_now();
            }
        })
    };
    let senders: Vec<_> = (0..2)
        .map(|_| {
            let (hca, pkts) = (hca.clone(), pkts.clone());
            std::thread::spawn(move || {
                let mut cq = TestCq::new(&hca, 256);
                let mut sq = TestSq::new(&hca, 256, cq.cqn);
                let run = hca.sq_runner(sq.info.qpn).unwrap();
                for _ in 0..500 {
                    for i in 0..16 {
                        let srcrb = if i == 15 { SIGNALED } else { UNSIGNALED };
                        let mut t = ctrl_tail(2, srcrb);
                        t.extend(dseg(64, pkts.lkey, pkts.mem.addr()));
                        sq.write(SEND, &t);
                    }
                    sq.doorbell();
                    run.run();
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while cq.poll().is_none() {
                        assert!(Instant::now() < deadline, "no completion");
                        run.run();
                    }
                    cq.update_ci();
                }
                // The rings go with this thread: the device lets go of them first.
                hca.destroy_sq(sq.info.qpn).unwrap();
                hca.destroy_cq(cq.cqn).unwrap();
            })
        })
        .collect();
    for t in senders {
        t.join().unwrap();
    }
    done.store(true, Ordering::Release);
    let got = receiver.join().unwrap();
    let c = hca.counters();
    assert_eq!(c.tx_frames, 16_000);
    assert_eq!(c.tx_frames, c.rx_frames + c.rx_dropped());
    assert_eq!(got, c.rx_frames);
}
