//! Runs real DPDK programs against the built plugin and hands back what they printed.
//!
//! EAL refuses a `-d` path under a world-writable directory, and a fresh clone may live in
//! one, so the plugin is always passed as a bare file name found through `LD_LIBRARY_PATH`,
//! from a working directory that does not hold it.
#![allow(dead_code)]

pub mod examples;
pub mod huge;
pub mod telemetry;

mod prompt;
use prompt::{cleaned, PROMPT};

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const PLUGIN: &str = "librte_net_mlx4rs.so";

/// The directory holding the plugin that `cargo build` made for this profile.
pub fn plugin_dir() -> PathBuf {
    // target/<profile>/deps/<test binary>
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf();
    assert!(
        dir.join(PLUGIN).is_file(),
        "{} not built: run `cargo build` before the integration tests",
        dir.join(PLUGIN).display()
    );
    dir
}

/// Builds the C program `tests/<src>` against the installed DPDK (`pkg-config libdpdk`) into
/// `dir`, as `name`; fails saying what is missing.
pub fn build_c_program(dir: &ScratchDir, name: &str, src: &str) -> PathBuf {
    let bin = dir.join(name);
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "libdpdk"])
        .output()
        .expect("pkg-config not found: run scripts/setup.sh");
    assert!(
        flags.status.success(),
        "pkg-config finds no libdpdk (DPDK installed? run scripts/setup.sh): {}",
        String::from_utf8_lossy(&flags.stderr)
    );
    let flags = String::from_utf8(flags.stdout).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(src);
    let out = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .args(flags.split_whitespace())
        .output()
        .expect("cc not found");
    assert!(
        out.status.success(),
        "building {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

/// A unique `--file-prefix` so that tests running side by side never share EAL state. Its EAL
/// runtime directory and hugepage files are removed when the test binary exits, whether its
/// tests passed or failed ([`cleanup::at_exit`]); [`EalPrefix`] removes them sooner.
pub fn file_prefix(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let p = format!(
        "mlx4rs-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    cleanup::at_exit(cleanup::Leftover::EalPrefix(p.clone()));
    p
}

/// A `--file-prefix` whose EAL runtime directory and hugepage files go when the guard drops,
/// also when the test fails (unwinding drops it). The programs using it must have exited.
pub struct EalPrefix(pub String);

impl EalPrefix {
    pub fn new(tag: &str) -> EalPrefix {
        EalPrefix(file_prefix(tag))
    }

    /// `--file-prefix=<prefix>`.
    pub fn arg(&self) -> String {
        format!("--file-prefix={}", self.0)
    }
}

impl Drop for EalPrefix {
    fn drop(&mut self) {
        cleanup::remove_eal_prefix(&self.0);
    }
}

/// A scratch directory (see [`scratch_dir`]) removed with everything in it when the guard
/// drops, also when the test fails.
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    pub fn new(tag: &str) -> ScratchDir {
        ScratchDir(scratch_dir(tag))
    }
}

impl std::ops::Deref for ScratchDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What tests leave behind, removed at the latest when the test binary exits.
pub mod cleanup {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    pub enum Leftover {
        /// An EAL `--file-prefix`: its runtime directory and hugepage files.
        EalPrefix(String),
        /// A file or directory tree.
        Path(PathBuf),
        /// A network interface (TAP), deleted with `ip link del`.
        Link(String),
        /// A network namespace, deleted with `ip netns del`.
        Netns(String),
    }

    static LEFT: Mutex<Vec<Leftover>> = Mutex::new(Vec::new());

    extern "C" {
        fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
    }

    extern "C" fn on_exit() {
        let left = match LEFT.lock() {
            Ok(mut l) => std::mem::take(&mut *l),
            Err(p) => std::mem::take(&mut *p.into_inner()),
        };
        for l in left {
            remove(&l);
        }
    }

    /// Removes `what` when the test binary exits. The test harness ends the process with
    /// `exit` whether tests passed or failed, which runs the handler; only a kill skips it.
    pub fn at_exit(what: Leftover) {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: registers a plain `extern "C"` function that only takes a lock and
            // removes files; `atexit` has no other precondition.
            let rc = unsafe { atexit(on_exit) };
            assert_eq!(rc, 0, "atexit");
        });
        LEFT.lock().unwrap_or_else(|p| p.into_inner()).push(what);
    }

    pub fn remove(what: &Leftover) {
        match what {
            Leftover::EalPrefix(p) => remove_eal_prefix(p),
            Leftover::Path(p) => {
                let _ = std::fs::remove_dir_all(p).or_else(|_| std::fs::remove_file(p));
            }
            Leftover::Link(name) => {
                if Path::new("/sys/class/net").join(name).exists() {
                    let _ = std::process::Command::new("ip")
                        .args(["link", "del", name])
                        .status();
                }
            }
            Leftover::Netns(name) => {
                if Path::new("/run/netns").join(name).exists() {
                    let _ = std::process::Command::new("ip")
                        .args(["netns", "del", name])
                        .status();
                }
            }
        }
    }

    /// EAL's runtime directory for `prefix` (as root `/var/run/dpdk/<prefix>`; otherwise under
    /// `XDG_RUNTIME_DIR`, else `/tmp`), and every `<prefix>map_*` file in a hugetlbfs mount.
    pub fn remove_eal_prefix(prefix: &str) {
        let _ = std::fs::remove_dir_all(eal_runtime_base().join(prefix));
        let mine = format!("{prefix}map_");
        for dir in hugetlbfs_mounts() {
            let Ok(rd) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(&mine) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }

    /// Removes what the tests' prefixes (`mlx4rs-<tag>-<pid>-<n>`, see [`super::file_prefix`])
    /// left behind when the test binary that chose them is gone: a killed run skips its
    /// exit handler, and its hugepage files would hold memory the next run needs.
    pub fn sweep_dead_prefixes() {
        let mut dead = std::collections::BTreeSet::new();
        let mut consider = |name: &str| {
            let Some(rest) = name.strip_prefix("mlx4rs-") else {
                return;
            };
            let prefix = rest.split_once("map_").map_or(rest, |(p, _)| p);
            let mut fields = prefix.rsplit('-');
            let (Some(n), Some(pid)) = (fields.next(), fields.next()) else {
                return;
            };
            let alive = Path::new("/proc").join(pid).exists();
            if n.parse::<u32>().is_ok() && pid.parse::<u32>().is_ok() && !alive {
                dead.insert(format!("mlx4rs-{prefix}"));
            }
        };
        for dir in [eal_runtime_base()]
            .into_iter()
            .chain(hugetlbfs_mounts().into_iter().map(PathBuf::from))
        {
            if let Ok(rd) = std::fs::read_dir(dir) {
                for e in rd.flatten() {
                    consider(&e.file_name().to_string_lossy());
                }
            }
        }
        for p in dead {
            remove_eal_prefix(&p);
        }
    }

    fn eal_runtime_base() -> PathBuf {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc_geteuid() } == 0;
        if root {
            PathBuf::from("/var/run/dpdk")
        } else {
            std::env::var_os("XDG_RUNTIME_DIR")
                .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from)
                .join("dpdk")
        }
    }

    fn hugetlbfs_mounts() -> Vec<String> {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        mounts
            .lines()
            .filter(|l| l.split(' ').nth(2) == Some("hugetlbfs"))
            .filter_map(|l| l.split(' ').nth(1).map(str::to_owned))
            .collect()
    }

    extern "C" {
        #[link_name = "geteuid"]
        fn libc_geteuid() -> u32;
    }
}

