//! What the device loop costs per WQE, on each wire: the figure that says whether end-to-end runs
//! measure the driver or the model (target: 10 ns for a 64-byte inline WQE on the null wire).
//!
//! `cargo bench -p mlx4-hca --bench device [-- --rounds N --quick]`
//!
//! `--only port-burst1` (or `port-burst32`, `step-burst1`, `step-burst32`) runs the device as
//! `device_loop=port` does instead: a producer posting 64-byte inline WQEs in bursts, a
//! doorbell per burst, against the device thread (`port-*`, spinning, both pinned with
//! `--pin`; `--secs S`, `--doorbell-ns N`), or against `Hca::step` called per burst in the
//! same thread (`step-*`, the device thread's work per doorbell, for callgrind:
//! `--toggle-collect='*device_step*'`). `lcore-burst1` (or `lcore-burst32`) runs the queue's
//! and the receive side's runners after each burst instead, as the polling lcore does in
//! `device_loop=lcore` (`--toggle-collect='*device_lcore*'`).
//!
//! The rings are filled before the clock starts (by the hand-rolled driver of the tests), one
//! doorbell announces a whole ring, and only `Hca::step` is timed: the device fetches, decodes
//! and executes every WQE, writes the completions (one every 32 WQEs, as drivers ask), and on
//! the loop wire also receives every frame into a posted RX buffer and completes it. The figure
//! is the median over rounds; the machine's load is printed with it because timings on a shared
//! machine move with it.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::*;
use mlx4_hca::{Hca, HcaConfig, Wire};

/// WQEs per round in the ring mode: a 2048-TXBB ring of two-TXBB WQEs.
const WQES: u32 = 1024;
const TXBBS: u32 = 2048;
/// WQEs per round in the burst mode: a driver's burst.
const BURST: u32 = 32;
/// A completion is requested on every this many WQEs.
const SIGNAL_EVERY: u32 = 32;
/// RX buffer size on the loop wire.
const RX_BUF: u64 = 2048;
const FRAME: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// The frame inline, split at the 64-byte boundary as drivers lay it out (DS 6, 2 TXBBs).
    Inline,
    /// One gather entry pointing at the frame in registered memory (DS 2, 1 TXBB).
    Gather,
}

