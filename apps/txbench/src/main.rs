//! txbench: the TX path of `net_mlx4rs` (BlueFlame with WC, BlueFlame without WC, doorbell)
//! swept over burst size, packet size and inline threshold, each point measured in alternating
//! turns with DPDK's `net_null` and `net_ring` in the same process, so that the noisy absolute
//! rates of a shared 2-core machine cancel in the ratios. The driver is linked as an rlib.

mod callgrind;
mod callgrind_eal;
mod callgrind_rx;
mod db_avoid;
mod opts;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;

use apps::eal::{self, FastPath, Mbufs, Pool};
use apps::model::{Model, PerPacket};
use apps::progress::{self, Progress};
use apps::report::{self, Series, Table};
use apps::stats::median;
use apps::Path;

use opts::{Mode, Point, Sweep, DEFAULT_INLINE};

fn main() {
    // Keeps the driver's registration constructor in the binary.
    let _ = mlx4rs::link();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = match opts::parse(args) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("txbench: {e}");
            std::process::exit(2);
        }
    };
    let rc = match mode {
        Mode::Help => {
            print!("{}", opts::USAGE);
            Ok(0)
        }
        Mode::Callgrind(c) => prefer_copy(c.copy).and_then(|_| {
            if c.mbufs {
                callgrind_eal::run(&c).map(|_| 0)
            } else if c.rx {
                callgrind_rx::run(&c).map(|_| 0)
            } else {
                callgrind::run(&c).map(|_| 0)
            }
        }),
        Mode::Sweep(s) => prefer_copy(s.copy).and_then(|_| sweep(&s)),
        Mode::DbAvoid(n) => db_avoid::run(n).map(|_| 0),
    };
    match rc {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("txbench: {e}");
            std::process::exit(1);
        }
    }
}

/// Makes the ports use `copy` for BlueFlame (before EAL probes them).
fn prefer_copy(copy: Option<mlx4rs::mmio::Copy64>) -> Result<(), String> {
    match copy {
        Some(c) => mlx4rs::mmio::Copy64::prefer(c),
        None => Ok(()),
    }
}

/// The copy routines this CPU offers, best first.
fn copies_offered() -> String {
    let v: Vec<&str> = mlx4rs::mmio::Copy64::ALL
        .into_iter()
        .filter(|c| c.available())
        .map(|c| c.key())
        .collect();
    v.join(", ")
}

/// The drivers measured at every point, in turn order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Drv {
    Mlx4rs,
    Null,
    Ring,
}

/// One driver's turn: what it took and what that cost.
#[derive(Debug, Default, Clone, Copy)]
struct Turn {
    sent: u64,
    /// TSC cycles inside tx_burst, the timer's own cost removed.
    tx_cycles: u64,
    wall_cycles: u64,
}

impl Turn {
    fn mpps(&self, hz: f64) -> f64 {
        self.sent as f64 / (self.wall_cycles as f64 / hz) / 1e6
    }
    fn cycles_per_pkt(&self) -> f64 {
        self.tx_cycles as f64 / self.sent.max(1) as f64
    }
}

/// Medians over rounds, per driver.
#[derive(Debug, Default, Clone, Copy)]
struct DrvResult {
    mpps: f64,
    cyc: f64,
}

#[derive(Debug, Clone)]
struct PointResult {
    p: Point,
    mlx: DrvResult,
    null: DrvResult,
    ring: DrvResult,
    /// Per packet, from xstats deltas over the mlx4rs turns.
    counts: PerPacket,
    hca_doorbells: f64,
    hca_bf_bursts: f64,
    wqe_from_bf: f64,
    inline_frac: f64,
    /// Doorbells rung again for WQEs that made no progress (a device thread the scheduler
    /// held off long enough looks like a lost doorbell): part of `counts.doorbells`.
    rerings: f64,
    rounds: usize,
}