pub struct Output {
    pub stdout: String,
    pub stderr: String,
    pub status: std::process::ExitStatus,
}

impl Output {
    /// stdout and stderr together: EAL logs go to stderr, testpmd's answers to stdout.
    pub fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }

    pub fn count(&self, needle: &str) -> usize {
        self.all().matches(needle).count()
    }
}

/// One step of an interactive testpmd session.
pub enum Step<'a> {
    /// A command, answered before the next step: the session waits for the prompt that
    /// follows its answer (at most [`ANSWER_LIMIT`]), except after `quit`, which has none.
    Cmd(&'a str),
    /// A pause, only where nothing testpmd can print marks the moment waited for (DPDK's C
    /// mlx4 has no counter for what the device drops): each use says why. Everywhere else a
    /// step waits for a condition.
    Sleep(u64),
    /// A shell command run at this point of the session (its failure fails the test).
    Shell(&'a str),
    /// A command written without waiting for its answer: for long scripted sessions of
    /// commands that complete before testpmd reads the next line (port stop/start/config).
    Quick(&'a str),
    /// Repeats `cmd` until the sum of the numbers after `key` in its answer has grown by `by`
    /// since its first answer, or `limit` passes: a counter that must move again in a second
    /// run of the same session.
    Grows {
        cmd: &'a str,
        key: &'a str,
        by: u64,
        limit: Duration,
    },
    /// Repeats a command (every 20 ms, each time once its answer is complete, i.e. the next
    /// prompt appeared) until `done` holds for its answer, or `limit` passes: waiting for a
    /// condition instead of sleeping for a guess.
    Until {
        cmd: &'a str,
        done: fn(&str) -> bool,
        limit: Duration,
    },
}

/// How long traffic may take to show in the counters after `start`, however slowly a loaded
/// machine schedules the lcore and the device threads.
pub const TRAFFIC_LIMIT: Duration = Duration::from_secs(20);

/// Every port of a `show fwd stats all` (or `show port stats ...`) answer has sent `N`.
pub fn every_port_sent<const N: u64>(answer: &str) -> bool {
    let tx = numbers_after(answer, "TX-packets:");
    !tx.is_empty() && tx.iter().all(|&n| n >= N)
}

/// Every port of the answer has received `N`.
pub fn every_port_received<const N: u64>(answer: &str) -> bool {
    let rx = numbers_after(answer, "RX-packets:");
    !rx.is_empty() && rx.iter().all(|&n| n >= N)
}

/// Every port of the answer has received and sent `N`.
pub fn every_port_moved<const N: u64>(answer: &str) -> bool {
    let rx = numbers_after(answer, "RX-packets:");
    let tx = numbers_after(answer, "TX-packets:");
    !rx.is_empty() && rx.len() == tx.len() && rx.iter().chain(&tx).all(|&n| n >= N)
}

/// After `start`: until every forwarding port has sent. It asks `show fwd stats all`, which
/// counts since `start` and leaves the ports' own statistics blocks, which tests parse, alone.
pub const SENT: Step<'static> = Step::Until {
    cmd: "show fwd stats all",
    done: every_port_sent::<1>,
    limit: TRAFFIC_LIMIT,
};

/// After `start`: until every forwarding port has received and sent.
pub const MOVED: Step<'static> = Step::Until {
    cmd: "show fwd stats all",
    done: every_port_moved::<1>,
    limit: TRAFFIC_LIMIT,
};

