//! latency: ping-pong with one packet per burst over a looped `net_mlx4rs` wire, per TX path
//! and message size, in the shape of `ib_write_lat`'s table, beside the bus cost model's
//! figure for the same per-packet counts; or a stream at burst 1 with each packet's TX-to-RX
//! latency ([`stream`]). The driver is linked as an rlib.

mod opts;
mod stream;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;

use apps::eal::{self, FastPath, Mbufs, Pool};
use apps::model::{Model, PerPacket};
use apps::progress::{self, Progress};
use apps::report::{self, Series, Table};
use apps::stats::{summarize, LatSummary};
use apps::Path;

use opts::{Mode, Opts, Wire};

/// Exit status when nothing came back: the receive path is missing or broken.
const NO_RX: i32 = 3;

fn main() {
    // Keeps the driver's registration constructor in the binary.
    let _ = mlx4rs::link();
    let rc = match opts::parse(std::env::args().skip(1)) {
        Ok(Mode::Help) => {
            print!("{}", opts::USAGE);
            Ok(0)
        }
        Ok(Mode::Run(o)) => run(&o),
        Err(e) => {
            eprintln!("latency: {e}");
            std::process::exit(2);
        }
    };
    match rc {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("latency: {e}");
            std::process::exit(1);
        }
    }
}

/// One size on one path.
struct Row {
    path: Path,
    size: u16,
    lat: Option<LatSummary>,
    lost: u32,
    counts: PerPacket,
    avoid: AvoidCounts,
    frame: usize,
}

/// Per transmitted packet: what doorbell avoidance did, and the completions it asked for.
#[derive(Clone, Copy, Default)]
struct AvoidCounts {
    avoided: f64,
    completions: f64,
    rerings: f64,
}

/// One stream on one path.
struct StreamRow {
    path: Path,
    size: u16,
    s: stream::Stream,
    lat: Option<LatSummary>,
    counts: PerPacket,
    avoid: AvoidCounts,
}

/// A frame of `size` message bytes: broadcast Ethernet header, local experimental EtherType,
/// then the message, whose first bytes carry the sequence number (as many as fit). Padded to
/// the 60-byte Ethernet minimum, as a NIC pads on the wire.
fn frame(size: u16, seq: u64, buf: &mut Vec<u8>) {
    buf.clear();
    buf.extend_from_slice(&[0xff; 6]);
    buf.extend_from_slice(&[0x02, 0, 0, 0, 0, 2]);
    buf.extend_from_slice(&[0x88, 0xb5]);
    let s = seq.to_le_bytes();
    buf.extend((0..usize::from(size)).map(|i| s.get(i).copied().unwrap_or(i as u8)));
    if buf.len() < 60 {
        buf.resize(60, 0);
    }
}

/// What one size measured on the worker.
#[derive(Default)]
struct Samples {
    us: Vec<f64>,
    lost: u32,
    /// A frame came back that was not the one sent.
    wrong: u32,
}

/// Polls `fp` until a packet arrives or `deadline` (TSC) passes; returns the arrival time.
#[inline(always)]
fn wait_rx(fp: FastPath, rx: &mut Mbufs, deadline: u64) -> Option<u64> {
    loop {
        let got = fp.rx(rx);
        let t = eal::rdtsc();
        if got > 0 {
            return Some(t);
        }
        if t >= deadline {
            return None;
        }
    }
}

/// Offers `m` until the driver takes it or `deadline` passes.
#[inline(always)]
fn send(fp: FastPath, m: &mut Mbufs, deadline: u64) -> bool {
    loop {
        if fp.tx_timed(m).0 > 0 && m.is_empty() {
            return true;
        }
        if eal::rdtsc() >= deadline {
            return false;
        }
    }
}

