//! csumcheck: proves TX checksum offload on the wire.
//!
//! Sends IPv4 TCP and UDP frames through a `net_mlx4rs` port on a pcap wire, prepared as DPDK
//! specifies for offload (`RTE_MBUF_F_TX_IPV4 | IP_CKSUM | TCP/UDP_CKSUM`, `l2_len`/`l3_len`,
//! IPv4 checksum 0, L4 checksum the pseudo-header sum), at lengths on each class boundary of the
//! TX path, with and without IPv4 options, in one segment or several. Then it reads the pcap
//! back: every frame must be the one sent, with both checksums complete (computed here
//! independently of the device). The test suite also decodes the same file with tshark, checksum
//! validation on.
//!
//!     csumcheck [--devargs "wc=off,txq_inline=0"] --out /some/dir/out.pcap
//!
//! Prints `csumcheck: PASS ...` (exit 0) or `csumcheck: FAIL ...` (exit 1); bad arguments exit 2.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod dpdk;
mod frames;

use std::time::{Duration, Instant};

use apps::eal;

struct Opts {
    devargs: String,
    out: std::path::PathBuf,
}

fn parse_args() -> Result<Opts, String> {
    let mut devargs = String::new();
    let mut out = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--devargs" => devargs = args.next().ok_or("--devargs needs a value")?,
            "--out" => out = Some(args.next().ok_or("--out needs a path")?.into()),
            "--help" | "-h" => {
                return Err("usage: csumcheck [--devargs \"k=v,...\"] --out FILE.pcap".into())
            }
            _ => return Err(format!("unknown argument {a:?}")),
        }
    }
    let out: std::path::PathBuf = out.ok_or("--out FILE.pcap is required")?;
    if devargs.contains("wire=") {
        return Err("--devargs must not set wire= (the pcap wire is --out)".into());
    }
    Ok(Opts { devargs, out })
}

fn main() {
    let _ = mlx4rs::link();
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("csumcheck: {e}");
            std::process::exit(2);
        }
    };
    match run(&opts) {
        Ok(summary) => {
            println!("csumcheck: PASS {summary}");
            eal::shutdown();
        }
        Err(e) => {
            println!("csumcheck: FAIL {e}");
            std::process::exit(1);
        }
    }
}

fn run(o: &Opts) -> Result<String, String> {
    let specs = frames::all();
    let mut vdev = format!("net_mlx4rs0,wire=pcap:{}", o.out.display());
    if !o.devargs.is_empty() {
        vdev = format!("{vdev},{}", o.devargs);
    }
    let mut args = eal::base_args("csumcheck");
    args.push(format!("--vdev={vdev}"));
    eal::init("csumcheck", &args)?;
    let port = eal::port_by_name("net_mlx4rs0")?;
    let pool = eal::Pool::create("csumcheck", 4096)?;
    dpdk::configure(port, pool, 512)?;
    eal::start(port)?;
    let path_bf = eal::xstats(port)
        .iter()
        .find(|(k, _)| k == "tx_path_bf")
        .map(|&(_, v)| v == 1);
    let mut pkts = Vec::with_capacity(specs.len());
    for s in &specs {
        pkts.push(dpdk::chain(pool, s, &s.for_offload())?);
    }
    dpdk::send_all(port, &mut pkts, Instant::now() + Duration::from_secs(10))?;
    let n = specs.len() as u64;
    let deadline = Instant::now() + Duration::from_secs(10);
    while dpdk::opackets(port) < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let sent = dpdk::opackets(port);
    // Stop drains the queue onto the wire; close flushes and closes the pcap file.
    dpdk::close(port);
    if sent != n {
        return Err(format!("opackets {sent}, expected {n}"));
    }
    let bytes = std::fs::read(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let got = frames::read_pcap(&bytes)?;
    if got.len() != specs.len() {
        return Err(format!(
            "{} frames on the wire, {} sent",
            got.len(),
            specs.len()
        ));
    }
    for (s, g) in specs.iter().zip(&got) {
        let want = s.on_wire();
        if *g != want {
            let at = g.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!(
                "frame {} ({} {} B, IP options {}, cuts {:?}) differs at byte {at}: {:02x?} vs {:02x?}",
                s.seq,
                if s.tcp { "TCP" } else { "UDP" },
                s.len,
                s.ip_opts,
                s.cuts,
                &g[at..(at + 4).min(g.len())],
                &want[at..(at + 4).min(want.len())],
            ));
        }
    }
    let path = match path_bf {
        Some(true) => "BlueFlame",
        Some(false) => "doorbell",
        None => "unknown",
    };
    Ok(format!(
        "{} frames (TCP and UDP, {} to {} bytes, 1 to 4 segments), TX path {path}, devargs {:?}: every checksum complete, every byte as sent",
        specs.len(),
        specs.iter().map(|s| s.len).min().unwrap_or(0),
        specs.iter().map(|s| s.len).max().unwrap_or(0),
        o.devargs
    ))
}
