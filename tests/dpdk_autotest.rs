//! DPDK's own test program (`dpdk-test`, in Debian's dpdk-dev) on our port.
//!
//! - `pmd_perf_autotest` in its default mode (continuous rx/tx on one lcore) on a looped port:
//!   it primes the port with 2048 frames and forwards whatever comes back to where it came
//!   from. It would run until 2 s of 40 Gb/s line rate (119 M frames) came back; the test stops
//!   it with SIGUSR1 (the test's own stop signal) once telemetry shows a million, and checks
//!   that every primed frame is either still circulating (freed at the end) or counted as
//!   missed by the receiver, and that nothing was dropped at TX. It prints cycles per packet
//!   (of this build; `scripts/pmd-perf.sh` has the release figures beside the C mlx4's).
//! - `pmd_perf_autotest` with `set_rxtx_sc poll_after_xmit`: 2048 frames sent while nobody
//!   polls, onto a port with 2048 receive descriptors posted, then received. A card puts them
//!   all in the ring.
//! - `ethdev_link_status`, in the same session: ethdev's link formatting.
//!
//! Tried and left out: `event_eth_rx_adapter_autotest` and `event_eth_rx_intr_adapter_autotest`
//! fail their setup on `net_null` as on ours (with `event_skeleton` or `event_sw0`);
//! `event_eth_tx_adapter_autotest`, `bitratestats_autotest`, `latencystats_autotest`,
//! `pdump_autotest` and the bonding tests create ring ports of their own and never touch ours.

mod common;

use std::io::Write;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::telemetry::Telemetry;
use common::{number_after, plugin_dir, EalPrefix, KillOnDrop, PLUGIN};

const PROGRAM: &str = "dpdk-test";

/// One session at a time: each wants both cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// One `dpdk-test` process at its `RTE>>` prompt, its output collected as it comes.
struct Session {
    child: KillOnDrop,
    stdin: Option<ChildStdin>,
    out: Arc<Mutex<String>>,
    /// stdout alone, where the prompt and the test's lines are looked for: a log line from
    /// stderr can land inside a prompt in `out` (`R` + `APP: HPET is not enabled...` +
    /// `TE>>`).
    stdout: Arc<Mutex<String>>,
    prefix: EalPrefix,
}

