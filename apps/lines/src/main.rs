//! Cross-core cost of the lines the polling lcore shares:
//! two threads pinned to two cores, TSC cycles per operation on the measured side, median of
//! `--trials` runs, each layout or access order against its alternative.
//!
//! - `cqe`: the device thread writes 32-byte CQEs, owner byte last, into a ring of 256; the
//!   lcore polls the owner byte, reads the entry and publishes its consumer index once per 32.
//!   `each` writes a CQE as soon as it is due (what `hca::cq::Cq::push` does); `line` writes the
//!   two CQEs of a 64-byte line together, bodies then owner bytes. Cycles per CQE, lcore side.
//! - `sq`: the lcore writes 64-byte WQEs, owner word last, into a ring of 256 TXBBs; the device
//!   thread polls the owner word, reads the WQE and publishes its consumer count once per 32.
//!   `write-first` writes the slot without reading it (what `txq` does); `read-then-write`
//!   loads the slot's first word before writing it; `prefetchw-ahead` writes blind as
//!   `write-first` does and asks for ownership of the slot 16 ahead (a free one) with
//!   `prefetchw`, so that the ownership request overlaps the writes. Cycles per WQE, lcore side.
//! - `counters`: the lcore adds to four u64 counters per packet while the device thread adds
//!   to its own four. `split` keeps each side's on a line of its own; `mixed` puts all eight
//!   on one line. Cycles per packet, lcore side. `telemetry` is `split` with a third party
//!   (the other core's thread) reading the lcore's counters in a loop instead of counting.
//!
//! Usage: lines [--trials N] [--ops N] [--cpus A,B]   (default 5, 2000000, 0,1)

use std::arch::x86_64::_rdtsc;
use std::hint::spin_loop;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::*};
use std::sync::Arc;

const RING: usize = 256;

#[repr(C, align(64))]
#[derive(Default)]
struct Line<T>(T);

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the calls only read it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            panic!("lines: cannot pin a thread to CPU {cpu}");
        }
    }
}

fn tsc() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86_64.
    unsafe { _rdtsc() }
}

/// Runs `lcore` on cpus.0 and `other` on cpus.1, both started together; returns the lcore's
/// TSC cycles.
fn pair<A, B>(cpus: (usize, usize), lcore: A, other: B) -> u64
where
    A: FnOnce() + Send + 'static,
    B: FnOnce() + Send + 'static,
{
    let go = Arc::new(AtomicU32::new(0));
    let g = go.clone();
    let t = std::thread::spawn(move || {
        pin(cpus.1);
        g.fetch_add(1, SeqCst);
        while g.load(SeqCst) < 2 {
            spin_loop();
        }
        other();
    });
    pin(cpus.0);
    while go.load(SeqCst) < 1 {
        spin_loop();
    }
    go.fetch_add(1, SeqCst);
    let t0 = tsc();
    lcore();
    let dt = tsc() - t0;
    t.join().expect("the other thread");
    dt
}

/// CQE ring: 32-byte entries, owner byte at 31, as 64-byte lines of two.
struct CqeRing {
    lines: Vec<Line<[AtomicU64; 8]>>,
    ci: Line<AtomicU32>,
}

impl CqeRing {
    fn new() -> CqeRing {
        CqeRing {
            lines: (0..RING / 2).map(|_| Line(Default::default())).collect(),
            ci: Line(AtomicU32::new(0)),
        }
    }
    fn owner(&self, i: usize) -> &AtomicU8 {
        let q = &self.lines[(i % RING) / 2].0[(i % 2) * 4 + 3];
        // SAFETY: byte 7 of an aligned AtomicU64 is byte 31 of the CQE; both accesses are atomic.
        unsafe { AtomicU8::from_ptr((q.as_ptr() as *mut u8).add(7)) }
    }
    fn body(&self, i: usize, v: u64) {
        let l = &self.lines[(i % RING) / 2].0;
        let b = (i % 2) * 4;
        for q in &l[b..b + 3] {
            q.store(v, Relaxed);
        }
    }
    fn read(&self, i: usize) -> u64 {
        let l = &self.lines[(i % RING) / 2].0;
        l[(i % 2) * 4].load(Relaxed)
    }
}