impl Kind {
    fn txbbs(self) -> u32 {
        match self {
            Kind::Inline => 2,
            Kind::Gather => 1,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum WireKind {
    Null,
    Loop,
    Pcap,
}

struct Rig {
    /// WQEs posted and executed per round (per `step`).
    per_round: u32,
    hca: Hca,
    cq: TestCq,
    sq: TestSq,
    rx: Option<(TestCq, TestRq)>,
    pkts: Pkts,
    pcap: Option<std::path::PathBuf>,
    /// What each round of the first period wrote to the ring, by phase.
    images: Vec<Option<Vec<u8>>>,
}

fn frame() -> Vec<u8> {
    let mut f =
        hex("020000000002020000000001080045000032000040004011000001020304050607081234abcd001e0000");
    f.resize(FRAME, 0x5a);
    f
}

/// Tail of a 64-byte inline WQE (everything after dword 0).
fn inline_tail(f: &[u8], srcrb: u8) -> Vec<u8> {
    let mut t = ctrl_tail(6, srcrb);
    t.extend(inline_hdr(44));
    t.extend(&f[..44]);
    t.extend(inline_hdr(f.len() - 44));
    t.extend(&f[44..]);
    t.resize(6 * 16 - 4, 0);
    t
}

impl Rig {
    fn new(wire: WireKind, per_round: u32) -> Rig {
        let hca = Hca::open(HcaConfig {
            threaded: false,
            rx_inbox_frames: WQES,
            ..HcaConfig::default()
        })
        .expect("open the HCA");
        let cq = TestCq::new(&hca, WQES);
        let sq = TestSq::new(&hca, TXBBS, cq.cqn);
        let pkts = Pkts::new(&hca, 4096 + (WQES as usize) * RX_BUF as usize);
        pkts.mem.put(0, &frame());
        let mut pcap = None;
        let rx = match wire {
            WireKind::Null => None,
            WireKind::Pcap => {
                let p = std::env::temp_dir()
                    .join(format!("mlx4_hca_bench_{}.pcap", std::process::id()));
                hca.set_wire(Wire::Pcap(p.clone())).expect("pcap wire");
                pcap = Some(p);
                None
            }
            WireKind::Loop => {
                hca.set_wire(Wire::Loop).expect("loop wire");
                let rcq = TestCq::new(&hca, WQES);
                let rq = TestRq::new(&hca, WQES, 1, rcq.cqn);
                Some((rcq, rq))
            }
        };
        Rig {
            per_round,
            hca,
            cq,
            sq,
            rx,
            pkts,
            pcap,
            images: Vec::new(),
        }
    }

    /// Fill the ring (and the RQ), ring one doorbell (or with `bf` copy the last WQE to
    /// BlueFlame, as the driver ends a burst); nothing timed. The ring goes through the
    /// same contents every two passes, so after one period the WQEs of a round are restored from
    /// the image of the same phase, which keeps the posting cheap next to what is measured.
    fn post(&mut self, kind: Kind, round: u64, bf: bool) {
        let per_round = self.per_round * kind.txbbs();
        let period = 2 * TXBBS / per_round;
        let phase = (round % u64::from(period)) as usize;
        if self.images.len() < period as usize {
            self.images.resize(period as usize, None);
        }
        let start = (self.sq.prod % TXBBS) as usize * 64;
        let len = per_round as usize * 64;
        if let Some(img) = &self.images[phase] {
            self.sq.ring.put_bulk(start, img);
            self.sq.prod += per_round;
        } else {
            self.write_wqes(kind);
            self.images[phase] = Some(self.sq.ring.get(start, len));
        }
        if let Some((_, rq)) = self.rx.as_mut() {
            let base = self.pkts.mem.addr() + 4096;
            for _ in 0..self.per_round {
                let i = u64::from(rq.prod % WQES);
                rq.post(&[(RX_BUF as u32, self.pkts.lkey, base + i * RX_BUF)]);
            }
        }
        if bf {
            let last = self.sq.prod - kind.txbbs();
            let wqe = self.sq.wqe_bytes(last);
            self.sq.bf_copy(last, wqe);
        } else {
            self.sq.doorbell();
        }
    }

    fn write_wqes(&mut self, kind: Kind) {
        let f = frame();
        for i in 0..self.per_round {
            let srcrb = if (i + 1) % SIGNAL_EVERY == 0 {
                SIGNALED
            } else {
                UNSIGNALED
            };
            match kind {
                Kind::Inline => self.sq.write(SEND, &inline_tail(&f, srcrb)),
                Kind::Gather => {
                    let mut t = ctrl_tail(2, srcrb);
                    t.extend(dseg(FRAME as u32, self.pkts.lkey, self.pkts.mem.addr()));
                    self.sq.write(SEND, &t)
                }
            };
        }
    }

    /// Consume the completions of a round and check that every WQE (and frame) got through.
    fn finish(&mut self, round: u64) {
        let tx = self.cq.drain().len() as u32;
        self.cq.update_ci();
        assert_eq!(tx, self.per_round / SIGNAL_EVERY, "TX completions");
        if let Some((rcq, _)) = self.rx.as_mut() {
            let rx = rcq.drain().len() as u32;
            rcq.update_ci();
            assert_eq!(rx, self.per_round, "RX completions");
        }
        let c = self.hca.counters();
        assert_eq!(
            c.tx_frames,
            round * u64::from(self.per_round),
            "frames on the wire"
        );
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(p) = &self.pcap {
            let _ = self.hca.set_wire(Wire::Null);
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Median and minimum.
fn median(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0])
}

/// What reading the clock twice costs, subtracted from every timed `step`.
fn clock_overhead_ns() -> f64 {
    let v = (0..1001)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(t.elapsed()).as_nanos() as f64
        })
        .collect();
    median(v).0
}

/// Nanoseconds per WQE, median and minimum over `rounds` of `per_round` WQEs each. A round of the ring
/// mode is one `Hca::step`; a burst is what the polled mode does after `tx_burst` and before
/// `rx_burst`: the SQ's runner, then the port's receive runner. With `bf` each round ends with a
/// BlueFlame copy of its last WQE instead of a doorbell.
fn measure(
    wire: WireKind,
    kind: Kind,
    per_round: u32,
    rounds: u64,
    clock: f64,
    bf: bool,
) -> (f64, f64) {
    let mut rig = Rig::new(wire, per_round);
    let sq_run = rig.hca.sq_runner(rig.sq.info.qpn).expect("SQ runner");
    let rx_run = rig.hca.rx_runner();
    let mut per = Vec::new();
    for round in 1..=rounds {
        rig.post(kind, round, bf);
        let t = Instant::now();
        let work = if per_round == WQES {
            rig.hca.step()
        } else {
            sq_run.run() + rx_run.run()
        };
        let dt = t.elapsed().as_nanos() as f64 - clock;
        assert!(work >= per_round as usize);
        rig.finish(round);
        if bf {
            let c = rig.hca.counters();
            assert_eq!(c.wqe_from_bf, round, "every copy taken: {c:?}");
        }
        per.push(dt / f64::from(per_round));
    }
    median(per)
}

/// What calling the device costs when there is nothing to do: one `Hca::step`, and the two
/// runners the polled mode calls per burst.
fn idle_ns(clock: f64) -> [f64; 3] {
    let rig = Rig::new(WireKind::Loop, BURST);
    let sq_run = rig.hca.sq_runner(rig.sq.info.qpn).expect("SQ runner");
    let rx_run = rig.hca.rx_runner();
    let n = 100_000u32;
    let time = |f: &dyn Fn() -> usize| {
        let t = Instant::now();
        for _ in 0..n {
            std::hint::black_box(f());
        }
        (t.elapsed().as_nanos() as f64 - clock) / f64::from(n)
    };
    [
        time(&|| rig.hca.step()),
        time(&|| sq_run.run()),
        time(&|| rx_run.run()),
    ]
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 5 } else { 101 });
    // `--only port-burst1` (and the like) runs one threaded or stepped case, printing its line.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    if let Some(o) = only.as_deref() {
        if o.starts_with("port-burst")
            || o.starts_with("step-burst")
            || o.starts_with("lcore-burst")
        {
            println!("load average before: {}", loadavg());
            per_burst(o, &args);
            println!("load average after: {}", loadavg());
            return;
        }
    }
    println!(
        "device cost per WQE, {FRAME}-byte frames (load average before: {})",
        loadavg()
    );
    println!(
        "  ring:  {WQES} WQEs posted, one doorbell, one step (the ring streams from L2); \
         median of {rounds} rounds"
    );
    println!(
        "  burst: {BURST} WQEs posted (cache-hot, as the driver just wrote them), one \
         doorbell, then the polled mode's SqRunner::run and RxRunner::run; median of {} rounds",
        rounds * u64::from(WQES / BURST)
    );
    println!("  bf:    as burst, but a BlueFlame copy of the last WQE instead of the doorbell");
    println!("  (median and, after the slash, the minimum over rounds: on a shared machine the");
    println!("  minimum is the round least disturbed by other work)");
    println!(
        "{:<6} {:<7} {:>16} {:>16} {:>16} {:>12}",
        "wire", "wqe", "ring ns/WQE", "burst ns/WQE", "bf ns/WQE", "burst Mpps"
    );
    // `--only null-inline` (wire-wqe) runs one case, e.g. under a profiler.
    let clock = clock_overhead_ns();
    for wire in [WireKind::Null, WireKind::Loop, WireKind::Pcap] {
        for kind in [Kind::Inline, Kind::Gather] {
            let name = format!("{wire:?}-{kind:?}").to_lowercase();
            if only.as_ref().is_some_and(|o| *o != name) {
                continue;
            }
            let bursts = rounds * u64::from(WQES / BURST);
            let ring = measure(wire, kind, WQES, rounds, clock, false);
            let burst = measure(wire, kind, BURST, bursts, clock, false);
            let bf = measure(wire, kind, BURST, bursts, clock, true);
            println!(
                "{:<6} {:<7} {:>16} {:>16} {:>16} {:>12.1}",
                format!("{wire:?}").to_lowercase(),
                format!("{kind:?}").to_lowercase(),
                format!("{:.1} / {:.1}", ring.0, ring.1),
                format!("{:.1} / {:.1}", burst.0, burst.1),
                format!("{:.1} / {:.1}", bf.0, bf.1),
                1e3 / burst.0
            );
        }
    }
    if only.as_ref().map_or(true, |o| o == "idle") {
        let [step, sq, rx] = idle_ns(clock);
        println!(
            "idle: Hca::step {step:.1} ns, SqRunner::run {sq:.1} ns, RxRunner::run {rx:.1} ns"
        );
    }
    println!("load average after: {}", loadavg());
}