/// The counters read around each mlx4rs turn.
const XSTATS: &[&str] = &[
    "tx_doorbells",
    "tx_doorbell_rerings",
    "tx_bf_writes",
    "tx_inline_packets",
    "tx_gather_packets",
    "hca_doorbells",
    "hca_bf_bursts",
    "hca_bf_pieces",
    "hca_wqe_fetched",
    "hca_wqe_from_bf",
    "hca_tx_frames",
];

fn xs(port: u16) -> HashMap<String, u64> {
    eal::xstats(port)
        .into_iter()
        .filter(|(k, _)| XSTATS.contains(&k.as_str()))
        .collect()
}

/// A frame header: broadcast Ethernet, local experimental EtherType, a recognisable pattern.
pub(crate) fn header() -> [u8; 64] {
    let mut h = [0u8; 64];
    h[..6].copy_from_slice(&[0xff; 6]);
    h[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    h[12..14].copy_from_slice(&[0x88, 0xb5]);
    for (i, b) in h[14..].iter_mut().enumerate() {
        *b = i as u8;
    }
    h
}

/// TSC cycles two back-to-back reads cost: taken off every timed call.
fn timer_overhead() -> u64 {
    let mut v: Vec<f64> = (0..2001)
        .map(|_| {
            let a = eal::rdtsc();
            let b = eal::rdtsc();
            b.wrapping_sub(a) as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[1000] as u64
}

struct Bench {
    pool: Pool,
    hz: f64,
    overhead: u64,
    hdr: [u8; 64],
}

impl Bench {
    /// Sends bursts of `size`-byte packets for `dur` TSC cycles. Packets a driver refuses are
    /// dropped (as testpmd's txonly does); `drain` empties a ring port's receive side so that
    /// the ring never stays full.
    fn turn(&self, fp: FastPath, drain: Option<FastPath>, burst: u16, size: u16, dur: u64) -> Turn {
        let mut t = Turn::default();
        let mut m = Mbufs::default();
        let mut rx = Mbufs::default();
        let start = eal::rdtsc();
        loop {
            if m.alloc(self.pool, usize::from(burst)) {
                m.prepare(&self.hdr, size);
                let (k, c) = fp.tx_timed(&mut m);
                t.sent += k as u64;
                t.tx_cycles += c.saturating_sub(self.overhead);
                m.free_all();
            }
            if let Some(d) = drain {
                while d.rx(&mut rx) > 0 {
                    rx.free_all();
                }
            }
            let now = eal::rdtsc();
            if now.wrapping_sub(start) >= dur {
                t.wall_cycles = now.wrapping_sub(start);
                return t;
            }
        }
    }
}

fn sweep(s: &Sweep) -> Result<i32, String> {
    progress::install_interrupt();
    let t_start = Instant::now();
    let inlines = s.port_inlines();
    let mut vdevs = Vec::new();
    let mut mlx_names = HashMap::new();
    for &path in &s.paths {
        for &inline in &inlines {
            let name = format!("net_mlx4rs{}", vdevs.len());
            vdevs.push(format!(
                // The device on a thread of its own: cycles in tx_burst are the driver's.
                "{name},wire=null,{},txq_inline={inline},busy_poll={},device_loop=port",
                path.devargs(),
                u8::from(s.busy_poll)
            ));
            mlx_names.insert((path, inline), name);
        }
    }
    vdevs.push("net_null0".into());
    vdevs.push("net_ring0".into());
    let mut eal_args = apps::eal::base_args("txbench");
    eal_args.extend(s.eal.iter().cloned());
    for v in &vdevs {
        eal_args.push("--vdev".into());
        eal_args.push(v.clone());
    }
    eal::init("txbench", &eal_args)?;
    let res = run_sweep(s, &mlx_names, t_start);
    eal::shutdown();
    res
}

fn run_sweep(
    s: &Sweep,
    mlx_names: &HashMap<(Path, u16), String>,
    t_start: Instant,
) -> Result<i32, String> {
    let pool = Pool::create("txbench_pool", 16383)?;
    let mut mlx_ports = HashMap::new();
    for (k, name) in mlx_names {
        let port = eal::port_by_name(name)?;
        // A large inline threshold makes every WQE up to 16 TXBBs, and the device caps the
        // ring: fewer descriptors then.
        let first = if k.1 > 256 { 512 } else { 1024 };
        let mut res = Err(String::new());
        for nb_desc in [first, first / 2, 256] {
            res = eal::setup_port(port, pool, nb_desc);
            if res.is_ok() {
                break;
            }
        }
        res?;
        mlx_ports.insert(*k, port);
    }
    let null = eal::port_by_name("net_null0")?;
    let ring = eal::port_by_name("net_ring0")?;
    for p in [null, ring] {
        eal::setup_port(p, pool, 1024)?;
        eal::start(p)?;
    }
    let (fp_null, fp_ring) = (FastPath::of(null)?, FastPath::of(ring)?);
    let hz = eal::tsc_hz() as f64;
    let bench = Bench {
        pool,
        hz,
        overhead: timer_overhead(),
        hdr: header(),
    };
    let dur = (hz * s.slice_ms as f64 / 1e3) as u64;
    let model = Model::mlx4rs();
    let points = s.points();
    let mut prog = Progress::new(points.len(), s.quiet);
    let mut results: Vec<PointResult> = Vec::new();
    eprintln!(
        "txbench: BlueFlame copy {} (offered: {})",
        mlx4rs::mmio::Copy64::best().name(),
        copies_offered()
    );
    eprintln!(
        "txbench: {} points x {} rounds x 3 drivers x {} ms; TSC {:.3} GHz, timer overhead {} cycles",
        points.len(),
        s.rounds,
        s.slice_ms,
        hz / 1e9,
        bench.overhead
    );
    for p in &points {
        if progress::interrupted() {
            break;
        }
        let port = mlx_ports[&(p.path, p.inline)];
        eal::start(port)?;
        let fp = FastPath::of(port)?;
        // Warm-up: caches, the pool's per-lcore cache, the device thread's first wake-up.
        for (f, d) in [(fp, None), (fp_null, None), (fp_ring, Some(fp_ring))] {
            eal::on_worker(|| bench.turn(f, d, p.burst, p.size, dur / 4));
        }
        let mut per: HashMap<Drv, Vec<Turn>> = HashMap::new();
        let mut delta: HashMap<String, u64> = HashMap::new();
        let mut mlx_sent = 0u64;
        for _ in 0..s.rounds {
            if progress::interrupted() {
                break;
            }
            for d in [Drv::Mlx4rs, Drv::Null, Drv::Ring] {
                let t = match d {
                    Drv::Mlx4rs => {
                        let x0 = xs(port);
                        let t = eal::on_worker(|| bench.turn(fp, None, p.burst, p.size, dur));
                        // The device counts what it executes: let it catch up first.
                        let mut x1 = xs(port);
                        for _ in 0..200 {
                            if x1["hca_tx_frames"] - x0["hca_tx_frames"] >= t.sent {
                                break;
                            }
                            std::thread::sleep(std::time::Duration::from_millis(1));
                            x1 = xs(port);
                        }
                        for k in XSTATS {
                            *delta.entry(k.to_string()).or_default() += x1[*k] - x0[*k];
                        }
                        mlx_sent += t.sent;
                        t
                    }
                    Drv::Null => eal::on_worker(|| bench.turn(fp_null, None, p.burst, p.size, dur)),
                    Drv::Ring => {
                        eal::on_worker(|| bench.turn(fp_ring, Some(fp_ring), p.burst, p.size, dur))
                    }
                };
                per.entry(d).or_default().push(t);
            }
        }
        eal::stop(port);
        let rounds = per.get(&Drv::Ring).map_or(0, Vec::len);
        if rounds == 0 {
            break;
        }
        let med = |d: Drv| {
            let v = &per[&d];
            DrvResult {
                mpps: median(&v.iter().map(|t| t.mpps(hz)).collect::<Vec<_>>()).unwrap_or(0.0),
                cyc: median(&v.iter().map(Turn::cycles_per_pkt).collect::<Vec<_>>()).unwrap_or(0.0),
            }
        };
        let pp = |k: &str| delta.get(k).copied().unwrap_or(0) as f64 / mlx_sent.max(1) as f64;
        let r = PointResult {
            p: *p,
            mlx: med(Drv::Mlx4rs),
            null: med(Drv::Null),
            ring: med(Drv::Ring),
            counts: PerPacket {
                doorbells: pp("tx_doorbells"),
                bf_writes: pp("tx_bf_writes"),
                torn_pieces: pp("hca_bf_pieces"),
                wqe_fetches: pp("hca_wqe_fetched"),
                gathers: pp("tx_gather_packets"),
            },
            hca_doorbells: pp("hca_doorbells"),
            hca_bf_bursts: pp("hca_bf_bursts"),
            wqe_from_bf: pp("hca_wqe_from_bf"),
            inline_frac: pp("tx_inline_packets"),
            rerings: pp("tx_doorbell_rerings"),
            rounds,
        };
        prog.step(&format!(
            "{:<8} inline {:>3} burst {:>2} size {:>4}: {:6.2} Mpps {:6.1} cyc/pkt | null {:6.2} Mpps {:5.1} cyc | ring {:6.2} Mpps {:5.1} cyc | db/pkt {:.3} bf/pkt {:.3} | modeled {:.2} Mpps",
            p.path.name(),
            p.inline,
            p.burst,
            p.size,
            r.mlx.mpps,
            r.mlx.cyc,
            r.null.mpps,
            r.null.cyc,
            r.ring.mpps,
            r.ring.cyc,
            r.counts.doorbells,
            r.counts.bf_writes,
            model.mpps(&r.counts, usize::from(p.size)),
        ));
        results.push(r);
    }
    let interrupted = progress::interrupted();
    let md = write_report(s, &results, &model, &bench, interrupted, t_start)?;
    println!("{md}");
    Ok(if interrupted { 130 } else { 0 })
}

fn f2(x: f64) -> String {
    format!("{x:.2}")
}

fn main_table(results: &[PointResult], model: &Model) -> Table {
    let mut t = Table::new(&[
        "path",
        "inline",
        "burst",
        "size",
        "Mpps",
        "cyc/pkt",
        "null Mpps",
        "null cyc/pkt",
        "ring Mpps",
        "ring cyc/pkt",
        "cyc/pkt ÷ null",
        "Mpps ÷ null",
        "Mpps ÷ ring",
        "doorbells/pkt",
        "BF writes/pkt",
        "WQE fetches/pkt",
        "torn pieces/pkt",
        "modeled Mpps",
    ]);
    for r in results {
        t.row(vec![
            r.p.path.name().into(),
            r.p.inline.to_string(),
            r.p.burst.to_string(),
            r.p.size.to_string(),
            f2(r.mlx.mpps),
            format!("{:.1}", r.mlx.cyc),
            f2(r.null.mpps),
            format!("{:.1}", r.null.cyc),
            f2(r.ring.mpps),
            format!("{:.1}", r.ring.cyc),
            f2(r.mlx.cyc / r.null.cyc.max(0.01)),
            f2(r.mlx.mpps / r.null.mpps.max(1e-9)),
            f2(r.mlx.mpps / r.ring.mpps.max(1e-9)),
            format!("{:.3}", r.counts.doorbells),
            format!("{:.3}", r.counts.bf_writes),
            format!("{:.3}", r.counts.wqe_fetches),
            format!("{:.2}", r.counts.torn_pieces),
            f2(model.mpps(&r.counts, usize::from(r.p.size))),
        ]);
    }
    t
}

fn write_report(
    s: &Sweep,
    results: &[PointResult],
    model: &Model,
    bench: &Bench,
    interrupted: bool,
    t_start: Instant,
) -> Result<String, String> {
    std::fs::create_dir_all(&s.out).map_err(|e| format!("{}: {e}", s.out.display()))?;
    let mut md = String::new();
    let _ = writeln!(md, "## TX throughput and service demand (txbench)\n");
    if interrupted {
        let _ = writeln!(md, "**Interrupted: partial results.**\n");
    }
    let _ = writeln!(
        md,
        "Machine: {}. TSC {:.3} GHz. {} points, {} rounds of {} ms turns per driver, alternating \
         net_mlx4rs / net_null / net_ring in one process; medians over rounds; {:.0} s in all.\n\
         Each started net_mlx4rs port runs its software HCA on a thread of its own that competes \
         with the benchmark for the 2 cores, so Mpps measure the machine as much as the driver; \
         cycles per packet count only the time inside `tx_burst` (TSC around each call, timer \
         cost of {} cycles removed). Counts per packet come from xstats deltas. \
         **Modeled** columns come from the bus cost model below, not from a measurement.\n",
        report::machine(),
        bench.hz / 1e9,
        results.len(),
        s.rounds,
        s.slice_ms,
        t_start.elapsed().as_secs_f64(),
        bench.overhead
    );
    let _ = writeln!(
        md,
        "BlueFlame copy routine: **{}** (`--copy`; this CPU offers: {}).\n",
        mlx4rs::mmio::Copy64::best().name(),
        copies_offered()
    );
    let (main, other): (Vec<PointResult>, Vec<PointResult>) = results
        .iter()
        .cloned()
        .partition(|r| r.p.inline == DEFAULT_INLINE);
    let _ = writeln!(
        md,
        "### Default inline threshold ({DEFAULT_INLINE} bytes)\n"
    );
    md += &main_table(&main, model).markdown();
    if !other.is_empty() {
        let _ = writeln!(
            md,
            "\n### Other inline thresholds (burst {})\n",
            s.inline_burst
        );
        md += &main_table(&other, model).markdown();
    }
    let _ = writeln!(md, "\n### Bus cost model (modeled, parameters)\n");
    md += &model.describe();
    let mut csv = String::from(
        "path,inline,burst,size,mpps,cyc_per_pkt,null_mpps,null_cyc,ring_mpps,ring_cyc,doorbells_pp,bf_writes_pp,wqe_fetches_pp,torn_pieces_pp,gathers_pp,hca_doorbells_pp,hca_bf_bursts_pp,wqe_from_bf_pp,inline_frac,rounds,modeled_mpps,doorbell_rerings_pp\n",
    );
    for r in results {
        let c = &r.counts;
        let _ = writeln!(
            csv,
            "{},{},{},{},{:.4},{:.2},{:.4},{:.2},{:.4},{:.2},{:.4},{:.4},{:.4},{:.3},{:.4},{:.4},{:.4},{:.4},{:.3},{},{:.4},{:.4}",
            r.p.path.name(),
            r.p.inline,
            r.p.burst,
            r.p.size,
            r.mlx.mpps,
            r.mlx.cyc,
            r.null.mpps,
            r.null.cyc,
            r.ring.mpps,
            r.ring.cyc,
            c.doorbells,
            c.bf_writes,
            c.wqe_fetches,
            c.torn_pieces,
            c.gathers,
            r.hca_doorbells,
            r.hca_bf_bursts,
            r.wqe_from_bf,
            r.inline_frac,
            r.rounds,
            model.mpps(c, usize::from(r.p.size)),
            r.rerings
        );
    }
    let csv_path = s.out.join("txbench.csv");
    std::fs::write(&csv_path, csv).map_err(|e| format!("{}: {e}", csv_path.display()))?;
    if s.plots && !main.is_empty() {
        md += "\n";
        md += &plots(s, &main, model);
    }
    let md_path = s.out.join("txbench.md");
    std::fs::write(&md_path, &md).map_err(|e| format!("{}: {e}", md_path.display()))?;
    eprintln!(
        "txbench: report in {} (txbench.md, txbench.csv, PNGs)",
        s.out.display()
    );
    Ok(md)
}

/// The two plots; returns the Markdown that shows them (or says why not).
fn plots(s: &Sweep, main: &[PointResult], model: &Model) -> String {
    let mut md = String::new();
    let size0 = s.sizes[0];
    let burst_c = if s.bursts.contains(&32) {
        32
    } else {
        *s.bursts.iter().max().unwrap_or(&32)
    };
    // A baseline driver's value at (burst, size): median over the paths' turns.
    let base = |sel: fn(&PointResult) -> f64, burst: u16, size: u16| {
        let v: Vec<f64> = main
            .iter()
            .filter(|r| r.p.burst == burst && r.p.size == size)
            .map(sel)
            .collect();
        median(&v)
    };
    let mut series = Vec::new();
    let mut cyc_series = Vec::new();
    for &path in &s.paths {
        let of = |f: &dyn Fn(&PointResult) -> Option<(f64, f64)>| -> Vec<(f64, f64)> {
            main.iter()
                .filter(|r| r.p.path == path)
                .filter_map(f)
                .collect()
        };
        series.push(Series {
            name: format!("{} (measured)", path.label()),
            points: of(&|r| (r.p.size == size0).then_some((f64::from(r.p.burst), r.mlx.mpps))),
            modeled: false,
        });
        series.push(Series {
            name: format!("{} (modeled)", path.label()),
            points: of(&|r| {
                (r.p.size == size0).then_some((
                    f64::from(r.p.burst),
                    model.mpps(&r.counts, usize::from(r.p.size)),
                ))
            }),
            modeled: true,
        });
        cyc_series.push(Series {
            name: path.label().into(),
            points: of(&|r| (r.p.burst == burst_c).then_some((f64::from(r.p.size), r.mlx.cyc))),
            modeled: false,
        });
    }
    for (name, sel) in [
        (
            "net_null",
            (|r: &PointResult| r.null.mpps) as fn(&PointResult) -> f64,
        ),
        ("net_ring", |r: &PointResult| r.ring.mpps),
    ] {
        series.push(Series {
            name: name.into(),
            points: s
                .bursts
                .iter()
                .filter_map(|&b| base(sel, b, size0).map(|y| (f64::from(b), y)))
                .collect(),
            modeled: false,
        });
    }
    for (name, sel) in [
        (
            "net_null",
            (|r: &PointResult| r.null.cyc) as fn(&PointResult) -> f64,
        ),
        ("net_ring", |r: &PointResult| r.ring.cyc),
    ] {
        cyc_series.push(Series {
            name: name.into(),
            points: s
                .sizes
                .iter()
                .filter_map(|&z| base(sel, burst_c, z).map(|y| (f64::from(z), y)))
                .collect(),
            modeled: false,
        });
    }
    series.retain(|s| !s.points.is_empty());
    cyc_series.retain(|s| !s.points.is_empty());
    let mut out = |file: &str, title: &str, xl: &str, yl: &str, ser: &[Series], log: bool| {
        match report::line_plot(&s.out.join(file), title, xl, yl, ser, log) {
            Ok(()) => {
                let _ = writeln!(md, "![{title}]({file})\n");
            }
            Err(e) => {
                let _ = writeln!(md, "(plot {file} not drawn: {e})\n");
            }
        }
    };
    out(
        "txbench_mpps_vs_burst.png",
        &format!("Mpps vs burst size, {size0}-byte packets, inline {DEFAULT_INLINE} (software HCA; modeled lines thin)"),
        "burst size",
        "Mpps",
        &series,
        true,
    );
    out(
        "txbench_cycles_vs_size.png",
        &format!("TSC cycles per packet in tx_burst vs packet size, burst {burst_c}"),
        "packet size (bytes)",
        "cycles per packet",
        &cyc_series,
        false,
    );
    md
}
