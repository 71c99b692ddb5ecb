//! Open vSwitch with DPDK (Debian's `openvswitch-switch-dpdk`: OVS 3.1 on DPDK 22.11) drives two
//! of our ports on TAP wires, each TAP in a network namespace of the test's own: ping both
//! ways, a 100 MB TCP transfer compared byte for byte, OVS's interface statistics against the
//! kernel's, the link, and the reconfigurations that restart or re-create a port (MTU 9000 with
//! an 8000-byte ping that must not fragment, two RX queues, del-port and add-port), with
//! traffic after each. OVS's log holds no warning or error from our driver.
//!
//! The test runs its own `ovsdb-server` and `ovs-vswitchd-dpdk` on a database and run directory
//! of its own. OVS runs EAL `--in-memory`, which needs hugepages: reserved with
//! `common::huge`, as for `tests/multiprocess.rs`, and given back. Everything the test creates (namespaces, the
//! bridge's interface, processes, the run directory, hugepage files) goes on drop, also when it
//! fails. Needs root, /dev/net/tun, and the packages scripts/setup.sh installs
//! (openvswitch-switch-dpdk, socat, iputils-ping, iproute2).

mod common;

use common::huge::Hugepages;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const VSWITCHD: &str = "/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk";
const SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";
/// EAL memory OVS may take (MB): its shared mempools are large (up to 262144 mbufs for MTU
/// 1500) and halve until they fit; an MTU change makes a second pool while the first lives.
const SOCKET_LIMIT_MB: u64 = 1024;
/// 2 MiB pages reserved: the limit and some room.
const PAGES: u64 = SOCKET_LIMIT_MB / 2 + 16;
/// Bytes of the TCP transfer.
const TRANSFER: usize = 100 << 20;
const ADDR_A: &str = "10.199.0.1";
const ADDR_B: &str = "10.199.0.2";

/// Tests of this file share the hugepage reservation: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// A directory removed on drop.
struct RunDir(PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A network namespace, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(name: String) -> Netns {
        let _ = quiet("ip", &["netns", "del", &name]);
        run("ip", &["netns", "add", &name]);
        // No IPv6: no router or neighbour solicitations besides the test's own traffic.
        run(
            "ip",
            &[
                "netns",
                "exec",
                &name,
                "sysctl",
                "-q",
                "-w",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ],
        );
        Netns(name)
    }

    /// A command run in the namespace.
    fn cmd(&self, prog: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0, prog]).args(args);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = quiet("ip", &["netns", "del", &self.0]);
    }
}

/// A child process killed (and reaped) on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn quiet(prog: &str, args: &[&str]) -> bool {
    Command::new(prog)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (run scripts/setup.sh for the packages)"))
}

/// Runs a command that must succeed; returns its standard output.
fn run(prog: &str, args: &[&str]) -> String {
    checked(Command::new(prog).args(args))
}

