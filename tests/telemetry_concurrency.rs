//! DPDK's telemetry thread reads our counters while the lcores forward: a
//! `dpdk-telemetry.py` client asks for both ports' xstats in a loop while testpmd forwards
//! with io forwarding on two forwarding lcores, between two ports cabled back to back
//! (`wire=peer:`). No counter may ever go backwards, from the first read to the last after the
//! ports stopped; at the end the counts conserve: each port's TX is what the other's device
//! received or dropped at its wire, and testpmd's own counts are the xstats.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::telemetry::Telemetry;
use common::{number_after, plugin_dir, run_interactive, EalPrefix, Step::*, PLUGIN};

type Xstats = HashMap<String, u64>;

fn forwarded(a: &str) -> bool {
    number_after(a, "RX-packets:").is_some_and(|n| n >= 1_000_000)
}

fn answered(_: &str) -> bool {
    true
}

/// Fails naming the counter and both values unless `now` holds every counter of `before`,
/// none smaller.
fn never_backwards(port: u16, before: &Xstats, now: &Xstats) {
    for (k, &v) in before {
        let n = *now
            .get(k)
            .unwrap_or_else(|| panic!("port {port}: xstat {k} vanished"));
        assert!(n >= v, "port {port}: {k} went backwards: {v} then {n}");
    }
}

/// testpmd's `show port stats` answer for `port` in `all`: (RX-packets, TX-packets).
fn testpmd_counts(all: &str, port: u16) -> (u64, u64) {
    let m = format!("NIC statistics for port {port}");
    let s = &all[all.rfind(&m).unwrap_or_else(|| panic!("no {m} in:\n{all}"))..];
    (
        number_after(s, "RX-packets:").unwrap(),
        number_after(s, "TX-packets:").unwrap(),
    )
}

#[test]
fn xstats_read_during_forwarding_never_go_backwards_and_conserve() {
    let prefix = EalPrefix::new("telemetry");
    let dir = common::ScratchDir::new("telemetry");
    let flag = dir.join("done");
    let mut cmd = Command::new("stdbuf");
    // Two forwarding lcores (1 and 2) on the two CPUs, the main lcore sharing CPU 0.
    cmd.args(["-oL", "dpdk-testpmd"])
        .current_dir(std::env::temp_dir())
        .env("LD_LIBRARY_PATH", plugin_dir())
        .args(["--lcores=0@0,1@1,2@0", "--no-huge", "-m", "512", "--no-pci"])
        .arg(prefix.arg())
        .args(["-d", PLUGIN])
        .args(["--vdev", "net_mlx4rs0,wire=peer:net_mlx4rs1"])
        .args(["--vdev", "net_mlx4rs1,wire=peer:net_mlx4rs0"])
        .args([
            "--",
            "-i",
            "--forward-mode=io",
            "--nb-cores=2",
            "--total-num-mbufs=8192",
        ]);

    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (prefix, stop, flag) = (prefix.0.clone(), stop.clone(), flag.clone());
        std::thread::spawn(move || {
            let mut tel = Telemetry::connect(&prefix, Duration::from_secs(60));
            let mut samples: Vec<[Xstats; 2]> = Vec::new();
            let mut last: Option<[Xstats; 2]> = None;
            // An answer without xstats (ethdev's handler says `null` when one of its calls
            // failed) is asked again; three in a row fail the test.
            let mut read = |port: u16, nulls: &mut u32| {
                let mut reply = String::new();
                for _ in 0..3 {
                    match tel.try_xstats(port) {
                        Ok(x) => return x,
                        Err(r) => (*nulls, reply) = (*nulls + 1, r),
                    }
                }
                panic!("port {port}: three telemetry answers in a row without xstats: {reply}")
            };
            let mut nulls = 0u32;
            // Until the session says the ports are stopped (the flag file), and once after.
            loop {
                let done = flag.exists();
                let now = [read(0, &mut nulls), read(1, &mut nulls)];
                if let Some(prev) = &last {
                    for p in 0..2 {
                        never_backwards(p as u16, &prev[p], &now[p]);
                    }
                }
                last = Some(now.clone());
                samples.push(now);
                if done || stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            READER_DONE.store(true, Ordering::Release);
            if nulls > 0 {
                println!("{nulls} telemetry answers without xstats, asked again");
            }
            samples
        })
    };

    let touch = format!("touch {}", flag.display());
    let out = run_interactive(
        cmd,
        &[
            Cmd("start tx_first"),
            Until {
                cmd: "show port stats 0",
                done: forwarded,
                limit: Duration::from_secs(120),
            },
            Cmd("stop"),
            Cmd("port stop all"),
            Until {
                cmd: "show port stats all",
                done: answered,
                limit: Duration::from_secs(30),
            },
            Shell(&touch),
            // The reader's last read happens while testpmd still runs.
            Until {
                cmd: "show port stats all",
                done: reader_done,
                limit: Duration::from_secs(30),
            },
            Cmd("quit"),
        ],
        Duration::from_secs(240),
    );
    stop.store(true, Ordering::Relaxed);
    let all = out.all();
    let samples = match reader.join() {
        Ok(s) => s,
        Err(e) => std::panic::resume_unwind(e),
    };
    assert!(
        out.status.success(),
        "testpmd exit {:?}:\n{all}",
        out.status
    );
    assert!(
        samples.len() >= 10,
        "only {} telemetry reads during the run:\n{all}",
        samples.len()
    );
    let [first, last] = [&samples[0], &samples[samples.len() - 1]];
    // The reads saw traffic move, not a port at rest.
    let during = samples
        .windows(2)
        .filter(|w| w[1][0]["rx_good_packets"] > w[0][0]["rx_good_packets"])
        .count();
    assert!(
        during >= 5,
        "fewer than 5 reads saw port 0's rx_good_packets grow ({} reads):\n{all}",
        samples.len()
    );
    for p in 0..2u16 {
        let (x, other) = (&last[p as usize], &last[1 - p as usize]);
        never_backwards(p, &first[p as usize], x);
        assert_eq!(
            x["tx_good_packets"], x["hca_tx_frames"],
            "port {p}: the device sent what the driver counted: {x:?}"
        );
        assert_eq!(
            x["hca_tx_frames"],
            other["hca_rx_frames"] + other["hca_rx_drops_wire"],
            "port {p}'s frames were all received or dropped at the other end's wire \
             (after port stop delivered what waited):\n{x:?}\n{other:?}"
        );
        let (rx, tx) = testpmd_counts(&all, p);
        assert_eq!(
            (rx, tx),
            (x["rx_good_packets"], x["tx_good_packets"]),
            "port {p}: testpmd's counts are the xstats telemetry read last"
        );
    }
    println!(
        "{} telemetry reads of both ports' xstats; port 0 forwarded {} frames",
        samples.len(),
        last[0]["tx_good_packets"]
    );
}

/// Set by the reader once it has taken its last sample.
static READER_DONE: AtomicBool = AtomicBool::new(false);

fn reader_done(_: &str) -> bool {
    READER_DONE.load(Ordering::Acquire)
}