/// `a` pings; over a peer cable `b` sends each packet straight back to `a`.
fn ping(a: FastPath, b: Option<FastPath>, pool: Pool, o: &Opts, size: u16, hz: f64) -> Samples {
    let mut s = Samples::default();
    let mut tx = Mbufs::default();
    let mut rx = Mbufs::default();
    let mut buf = Vec::with_capacity(1100);
    let timeout = (hz * o.timeout_ms as f64 / 1e3) as u64;
    let passes = if b.is_some() { 2.0 } else { 1.0 };
    for i in 0..u64::from(o.warmup + o.iters) {
        if progress::interrupted() {
            break;
        }
        frame(size, i, &mut buf);
        if !tx.alloc(pool, 1) {
            s.lost += 1;
            continue;
        }
        tx.fill(&buf);
        let t0 = eal::rdtsc();
        let deadline = t0 + timeout;
        let mut back = send(a, &mut tx, deadline).then_some(t0);
        if let (Some(_), Some(b)) = (back, b) {
            back = wait_rx(b, &mut rx, deadline)
                .filter(|_| rx.len() == 1 && send(b, &mut rx, deadline))
                .map(|_| t0);
            // Whatever the echo side could not send goes back to the pool.
            rx.free_all();
        }
        let t1 = back.and_then(|_| wait_rx(a, &mut rx, deadline));
        let Some(t1) = t1 else {
            s.lost += 1;
            rx.free_all();
            // Ten timeouts before any packet came back: the path does not receive at all;
            // waiting out every remaining timeout would only delay saying so.
            if s.lost >= 10 && u64::from(s.lost) == i + 1 {
                break;
            }
            continue;
        };
        // Anything but our frame (a late one after a timeout) does not make a sample.
        let ok = rx.len() == 1 && rx.data(0) == buf.as_slice();
        rx.free_all();
        if !ok {
            s.wrong += 1;
            continue;
        }
        if i >= u64::from(o.warmup) {
            s.us.push(t1.wrapping_sub(t0) as f64 / hz * 1e6 / passes);
        }
    }
    s
}

const XSTATS: &[&str] = &[
    "tx_doorbells",
    "tx_bf_writes",
    "tx_gather_packets",
    "hca_bf_pieces",
    "hca_wqe_fetched",
    "tx_good_packets",
    "tx_doorbells_avoided",
    "tx_completions",
    "tx_doorbell_rerings",
];

fn xs(port: u16) -> HashMap<String, u64> {
    eal::xstats(port)
        .into_iter()
        .filter(|(k, _)| XSTATS.contains(&k.as_str()))
        .collect()
}

fn run(o: &Opts) -> Result<i32, String> {
    progress::install_interrupt();
    let t_start = Instant::now();
    let mut eal_args = apps::eal::base_args("latency");
    eal_args.extend(o.eal.iter().cloned());
    for (i, p) in o.paths.iter().enumerate() {
        for (name, wire) in port_names(o.wire, i) {
            eal_args.push("--vdev".into());
            eal_args.push(format!(
                "{name},{wire},busy_poll={},device_loop={},doorbell_ns={},tx_db_avoid={},{}",
                u8::from(o.busy_poll),
                o.device_loop.name(),
                o.doorbell_ns,
                u8::from(o.db_avoid),
                p.devargs()
            ));
        }
    }
    eal::init("latency", &eal_args)?;
    let res = measure(o, t_start);
    eal::shutdown();
    res
}

/// The ports of path number `i` and their wire devargs: the pinging port first.
fn port_names(wire: Wire, i: usize) -> Vec<(String, String)> {
    match wire {
        Wire::Loop => vec![(format!("net_mlx4rs{i}"), "wire=loop".into())],
        Wire::Peer => {
            let (a, b) = (
                format!("net_mlx4rs{}", 2 * i),
                format!("net_mlx4rs{}", 2 * i + 1),
            );
            vec![
                (a.clone(), format!("wire=peer:{b}")),
                (b, format!("wire=peer:{a}")),
            ]
        }
    }
}

