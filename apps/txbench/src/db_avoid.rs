//! `txbench --db-avoid`: doorbell avoidance (`DbAvoid`, devarg `tx_db_avoid`) off and on, the
//! experiment of Eric Dumazet's "auto doorbell" for mlx4 reproduced on the software HCA in
//! step mode, in this one thread, so that every figure repeats exactly.
//!
//! The device's completion time is modeled in calls: it runs (executes what it was told
//! about, writes the completions asked for) once every `lag` calls of `tx_burst`. At lag 1 it
//! keeps up, a burst always finds the last doorbell completed, and avoidance only adds the
//! completion it asks for per doorbell; the slower the device, the more bursts find a
//! doorbell outstanding and skip theirs, up to the packet bound. The TSC deadline is set out of
//! reach here (the lag is counted in calls, not time), so the packet bound is the one that
//! fires. Modeled Mpps charge each doorbell and BlueFlame copy a UAR write's cost in the bus
//! cost model (`apps::model`); `wait` is the mean number of later calls a packet spent
//! published but unannounced: what avoidance costs in latency.

use apps::model::{Model, PerPacket};
use apps::Path;
use mlx4rs::hca::{HcaConfig, Wire};
use mlx4rs::txq::{DbAvoid, TxPath, TxQueue};

use mlx4rs_testkit::{tx_config, Plain, Scratch};

const SIZE: usize = 64;

struct Row {
    doorbells: f64,
    bf_writes: f64,
    completions: f64,
    avoided: f64,
    wait: f64,
}

fn run_one(path: Path, burst: usize, lag: u64, avoid: bool, packets: u64) -> Result<Row, String> {
    let hca_cfg = HcaConfig {
        wc: path != Path::BfNoWc,
        ..HcaConfig::default()
    };
    let s = Scratch::open("txbench-dbavoid-", hca_cfg, Wire::Null)?;
    let frame: Vec<u8> = (0..SIZE * burst).map(|i| (i * 7) as u8).collect();
    let (pkts, frame) = Plain::leak(frame, SIZE);
    let mr = s.reg_mr(frame)?;
    let tx_path = match path {
        Path::Doorbell => TxPath::Doorbell,
        _ => TxPath::BlueFlame,
    };
    // SAFETY: the scratch device outlives the queue, which is destroyed on it or leaked.
    let mut q: TxQueue<Plain> = unsafe { s.txq("txbench", 1024, tx_config(tx_path, 104), &[mr]) }?;
    if avoid {
        q.set_db_avoid(Some(DbAvoid {
            cycles: u64::MAX / 4,
            ..DbAvoid::default_bound()
        }));
    }
    let (mut sent, mut calls, mut waited) = (0u64, 0u64, 0u64);
    while sent < packets {
        let n = (packets - sent).min(burst as u64) as usize;
        // SAFETY: `Plain` borrows a leaked frame and its release frees nothing.
        sent += unsafe { q.burst(&pkts[..n]) } as u64;
        calls += 1;
        waited += u64::from(q.unrung());
        if calls % lag == 0 {
            s.step();
        }
    }
    q.kick();
    s.step();
    q.complete();
    let st = q.stats();
    let hc = s.hca.counters();
    if st.packets != packets || hc.tx_frames != packets {
        return Err(format!(
            "sent {packets} but the queue counted {} and the device {}",
            st.packets, hc.tx_frames
        ));
    }
    q.destroy(&s.dev);
    let per = |x: u64| x as f64 / packets as f64;
    Ok(Row {
        doorbells: per(st.doorbells),
        bf_writes: per(st.bf_writes),
        completions: per(st.completions),
        avoided: per(st.doorbells_avoided),
        wait: per(waited),
    })
}

pub fn run(packets: u64) -> Result<(), String> {
    let model = Model::mlx4rs();
    println!(
        "doorbell avoidance, software HCA in step mode, {SIZE}-byte inline packets, {packets} \
         per point; the device runs once every `lag` calls; modeled Mpps: bus cost model \
         (t_pkt {:.1} ns, t_db {:.1} ns per doorbell or BF copy)\n",
        model.t_pkt_ns, model.t_db_ns
    );
    println!(
        "| path | burst | lag | avoidance | doorbells/pkt | BF writes/pkt | completions/pkt | \
         skips/pkt | wait (calls/pkt) | modeled Mpps | on ÷ off |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for path in [Path::Doorbell, Path::BfWc] {
        for burst in [1, 2, 4, 8] {
            for lag in [1, 4, 16] {
                let mut off_mpps = 0.0;
                for avoid in [false, true] {
                    let r = run_one(path, burst, lag, avoid, packets)?;
                    let c = PerPacket {
                        doorbells: r.doorbells,
                        bf_writes: r.bf_writes,
                        ..PerPacket::default()
                    };
                    let mpps = model.mpps(&c, SIZE);
                    if !avoid {
                        off_mpps = mpps;
                    }
                    println!(
                        "| {} | {burst} | {lag} | {} | {:.4} | {:.4} | {:.4} | {:.4} | {:.2} | \
                         {mpps:.2} | {} |",
                        path.name(),
                        if avoid { "on" } else { "off" },
                        r.doorbells,
                        r.bf_writes,
                        r.completions,
                        r.avoided,
                        r.wait,
                        if avoid {
                            format!("{:.2}", mpps / off_mpps)
                        } else {
                            "".into()
                        }
                    );
                }
            }
        }
    }
    Ok(())
}