/// How long a command may take to be answered: port start with its device set-up and
/// BlueFlame self-test takes tens of milliseconds, far longer on a loaded 2-core machine.
pub const ANSWER_LIMIT: Duration = Duration::from_secs(60);

/// Writes `cmd` and returns its answer. testpmd prints one prompt at start and one after each
/// line it has processed, so with `written` lines before this one, the answer lies between
/// prompt `written + 1` and prompt `written + 2` (or is whatever arrived within `limit`).
/// The answer is given up on once `reader` (the thread reading testpmd's stdout) has seen it
/// exit.
fn ask(
    stdin: &mut std::process::ChildStdin,
    seen: &std::sync::Mutex<String>,
    written: &mut usize,
    cmd: &str,
    limit: Duration,
    reader: &std::thread::JoinHandle<String>,
) -> String {
    // A closed pipe means testpmd already exited; the output tells why.
    let _ = writeln!(stdin, "{cmd}");
    *written += 1;
    let start = Instant::now();
    loop {
        {
            let text = cleaned(&seen.lock().unwrap());
            let prompts: Vec<usize> = text.match_indices(PROMPT).map(|(i, _)| i).collect();
            if prompts.len() > *written {
                let from = prompts[*written - 1] + PROMPT.len();
                return text[from..prompts[*written]].to_owned();
            }
            if start.elapsed() > limit || reader.is_finished() {
                let from = prompts.last().map_or(0, |i| i + PROMPT.len());
                return text[from..].to_owned();
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Runs `dpdk-testpmd` with the plugin and `vdevs`, feeding `steps` to its `-i` prompt over a
/// pipe, and waits for it to exit (at most `limit`).
pub fn testpmd(vdevs: &[&str], app_args: &[&str], steps: &[Step], limit: Duration) -> Output {
    let prefix = EalPrefix::new("testpmd");
    testpmd_in(&prefix.0, 512, vdevs, app_args, steps, limit)
}

/// As [`testpmd`], with a chosen `--file-prefix` (so a test can find the process by it) and
/// `mem_mb` of EAL memory.
pub fn testpmd_in(
    prefix: &str,
    mem_mb: u32,
    vdevs: &[&str],
    app_args: &[&str],
    steps: &[Step],
    limit: Duration,
) -> Output {
    // The runtime directory goes once testpmd has exited, even if the session panics.
    let _prefix = EalPrefix(prefix.to_owned());
    let dir = plugin_dir();
    // Line-buffered stdout: testpmd prints with stdio but its prompt with write(2), so a
    // block-buffered pipe would splice prompts into the middle of lines.
    let mut cmd = Command::new("stdbuf");
    cmd.args(["-oL", "dpdk-testpmd"])
        .current_dir(std::env::temp_dir())
        .env("LD_LIBRARY_PATH", &dir)
        .args([
            "-l",
            "0-1",
            "--no-huge",
            "-m",
            &mem_mb.to_string(),
            "--no-pci",
        ])
        .arg(format!("--file-prefix={prefix}"))
        .args(["-d", PLUGIN]);
    for v in vdevs {
        cmd.arg("--vdev").arg(v);
    }
    cmd.arg("--").arg("-i").args(app_args);
    run_interactive(cmd, steps, limit)
}

/// A child process killed (and reaped) when the guard drops without it having exited: a test
/// that fails in the middle of a session leaves no program running.
pub struct KillOnDrop(pub std::process::Child);

impl std::ops::Deref for KillOnDrop {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

pub fn run_interactive(mut cmd: Command, steps: &[Step], limit: Duration) -> Output {
    let mut child = KillOnDrop(
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{cmd:?} cannot start ({e}): run scripts/setup.sh")),
    );
    let mut stdin = child.stdin.take().unwrap();
    let out_pipe = child.stdout.take().unwrap();
    let err_pipe = child.stderr.take().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let seen_w = seen.clone();
    let out_t = std::thread::spawn(move || read_all_into(out_pipe, &seen_w));
    let err_t = std::thread::spawn(move || read_all(err_pipe));
    // Commands typed before the prompt would race initialisation (slow on a busy 2-core
    // machine): wait for the first prompt, or for the program to give up.
    let start = Instant::now();
    while !cleaned(&seen.lock().unwrap()).contains(PROMPT) && start.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Lines written so far: each earns one prompt once testpmd has processed it.
    let mut written = 0usize;
    for s in steps {
        match s {
            Step::Cmd("quit") => {
                written += 1;
                // A closed pipe means testpmd already exited; the output tells why.
                let _ = writeln!(stdin, "quit");
            }
            Step::Cmd(c) => {
                ask(&mut stdin, &seen, &mut written, c, ANSWER_LIMIT, &out_t);
            }
            Step::Quick(c) => {
                let _ = writeln!(stdin, "{c}");
                written += 1;
            }
            Step::Until { cmd, done, limit } => {
                let mut query = |c: &str| ask(&mut stdin, &seen, &mut written, c, *limit, &out_t);
                if let Err(answer) = repeat(&mut query, cmd, *limit, &out_t, done) {
                    eprintln!("gave up waiting after {limit:?}; last answer to {cmd:?}:\n{answer}");
                }
            }
            Step::Sleep(ms) => std::thread::sleep(Duration::from_millis(*ms)),
            Step::Grows {
                cmd,
                key,
                by,
                limit,
            } => {
                let sum = |a: &str| numbers_after(a, key).iter().sum::<u64>();
                let mut query = |c: &str| ask(&mut stdin, &seen, &mut written, c, *limit, &out_t);
                let from = sum(&query(cmd));
                if let Err(answer) =
                    repeat(&mut query, cmd, *limit, &out_t, |a| sum(a) >= from + by)
                {
                    eprintln!(
                        "gave up waiting after {limit:?} for {key} to grow by {by}:\n{answer}"
                    );
                }
            }
            Step::Shell(c) => {
                let _ = stdin.flush();
                let st = Command::new("sh").arg("-c").arg(c).status().expect("sh");
                assert!(st.success(), "shell step failed: {c}");
            }
        }
    }
    drop(stdin);
    let status = wait_or_kill(&mut child, limit);
    Output {
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
        status,
    }
}

/// Asks `cmd` (every 20 ms, each time once its answer is complete) until `done` holds for
/// its answer; the last answer if `limit` passed or testpmd (`reader`) exited first.
fn repeat(
    ask: &mut impl FnMut(&str) -> String,
    cmd: &str,
    limit: Duration,
    reader: &std::thread::JoinHandle<String>,
    done: impl Fn(&str) -> bool,
) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let answer = ask(cmd);
        if done(&answer) {
            return Ok(());
        }
        if start.elapsed() > limit || reader.is_finished() {
            return Err(answer);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` to exit, killing it once `limit` has passed.
pub fn wait_or_kill(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    wait_until(child, limit).unwrap_or_else(|| {
        let _ = child.kill();
        child.wait().unwrap()
    })
}

/// Waits for `child` to exit for at most `limit`; `None` if it still runs.
pub fn wait_until(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_all_into(mut r: impl std::io::Read, seen: &std::sync::Mutex<String>) -> String {
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => seen
                .lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n])),
        }
    }
    let s = seen.lock().unwrap().clone();
    s
}

fn read_all(mut r: impl std::io::Read) -> String {
    let mut v = Vec::new();
    let _ = r.read_to_end(&mut v);
    String::from_utf8_lossy(&v).into_owned()
}

/// The first number after `key` in `text` (testpmd prints `RX-packets: 123` and the like).
pub fn number_after(text: &str, key: &str) -> Option<u64> {
    let i = text.find(key)? + key.len();
    text[i..]
        .trim_start_matches([':', ' ', '\t', '='])
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// All numbers after each occurrence of `key`.
pub fn numbers_after(text: &str, key: &str) -> Vec<u64> {
    let mut v = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(key) {
        rest = &rest[i + key.len()..];
        if let Some(n) = number_after(rest, "") {
            v.push(n);
        }
    }
    v
}

/// The value of an xstat as `show port xstats` prints it (`name: value`).
pub fn xstat(text: &str, name: &str) -> Option<u64> {
    text.lines().rev().find_map(|l| {
        let (k, v) = l.trim().split_once(':')?;
        (k.trim() == name).then(|| v.trim().parse().ok())?
    })
}

/// testpmd's command that prints every mempool: `dump_mempool` up to 24.11, `dump mempool` from
/// 25.11 (testpmd's dump commands took spaces then).
pub fn dump_mempool() -> &'static str {
    static CMD: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    CMD.get_or_init(|| {
        let out = std::process::Command::new("pkg-config")
            .args(["--modversion", "libdpdk"])
            .output()
            .expect("pkg-config not found: run scripts/setup.sh");
        let v = String::from_utf8_lossy(&out.stdout);
        let year: u32 = v
            .split('.')
            .next()
            .and_then(|y| y.trim().parse().ok())
            .unwrap_or_else(|| {
                panic!("pkg-config --modversion libdpdk said {v:?}: run scripts/setup.sh")
            });
        if year >= 25 {
            "dump mempool"
        } else {
            "dump_mempool"
        }
    })
}

/// mbufs in use in each `dump_mempool` of the session (populated less the cached and the free).
pub fn in_use(text: &str) -> Vec<u64> {
    let pop = numbers_after(text, "populated_size=");
    let cached = numbers_after(text, "total_cache_count=");
    let free = numbers_after(text, "common_pool_count=");
    assert_eq!(pop.len(), cached.len());
    assert_eq!(pop.len(), free.len());
    pop.iter()
        .zip(&cached)
        .zip(&free)
        .map(|((p, c), f)| p - c - f)
        .collect()
}

/// xstat `name` of port `port` from the last `show port xstats` output for that port.
pub fn port_xstat(all: &str, port: u32, name: &str) -> u64 {
    let marker = format!("NIC extended statistics for port {port}");
    let start = all
        .rfind(&marker)
        .unwrap_or_else(|| panic!("no xstats of port {port}:\n{all}"));
    let rest = &all[start + marker.len()..];
    let end = rest
        .find("NIC extended statistics for port")
        .unwrap_or(rest.len());
    xstat(&rest[..end], name).unwrap_or_else(|| panic!("no {name} for port {port}:\n{all}"))
}

/// Frames of a classic pcap file (microsecond, either byte order).
pub fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (out, end) = pcap_records(&b);
    assert_eq!(end, b.len(), "no trailing bytes");
    out
}

/// The whole frames of a pcap file another process may still be writing (its last record may
/// be partial), and where they end.
pub fn pcap_records(b: &[u8]) -> (Vec<Vec<u8>>, usize) {
    assert!(b.len() >= 24, "pcap header");
    let le = match &b[..4] {
        [0xd4, 0xc3, 0xb2, 0xa1] => true,
        [0xa1, 0xb2, 0xc3, 0xd4] => false,
        m => panic!("not a pcap file: magic {m:02x?}"),
    };
    let u32_at = |i: usize| {
        let w = [b[i], b[i + 1], b[i + 2], b[i + 3]];
        if le {
            u32::from_le_bytes(w)
        } else {
            u32::from_be_bytes(w)
        }
    };
    assert_eq!(u32_at(20), 1, "LINKTYPE_ETHERNET");
    let mut out = Vec::new();
    let mut i = 24;
    while i + 16 <= b.len() {
        let incl = u32_at(i + 8) as usize;
        let orig = u32_at(i + 12) as usize;
        assert_eq!(incl, orig, "frames are never truncated");
        if i + 16 + incl > b.len() {
            break;
        }
        out.push(b[i + 16..i + 16 + incl].to_vec());
        i += 16 + incl;
    }
    (out, i)
}

/// A scratch directory that is not world-writable (EAL and our pcap paths live there); removed
/// when the test binary exits at the latest ([`ScratchDir`] removes it sooner).
pub fn scratch_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("{}-{}", file_prefix(tag), "dir"));
    std::fs::create_dir_all(&d).unwrap();
    cleanup::at_exit(cleanup::Leftover::Path(d.clone()));
    d
}

/// Internet checksum over `data` (0 when a header with its checksum in place is valid).
pub fn inet_csum(data: &[u8]) -> u16 {
    let mut s: u32 = 0;
    for c in data.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}
