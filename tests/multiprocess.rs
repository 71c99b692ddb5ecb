//! Secondary processes on our ports (doc/multi-process.md), with real DPDK programs:
//! `dpdk-proc-info` shows the primary testpmd's live counters, `dpdk-dumpcap` captures the frames
//! testpmd sends, and DPDK's `multi_process` examples (built here from the cached DPDK source,
//! outside the project tree) run a primary and a secondary over our ports.
//!
//! Secondary processes need hugepages (DPDK shares no `--no-huge` memory between processes):
//! each test reserves what it needs in `/proc/sys/vm/nr_hugepages` (hugetlbfs on
//! `/dev/hugepages`), gives back what it added, and fails saying why where the machine refuses.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::huge::Hugepages;
use common::{plugin_dir, read_pcap, scratch_dir, xstat, PLUGIN};

/// 2 MiB pages the tests of this file use at most at once: a primary of 256 MB (`-m 256`)
/// and what secondaries allocate besides (dumpcap's capture pool).
const PAGES: u64 = 192;
const DPDK_SRC: &str = "/var/cache/mlx4rs/dpdk-stable-22.11.11";

/// One test at a time: they share the hugepage reservation.
static SERIAL: Mutex<()> = Mutex::new(());

/// A DPDK program running in the background, its output collected as it comes.
struct Program {
    child: Child,
    out: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

fn collect(
    mut r: impl Read + Send + 'static,
    out: Arc<Mutex<String>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    })
}

impl Program {
    fn start(mut cmd: Command) -> Program {
        let mut child = cmd
            .current_dir(std::env::temp_dir())
            .env("LD_LIBRARY_PATH", plugin_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
        let out = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            collect(child.stdout.take().unwrap(), out.clone()),
            collect(child.stderr.take().unwrap(), out.clone()),
        ];
        Program {
            child,
            out,
            readers,
        }
    }

