//! What the device loop costs per WQE, on each wire: the figure that says whether end-to-end runs
//! measure the driver or the model (target: 10 ns for a 64-byte inline WQE on the null wire).
//!
//! `cargo bench -p mlx4-hca --bench device [-- --rounds N --quick]`
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
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
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