fn cqe(cpus: (usize, usize), ops: usize, whole_line: bool) -> f64 {
    let r = Arc::new(CqeRing::new());
    for i in 0..RING {
        r.owner(i).store(1, Relaxed);
    }
    let p = r.clone();
    let dt = pair(
        cpus,
        {
            let r = r.clone();
            move || {
                let mut sum = 0u64;
                for i in 0..ops {
                    let pass = ((i / RING) & 1) as u8;
                    while r.owner(i).load(Acquire) != pass {
                        spin_loop();
                    }
                    sum = sum.wrapping_add(r.read(i));
                    if i % 32 == 31 {
                        r.ci.0.store(i as u32 + 1, Release);
                    }
                }
                std::hint::black_box(sum);
            }
        },
        move || {
            let mut credit = 0usize;
            let mut i = 0usize;
            while i < ops {
                // The consumer index, read once per batch of credit (as CqCredit).
                if credit < 2 {
                    loop {
                        let ci = p.ci.0.load(Acquire) as usize;
                        credit = RING - (i - ci);
                        if credit >= 2 {
                            break;
                        }
                        spin_loop();
                    }
                }
                let k = if whole_line { 2 } else { 1 };
                for j in i..i + k {
                    p.body(j, j as u64);
                }
                for j in i..i + k {
                    p.owner(j).store(((j / RING) & 1) as u8, Release);
                }
                i += k;
                credit -= k;
            }
        },
    );
    dt as f64 / ops as f64
}

/// How the lcore comes to own a slot it writes.
#[derive(Clone, Copy, PartialEq)]
enum SqOrder {
    WriteFirst,
    ReadThenWrite,
    PrefetchAhead,
}

/// How far ahead `SqOrder::PrefetchAhead` asks for a slot.
const AHEAD: usize = 16;

/// Ask for the line at `p` in a state that can be written (x86 `prefetchw`, a no-op on CPUs
/// without it); a hint, it changes no memory.
fn prefetch_write<T>(p: &T) {
    // SAFETY: prefetchw reads no data and writes none; a prefetch of any address is harmless.
    unsafe {
        std::arch::asm!("prefetchw [{}]", in(reg) p, options(nostack, preserves_flags, readonly))
    };
}

fn sq(cpus: (usize, usize), ops: usize, order: SqOrder) -> f64 {
    let ring: Arc<Vec<Line<[AtomicU64; 8]>>> =
        Arc::new((0..RING).map(|_| Line(Default::default())).collect());
    for l in ring.iter() {
        l.0[0].store(u64::MAX, Relaxed);
    }
    let cons = Arc::new(Line(AtomicU32::new(0)));
    let (d, c) = (ring.clone(), cons.clone());
    let dt = pair(
        cpus,
        move || {
            let mut seen = 0usize;
            let mut junk = 0u64;
            for i in 0..ops {
                while i - seen >= RING - 32 {
                    seen = cons.0.load(Acquire) as usize;
                    spin_loop();
                }
                let l = &ring[i % RING].0;
                match order {
                    SqOrder::ReadThenWrite => junk = junk.wrapping_add(l[0].load(Relaxed)),
                    // Only a slot the device is done with: within the room it published.
                    SqOrder::PrefetchAhead if i + AHEAD - seen < RING - 32 => {
                        prefetch_write(&ring[(i + AHEAD) % RING].0)
                    }
                    _ => {}
                }
                for q in &l[1..] {
                    q.store(i as u64, Relaxed);
                }
                l[0].store(((i / RING) & 1) as u64, Release);
            }
            std::hint::black_box(junk);
        },
        move || {
            let mut sum = 0u64;
            for i in 0..ops {
                let l = &d[i % RING].0;
                while l[0].load(Acquire) != ((i / RING) & 1) as u64 {
                    spin_loop();
                }
                for q in &l[1..] {
                    sum = sum.wrapping_add(q.load(Relaxed));
                }
                if i % 32 == 31 {
                    c.0.store(i as u32 + 1, Release);
                }
            }
            std::hint::black_box(sum);
        },
    );
    dt as f64 / ops as f64
}