// ------------------------------------------------------------------ the device thread's share

/// A producer of 64-byte inline WQEs (two TXBBs each, a completion every `SIGNAL_EVERY`), as
/// a driver's `tx_burst` posts them: the WQE's bytes after its first dword, then the owner
/// dword, then per burst one doorbell. Completions free the ring, 32 WQEs per CQE.
struct Producer {
    cq: TestCq,
    sq: TestSq,
    /// Bytes 4..128 of the WQE, unsignaled and signaled.
    tails: [Vec<u8>; 2],
    /// TXBBs the device completed (free-running, as `sq.prod`).
    done: u32,
    /// Calls that found no room for their burst (the ring full: the device behind).
    full_calls: u64,
}

impl Producer {
    fn new(hca: &Hca) -> Producer {
        let cq = TestCq::new(hca, WQES);
        let sq = TestSq::new(hca, TXBBS, cq.cqn);
        let f = frame();
        let tails = [UNSIGNALED, SIGNALED].map(|srcrb| inline_tail(&f, srcrb));
        Producer {
            cq,
            sq,
            tails,
            done: 0,
            full_calls: 0,
        }
    }

    /// Take the completions there are; true if any.
    fn reap(&mut self) -> bool {
        let mut any = false;
        loop {
            let off = (self.cq.cons & (self.cq.cnt - 1)) as usize * 32;
            // SAFETY: `off + 31` lies inside the CQ ring (cnt * 32 bytes); volatile since the
            // device thread writes it.
            let owner = unsafe { self.cq.ring.ptr().add(off + 31).read_volatile() } & 0x80;
            if (owner != 0) != (self.cq.cons & self.cq.cnt != 0) {
                break;
            }
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            self.cq.cons += 1;
            self.done += SIGNAL_EVERY * Kind::Inline.txbbs();
            any = true;
        }
        if any {
            self.cq.update_ci();
        }
        any
    }