fn measure(o: &Opts, t_start: Instant) -> Result<i32, String> {
    let pool = Pool::create("latency_pool", 8191)?;
    let hz = eal::tsc_hz() as f64;
    let model = Model::mlx4rs();
    let mut prog = Progress::new(o.paths.len() * o.sizes.len(), o.quiet);
    let mut rows = Vec::new();
    let mut srows = Vec::new();
    let mut no_rx = false;
    'paths: for (i, &path) in o.paths.iter().enumerate() {
        let mut ports = Vec::new();
        for (name, _) in port_names(o.wire, i) {
            let port = eal::port_by_name(&name)?;
            eal::setup_port(port, pool, 512)?;
            eal::start(port)?;
            ports.push(port);
        }
        let stop_all = |ports: &[u16]| ports.iter().for_each(|&p| eal::stop(p));
        let fa = FastPath::of(ports[0])?;
        let fb = match ports.get(1) {
            Some(&p) => Some(FastPath::of(p)?),
            None => None,
        };
        for &size in &o.sizes {
            if progress::interrupted() {
                stop_all(&ports);
                break 'paths;
            }
            let x0: Vec<_> = ports.iter().map(|&p| xs(p)).collect();
            if o.stream {
                let s = eal::on_worker(|| stream::stream(fa, pool, o, size, hz));
                let x1: Vec<_> = ports.iter().map(|&p| xs(p)).collect();
                let (counts, avoid) = per_packet(&x0, &x1);
                let row = StreamRow {
                    path,
                    size,
                    lat: summarize(&s.us),
                    s,
                    counts,
                    avoid,
                };
                prog.step(&match &row.lat {
                    Some(l) => format!(
                        "{:<8} {:>4} B stream: median {:.2} p99 {:.2} us, {:.3} Mpps, lost {}, avoided {:.3}/pkt",
                        path.name(), size, l.typical, l.p99, row.s.pps / 1e6, row.s.lost(), avoid.avoided
                    ),
                    None => format!("{:<8} {:>4} B stream: nothing came back ({} lost)", path.name(), size, row.s.lost()),
                });
                let empty = row.lat.is_none() && !progress::interrupted();
                srows.push(row);
                if empty {
                    no_rx = true;
                    stop_all(&ports);
                    break 'paths;
                }
                continue;
            }
            let s = eal::on_worker(|| ping(fa, fb, pool, o, size, hz));
            let x1: Vec<_> = ports.iter().map(|&p| xs(p)).collect();
            let (counts, avoid) = per_packet(&x0, &x1);
            let mut buf = Vec::new();
            frame(size, 0, &mut buf);
            let row = Row {
                path,
                size,
                lat: summarize(&s.us),
                lost: s.lost + s.wrong,
                counts,
                avoid,
                frame: buf.len(),
            };
            let modeled = model.latency_us(&row.counts, row.frame);
            prog.step(&match &row.lat {
                Some(l) => format!(
                    "{:<8} {:>4} B: t_min {:.2} t_typical {:.2} t_max {:.2} p99 {:.2} us, lost {} | modeled {:.2} us",
                    path.name(), size, l.min, l.typical, l.max, l.p99, row.lost, modeled
                ),
                None => format!("{:<8} {:>4} B: nothing came back ({} lost)", path.name(), size, row.lost),
            });
            let empty = row.lat.is_none() && !progress::interrupted();
            rows.push(row);
            if empty {
                no_rx = true;
                stop_all(&ports);
                break 'paths;
            }
        }
        stop_all(&ports);
    }
    let interrupted = progress::interrupted();
    let md = if o.stream {
        write_stream_report(o, &srows, hz, interrupted, no_rx, t_start)?
    } else {
        write_report(o, &rows, &model, hz, interrupted, no_rx, t_start)?
    };
    println!("{md}");
    Ok(if no_rx {
        NO_RX
    } else if interrupted {
        130
    } else {
        0
    })
}

/// The xstats deltas from `x0` to `x1`, summed over every port of a path, per transmitted
/// packet (both directions over a peer cable).
fn per_packet(
    x0: &[HashMap<String, u64>],
    x1: &[HashMap<String, u64>],
) -> (PerPacket, AvoidCounts) {
    let sum = |k: &str, x: &[HashMap<String, u64>]| -> u64 {
        x.iter().map(|m| m.get(k).copied().unwrap_or(0)).sum()
    };
    let sent = (sum("tx_good_packets", x1) - sum("tx_good_packets", x0)).max(1) as f64;
    let pp = |k: &str| (sum(k, x1) - sum(k, x0)) as f64 / sent;
    (
        PerPacket {
            doorbells: pp("tx_doorbells"),
            bf_writes: pp("tx_bf_writes"),
            torn_pieces: pp("hca_bf_pieces"),
            wqe_fetches: pp("hca_wqe_fetched"),
            gathers: pp("tx_gather_packets"),
        },
        AvoidCounts {
            avoided: pp("tx_doorbells_avoided"),
            completions: pp("tx_completions"),
            rerings: pp("tx_doorbell_rerings"),
        },
    )
}

