//! txbench as a process: EAL can start once per process, so each run is a child. Runs from a
//! scratch directory, with its report there too.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("txbench-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn txbench(dir: &PathBuf, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_txbench"));
    c.current_dir(dir).args(args);
    c
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
fn short_sweep_reports_every_path_beside_null_and_ring() {
    let d = scratch("short");
    let out = d.join("report");
    let o = txbench(
        &d,
        &[
            "--short",
            "--rounds=1",
            "--slice-ms=5",
            "--out",
            out.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    let all = text(&o);
    assert!(o.status.success(), "{all}");
    let md = std::fs::read_to_string(out.join("txbench.md")).unwrap();
    for path in [
        "| bf-wc | 104 | 1 | 64 |",
        "| bf-nowc | 0 | 32 | 1500 |",
        "| doorbell | 928 | 32 | 512 |",
    ] {
        assert!(md.contains(path), "{path} missing:\n{md}");
    }
    assert!(md.contains("Bus cost model (modeled"), "{md}");
    // The measured rows carry the xstats counts: one doorbell per burst on the doorbell path,
    // besides the re-rings of a ring the device thread left full for long (the scheduler's
    // doing on a loaded machine, counted apart).
    let csv = std::fs::read_to_string(out.join("txbench.csv")).unwrap();
    let row = csv
        .lines()
        .find(|l| l.starts_with("doorbell,104,32,64,"))
        .expect("doorbell row");
    let col = |i: usize| -> f64 { row.split(',').nth(i).unwrap().parse().unwrap() };
    let (db_per_pkt, rerings) = (col(10), col(21));
    assert!((db_per_pkt - rerings - 1.0 / 32.0).abs() < 0.01, "{row}");
    for png in ["txbench_mpps_vs_burst.png", "txbench_cycles_vs_size.png"] {
        let b = std::fs::read(out.join(png)).unwrap_or_default();
        assert!(b.starts_with(b"\x89PNG"), "{png} not a PNG\n{all}");
    }
    // Progress lines on stderr, the report on stdout.
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("[ 36/36]"),
        "{all}"
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("net_null"),
        "{all}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn sigint_stops_cleanly_with_partial_results() {
    let d = scratch("sigint");
    let out = d.join("report");
    let child = txbench(&d, &["--out", out.to_str().unwrap(), "--no-plots"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    // Wait until it measures (the first progress line), then interrupt.
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(4));
    let rc = Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(rc.success());
    let o = child.wait_with_output().unwrap();
    let all = text(&o);
    assert!(start.elapsed() < Duration::from_secs(60), "{all}");
    assert_eq!(o.status.code(), Some(130), "{all}");
    let md = std::fs::read_to_string(out.join("txbench.md")).unwrap();
    assert!(md.contains("Interrupted: partial results"), "{md}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn callgrind_mode_runs_every_path_without_eal() {
    let d = scratch("cg");
    for path in ["bf-wc", "bf-nowc", "doorbell"] {
        let o = txbench(
            &d,
            &[
                "--callgrind",
                "--path",
                path,
                "--packets",
                "5000",
                "--burst",
                "8",
            ],
        )
        .output()
        .unwrap();
        let all = text(&o);
        assert!(o.status.success(), "{all}");
        let s = String::from_utf8_lossy(&o.stdout);
        assert!(s.contains("packets 5000 "), "{all}");
        let want = if path == "doorbell" {
            "doorbells/pkt 0.1250 bf_writes/pkt 0.0000"
        } else {
            "doorbells/pkt 0.0000 bf_writes/pkt 0.1250"
        };
        assert!(s.contains(want), "{path}: {all}");
        assert!(!all.contains("EAL: Detected"), "no EAL in this mode: {all}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_arguments_exit_2_with_the_reason() {
    let d = scratch("args");
    for (args, needle) in [
        (&["--bursts", "0"][..], "outside 1..=64"),
        (&["--paths", "fast"][..], "unknown TX path"),
        (&["--frobnicate"][..], "unknown option"),
        (&["--callgrind", "--short"][..], "sweep option"),
    ] {
        let o = txbench(&d, args).output().unwrap();
        let all = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {all}");
        assert!(all.contains(needle), "{args:?}: {all}");
        assert!(
            !all.contains("EAL: Detected"),
            "rejected before EAL starts: {all}"
        );
    }
    let o = txbench(&d, &["--help"]).output().unwrap();
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("usage: txbench"));
    std::fs::remove_dir_all(&d).unwrap();
}

/// The point of the callgrind mode: the same run gives the same instruction count, and the
/// count covers the driver's burst function (not zero: the toggle pattern matched).
#[test]
fn callgrind_counts_repeat_exactly() {
    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!("valgrind not installed (scripts/setup.sh installs it): skipped");
        return;
    }
    let d = scratch("cgrepeat");
    let count = |i: usize| -> u64 {
        let o = Command::new("valgrind")
            .current_dir(&d)
            .arg("--tool=callgrind")
            .arg(format!(
                "--callgrind-out-file={}",
                d.join(format!("cg.{i}")).display()
            ))
            .arg("--toggle-collect=*measured_burst*")
            .arg(env!("CARGO_BIN_EXE_txbench"))
            .args(["--callgrind", "--path", "bf-wc", "--packets", "20000"])
            .output()
            .unwrap();
        let all = text(&o);
        assert!(o.status.success(), "{all}");
        let err = String::from_utf8_lossy(&o.stderr);
        err.lines()
            .find_map(|l| {
                l.split_once("Collected : ")
                    .map(|(_, n)| n.trim().parse().unwrap())
            })
            .unwrap_or_else(|| panic!("no Collected line:\n{all}"))
    };
    let (a, b) = (count(0), count(1));
    assert_eq!(a, b, "instruction counts differ between identical runs");
    let per_packet = a as f64 / 20000.0;
    assert!(
        (50.0..5000.0).contains(&per_packet),
        "{per_packet} instructions per packet"
    );
    std::fs::remove_dir_all(&d).unwrap();
}