    /// Post `n` WQEs and ring the doorbell, if the ring has room for them; false (a call on a
    /// full ring) if not, after looking for completions once.
    fn burst(&mut self, n: u32) -> bool {
        let need = n * Kind::Inline.txbbs();
        if TXBBS - self.sq.prod.wrapping_sub(self.done) < need {
            self.reap();
            if TXBBS - self.sq.prod.wrapping_sub(self.done) < need {
                self.full_calls += 1;
                return false;
            }
        }
        for _ in 0..n {
            let c = self.sq.prod;
            let signaled = (c / Kind::Inline.txbbs() + 1) % SIGNAL_EVERY == 0;
            let off = (c & (TXBBS - 1)) as usize * 64;
            self.sq
                .ring
                .put_bulk(off + 4, &self.tails[usize::from(signaled)]);
            self.sq.ring.put32(off, self.sq.owner(c) | u32::from(SEND));
            self.sq.prod += Kind::Inline.txbbs();
        }
        self.sq.doorbell();
        true
    }

    fn wqes(&self) -> u64 {
        u64::from(self.sq.prod / Kind::Inline.txbbs())
    }
}

/// The device's work per doorbell as its thread does it, in this thread: `n_wqes` WQEs posted
/// in bursts of `burst`, each burst followed by `Hca::step` (its polls until one finds
/// nothing: the work, then one idle poll, as the thread polls between doorbells). Under
/// callgrind (`--toggle-collect='*device_step*'`) the collected count over `n_wqes` is the
/// device's instructions per WQE at that burst.
fn stepped(burst: u32, n_wqes: u32) {
    let hca = Hca::open(HcaConfig {
        threaded: false,
        ..HcaConfig::default()
    })
    .expect("open the HCA");
    let mut p = Producer::new(&hca);
    let t = Instant::now();
    let mut ns = 0.0;
    while p.wqes() < u64::from(n_wqes) {
        if !p.burst(burst.min(n_wqes - p.wqes() as u32)) {
            panic!("a stepped device leaves no WQE behind");
        }
        let s = Instant::now();
        assert!(device_step(&hca) > 0);
        ns += s.elapsed().as_nanos() as f64;
        p.reap();
    }
    let c = hca.counters();
    assert_eq!(c.tx_frames, u64::from(n_wqes), "frames on the wire");
    assert_eq!(
        c.doorbells,
        u64::from(n_wqes.div_ceil(burst)),
        "doorbells taken"
    );
    println!(
        "step-burst{burst}: {n_wqes} WQEs, {} doorbells, Hca::step {:.1} ns per WQE \
         ({:.2} s in all)",
        c.doorbells,
        ns / f64::from(n_wqes),
        t.elapsed().as_secs_f64()
    );
}