/// The device settings a run used, as devargs, for the reports.
fn settings(o: &Opts) -> String {
    format!(
        "`device_loop={}`, `doorbell_ns={}`, `tx_db_avoid={}`, `busy_poll={}`",
        o.device_loop.name(),
        o.doorbell_ns,
        u8::from(o.db_avoid),
        u8::from(o.busy_poll)
    )
}

/// The `ib_write_lat` table for one path, plus the modeled column.
fn lat_table(rows: &[&Row], model: &Model) -> String {
    let mut s = String::from(
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]   modeled[usec]\n",
    );
    for r in rows {
        let m = model.latency_us(&r.counts, r.frame);
        match &r.lat {
            Some(l) => {
                let _ = writeln!(
                    s,
                    " {:<7}{:<10}{:>14.2}{:>15.2}{:>17.2}{:>15.2}{:>17.2}{:>23.2}{:>25.2}{:>16.2}",
                    r.size, l.n, l.min, l.max, l.typical, l.avg, l.stdev, l.p99, l.p999, m
                );
            }
            None => {
                let _ = writeln!(s, " {:<7}{:<10}   (nothing came back)", r.size, 0);
            }
        }
    }
    s
}

/// A report's directory, title and warnings, shared by the ping-pong and the stream.
fn report_head(o: &Opts, title: &str, interrupted: bool, no_rx: bool) -> Result<String, String> {
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let mut md = format!("## {title}\n\n");
    if interrupted {
        md += "**Interrupted: partial results.**\n\n";
    }
    if no_rx {
        md += "**No packet came back over the looped wire: the receive path (rx_burst) returned \
               nothing, so there is no latency to report.**\n\n";
    }
    Ok(md)
}

