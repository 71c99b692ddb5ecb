//! DPDK's example applications: built from the cached DPDK source package (its `examples/`,
//! whose Makefiles use `pkg-config libdpdk`) into the cargo target directory, and run on our
//! ports with the plugin, as a user would run them.
//!
//! The traffic source is `dpdk-testpmd` in a second process ([`peer`]): each of its ports is
//! joined to the example's port of the same number by a cable file (`wire=cable:<path>`), so
//! what testpmd sends arrives at the example, and what the example sends arrives at testpmd,
//! each side's device counting what it sent and received.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{plugin_dir, Output, PLUGIN};

/// The DPDK source tree the examples come from: `MLX4RS_DPDK_SRC`, or the set-up's cache for
/// the installed DPDK's version.
fn dpdk_src() -> PathBuf {
    if let Some(d) = std::env::var_os("MLX4RS_DPDK_SRC") {
        return PathBuf::from(d);
    }
    let out = Command::new("pkg-config")
        .args(["--modversion", "libdpdk"])
        .output()
        .expect("pkg-config not found: run scripts/setup.sh");
    assert!(
        out.status.success(),
        "pkg-config knows no libdpdk: run scripts/setup.sh"
    );
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let cache = std::env::var_os("MLX4RS_CACHE").unwrap_or_else(|| "/var/cache/mlx4rs".into());
    Path::new(&cache).join(format!("dpdk-stable-{version}"))
}

/// Builds example `dir` (a folder of DPDK's `examples/`) and returns the program at `bin`
/// inside it (e.g. `build/basicfwd`). The examples are copied once into the target
/// directory (the source cache stays read-only) and built with their own Makefiles; `make`
/// rebuilds nothing that is up to date.
pub fn build(dir: &str, bin: &str) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _one_at_a_time = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let src = dpdk_src().join("examples");
    assert!(
        src.join(dir).is_dir(),
        "{} not found: the DPDK source package must be unpacked (scripts/setup.sh)",
        src.join(dir).display()
    );
    let root = plugin_dir().join("dpdk-examples");
    let tree = root.join("examples");
    if !tree.join(dir).is_dir() {
        std::fs::create_dir_all(&root).unwrap();
        let st = Command::new("cp")
            .arg("-r")
            .arg(&src)
            .arg(&root)
            .status()
            .expect("cp");
        assert!(st.success(), "copying {} failed", src.display());
    }
    let out = Command::new("make")
        .arg("-C")
        .arg(tree.join(dir))
        .output()
        .unwrap_or_else(|e| panic!("make not found ({e}): run scripts/setup.sh"));
    assert!(
        out.status.success(),
        "building DPDK's {dir} example failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let exe = tree.join(dir).join(bin);
    assert!(exe.is_file(), "{} not built", exe.display());
    exe
}

/// Cable files joining port `i` of an example to port `i` of its peer, in a scratch directory
/// of their own.
pub struct Cables {
    pub dir: PathBuf,
    pub paths: Vec<PathBuf>,
}

impl Cables {
    pub fn new(tag: &str, ports: usize) -> Cables {
        let dir = super::scratch_dir(tag);
        let paths = (0..ports).map(|i| dir.join(format!("cable{i}"))).collect();
        Cables { dir, paths }
    }

    /// The example's ports: `net_mlx4rs<i>` on cable `i`, MAC 02:ee:00:00:00:0<i> (so that
    /// frames it sends are told from the peer's own), plus `extra` devargs.
    pub fn example_vdevs(&self, extra: &str) -> Vec<String> {
        self.paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                format!(
                    "net_mlx4rs{i},wire=cable:{},mac=02:ee:00:00:00:0{i}{extra}",
                    p.display()
                )
            })
            .collect()
    }

    /// The peer's ports, on the same cables.
    pub fn peer_vdevs(&self) -> Vec<String> {
        self.paths
            .iter()
            .enumerate()
            .map(|(i, p)| format!("net_mlx4rs{i},wire=cable:{}", p.display()))
            .collect()
    }
}

impl Drop for Cables {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running example application and what it printed so far.
pub struct App {
    child: Child,
    stdin: Option<ChildStdin>,
    seen: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl App {
    /// Starts `exe` on lcores `lcores` with the plugin and `vdevs`, then `args` after `--`.
    /// `lib_dirs` are added to the library path (an example's own shared library).
    pub fn start(
        exe: &Path,
        lcores: &str,
        vdevs: &[String],
        args: &[&str],
        lib_dirs: &[PathBuf],
    ) -> App {
        Self::start_with(exe, lcores, vdevs, &[], args, lib_dirs)
    }

    /// As [`App::start`], with `eal` added to the EAL arguments (e.g. a log level).
    pub fn start_with(
        exe: &Path,
        lcores: &str,
        vdevs: &[String],
        eal: &[&str],
        args: &[&str],
        lib_dirs: &[PathBuf],
    ) -> App {
        let mut path = vec![plugin_dir()];
        path.extend(lib_dirs.iter().cloned());
        let mut cmd = Command::new("stdbuf");
        cmd.arg("-oL")
            .arg(exe)
            .current_dir(std::env::temp_dir())
            .env("LD_LIBRARY_PATH", std::env::join_paths(path).unwrap())
            .args(["-l", lcores, "--no-huge", "-m", "256", "--no-pci"])
            .arg(format!("--file-prefix={}", super::file_prefix("example")))
            .args(["-d", PLUGIN])
            .args(eal);
        for v in vdevs {
            cmd.arg("--vdev").arg(v);
        }
        cmd.arg("--").args(args);
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
        let seen = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        let out: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for mut pipe in [out, err] {
            let seen = seen.clone();
            readers.push(std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    seen.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }));
        }
        App {
            stdin: child.stdin.take(),
            child,
            seen,
            readers,
        }
    }

    /// What it printed so far.
    pub fn output(&self) -> String {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until `done` holds for its output (true), it exits, or `limit` passes.
    pub fn wait_for(&mut self, done: impl Fn(&str) -> bool, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if done(&self.output()) {
                return true;
            }
            if self.child.try_wait().unwrap().is_some() {
                return done(&self.output());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Types `line` at its command line.
    pub fn type_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin");
        let _ = writeln!(stdin, "{line}");
        let _ = stdin.flush();
    }

    /// Ends it as a user does, with Ctrl-C (SIGINT), and waits for it (killed after 10 s).
    pub fn interrupt(self) -> Output {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        self.finish(Duration::from_secs(10))
    }

    /// Waits for it to exit by itself (killed after `limit`).
    pub fn finish(mut self, limit: Duration) -> Output {
        drop(self.stdin.take());
        let status = super::wait_or_kill(&mut self.child, limit);
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        Output {
            stdout: self.output(),
            stderr: String::new(),
            status,
        }
    }
}

impl Drop for App {
    fn drop(&mut self) {
        // A test that failed half-way must not leave a polling process behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// testpmd in a second process on the other end of `cables`, fed `steps`; its RX rings are
/// deep (4096) so that a burst an example forwards at once is never more than they hold.
pub fn peer(cables: &Cables, args: &[&str], steps: &[super::Step]) -> Output {
    let vdevs = cables.peer_vdevs();
    let vdevs: Vec<&str> = vdevs.iter().map(String::as_str).collect();
    let mut all_args = vec!["--rxd=4096", "--total-num-mbufs=16384"];
    all_args.extend_from_slice(args);
    super::testpmd_in(
        &super::file_prefix("peer"),
        512,
        &vdevs,
        &all_args,
        steps,
        Duration::from_secs(90),
    )
}