/// `Hca::step`, kept out of line so that callgrind can collect it by name
/// (`--toggle-collect='*device_step*'`).
#[inline(never)]
fn device_step(hca: &Hca) -> usize {
    hca.step()
}

/// The device's work per doorbell as the polling lcore pays it in `device_loop=lcore`: after
/// each burst the burst glue runs the queue's runner, then the receive side's (before
/// `rx_burst`). Under callgrind (`--toggle-collect='*device_lcore*'`) the collected count
/// over `n_wqes` is what the lcore spends in the model per WQE at that burst.
fn lcore(burst: u32, n_wqes: u32) {
    let hca = Hca::open(HcaConfig {
        threaded: false,
        ..HcaConfig::default()
    })
    .expect("open the HCA");
    let mut p = Producer::new(&hca);
    let sq = hca.sq_runner(p.sq.info.qpn).expect("the SQ's runner");
    let rx = hca.rx_runner();
    while p.wqes() < u64::from(n_wqes) {
        if !p.burst(burst.min(n_wqes - p.wqes() as u32)) {
            panic!("a run device leaves no WQE behind");
        }
        assert!(device_lcore(&sq, &rx) > 0);
        p.reap();
    }
    let c = hca.counters();
    assert_eq!(c.tx_frames, u64::from(n_wqes), "frames on the wire");
    assert_eq!(
        c.doorbells,
        u64::from(n_wqes.div_ceil(burst)),
        "doorbells taken"
    );
    println!(
        "lcore-burst{burst}: {n_wqes} WQEs, {} doorbells",
        c.doorbells
    );
}

/// The runners of one burst, out of line for callgrind (`--toggle-collect='*device_lcore*'`).
#[inline(never)]
fn device_lcore(sq: &mlx4_hca::SqRunner, rx: &mlx4_hca::RxRunner) -> usize {
    sq.run() + rx.run()
}

struct Threaded {
    burst: u32,
    secs: f64,
    pin: bool,
    doorbell_ns: u32,
}