fn write_report(
    o: &Opts,
    rows: &[Row],
    model: &Model,
    hz: f64,
    interrupted: bool,
    no_rx: bool,
    t_start: Instant,
) -> Result<String, String> {
    let mut md = report_head(o, "Latency (latency)", interrupted, no_rx)?;
    let how = match o.wire {
        Wire::Loop => {
            "One packet per burst over `wire=loop`; a sample is the time from handing \
             the packet to `tx_burst` until `rx_burst` returns it on the same port (one pass \
             through the TX path, the device and the RX path: what `ib_write_lat` reports as \
             half a round trip)"
        }
        Wire::Peer => {
            "One packet per burst between two ports cabled with `wire=peer`; the \
             second port sends every packet straight back and a sample is half the round trip, \
             as `ib_write_lat` reports; both ports run the same TX path"
        }
    };
    let _ = writeln!(
        md,
        "Machine: {}. TSC {:.3} GHz. {how}. The application runs on the worker lcore; the \
         software HCA runs with {}. {} samples per size after {} warm-up; {:.0} s in all. Message sizes are bytes after the 14-byte Ethernet \
         header, frames padded to 60 bytes. **modeled[usec]** is the bus cost model's \
         hardware latency of one pass for the same per-packet counts, not a measurement.\n",
        report::machine(),
        hz / 1e9,
        settings(o),
        o.iters,
        o.warmup,
        t_start.elapsed().as_secs_f64()
    );
    for &path in &o.paths {
        let rs: Vec<&Row> = rows.iter().filter(|r| r.path == path).collect();
        if rs.is_empty() {
            continue;
        }
        let _ = writeln!(md, "### TX path: {}\n\n```", path.label());
        md += &lat_table(&rs, model);
        md += "```\n\n";
    }
    let mut t = Table::new(&[
        "path",
        "size",
        "lost",
        "doorbells/pkt",
        "BF writes/pkt",
        "WQE fetches/pkt",
        "torn pieces/pkt",
        "gathers/pkt",
        "doorbells avoided/pkt",
        "completions/pkt",
    ]);
    for r in rows {
        let c = &r.counts;
        t.row(vec![
            r.path.name().into(),
            r.size.to_string(),
            r.lost.to_string(),
            format!("{:.3}", c.doorbells),
            format!("{:.3}", c.bf_writes),
            format!("{:.3}", c.wqe_fetches),
            format!("{:.2}", c.torn_pieces),
            format!("{:.3}", c.gathers),
            format!("{:.3}", r.avoid.avoided),
            format!("{:.3}", r.avoid.completions),
        ]);
    }
    if !t.is_empty() {
        md += "Per-packet counts (xstats deltas), the model's inputs:\n\n";
        md += &t.markdown();
        md += "\n";
    }
    let mut csv = String::from(
        "path,size,n,t_min,t_max,t_typical,t_avg,t_stdev,p99,p999,lost,modeled_us,doorbells_pkt,avoided_pkt,completions_pkt\n",
    );
    for r in rows {
        let m = model.latency_us(&r.counts, r.frame);
        match &r.lat {
            Some(l) => {
                let _ = writeln!(
                    csv,
                    "{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{},{:.3},{:.4},{:.4},{:.4}",
                    r.path.name(),
                    r.size,
                    l.n,
                    l.min,
                    l.max,
                    l.typical,
                    l.avg,
                    l.stdev,
                    l.p99,
                    l.p999,
                    r.lost,
                    m,
                    r.counts.doorbells + r.counts.bf_writes,
                    r.avoid.avoided,
                    r.avoid.completions
                );
            }
            None => {
                let _ = writeln!(
                    csv,
                    "{},{},0,,,,,,,,{},{:.3},{:.4},{:.4},{:.4}",
                    r.path.name(),
                    r.size,
                    r.lost,
                    m,
                    r.counts.doorbells + r.counts.bf_writes,
                    r.avoid.avoided,
                    r.avoid.completions
                );
            }
        }
    }
    let csv_path = o.out.join("latency.csv");
    std::fs::write(&csv_path, csv).map_err(|e| format!("{}: {e}", csv_path.display()))?;
    if o.plots && rows.iter().any(|r| r.lat.is_some()) {
        let mut series = Vec::new();
        for &path in &o.paths {
            let rs: Vec<&Row> = rows.iter().filter(|r| r.path == path).collect();
            series.push(Series {
                name: format!("{} t_typical (measured)", path.label()),
                points: rs
                    .iter()
                    .filter_map(|r| r.lat.map(|l| (f64::from(r.size), l.typical)))
                    .collect(),
                modeled: false,
            });
            series.push(Series {
                name: format!("{} (modeled)", path.label()),
                points: rs
                    .iter()
                    .map(|r| (f64::from(r.size), model.latency_us(&r.counts, r.frame)))
                    .collect(),
                modeled: true,
            });
        }
        series.retain(|s| !s.points.is_empty());
        let file = "latency_vs_size.png";
        let title = "Latency vs message size (software HCA measured; modeled lines thin)";
        match report::line_plot(
            &o.out.join(file),
            title,
            "message size (bytes)",
            "usec",
            &series,
            true,
        ) {
            Ok(()) => {
                let _ = writeln!(md, "![{title}]({file})\n");
            }
            Err(e) => {
                let _ = writeln!(md, "(plot {file} not drawn: {e})\n");
            }
        }
    }
    let md_path = o.out.join("latency.md");
    std::fs::write(&md_path, &md).map_err(|e| format!("{}: {e}", md_path.display()))?;
    eprintln!(
        "latency: report in {} (latency.md, latency.csv, PNG)",
        o.out.display()
    );
    Ok(md)
}