fn checked(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `check` every 50 ms until it gives `Ok`, for at most `limit`; fails with its last word.
fn wait_for<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
    let end = Instant::now() + limit;
    loop {
        match check() {
            Ok(v) => return v,
            Err(e) if Instant::now() >= end => {
                panic!("timed out after {limit:?} waiting for {what}: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The test's Open vSwitch: its database server and switch daemon, and the bridge.
struct Ovs {
    dir: PathBuf,
    bridge: String,
    vswitchd: Option<Proc>,
    db: Option<Proc>,
}

impl Ovs {
    fn command(&self, prog: &str) -> Command {
        let mut c = Command::new(prog);
        for var in ["OVS_RUNDIR", "OVS_DBDIR", "OVS_LOGDIR", "OVS_SYSCONFDIR"] {
            c.env(var, &self.dir);
        }
        c
    }

    fn vsctl(&self, args: &[&str]) -> String {
        let db = format!("--db=unix:{}", self.dir.join("db.sock").display());
        checked(
            self.command("ovs-vsctl")
                .args([&db, "--timeout=30"])
                .args(args),
        )
    }

    fn appctl(&self, args: &[&str]) -> String {
        let target = self.dir.join("ovs-vswitchd.ctl");
        checked(self.command("ovs-appctl").arg("-t").arg(&target).args(args))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("ovs-vswitchd.log")).unwrap_or_default()
    }

    /// `ovs-vsctl get Interface <iface> <column>`, unquoted.
    fn get(&self, iface: &str, column: &str) -> String {
        self.vsctl(&["get", "Interface", iface, column])
            .trim()
            .trim_matches('"')
            .to_owned()
    }

    /// The Interface's `statistics` map.
    fn statistics(&self, iface: &str) -> HashMap<String, u64> {
        let s = self.get(iface, "statistics");
        s.trim_matches(|c| c == '{' || c == '}')
            .split(", ")
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                Some((k.to_owned(), v.parse().ok()?))
            })
            .collect()
    }

    /// Adds our port `port` (vdev `net_mlx4rs<n>`) on a TAP wire named `tap`.
    fn add_port(&self, port: &str, n: u32, tap: &str, extra: &[&str]) {
        let devargs = format!("options:dpdk-devargs=net_mlx4rs{n},wire=tap:{tap}");
        let mut args = vec![
            "add-port",
            &self.bridge,
            port,
            "--",
            "set",
            "Interface",
            port,
            "type=dpdk",
            &devargs,
        ];
        args.extend(extra);
        self.vsctl(&args);
    }
}

impl Drop for Ovs {
    fn drop(&mut self) {
        // The bridge's own interface is a persistent TAP of OVS's: deleted with the bridge,
        // or by hand if the daemon is gone.
        if self.vswitchd.is_some() {
            let db = format!("--db=unix:{}", self.dir.join("db.sock").display());
            let _ = self
                .command("ovs-vsctl")
                .args([&db, "--timeout=10", "--if-exists", "del-br", &self.bridge])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        self.vswitchd.take();
        self.db.take();
        let _ = quiet("ip", &["link", "del", &self.bridge]);
    }
}

/// A TAP interface in its namespace: there, with its address, up.
fn tap_in_place(ns: &Netns, tap: &str, addr: &str) -> Result<(), String> {
    let out = output(&mut ns.cmd("ip", &["addr", "show", "dev", tap]));
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && text.contains(&format!("inet {addr}/24")) && text.contains(",UP") {
        Ok(())
    } else {
        Err(format!(
            "{tap} in {}: {text}{}",
            ns.0,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Pings until one answer comes (the bridge learns, ARP resolves), then `count` pings of
/// `size` bytes (`-M do`: never fragmented) must all be answered.
fn ping(from: &Netns, to: &str, count: u32, size: u32) {
    let size = size.to_string();
    let base = ["-M", "do", "-s", &size, "-W", "1"];
    wait_for(
        &format!("a ping from {} to {to}", from.0),
        Duration::from_secs(30),
        || {
            let mut args = vec!["-c", "1"];
            args.extend(base);
            args.push(to);
            let out = output(&mut from.cmd("ping", &args));
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stdout).into_owned())
            }
        },
    );
    let n = count.to_string();
    let mut args = vec!["-c", &n, "-i", "0.2"];
    args.extend(base);
    args.push(to);
    let out = checked(&mut from.cmd("ping", &args));
    assert!(
        out.contains(&format!("{count} packets transmitted, {count} received")),
        "{out}"
    );
}

/// The kernel's counters of `tap` in `ns`.
fn kernel_stats(ns: &Netns, tap: &str) -> [u64; 4] {
    ["rx_packets", "rx_bytes", "tx_packets", "tx_bytes"].map(|k| {
        let path = format!("/sys/class/net/{tap}/statistics/{k}");
        checked(&mut ns.cmd("cat", &[&path]))
            .trim()
            .parse()
            .unwrap()
    })
}

/// A file of `len` pseudo-random bytes (xorshift64*).
fn random_file(path: &Path, len: usize) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut buf = vec![0u8; 1 << 16];
    let mut left = len;
    while left > 0 {
        for c in buf.chunks_exact_mut(8) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            c.copy_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
        }
        let n = left.min(buf.len());
        out.write_all(&buf[..n]).unwrap();
        left -= n;
    }
    out.flush().unwrap();
}

/// Sends `src` from namespace `a` to a socat listening in `b`, into `dst`; returns how long it
/// took.
fn transfer(a: &Netns, b: &Netns, src: &Path, dst: &Path) -> Duration {
    let listen = format!("TCP-LISTEN:5001,bind={ADDR_B},reuseaddr");
    let create = format!("CREATE:{}", dst.display());
    let mut rx = Proc(
        b.cmd("socat", &["-u", &listen, &create])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("socat is needed (scripts/setup.sh installs it)"),
    );
    let open = format!("OPEN:{}", src.display());
    let connect = format!("TCP:{ADDR_B}:5001");
    let start = Instant::now();
    // Until the listener is up: a refused connection fails at once and is tried again.
    wait_for("the TCP transfer", Duration::from_secs(180), || {
        let out = output(&mut a.cmd("socat", &["-u", &open, &connect]));
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    });
    let status = wait_for(
        "the receiving socat to end",
        Duration::from_secs(30),
        || {
            rx.0.try_wait()
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "still running".to_owned())
        },
    );
    assert!(status.success(), "receiving socat: {status}");
    start.elapsed()
}

#[test]
fn ovs_bridges_two_ports_on_tap_wires_through_reconfigurations() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for need in [VSWITCHD, SCHEMA, "/dev/net/tun"] {
        assert!(
            Path::new(need).exists(),
            "{need} is missing: this test needs root, /dev/net/tun and Debian's \
             openvswitch-switch-dpdk (scripts/setup.sh installs it)"
        );
    }
    // EAL refuses a `-d` path under a world-writable directory (where a fresh clone may
    // live): the plugin goes by its bare name, found through LD_LIBRARY_PATH.
    let plugin_dir = common::plugin_dir();
    let id = std::process::id() % 100_000;
    let prefix = format!("mlx4rs-ovs-{id}");
    let pages = Hugepages::reserve(PAGES, "OVS-DPDK");
    pages.adopt(&prefix);
    let dir = RunDir(std::env::temp_dir().join(format!("mlx4rs-ovs-{id}")));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).unwrap();
    let (tap_a, tap_b) = (format!("m4ova{id}"), format!("m4ovb{id}"));
    let ns_a = Netns::new(format!("mlx4rs-ovs-a-{id}"));
    let ns_b = Netns::new(format!("mlx4rs-ovs-b-{id}"));
    let mut ovs = Ovs {
        dir: dir.0.clone(),
        bridge: format!("m4ovbr{id}"),
        vswitchd: None,
        db: None,
    };

    // The database and the daemon, on the test's own run directory.
    let db = dir.0.join("conf.db");
    run("ovsdb-tool", &["create", &db.to_string_lossy(), SCHEMA]);
    let sock = dir.0.join("db.sock");
    ovs.db = Some(Proc(
        ovs.command("ovsdb-server")
            .arg(&db)
            .arg(format!("--remote=punix:{}", sock.display()))
            .arg(format!(
                "--unixctl={}",
                dir.0.join("ovsdb-server.ctl").display()
            ))
            .arg(format!(
                "--log-file={}",
                dir.0.join("ovsdb-server.log").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ovsdb-server"),
    ));
    wait_for("ovsdb-server's socket", Duration::from_secs(20), || {
        sock.exists().then_some(()).ok_or_else(|| "absent".into())
    });
    let extra = format!(
        "other_config:dpdk-extra=-d {} --no-pci --file-prefix={prefix}",
        common::PLUGIN
    );
    let limit = format!("other_config:dpdk-socket-limit={SOCKET_LIMIT_MB}");
    ovs.vsctl(&["--no-wait", "init"]);
    ovs.vsctl(&[
        "--no-wait",
        "set",
        "Open_vSwitch",
        ".",
        "other_config:dpdk-init=true",
        &extra,
        "other_config:dpdk-socket-mem=64",
        &limit,
    ]);
    ovs.vswitchd = Some(Proc(
        ovs.command(VSWITCHD)
            .current_dir(&dir.0)
            .env("LD_LIBRARY_PATH", &plugin_dir)
            .arg(format!("unix:{}", sock.display()))
            .arg(format!(
                "--unixctl={}",
                dir.0.join("ovs-vswitchd.ctl").display()
            ))
            .arg(format!(
                "--log-file={}",
                dir.0.join("ovs-vswitchd.log").display()
            ))
            .arg("-vconsole:off")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ovs-vswitchd-dpdk"),
    ));
    wait_for("DPDK initialised in OVS", Duration::from_secs(60), || {
        let db = format!("--db=unix:{}", sock.display());
        let out = output(ovs.command("ovs-vsctl").args([
            &db,
            "--timeout=5",
            "get",
            "Open_vSwitch",
            ".",
            "dpdk_initialized",
        ]));
        let s = String::from_utf8_lossy(&out.stdout);
        (s.trim() == "true")
            .then_some(())
            .ok_or_else(|| format!("{s}\n{}", ovs.log()))
    });

    // The bridge and our two ports; each TAP goes into its namespace with an address.
    ovs.vsctl(&[
        "add-br",
        &ovs.bridge,
        "--",
        "set",
        "bridge",
        &ovs.bridge,
        "datapath_type=netdev",
    ]);
    ovs.add_port("p0", 0, &tap_a, &[]);
    ovs.add_port("p1", 1, &tap_b, &[]);
    for (ns, tap, addr) in [(&ns_a, &tap_a, ADDR_A), (&ns_b, &tap_b, ADDR_B)] {
        run("ip", &["link", "set", tap, "netns", &ns.0]);
        checked(&mut ns.cmd("ip", &["addr", "add", &format!("{addr}/24"), "dev", tap]));
        checked(&mut ns.cmd("ip", &["link", "set", tap, "up"]));
    }
    let in_place = || {
        tap_in_place(&ns_a, &tap_a, ADDR_A).unwrap();
        tap_in_place(&ns_b, &tap_b, ADDR_B).unwrap();
    };
    let link_up = |what: &str| {
        for p in ["p0", "p1"] {
            wait_for(
                &format!("{p}'s link up {what}"),
                Duration::from_secs(20),
                || {
                    let (state, speed) = (ovs.get(p, "link_state"), ovs.get(p, "link_speed"));
                    (state == "up" && speed == "40000000000")
                        .then_some(())
                        .ok_or_else(|| format!("link_state {state}, link_speed {speed}"))
                },
            );
        }
    };
    let both_ways = |size: u32| {
        ping(&ns_a, ADDR_B, 5, size);
        ping(&ns_b, ADDR_A, 5, size);
    };
    link_up("in their namespaces");
    both_ways(56);

    // 100 MB of TCP across the bridge, byte for byte.
    let (src, dst) = (dir.0.join("send.bin"), dir.0.join("recv.bin"));
    random_file(&src, TRANSFER);
    let took = transfer(&ns_a, &ns_b, &src, &dst);
    let (sent, got) = (std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
    assert_eq!(got.len(), sent.len(), "bytes received");
    assert!(got == sent, "the received file differs from the sent one");
    drop((sent, got));
    println!(
        "TCP {} MB across the bridge in {:.2} s: {:.0} Mbit/s",
        TRANSFER >> 20,
        took.as_secs_f64(),
        TRANSFER as f64 * 8.0 / took.as_secs_f64() / 1e6
    );

    // OVS's statistics (refreshed every 5 s) against the kernel's: what a port received is
    // what its TAP's kernel side sent, and the other way round. OVS asks for KEEP_CRC where a
    // port offers it, and our driver then hands up each frame with its 4-byte FCS, counted in
    // the bytes received (DPDK's C mlx4 leaves it after the frame, outside pkt_len): 4 bytes
    // per frame more than the kernel sent.
    for (p, ns, tap) in [("p0", &ns_a, &tap_a), ("p1", &ns_b, &tap_b)] {
        let s = wait_for(
            &format!("{p}'s statistics equal to {tap}'s kernel counters"),
            Duration::from_secs(30),
            || {
                let k = kernel_stats(ns, tap);
                let s = ovs.statistics(p);
                let o = ["tx_packets", "tx_bytes", "rx_packets", "rx_bytes"]
                    .map(|n| s.get(n).copied().unwrap_or(u64::MAX));
                let want = [k[0], k[1], k[2], k[3] + 4 * k[2]];
                (want == o && kernel_stats(ns, tap) == k)
                    .then(|| s.clone())
                    .ok_or_else(|| format!("kernel rx/tx packets/bytes {k:?}, OVS {o:?}: {s:?}"))
            },
        );
        println!("{p}: {s:?}");
        assert!(
            s["rx_packets"].max(s["tx_packets"]) > 70_000,
            "the transfer went through {p}: {s:?}"
        );
        // Our port counters, as OVS maps them (rx_size_64_packets is its rx_1_to_64_packets).
        let buckets = [
            "1_to_64",
            "65_to_127",
            "128_to_255",
            "256_to_511",
            "512_to_1023",
            "1024_to_1522",
            "1523_to_max",
        ];
        for dir in ["rx", "tx"] {
            let sum: u64 = buckets
                .iter()
                .map(|b| s[&format!("{dir}_{b}_packets")])
                .sum();
            assert_eq!(
                sum,
                s[&format!("{dir}_packets")],
                "{dir} buckets of {p}: {s:?}"
            );
        }
        assert!(
            s["rx_broadcast_packets"] + s["tx_broadcast_packets"] > 0,
            "ARP: {s:?}"
        );
        for n in ["rx_errors", "rx_undersized_errors", "rx_oversize_errors"] {
            assert_eq!(s[n], 0, "{n}: {s:?}");
        }
    }

    // MTU 9000: OVS restarts the ports; the TAPs stay and take the MTU.
    for p in ["p0", "p1"] {
        ovs.vsctl(&["set", "Interface", p, "mtu_request=9000"]);
    }
    for (p, ns, tap) in [("p0", &ns_a, &tap_a), ("p1", &ns_b, &tap_b)] {
        wait_for(
            &format!("{p} and {tap} at MTU 9000"),
            Duration::from_secs(30),
            || {
                let mtu = ovs.get(p, "mtu");
                let link = String::from_utf8_lossy(
                    &output(&mut ns.cmd("ip", &["link", "show", tap])).stdout,
                )
                .into_owned();
                (mtu == "9000" && link.contains("mtu 9000"))
                    .then_some(())
                    .ok_or_else(|| format!("OVS mtu {mtu}; {link}\n{}", ovs.log()))
            },
        );
    }
    in_place();
    link_up("at MTU 9000");
    both_ways(8000);

    // Two RX queues on each port: another restart.
    for p in ["p0", "p1"] {
        ovs.vsctl(&["set", "Interface", p, "options:n_rxq=2"]);
    }
    wait_for("two RX queues per port", Duration::from_secs(30), || {
        let show = ovs.appctl(&["dpif-netdev/pmd-rxq-show"]);
        let ok = ["p0", "p1"].iter().all(|p| {
            show.lines()
                .any(|l| l.contains(&format!("port: {p}")) && l.contains("queue-id:  1"))
        });
        ok.then_some(()).ok_or(show)
    });
    in_place();
    link_up("with two RX queues");
    both_ways(8000);

    // del-port and add-port: OVS closes and detaches the device, then probes it again; the
    // interface is taken back where it is.
    ovs.vsctl(&["del-port", &ovs.bridge, "p0"]);
    ovs.add_port("p0", 0, &tap_a, &["mtu_request=9000", "options:n_rxq=2"]);
    assert!(
        !quiet("ip", &["link", "show", &tap_a]),
        "{tap_a} was made anew in the root namespace"
    );
    in_place();
    link_up("after del-port and add-port");
    both_ways(8000);

    // Our driver logged no warning or error.
    let log = ovs.log();
    let ours: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("|WARN|") || l.contains("|ERR|") || l.contains("|EMER|"))
        .filter(|l| l.contains("mlx4rs"))
        .collect();
    assert!(
        ours.is_empty(),
        "warnings from our driver:\n{}",
        ours.join("\n")
    );
    for l in log
        .lines()
        .filter(|l| l.contains("|WARN|") || l.contains("|ERR|"))
    {
        println!("OVS: {l}");
    }
}