impl Session {
    fn start(tag: &str, vdevs: &[&str]) -> Session {
        let prefix = EalPrefix::new(tag);
        // Line-buffered: the test prints its progress with stdio and flushes rarely.
        let mut cmd = Command::new("stdbuf");
        cmd.args(["-oL", PROGRAM])
            .current_dir(std::env::temp_dir())
            .env("LD_LIBRARY_PATH", plugin_dir())
            .args(["-l", "0-1", "--no-huge", "-m", "512", "--no-pci"])
            .arg(prefix.arg())
            .args(["-d", PLUGIN]);
        for v in vdevs {
            cmd.arg("--vdev").arg(v);
        }
        let mut child = KillOnDrop(
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("{PROGRAM} cannot start ({e}): it is in Debian's dpdk-dev (scripts/setup.sh)")
                }),
        );
        let out = Arc::new(Mutex::new(String::new()));
        let stdout = Arc::new(Mutex::new(String::new()));
        for (pipe, own) in [
            (
                Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
                Some(stdout.clone()),
            ),
            (Box::new(child.stderr.take().unwrap()), None),
        ] {
            let out = out.clone();
            std::thread::spawn(move || {
                let mut pipe = pipe;
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let piece = String::from_utf8_lossy(&buf[..n]);
                    // `out` first: what `wait_for` finds on stdout is in `out` already.
                    out.lock().unwrap().push_str(&piece);
                    if let Some(own) = &own {
                        own.lock().unwrap().push_str(&piece);
                    }
                }
            });
        }
        let stdin = child.stdin.take();
        let s = Session {
            child,
            stdin,
            out,
            stdout,
            prefix,
        };
        s.wait_for("RTE>>", 0, Duration::from_secs(60));
        s
    }

    fn text(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// Sends a command; returns where in the output its answer starts. The answer cannot be
    /// found by the command's echo: the echo and log lines from stderr interleave.
    fn send(&mut self, line: &str) -> usize {
        let mark = self.out.lock().unwrap().len();
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("dpdk-test exited");
        stdin.flush().unwrap();
        mark
    }

    /// Waits for the `n`-th (from 0) occurrence of `needle` on stdout; returns the whole
    /// output.
    fn wait_for(&self, needle: &str, n: usize, limit: Duration) -> String {
        let start = Instant::now();
        loop {
            if self.stdout.lock().unwrap().matches(needle).count() > n {
                return self.text();
            }
            let t = self.text();
            assert!(
                start.elapsed() < limit,
                "no {needle:?} (#{n}) from {PROGRAM} after {limit:?}:\n{t}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ends the session with `quit` and returns all it printed.
    fn quit(mut self) -> String {
        self.send("quit");
        drop(self.stdin.take());
        let st = common::wait_or_kill(&mut self.child, Duration::from_secs(30));
        let t = self.text();
        assert!(st.success(), "{PROGRAM} exit {st:?}:\n{t}");
        t
    }
}

#[test]
fn pmd_perf_autotest_forwards_on_a_looped_port_and_conserves_the_primed_frames() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut s = Session::start("pmdperf", &["net_mlx4rs0,wire=loop"]);
    let mark = s.send("ethdev_link_status");
    let t = s.wait_for("RTE>>", 1, Duration::from_secs(30));
    assert!(t[mark..].contains("Test OK"), "ethdev_link_status:\n{t}");

    let mark = s.send("pmd_perf_autotest");
    let t = s.wait_for("Test will stop after", 0, Duration::from_secs(60));
    let injected = number_after(&t, "Total packets inject to prime ports =")
        .unwrap_or_else(|| panic!("no priming count:\n{t}"));
    assert_eq!(
        injected, 2048,
        "the port takes all 2048 priming frames:\n{t}"
    );
    assert!(
        t.contains("Link up at 40 Gbps"),
        "a ConnectX-3 port's link is up at 40 Gb/s:\n{t}"
    );

    // Measure until a million frames came back, then stop the test as its SIGUSR1 does.
    let mut tel = Telemetry::connect(&s.prefix.0, Duration::from_secs(10));
    let start = Instant::now();
    let limit = Duration::from_secs(180);
    loop {
        let x = tel.xstats(0);
        if x["rx_good_packets"] >= 1_000_000 {
            break;
        }
        assert!(
            start.elapsed() < limit,
            "fewer than 1 M frames back after {limit:?}: {x:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = s.child.id().to_string();
    let st = Command::new("kill").args(["-USR1", &pid]).status().unwrap();
    assert!(st.success(), "kill -USR1 {pid}");
    let t = s.wait_for("RTE>>", 2, Duration::from_secs(60));
    let run = &t[mark..];
    assert!(run.contains("Test OK"), "pmd_perf_autotest failed:\n{run}");
    let freed = run
        .lines()
        .find(|l| l.contains("mbuf left in port 0"))
        .and_then(|l| number_after(l, "free "))
        .unwrap_or_else(|| panic!("no dry-out count:\n{run}"));
    let line = run
        .lines()
        .find(|l| l.contains(" packet, ") && l.contains(" drop, "))
        .unwrap_or_else(|| panic!("no packet/drop line:\n{run}"));
    let count = number_after(line, "").unwrap();
    let dropped = number_after(line, "packet,").unwrap();
    let cycles = number_after(run, "Result:").unwrap_or_else(|| panic!("no result:\n{run}"));

    // After the test the port is still up: its counters tell where each primed frame went.
    let x = tel.xstats(0);
    drop(tel);
    let missed = x["rx_missed_errors"];
    assert_eq!(dropped, 0, "tx_burst took every frame it was given:\n{run}");
    assert_eq!(
        freed + missed,
        injected,
        "each primed frame circulates to the end or was missed at the receiver \
         (freed {freed}, rx_missed_errors {missed}):\n{run}\n{x:?}"
    );
    assert!(count >= 1_000_000, "{run}");
    assert_eq!(
        x["tx_good_packets"],
        x["rx_good_packets"] + missed + x["rx_errors"],
        "the loop wire returns every frame sent: {x:?}"
    );
    assert!(cycles > 0, "{run}");
    let _ = s.quit();
    println!("pmd_perf_autotest (continuous, rxtx, wire=loop, this build): {cycles} cycles per packet over {count} packets");
}

#[test]
fn pmd_perf_autotest_burst_mode_receives_what_the_posted_descriptors_hold() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut s = Session::start("pmdburst", &["net_mlx4rs0,wire=loop"]);
    s.send("set_rxtx_sc poll_after_xmit");
    s.wait_for("RTE>>", 1, Duration::from_secs(30));
    let mark = s.send("pmd_perf_autotest");
    // The test sends, waits 5 s, then polls.
    let t = s.wait_for("packets lost", 0, Duration::from_secs(120));
    let run = t[mark..].to_owned();
    assert!(run.contains("CONFIG RXD=2048"), "{run}");
    let mut tel = Telemetry::connect(&s.prefix.0, Duration::from_secs(10));
    let x = tel.xstats(0);
    drop(tel);
    let lost = number_after(&run, "start to receive total expect 2048\n")
        .unwrap_or_else(|| panic!("no lost count:\n{run}"));
    assert_eq!(
        lost, 0,
        "2048 frames sent onto a port with 2048 receive descriptors posted all arrive, as \
         they would into a card's ring (rx_missed_errors {}, hca_rx_drops_wire {}):\n{run}",
        x["rx_missed_errors"], x["hca_rx_drops_wire"]
    );
    s.wait_for("RTE>>", 2, Duration::from_secs(30));
    let _ = s.quit();
}
