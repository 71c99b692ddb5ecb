//! Instruction counts: the driver's generic TX queue against the software HCA in step mode, in
//! this one thread, without EAL, so that callgrind sees exactly the same instructions on every
//! run. Only `measured_burst` is meant to be collected (`--toggle-collect='*measured_burst*'`);
//! the device's work happens in `step`, outside it.

use apps::Path;
use mlx4rs::hca::{HcaConfig, Wire};
use mlx4rs::mmio::Copy64;
use mlx4rs::txq::{DbAvoid, TxPath, TxQueue};
use mlx4rs_testkit::{tx_config, Plain, Scratch};

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
    let hca_cfg = HcaConfig {
        wc: c.path != Path::BfNoWc,
        ..HcaConfig::default()
    };
    let s = Scratch::open("txbench-callgrind-", hca_cfg, Wire::Null)?;
    let burst = usize::from(c.burst);
    let frame: Vec<u8> = (0..usize::from(c.size) * burst)
        .map(|i| (i * 7) as u8)
        .collect();
    let (pkts, frame) = Plain::leak(frame, usize::from(c.size));
    let mr = s.reg_mr(frame)?;
    let path = match c.path {
        Path::Doorbell => TxPath::Doorbell,
        _ => TxPath::BlueFlame,
    };
    let cfg = tx_config(path, c.inline);
    // Large inline thresholds make WQEs of up to 16 TXBBs and the device caps the ring size.
    let mut q: TxQueue<Plain> = [1024, 512, 256]
        .into_iter()
        // SAFETY: the scratch device outlives the queue, which is destroyed on it or leaked.
        .find_map(|n| unsafe { s.txq("txbench", n, cfg.clone(), &[mr]) }.ok())
        .ok_or("no TX queue size the device accepts")?;
    if c.avoid {
        // The device runs after every burst here, so the deadline never matters.
        q.set_db_avoid(Some(DbAvoid {
            cycles: u64::MAX / 4,
            ..DbAvoid::default_bound()
        }));
    }
    if c.full_ring {
        let n = burst.min(pkts.len());
        full_ring(&mut q, &pkts[..n], c.packets)?;
        s.step();
        q.complete();
        drop(q);
        return Ok(());
    }
    let mut sent = 0u64;
    while sent < c.packets {
        let n = (c.packets - sent).min(burst as u64) as usize;
        let k = measured_burst(&mut q, &pkts[..n]);
        sent += k as u64;
        // Every burst is consumed before the next, so each one costs the same.
        s.step();
    }
    s.step();
    q.complete();
    let st = q.stats();
    let hc = s.hca.counters();
    let per = |x: u64| x as f64 / sent as f64;
    println!(
        "callgrind mode: path {} size {} burst {} inline {} copy {} avoidance {}",
        c.path.name(),
        c.size,
        c.burst,
        c.inline,
        Copy64::best().name(),
        if c.avoid { "on" } else { "off" }
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
    q.destroy(&s.dev);
    Ok(())
}
