//! Instruction counts: the driver's generic TX queue against the software HCA in step mode, in
//! this one thread, without EAL, so that callgrind sees exactly the same instructions on every
//! run. Only `measured_burst` is meant to be collected (`--toggle-collect='*measured_burst*'`);
//! the device's work happens in `step`, outside it.

use apps::Path;
use mlx4rs::hca::{Hca, HcaConfig, Wire};
use mlx4rs::hw::soft::Soft;
use mlx4rs::hw::Device;
use mlx4rs::mem::MemSource;
use mlx4rs::mmio::Copy64;
use mlx4rs::txq::{TxConfig, TxPath, TxQueue};
use mlx4rs_testkit::Plain;

use crate::opts::Callgrind;

/// The one function callgrind collects: `tx_burst` minus the C calling convention. Out of
/// line, so its arguments are opaque to it (no `black_box`, whose stores would be counted).
#[inline(never)]
fn measured_burst(q: &mut TxQueue<Plain>, pkts: &[Plain]) -> usize {
    // SAFETY: `Plain` borrows a leaked frame and its release frees nothing.
    unsafe { q.burst(pkts) }
}

/// The same call on a full ring (`--full-ring`), collected on its own. It returns whether the
/// call sent nothing, so that its body differs from `measured_burst` (identical functions
/// are folded into one symbol, and callgrind would collect nothing).
#[inline(never)]
fn measured_full_ring(q: &mut TxQueue<Plain>, pkts: &[Plain]) -> bool {
    // SAFETY: `Plain` borrows a leaked frame and its release frees nothing.
    (unsafe { q.burst(pkts) }) == 0
}

/// Fills the ring with the device held (never stepped), then makes `calls` calls that must
/// all send nothing: what an application polling a slow device pays per call.
fn full_ring(q: &mut TxQueue<Plain>, pkts: &[Plain], calls: u64) -> Result<(), String> {
    let mut filled = 0u64;
    // SAFETY: `Plain` borrows a leaked frame and its release frees nothing.
    while unsafe { q.burst(pkts) } > 0 {
        filled += 1;
        if filled > 1 << 20 {
            return Err("the ring never filled".into());
        }
    }
    let before = q.stats().ring_full;
    for _ in 0..calls {
        if !measured_full_ring(q, pkts) {
            return Err("a call on a full ring sent something".into());
        }
    }
    let st = q.stats();
    println!(
        "full ring: {calls} calls sent nothing; ring_full counted {} of them; {} packets posted before",
        st.ring_full - before,
        st.packets
    );
    Ok(())
}

pub fn run(c: &Callgrind) -> Result<(), String> {
    let hca = Hca::open(HcaConfig {
        wc: c.path != Path::BfNoWc,
        threaded: false,
        name: format!("txbench-callgrind-{}", std::process::id()),
        ..HcaConfig::default()
    })
    .map_err(|e| format!("opening the software HCA: {e}"))?;
    hca.set_wire(Wire::Null).map_err(|e| e.to_string())?;
    hca.start().map_err(|e| e.to_string())?;
    hca.set_port_up(true);
    let burst = usize::from(c.burst);
    let frame: Vec<u8> = (0..usize::from(c.size) * burst)
        .map(|i| (i * 7) as u8)
        .collect();
    let frame: &'static [u8] = frame.leak();
    let dev = Soft::new(hca.clone(), MemSource::Heap);
    let mr = dev
        // SAFETY: a leaked Vec, mapped and writable for the process's life; only this TX
        // queue uses the region, and a send queue reads.
        .reg_mr(unsafe { frame_range(frame) })
        .map_err(|e| e.to_string())?;
    let pkts: Vec<Plain> = frame.chunks(usize::from(c.size)).map(Plain).collect();
    let cfg = TxConfig {
        inline_max: c.inline,
        path: match c.path {
            Path::Doorbell => TxPath::Doorbell,
            _ => TxPath::BlueFlame,
        },
        copy: Copy64::best(),
        fast_free: false,
        source: MemSource::Heap,
    };
    // Large inline thresholds make WQEs of up to 16 TXBBs and the device caps the ring size.
    let mut q: TxQueue<Plain> = [1024, 512, 256]
        .into_iter()
        // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
        .find_map(|n| unsafe { TxQueue::new(&dev, "txbench", 0, n, cfg.clone(), &[mr]) }.ok())
        .ok_or("no TX queue size the device accepts")?;
    if c.full_ring {
        let n = burst.min(pkts.len());
        full_ring(&mut q, &pkts[..n], c.packets)?;
        hca.step();
        q.complete();
        drop(q);
        hca.stop();
        return Ok(());
    }
    let mut sent = 0u64;
    while sent < c.packets {
        let n = (c.packets - sent).min(burst as u64) as usize;
        let k = measured_burst(&mut q, &pkts[..n]);
        sent += k as u64;
        // Every burst is consumed before the next, so each one costs the same.
        hca.step();
    }
    hca.step();
    q.complete();
    let st = q.stats();
    let hc = hca.counters();
    let per = |x: u64| x as f64 / sent as f64;
    println!(
        "callgrind mode: path {} size {} burst {} inline {} copy {}",
        c.path.name(),
        c.size,
        c.burst,
        c.inline,
        Copy64::best().name()
    );
    println!(
        "packets {sent} doorbells/pkt {:.4} bf_writes/pkt {:.4} inline/pkt {:.3} \
         hca_wqe_fetched/pkt {:.4} hca_wqe_from_bf/pkt {:.4} hca_bf_torn/pkt {:.4} ring_full {}",
        per(st.doorbells),
        per(st.bf_writes),
        per(st.inline_packets),
        per(hc.wqe_fetched),
        per(hc.wqe_from_bf),
        per(hc.bf_torn),
        st.ring_full
    );
    if st.packets != c.packets || hc.tx_frames != c.packets {
        return Err(format!(
            "sent {} but the queue counted {} and the device {}",
            c.packets, st.packets, hc.tx_frames
        ));
    }
    q.destroy(&dev);
    hca.stop();
    Ok(())
}

/// The region of frames that only send queues use (the device reads them, never writes).
///
/// # Safety
/// `frame` is never freed, and no receive queue is handed buffers inside it.
pub unsafe fn frame_range(frame: &'static [u8]) -> mlx4rs::mem::DmaRange {
    let start = frame.as_ptr() as usize;
    // SAFETY: the caller's contract: memory for the process's life that the device only reads.
    unsafe { mlx4rs::mem::DmaRange::new(start, start + frame.len()) }
}
