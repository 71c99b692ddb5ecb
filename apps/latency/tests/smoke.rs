//! latency as a process (EAL starts once per process), from a scratch directory.

use std::path::PathBuf;
use std::process::{Command, Output};

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("latency-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn short_run_prints_an_ib_write_lat_table_per_path() {
    let d = scratch("short");
    let out = d.join("report");
    let o = Command::new(env!("CARGO_BIN_EXE_latency"))
        .current_dir(&d)
        .args(["--short", "--iters=50", "--warmup=5", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let all = text(&o);
    assert!(o.status.success(), "{all}");
    let md = std::fs::read_to_string(out.join("latency.md")).unwrap();
    for label in [
        "TX path: BlueFlame with WC",
        "TX path: BlueFlame without WC",
        "TX path: doorbell",
    ] {
        assert!(md.contains(label), "{label}:\n{md}");
    }
    assert!(md.contains("t_typical[usec]") && md.contains("99% percentile[usec]"));
    assert!(!md.contains("nothing came back"), "{md}");
    // Every size of every path: n samples, t_min <= t_typical <= t_max.
    let csv = std::fs::read_to_string(out.join("latency.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 3 * 4, "{csv}");
    for r in &rows {
        assert_eq!(r[2], "50", "{r:?}");
        let (min, max, typ): (f64, f64, f64) = (
            r[3].parse().unwrap(),
            r[4].parse().unwrap(),
            r[5].parse().unwrap(),
        );
        assert!(min > 0.0 && min <= typ && typ <= max, "{r:?}");
    }
    // Burst 1 on the doorbell path: one doorbell per packet.
    assert!(md.contains("| doorbell | 2 | 0 | 1.000 | 0.000 |"), "{md}");
    let png = std::fs::read(out.join("latency_vs_size.png")).unwrap_or_default();
    assert!(png.starts_with(b"\x89PNG"), "{all}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_arguments_exit_2_with_the_reason() {
    let d = scratch("args");
    for (args, needle) in [
        (&["--sizes", "1"][..], "outside 2..=1024"),
        (&["--paths", "bf"][..], "unknown TX path"),
        (&["--bursts", "4"][..], "unknown option"),
        (&["--stream", "--wire=peer"][..], "loop only"),
        (&["--device-loop", "thread"][..], "lcore, port or process"),
        (&["--db-avoid", "yes"][..], "not 0 or 1"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_latency"))
            .current_dir(&d)
            .args(args)
            .output()
            .unwrap();
        let all = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {all}");
        assert!(all.contains(needle), "{args:?}: {all}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn sigint_stops_cleanly_with_partial_results() {
    let d = scratch("sigint");
    let out = d.join("report");
    let child = Command::new(env!("CARGO_BIN_EXE_latency"))
        .current_dir(&d)
        .args(["--iters=10000000", "--no-plots", "--out"])
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    let rc = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(rc.success());
    let o = child.wait_with_output().unwrap();
    let all = text(&o);
    assert_eq!(o.status.code(), Some(130), "{all}");
    let md = std::fs::read_to_string(out.join("latency.md")).unwrap();
    assert!(md.contains("Interrupted: partial results"), "{md}");
    // The interrupted size still reports what it measured.
    assert!(md.contains("TX path: BlueFlame with WC"), "{md}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn peer_cable_echoes_back() {
    let d = scratch("peer");
    let out = d.join("report");
    let o = Command::new(env!("CARGO_BIN_EXE_latency"))
        .current_dir(&d)
        .args([
            "--wire=peer",
            "--busy-poll=0",
            "--paths=doorbell,bf-wc",
            "--sizes=2,1024",
            "--iters=30",
            "--warmup=2",
            "--no-plots",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let all = text(&o);
    assert!(o.status.success(), "{all}");
    let md = std::fs::read_to_string(out.join("latency.md")).unwrap();
    assert!(md.contains("half the round trip"), "{md}");
    let csv = std::fs::read_to_string(out.join("latency.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 2 * 2, "{csv}");
    assert!(
        csv.lines()
            .skip(1)
            .all(|l| l.split(',').nth(2) == Some("30")),
        "{csv}"
    );
    // Both ports transmit once per sample: still one doorbell per packet on that path.
    assert!(md.contains("| doorbell | 2 | 0 | 1.000 | 0.000 |"), "{md}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// One stream's CSV row by column name.
fn stream_row(csv: &str) -> std::collections::HashMap<String, String> {
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let row: Vec<&str> = lines.next().expect("a stream row").split(',').collect();
    assert_eq!(head.len(), row.len(), "{csv}");
    head.iter()
        .zip(row)
        .map(|(h, v)| (h.to_string(), v.to_string()))
        .collect()
}

#[test]
fn stream_brings_every_packet_back_once() {
    // Avoidance on with the device on its own thread: skipped doorbells must still be rung
    // for, or the stream stalls and counts the rest lost. Then the device in the lcore.
    for (device_loop, avoid) in [("port", "1"), ("lcore", "0")] {
        let d = scratch(&format!("stream-{device_loop}"));
        let out = d.join("report");
        let o = Command::new(env!("CARGO_BIN_EXE_latency"))
            .current_dir(&d)
            .args([
                "--stream",
                "--paths=doorbell",
                "--iters=3000",
                "--warmup=50",
                "--window=16",
                "--doorbell-ns=177",
                "--no-plots",
            ])
            .arg(format!("--device-loop={device_loop}"))
            .arg(format!("--db-avoid={avoid}"))
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        let all = text(&o);
        assert!(o.status.success(), "{all}");
        let csv = std::fs::read_to_string(out.join("latency_stream.csv")).unwrap();
        let r = stream_row(&csv);
        let num = |k: &str| -> f64 { r[k].parse().unwrap_or_else(|_| panic!("{k}: {csv}")) };
        assert_eq!(num("sent"), 3050.0, "{csv}");
        assert_eq!(num("received"), 3050.0, "{csv}");
        for k in ["lost", "duplicates", "foreign"] {
            assert_eq!(num(k), 0.0, "{k}: {csv}");
        }
        assert_eq!(num("n"), 3000.0, "{csv}");
        let (min, median, p99, max) = (num("t_min"), num("median"), num("p99"), num("t_max"));
        assert!(
            0.0 < min && min <= median && median <= p99 && p99 <= max,
            "{csv}"
        );
        assert!(num("mpps") > 0.0, "{csv}");
        // Each packet's burst either rang or skipped its doorbell; a later call rings for the
        // skipped ones (the rerings, and the ringing bursts that cover them).
        let (rung, avoided) = (num("doorbells_pkt"), num("avoided_pkt"));
        if avoid == "0" {
            assert_eq!((rung, avoided), (1.0, 0.0), "{csv}");
        } else {
            let rerings = num("rerings_pkt");
            assert!(avoided >= 0.0 && rung > 0.0, "{csv}");
            assert!((rung + avoided - 1.0).abs() <= 0.001 + rerings, "{csv}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