/// The streaming report: one row per path and size.
fn write_stream_report(
    o: &Opts,
    rows: &[StreamRow],
    hz: f64,
    interrupted: bool,
    no_rx: bool,
    t_start: Instant,
) -> Result<String, String> {
    let mut md = report_head(
        o,
        "Streaming latency (latency --stream)",
        interrupted,
        no_rx,
    )?;
    let window = match o.window {
        0 => "as many in flight as the ring takes".to_owned(),
        w => format!("at most {w} in flight"),
    };
    let gap = match o.gap_ns {
        0 => "back to back".to_owned(),
        g => format!("at least {g} ns apart"),
    };
    let _ = writeln!(
        md,
        "Machine: {}. TSC {:.3} GHz. Packets at burst 1 over `wire=loop`, {gap}, {window}; each \
         frame carries its sequence number and the TSC read just before the `tx_burst` that \
         took it, and a sample is the time from there until the `rx_burst` that returned it \
         (the loop polls RX once per send). The application runs on the worker lcore; the \
         software HCA runs with {}. {} packets after {} warm-up per row; {:.0} s in all. \
         Mpps: packets back per second from the first measured TX to the last arrival.\n",
        report::machine(),
        hz / 1e9,
        settings(o),
        o.iters,
        o.warmup,
        t_start.elapsed().as_secs_f64()
    );
    let mut t = Table::new(&[
        "path",
        "size",
        "sent",
        "back",
        "lost",
        "reordered",
        "duplicates",
        "median us",
        "p99 us",
        "p99.9 us",
        "max us",
        "Mpps",
        "doorbells or BF/pkt",
        "doorbells avoided/pkt",
        "completions/pkt",
        "rerings/pkt",
    ]);
    let mut csv = String::from(
        "path,size,sent,received,lost,reordered,duplicates,foreign,n,t_min,median,p99,p999,t_max,mpps,doorbells_pkt,avoided_pkt,completions_pkt,rerings_pkt\n",
    );
    for r in rows {
        let l = r.lat;
        let f = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.3}"));
        let rung = r.counts.doorbells + r.counts.bf_writes;
        t.row(vec![
            r.path.name().into(),
            r.size.to_string(),
            r.s.sent.to_string(),
            r.s.received.to_string(),
            r.s.lost().to_string(),
            r.s.reordered.to_string(),
            r.s.duplicates.to_string(),
            f(l.map(|l| l.typical)),
            f(l.map(|l| l.p99)),
            f(l.map(|l| l.p999)),
            f(l.map(|l| l.max)),
            format!("{:.3}", r.s.pps / 1e6),
            format!("{rung:.3}"),
            format!("{:.3}", r.avoid.avoided),
            format!("{:.3}", r.avoid.completions),
            format!("{:.4}", r.avoid.rerings),
        ]);
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.4},{:.4},{:.4},{:.4},{:.4}",
            r.path.name(),
            r.size,
            r.s.sent,
            r.s.received,
            r.s.lost(),
            r.s.reordered,
            r.s.duplicates,
            r.s.foreign,
            l.map_or(0, |l| l.n),
            f(l.map(|l| l.min)),
            f(l.map(|l| l.typical)),
            f(l.map(|l| l.p99)),
            f(l.map(|l| l.p999)),
            f(l.map(|l| l.max)),
            r.s.pps / 1e6,
            rung,
            r.avoid.avoided,
            r.avoid.completions,
            r.avoid.rerings
        );
    }
    if !t.is_empty() {
        md += &t.markdown();
        md += "\n";
    }
    let csv_path = o.out.join("latency_stream.csv");
    std::fs::write(&csv_path, csv).map_err(|e| format!("{}: {e}", csv_path.display()))?;
    let md_path = o.out.join("latency_stream.md");
    std::fs::write(&md_path, &md).map_err(|e| format!("{}: {e}", md_path.display()))?;
    eprintln!(
        "latency: report in {} (latency_stream.md, latency_stream.csv)",
        o.out.display()
    );
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_the_sequence_and_are_padded() {
        let mut b = Vec::new();
        frame(2, 0x0102, &mut b);
        assert_eq!(b.len(), 60);
        assert_eq!(&b[12..16], &[0x88, 0xb5, 0x02, 0x01]);
        frame(1024, 7, &mut b);
        assert_eq!(b.len(), 14 + 1024);
        assert_eq!(b[14], 7);
        assert_eq!(b[14 + 100], 100);
    }
}