    fn text(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// Waits until the output holds `needle` (the number of times given), or panics.
    fn wait_for(&mut self, needle: &str, times: usize, limit: Duration) {
        let start = Instant::now();
        while self.text().matches(needle).count() < times {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("exited ({st}) before printing {needle:?}:\n{}", self.text());
            }
            assert!(
                start.elapsed() < limit,
                "no {needle:?} within {limit:?}:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn send(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("the program reads its input");
        stdin.flush().unwrap();
    }

    /// Interrupts the program (DPDK's examples print their statistics on SIGINT).
    fn signal_int(&self) {
        let st = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(st.success());
    }

    /// Waits for the exit (killing the program after `limit`), and returns its output.
    fn finish(mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        drop(self.child.stdin.take());
        let start = Instant::now();
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                break self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        (status, self.text())
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The primary: interactive testpmd on hugepages with `vdevs`.
fn primary_testpmd(prefix: &str, vdevs: &[String], app_args: &[&str]) -> Program {
    let mut cmd = Command::new("stdbuf");
    cmd.args(["-oL", "dpdk-testpmd", "-l", "0-1", "-m", "256", "--no-pci"])
        .arg(format!("--file-prefix={prefix}"))
        .args(["-d", PLUGIN]);
    for v in vdevs {
        cmd.arg("--vdev").arg(v);
    }
    cmd.arg("--").arg("-i").args(app_args);
    let mut p = Program::start(cmd);
    p.wait_for("testpmd> ", 1, Duration::from_secs(60));
    p
}

/// A testpmd command, answered once the next prompt shows.
fn testpmd_cmd(p: &mut Program, cmd: &str) {
    let prompts = p.text().matches("testpmd> ").count();
    p.send(cmd);
    p.wait_for("testpmd> ", prompts + 1, Duration::from_secs(30));
}

/// Runs `dpdk-proc-info` on the primary with `prefix` and returns what it printed. It must end
/// within [`PROC_INFO_LIMIT`]; one that does not fails the test with its threads' states, and
/// is not waited for, since a thread stuck in the kernel outlives a kill.
fn proc_info(prefix: &str, args: &[&str]) -> String {
    let dir = scratch_dir("mp-proc-info");
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let file = |p: &Path| std::fs::File::create(p).expect("proc-info's output file");
    let mut child = Command::new("dpdk-proc-info")
        .current_dir(std::env::temp_dir())
        .env("LD_LIBRARY_PATH", plugin_dir())
        .arg(format!("--file-prefix={prefix}"))
        .args(["--no-pci", "-d", PLUGIN, "--"])
        .args(args)
        .stdout(file(&out_path))
        .stderr(file(&err_path))
        .spawn()
        .expect("dpdk-proc-info not found: run scripts/setup.sh");
    let Some(status) = common::wait_until(&mut child, PROC_INFO_LIMIT) else {
        let threads = thread_states(child.id());
        let _ = child.kill();
        panic!("dpdk-proc-info {args:?} still running after {PROC_INFO_LIMIT:?}; its threads:\n{threads}");
    };
    let all = format!(
        "{}\n{}",
        std::fs::read_to_string(&out_path).unwrap_or_default(),
        std::fs::read_to_string(&err_path).unwrap_or_default()
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "dpdk-proc-info {args:?}:\n{all}");
    all
}

/// How long one `dpdk-proc-info` may take: it attaches, asks the primary and exits in well
/// under a second when the machine is not starved.
const PROC_INFO_LIMIT: Duration = Duration::from_secs(30);

/// Each thread of `pid`: its name, scheduler state and kernel stack (as root).
fn thread_states(pid: u32) -> String {
    let mut s = String::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return s;
    };
    for t in tasks.flatten() {
        let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
        let stat = read("stat");
        let state = stat.rsplit_once(") ").and_then(|(_, r)| r.get(..1));
        let state = state.unwrap_or("?");
        s += &format!(
            "{} {} {state}\n{}",
            read("comm").trim(),
            t.file_name().to_string_lossy(),
            read("stack")
        );
    }
    s
}

/// The block of `text` after `marker` for port `port`, up to the next port's.
fn port_block<'a>(text: &'a str, marker: &str, port: u32) -> &'a str {
    let head = format!("{marker} for port {port}");
    let start = text
        .rfind(&head)
        .unwrap_or_else(|| panic!("no {head:?} in:\n{text}"));
    let rest = &text[start + head.len()..];
    let end = rest
        .find(&format!("{marker} for port"))
        .unwrap_or(rest.len());
    &rest[..end]
}

/// `name: value` lines of an xstats block.
fn xstats_of(block: &str) -> Vec<(String, u64)> {
    block
        .lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            Some((k.trim().to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn proc_info_shows_the_primarys_live_counters() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pages = Hugepages::reserve(PAGES, "secondary processes");
    let prefix = pages.prefix("mp-procinfo");
    let mut p = primary_testpmd(
        &prefix,
        &["net_mlx4rs0".into(), "net_mlx4rs1,wc=off".into()],
        &["--forward-mode=txonly", "--total-num-mbufs=16384"],
    );
    testpmd_cmd(&mut p, "start");
    // Live: the counters proc-info reads grow while testpmd sends.
    let tx = |s: &str, port| {
        common::number_after(port_block(s, "NIC statistics", port), "TX-packets:")
            .unwrap_or_else(|| panic!("TX-packets of port {port}:\n{s}"))
    };
    let first = proc_info(&prefix, &["--stats"]);
    let start = Instant::now();
    let later = loop {
        let s = proc_info(&prefix, &["--stats"]);
        if tx(&s, 0) > tx(&first, 0) && tx(&s, 1) > tx(&first, 1) {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "proc-info's counters did not move:\n{first}\n{s}"
        );
    };
    assert!(tx(&later, 0) > 0 && tx(&later, 1) > 0);
    // Frozen: after stop, proc-info and testpmd show the same numbers.
    testpmd_cmd(&mut p, "stop");
    testpmd_cmd(&mut p, "show port stats all");
    testpmd_cmd(&mut p, "show port xstats all");
    let ours = p.text();
    let stats = proc_info(&prefix, &["--stats"]);
    let xstats = proc_info(&prefix, &["--xstats"]);
    let show = proc_info(&prefix, &["--show-port"]);
    p.send("quit");
    let (status, all) = p.finish(Duration::from_secs(30));
    assert!(status.success(), "{all}");
    for port in [0, 1] {
        let theirs = port_block(&ours, "NIC statistics", port);
        assert_eq!(
            tx(&stats, port),
            common::number_after(theirs, "TX-packets:").unwrap(),
            "port {port}: proc-info's TX-packets is testpmd's"
        );
        let a = xstats_of(port_block(&xstats, "NIC extended statistics", port));
        let b = xstats_of(port_block(&ours, "NIC extended statistics", port));
        assert!(
            a.iter().any(|(k, v)| k == "hca_tx_frames" && *v > 0),
            "the device's own counters reach the secondary:\n{xstats}"
        );
        assert_eq!(a, b, "port {port}: proc-info's xstats are testpmd's");
    }
    assert_eq!(
        xstat(
            port_block(&xstats, "NIC extended statistics", 0),
            "tx_path_bf"
        ),
        Some(1)
    );
    assert_eq!(
        xstat(
            port_block(&xstats, "NIC extended statistics", 1),
            "tx_path_bf"
        ),
        Some(0)
    );
    assert_eq!(show.matches("driver net_mlx4rs").count(), 2, "{show}");
    assert!(show.contains("Link up at 40 Gbps"), "{show}");
    assert!(!stats.contains("Invalid port_id"), "{stats}");
}

#[test]
fn dumpcap_captures_what_testpmd_sends() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pages = Hugepages::reserve(PAGES, "secondary processes");
    let prefix = pages.prefix("mp-dumpcap");
    let dir = scratch_dir("mp-dumpcap");
    let wire = dir.join("wire.pcap");
    let capture = dir.join("capture.pcapng");
    let mut p = primary_testpmd(
        &prefix,
        &[format!("net_mlx4rs0,wire=pcap:{}", wire.display())],
        &[
            "--forward-mode=txonly",
            "--txonly-multi-flow",
            "--total-num-mbufs=8192",
        ],
    );
    testpmd_cmd(&mut p, "start");
    // dumpcap builds its own EAL arguments (no -d): the driver comes in with LD_PRELOAD. So
    // does Debian's dpaa mempool driver, which dpdk-testpmd links directly: without it the two
    // processes number their mempool drivers differently, and testpmd copies every captured
    // packet into dumpcap's pool with the wrong driver (all counted dropped, for net_null too).
    let count = 300;
    let dpaa = installed_pmd("librte_mempool_dpaa.so");
    let out = Command::new("dpdk-dumpcap")
        .current_dir(std::env::temp_dir())
        .env("LD_LIBRARY_PATH", plugin_dir())
        .env(
            "LD_PRELOAD",
            format!("{} {}", plugin_dir().join(PLUGIN).display(), dpaa.display()),
        )
        .arg(format!("--file-prefix={prefix}"))
        .args(["-i", "net_mlx4rs0", "-c", &count.to_string(), "-q", "-w"])
        .arg(&capture)
        .output()
        .expect("dpdk-dumpcap not found: run scripts/setup.sh");
    let dumpcap = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    testpmd_cmd(&mut p, "stop");
    testpmd_cmd(&mut p, "port stop all");
    p.send("quit");
    let (status, all) = p.finish(Duration::from_secs(30));
    assert!(status.success(), "{all}");
    assert!(out.status.success(), "dpdk-dumpcap:\n{dumpcap}");
    // tshark decodes the capture; its pcap rewrite is compared frame by frame with the wire.
    let plain = dir.join("capture.pcap");
    let conv = Command::new("tshark")
        .args(["-r"])
        .arg(&capture)
        .args(["-F", "pcap", "-w"])
        .arg(&plain)
        .output()
        .expect("tshark not found: run scripts/setup.sh");
    assert!(conv.status.success(), "{conv:?}");
    let decoded = Command::new("tshark")
        .arg("-r")
        .arg(&capture)
        .args(["-T", "fields", "-e", "frame.protocols"])
        .output()
        .unwrap();
    let protocols = String::from_utf8_lossy(&decoded.stdout);
    let got = read_pcap(&plain);
    let sent = read_pcap(&wire);
    // dumpcap stops after the burst that reached its count.
    assert!(
        (count..count + 64).contains(&got.len()),
        "dumpcap took {count} frames: {}\n{dumpcap}",
        got.len()
    );
    let count = got.len();
    assert_eq!(
        protocols
            .lines()
            // Newer tsharks name UDP port 9 after the discard service.
            .filter(|l| matches!(
                *l,
                "eth:ethertype:ip:udp:data" | "eth:ethertype:ip:udp:discard"
            ))
            .count(),
        count,
        "every captured frame decodes as testpmd's UDP frame:\n{protocols}"
    );
    // testpmd's multi-flow frames differ from one another: the capture is a run of the wire.
    let at = sent
        .iter()
        .position(|f| *f == got[0])
        .unwrap_or_else(|| panic!("the first captured frame is not on the wire"));
    assert!(
        sent.len() >= at + count,
        "the wire holds the whole captured run"
    );
    for (i, f) in got.iter().enumerate() {
        assert_eq!(
            f,
            &sent[at + i],
            "captured frame {i} is the wire's frame {}",
            at + i
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The installed DPDK's copy of the driver `name` (`librte_X.so`), in its plugin directory
/// (`pmds-23.0` on 22.11, `pmds-25.0` on 24.11, ...).
fn installed_pmd(name: &str) -> PathBuf {
    let out = Command::new("pkg-config")
        .args(["--variable=libdir", "libdpdk"])
        .output()
        .expect("pkg-config not found: run scripts/setup.sh");
    let dpdk = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("dpdk");
    let found = std::fs::read_dir(&dpdk)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|d| d.file_name().to_string_lossy().starts_with("pmds-"))
        .map(|d| d.path().join(name))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "{name} missing under {} (Debian's dpdk package)",
            dpdk.display()
        )
    })
}

/// Builds one of DPDK's multi_process examples from the cached source, in `dir`.
fn build_example(name: &str, dir: &Path) -> PathBuf {
    let src = Path::new(DPDK_SRC)
        .join("examples/multi_process")
        .join(name);
    assert!(
        src.is_dir(),
        "{} missing: run scripts/setup.sh (it caches the DPDK source)",
        src.display()
    );
    let work = dir.join(name);
    let cp = Command::new("cp")
        .arg("-r")
        .arg(&src)
        .arg(&work)
        .status()
        .unwrap();
    assert!(cp.success());
    let out = Command::new("make")
        .arg("-s")
        .current_dir(&work)
        .output()
        .expect("make");
    assert!(
        out.status.success(),
        "building {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    work.join("build").join(name)
}

#[test]
fn simple_mp_secondary_attaches_to_our_port() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pages = Hugepages::reserve(PAGES, "secondary processes");
    let dir = scratch_dir("mp-simple");
    let bin = build_example("simple_mp", &dir);
    let prefix = pages.prefix("mp-simple");
    // Each process receives on its worker lcore.
    // Line-buffered: the receiving lcore prints with stdio.
    let eal = |kind: &str| {
        let mut c = Command::new("stdbuf");
        c.arg("-oL")
            .arg(&bin)
            .args(["-l", "0-1", "-m", "256", "--no-pci"])
            .arg(format!("--file-prefix={prefix}"))
            .arg(format!("--proc-type={kind}"))
            .args(["-d", PLUGIN]);
        c
    };
    let mut primary = eal("primary");
    primary.args(["--vdev", "net_mlx4rs0"]);
    // Each is ready once its receiving lcore started (its command line reads what waits).
    let mut primary = Program::start(primary);
    primary.wait_for("Starting core 1", 1, Duration::from_secs(60));
    let mut secondary = Program::start(eal("secondary"));
    secondary.wait_for("Starting core 1", 1, Duration::from_secs(60));
    secondary.send("send hello_from_secondary");
    primary.wait_for("hello_from_secondary", 1, Duration::from_secs(10));
    primary.send("send hello_from_primary");
    secondary.wait_for("hello_from_primary", 1, Duration::from_secs(10));
    secondary.send("quit");
    let (st2, out2) = secondary.finish(Duration::from_secs(20));
    primary.send("quit");
    let (st1, out1) = primary.finish(Duration::from_secs(20));
    assert!(st2.success(), "secondary:\n{out2}");
    assert!(st1.success(), "primary:\n{out1}");
    assert!(
        out1.contains("net_mlx4rs0: device ready"),
        "the primary probed the port:\n{out1}"
    );
    assert!(
        out2.contains("net_mlx4rs0: attached to the primary's port 0"),
        "the secondary attached:\n{out2}"
    );
    assert!(
        !out2.contains("device ready") && !out2.contains("TX path"),
        "the secondary created nothing:\n{out2}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `Port <p>: RX - <rx>, TX - <tx>, Drop - <drop>` lines symmetric_mp prints when it exits.
fn smp_stats(out: &str, port: u32) -> (u64, u64, u64) {
    let head = format!("Port {port}: RX - ");
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with(&head))
        .unwrap_or_else(|| panic!("no stats of port {port}:\n{out}"));
    let n: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect();
    assert_eq!(n.len(), 4, "{line}");
    (n[1], n[2], n[3])
}

/// DPDK's symmetric_mp over our ports, a secondary TX/RX round trip: the primary and a
/// secondary each forward their own queue of port 0 (a TAP the kernel sends into) to the same
/// queue of port 1 (a pcap wire). RSS spreads the kernel's flows over both queues, so each
/// process receives and transmits a share; every frame is received once, by one of them, and
/// reaches the wire once, byte for byte.
#[test]
fn symmetric_mp_round_trip_through_a_secondary_conserves_every_frame() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    assert!(
        Path::new("/dev/net/tun").exists(),
        "the TAP wire needs /dev/net/tun"
    );
    let pages = Hugepages::reserve(PAGES, "secondary processes");
    let dir = scratch_dir("mp-symmetric");
    let bin = build_example("symmetric_mp", &dir);
    let prefix = pages.prefix("mp-symmetric");
    let id = std::process::id() % 100_000;
    let ifname = format!("m4mp{id}");
    let ns = format!("mlx4rs-mp-{id}");
    let wire = dir.join("port1.pcap");
    let run = |args: &str| {
        let st = Command::new("sh").arg("-c").arg(args).status().unwrap();
        assert!(st.success(), "{args}");
    };
    let quiet = |args: &str| {
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!("{args} 2>/dev/null"))
            .status();
    };
    quiet(&format!("ip netns del {ns}"));
    // Both processes' lcores busy-poll CPU 0 (`--lcores=N@0`), leaving the other core to the
    // device thread, the kernel and the test: with every core of a 2-core VM spinning, work
    // the kernel must do on each CPU (page-list drains, reaping a process, mmap) was seen to
    // take minutes.
    let smp = |kind: &str, lcore: &str, proc_id: &str| {
        let mut c = Command::new("stdbuf");
        c.arg("-oL")
            .arg(&bin)
            .arg(format!("--lcores={lcore}@0"))
            .args(["-m", "256", "--no-pci"])
            .arg(format!("--file-prefix={prefix}"))
            .arg(format!("--proc-type={kind}"))
            .args(["-d", PLUGIN]);
        if kind == "primary" {
            c.arg("--vdev")
                .arg(format!("net_mlx4rs0,wire=tap:{ifname}"))
                .arg("--vdev")
                .arg(format!("net_mlx4rs1,wire=pcap:{}", wire.display()));
        }
        c.args(["--", "-p", "3", "--num-procs=2"])
            .arg(format!("--proc-id={proc_id}"));
        c
    };
    let mut primary = Program::start(smp("primary", "0", "0"));
    primary.wait_for("using queue 0 of each port", 1, Duration::from_secs(60));
    let mut secondary = Program::start(smp("secondary", "1", "1"));
    secondary.wait_for("using queue 1 of each port", 1, Duration::from_secs(60));
    // The kernel side: its own namespace, no IPv6 chatter; 200 UDP frames of 200 flows.
    let frames = 200;
    run(&format!(
        "ip netns add {ns} && ip link set {ifname} netns {ns} && \
         ip netns exec {ns} sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 && \
         ip -n {ns} link set {ifname} up"
    ));
    let script = format!(
        "import socket, struct\n\
         s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n\
         s.bind(('{ifname}', 0))\n\
         for i in range({frames}):\n\
         \x20   ip = bytes([0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 1, i // 256, i % 256, 10, 2, 0, 1])\n\
         \x20   udp = struct.pack('!HHHH', 1000 + i, 2000, 8, 0)\n\
         \x20   s.send(bytes.fromhex('020000000001020000000002') + b'\\x08\\x00' + ip + udp + bytes(18))\n"
    );
    std::fs::write(dir.join("send.py"), script).unwrap();
    run(&format!(
        "ip netns exec {ns} python3 {}",
        dir.join("send.py").display()
    ));
    // Wait until every frame is on port 1's wire, reading the capture as it grows: one
    // process spawned and reaped per poll, while both cores busy-poll, was seen to stall
    // minutes in the kernel's reaping. A third process then reads the device's count.
    let start = Instant::now();
    loop {
        let b = std::fs::read(&wire).unwrap_or_default();
        let sent = if b.len() < 24 {
            0
        } else {
            common::pcap_records(&b).0.len() as u64
        };
        if sent >= frames {
            break;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let x = proc_info(&prefix, &["--xstats"]);
            panic!("port 1's wire holds {sent} of {frames} frames; the ports' xstats:\n{x}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let x = proc_info(&prefix, &["--xstats"]);
    let sent = xstat(
        port_block(&x, "NIC extended statistics", 1),
        "hca_tx_frames",
    );
    assert_eq!(
        sent,
        Some(frames),
        "port 1's hca_tx_frames, read by a third process:\n{x}"
    );
    secondary.signal_int();
    let (_, sec) = secondary.finish(Duration::from_secs(20));
    primary.signal_int();
    let (_, pri) = primary.finish(Duration::from_secs(20));
    quiet(&format!("ip netns del {ns}"));
    let (p_rx, _, _) = smp_stats(&pri, 0);
    let (_, p_tx, p_drop) = smp_stats(&pri, 1);
    let (s_rx, _, _) = smp_stats(&sec, 0);
    let (_, s_tx, s_drop) = smp_stats(&sec, 1);
    assert_eq!(
        p_rx + s_rx,
        frames,
        "every frame received once, by one process:\nprimary:\n{pri}\nsecondary:\n{sec}"
    );
    assert!(
        p_rx > 0 && s_rx > 0,
        "RSS gave each process a share: {p_rx} / {s_rx}"
    );
    assert_eq!((p_tx, p_drop), (p_rx, 0), "the primary forwarded its share");
    assert_eq!(
        (s_tx, s_drop),
        (s_rx, 0),
        "the secondary forwarded its share:\n{sec}"
    );
    let on_wire = read_pcap(&wire);
    assert_eq!(on_wire.len() as u64, frames, "every frame on the wire");
    for f in &on_wire {
        assert_eq!(
            (f.len(), &f[..12]),
            (60, &b"\x02\x00\x00\x00\x00\x01\x02\x00\x00\x00\x00\x02"[..])
        );
        assert_eq!(&f[26..28], &[10, 1], "one of the kernel's frames");
    }
    let ports: std::collections::HashSet<&[u8]> = on_wire.iter().map(|f| &f[34..36]).collect();
    assert_eq!(ports.len(), on_wire.len(), "no frame twice");
    std::fs::remove_dir_all(&dir).ok();
}