#[derive(Clone, Copy, PartialEq)]
enum Counters {
    Split,
    Mixed,
    Telemetry,
}

fn counters(cpus: (usize, usize), ops: usize, how: Counters) -> f64 {
    // Two lines; in `mixed` both sides count on the first.
    let lines: Arc<[Line<[AtomicU64; 8]>; 2]> = Arc::new(Default::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (l2, s2) = (lines.clone(), stop.clone());
    let dt = pair(
        cpus,
        {
            let (lines, stop) = (lines.clone(), stop.clone());
            move || {
                let mine = &lines[0].0[..4];
                for i in 0..ops as u64 {
                    // Relaxed load and store: one writer, readers elsewhere (stats.rs's rule).
                    for (k, c) in mine.iter().enumerate() {
                        c.store(c.load(Relaxed) + i + k as u64, Relaxed);
                    }
                }
                stop.store(true, Release);
            }
        },
        move || {
            let mut sum = 0u64;
            while !s2.load(Acquire) {
                match how {
                    Counters::Telemetry => {
                        for c in &l2[0].0[..4] {
                            sum = sum.wrapping_add(c.load(Relaxed));
                        }
                    }
                    _ => {
                        let theirs = if how == Counters::Mixed {
                            &l2[0].0[4..]
                        } else {
                            &l2[1].0[..4]
                        };
                        for c in theirs {
                            c.store(c.load(Relaxed) + 1, Relaxed);
                        }
                    }
                }
            }
            std::hint::black_box(sum);
        },
    );
    dt as f64 / ops as f64
}

/// A row: the line, the layout or order, and one trial of it.
type Case = (&'static str, &'static str, Box<dyn Fn() -> f64>);

fn median(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    (v[v.len() / 2], v[0])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .map(|i| args[i + 1].clone())
    };
    let trials: usize = arg("--trials").map_or(5, |v| v.parse().expect("--trials N"));
    let ops: usize = arg("--ops").map_or(2_000_000, |v| v.parse().expect("--ops N"));
    let cpus = arg("--cpus").map_or((0, 1), |v| {
        let (a, b) = v.split_once(',').expect("--cpus A,B");
        (a.parse().expect("cpu"), b.parse().expect("cpu"))
    });
    let cases: [Case; 8] = [
        (
            "cqe",
            "each (ours)",
            Box::new(move || cqe(cpus, ops, false)),
        ),
        ("cqe", "line", Box::new(move || cqe(cpus, ops, true))),
        (
            "sq",
            "write-first (ours)",
            Box::new(move || sq(cpus, ops, SqOrder::WriteFirst)),
        ),
        (
            "sq",
            "read-then-write",
            Box::new(move || sq(cpus, ops, SqOrder::ReadThenWrite)),
        ),
        (
            "sq",
            "prefetchw-ahead",
            Box::new(move || sq(cpus, ops, SqOrder::PrefetchAhead)),
        ),
        (
            "counters",
            "split",
            Box::new(move || counters(cpus, ops, Counters::Split)),
        ),
        (
            "counters",
            "mixed",
            Box::new(move || counters(cpus, ops, Counters::Mixed)),
        ),
        (
            "counters",
            "telemetry reader",
            Box::new(move || counters(cpus, ops, Counters::Telemetry)),
        ),
    ];
    println!(
        "| line | layout / order | TSC cycles per op, lcore side (median / min of {trials}) |"
    );
    println!("|---|---|---|");
    for (line, how, f) in &cases {
        let (med, min) = median((0..trials).map(|_| f()).collect());
        println!("| {line} | {how} | {med:.1} / {min:.1} |");
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "\nCPUs {}/{}, {ops} ops per trial, load average {}",
        cpus.0,
        cpus.1,
        load.trim()
    );
}
