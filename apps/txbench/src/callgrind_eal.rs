//! Instruction counts with real mbufs: a `net_mlx4rs` port under EAL, its `tx_pkt_burst`
//! called through `rte_eth_fp_ops` as an application calls it, the software HCA on a device
//! thread of its own. Run under `valgrind --tool=callgrind --fair-sched=yes` (so that the
//! device thread gets the CPU) with `--toggle-collect='*measured_eal_burst*'`: callgrind then
//! counts the ethdev glue, the queue's burst and the mempool put of the inline packets, in
//! this thread only.
//!
//! Every measured call finds the device drained (the loop waits for it between calls, outside
//! the measured function), so every call sends its whole burst: the count is per packet of
//! calls that sent something. The mempool put is `rte_pktmbuf_free_bulk`, whose inclusive
//! cost callgrind reports separately (see `callgrind.sh`), which gives the figure without it.

use std::time::{Duration, Instant};

use apps::eal::{self, FastPath, Mbufs, Pool};

use crate::opts::Callgrind;

/// The one function callgrind collects: what an application's `rte_eth_tx_burst` does.
#[inline(never)]
fn measured_eal_burst(fp: &FastPath, m: &mut Mbufs) -> usize {
    fp.tx(m)
}

fn hca_tx_frames(port: u16) -> u64 {
    eal::xstats(port)
        .into_iter()
        .find(|(k, _)| k == "hca_tx_frames")
        .map_or(0, |(_, v)| v)
}

pub fn run(c: &Callgrind) -> Result<(), String> {
    let mut args = eal::base_args("txbench-cg");
    args.push("--vdev".into());
    // The device on a thread of its own, not in the polling lcore (the default, whose burst
    // functions run the device inline and would put its work in the count).
    args.push(format!(
        "net_mlx4rs0,wire=null,device_loop=port,{},txq_inline={}",
        c.path.devargs(),
        c.inline
    ));
    eal::init("txbench", &args)?;
    let res = measure(c);
    eal::shutdown();
    res
}

fn measure(c: &Callgrind) -> Result<(), String> {
    let pool = Pool::create("txbench_cg_pool", 8191)?;
    let port = eal::port_by_name("net_mlx4rs0")?;
    eal::setup_port(port, pool, 1024)?;
    eal::start(port)?;
    let fp = FastPath::of(port)?;
    let hdr = crate::header();
    let burst = usize::from(c.burst);
    let mut m = Mbufs::default();
    let (mut sent, mut calls, mut short) = (0u64, 0u64, 0u64);
    while sent < c.packets {
        let n = (c.packets - sent).min(burst as u64) as usize;
        if !m.alloc(pool, n) {
            return Err("the mempool ran dry".into());
        }
        m.prepare(&hdr, c.size);
        let k = measured_eal_burst(&fp, &mut m);
        m.free_all();
        sent += k as u64;
        calls += 1;
        short += u64::from(k < n);
        // The device thread drains the ring before the next call, so that every call has
        // room for its whole burst.
        let deadline = Instant::now() + Duration::from_secs(30);
        while hca_tx_frames(port) < sent {
            if Instant::now() > deadline {
                return Err(format!("the device executed too few WQEs of {sent}"));
            }
            std::thread::yield_now();
        }
    }
    let xs: std::collections::HashMap<String, u64> = eal::xstats(port).into_iter().collect();
    let per = |k: &str| xs.get(k).copied().unwrap_or(0) as f64 / sent as f64;
    println!(
        "callgrind EAL mode: path {} size {} burst {} inline {} copy {}",
        c.path.name(),
        c.size,
        c.burst,
        c.inline,
        mlx4rs::mmio::Copy64::best().name()
    );
    println!(
        "packets {sent} calls {calls} short_calls {short} doorbells/pkt {:.4} bf_writes/pkt {:.4} \
         inline/pkt {:.3}",
        per("tx_doorbells"),
        per("tx_bf_writes"),
        per("tx_inline_packets"),
    );
    eal::stop(port);
    if short > 0 {
        return Err(format!("{short} calls did not send their whole burst"));
    }
    Ok(())
}