/// The thread of this process named `name` (its TID), found in /proc.
fn thread_named(name: &str) -> Option<i32> {
    std::fs::read_dir("/proc/self/task").ok()?.find_map(|e| {
        let e = e.ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim_end() == name)
            .then(|| e.file_name().to_str()?.parse().ok())
            .flatten()
    })
}

/// Nanoseconds thread `tid` of this process has run (schedstat's first field).
fn thread_cpu_ns(tid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn pin(tid: i32, cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity only read and
    // write the set we own.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) != 0 {
            eprintln!("pinning thread {tid} to CPU {cpu} failed");
        }
    }
}

/// `device_loop=port` at burst `cfg.burst`: the device on its own thread (spinning), this
/// thread posting for `cfg.secs` as fast as the ring allows. Prints WQEs per second, the
/// doorbells the device took per WQE (fewer than one per burst when doorbells merge), calls
/// on a full ring per WQE, and each thread's CPU time per WQE.
fn threaded(cfg: &Threaded) {
    let hca = Hca::open(HcaConfig {
        threaded: true,
        busy_poll: true,
        doorbell_ns: cfg.doorbell_ns,
        ..HcaConfig::default()
    })
    .expect("open the HCA");
    let mut p = Producer::new(&hca);
    hca.start().expect("start the device thread");
    // The thread names itself once it runs.
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    let dev = loop {
        match thread_named("mlx4-hca") {
            Some(t) => break t,
            None if Instant::now() < deadline => std::thread::yield_now(),
            None => panic!("no device thread"),
        }
    };
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    if cfg.pin {
        pin(me, 0);
        pin(dev, 1);
    }
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() < 0.2 {
        p.burst(cfg.burst);
    }
    let (w0, f0, d0) = (p.wqes(), p.full_calls, hca.counters().doorbells);
    let (dev0, me0) = (thread_cpu_ns(dev), thread_cpu_ns(me));
    let t = Instant::now();
    let mut calls = 0u64;
    while t.elapsed().as_secs_f64() < cfg.secs {
        for _ in 0..64 {
            p.burst(cfg.burst);
            calls += 1;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let (dev_ns, me_ns) = (thread_cpu_ns(dev) - dev0, thread_cpu_ns(me) - me0);
    let wqes = p.wqes() - w0;
    let full = p.full_calls - f0;
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    let mut c = hca.counters();
    while c.tx_frames != p.wqes() && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
        c = hca.counters();
    }
    assert_eq!(c.tx_frames, p.wqes(), "every WQE on the wire: {c:?}");
    let per = |v: u64| v as f64 / wqes as f64;
    println!(
        "port-burst{} (busy_poll, {}, doorbell_ns {}): {:.2} M WQEs/s; per WQE: {:.3} doorbells \
         taken, {:.2} calls on a full ring ({:.2} per call), device thread {:.1} ns CPU, \
         producer {:.1} ns CPU",
        cfg.burst,
        if cfg.pin {
            "pinned to CPUs 1 and 0"
        } else {
            "not pinned"
        },
        cfg.doorbell_ns,
        wqes as f64 / secs / 1e6,
        per(c.doorbells - d0),
        per(full),
        full as f64 / calls as f64,
        per(dev_ns),
        per(me_ns),
    );
    hca.stop();
}

/// `--only port-burstB` or `step-burstB`.
fn per_burst(o: &str, args: &[String]) {
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
    };
    let burst = |prefix: &str| o.strip_prefix(prefix).and_then(|b| b.parse::<u32>().ok());
    if let Some(b) = burst("port-burst") {
        let cfg = Threaded {
            burst: b,
            secs: flag("--secs").unwrap_or(3.0),
            pin: args.iter().any(|a| a == "--pin"),
            doorbell_ns: flag("--doorbell-ns").unwrap_or(0.0) as u32,
        };
        threaded(&cfg);
    } else if let Some(b) = burst("step-burst") {
        stepped(b, flag("--wqes").unwrap_or(30_720.0) as u32);
    } else if let Some(b) = burst("lcore-burst") {
        lcore(b, flag("--wqes").unwrap_or(30_720.0) as u32);
    }
}
