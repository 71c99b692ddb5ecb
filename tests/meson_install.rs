//! The meson build and a staged install, exercised as a user would: `meson setup`, `ninja`,
//! `DESTDIR=... ninja install`, then the installed C application and testpmd against the
//! staged files. Nothing is installed into the system; each test checks that the system's
//! DPDK driver directory is as it was.

mod common;

use common::{file_prefix, run_interactive, Output, Step::*};
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);
const LIB: &str = "librte_net_mlx4rs.so";
const EAL_ARGS: &[&str] = &["-l", "0-1", "--no-huge", "-m", "512", "--no-pci"];

struct Stage {
    /// `DESTDIR` of the install.
    destdir: PathBuf,
    /// The meson build directory.
    build: PathBuf,
    /// The directory EAL of the installed DPDK loads drivers from (system path).
    pmd_dir: PathBuf,
    /// What that directory held before anything here ran.
    system_before: Vec<String>,
    /// A private directory whose ancestors are not world-writable, for `-d` paths.
    private: PathBuf,
}

impl Stage {
    /// `pmd_dir` as staged under `DESTDIR`.
    fn staged_pmd_dir(&self) -> PathBuf {
        self.destdir.join(self.pmd_dir.strip_prefix("/").unwrap())
    }

    /// 1 when the machine has the driver installed for real: EAL then loads that copy too,
    /// after ours, and it withdraws with one more warning.
    fn system_copies(&self) -> usize {
        self.pmd_dir.join(LIB).exists() as usize
    }

    fn assert_system_unchanged(&self) {
        assert_eq!(
            system_listing(&self.pmd_dir),
            self.system_before,
            "the system's DPDK driver directory {} changed",
            self.pmd_dir.display()
        );
    }
}

/// The repository's cargo target directory (this binary is target/<profile>/deps/<name>).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .nth(3)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

/// The driver directory the installed EAL loads by itself, read the way EAL's tooling reads
/// it (the embedded `DPDK_PLUGIN_PATH=`), independently of the meson helper.
fn system_pmd_dir() -> PathBuf {
    let libdir = String::from_utf8(
        Command::new("pkg-config")
            .args(["--variable=libdir", "libdpdk"])
            .output()
            .expect("pkg-config")
            .stdout,
    )
    .unwrap();
    let eal = fs::read(Path::new(libdir.trim()).join("librte_eal.so")).expect("librte_eal.so");
    let key = b"DPDK_PLUGIN_PATH=";
    let at = eal
        .windows(key.len())
        .position(|w| w == key)
        .expect("DPDK_PLUGIN_PATH in librte_eal")
        + key.len();
    let end = eal[at..].iter().position(|&b| b == 0).unwrap() + at;
    PathBuf::from(String::from_utf8(eal[at..end].to_vec()).unwrap())
}

/// Names, sizes and modification times: enough to see an install or a removal.
fn system_listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| {
                    let m = fs::symlink_metadata(e.path()).unwrap();
                    format!("{:?} {} {:?}", e.file_name(), m.len(), m.modified().ok())
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The first ancestor of `p` (or `p` itself) that anyone may write to: EAL refuses `-d`
/// paths below such a directory.
fn world_writable_ancestor(p: &Path) -> Option<PathBuf> {
    p.ancestors()
        .find(|a| fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o002 != 0))
        .map(Path::to_path_buf)
}

/// A fresh mode-0700 directory for staged files, in the target directory when EAL would
/// accept it there, else in a place that is not world-writable.
fn private_dir(tag: &str) -> PathBuf {
    let name = format!("mlx4rs-{tag}-{}", std::process::id());
    let mut candidates = vec![target_dir().join("meson-test")];
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join(".cache"));
    }
    candidates.push(PathBuf::from("/var/cache/mlx4rs"));
    for base in candidates {
        if fs::create_dir_all(&base).is_err() {
            continue;
        }
        let base = fs::canonicalize(base).unwrap();
        if world_writable_ancestor(&base).is_some() {
            continue;
        }
        remove_stale(&base, tag);
        let dir = base.join(&name);
        let _ = fs::remove_dir_all(&dir);
        if fs::DirBuilder::new().mode(0o700).create(&dir).is_ok() {
            return dir;
        }
    }
    panic!("no directory without a world-writable ancestor to stage the plugin in");
}

/// Staging directories of earlier runs whose process is gone (a failed run leaves its files
/// for inspection; the next run clears them).
fn remove_stale(base: &Path, tag: &str) {
    let prefix = format!("mlx4rs-{tag}-");
    for e in fs::read_dir(base)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
    {
        let name = e.file_name();
        let pid = name.to_str().and_then(|n| n.strip_prefix(&prefix));
        if pid.is_some_and(|p| !Path::new("/proc").join(p).exists()) {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (run scripts/setup.sh)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// meson setup, ninja and a staged install, once for all tests of this binary.
fn stage() -> &'static Stage {
    static STAGE: OnceLock<Stage> = OnceLock::new();
    STAGE.get_or_init(|| {
        let pmd_dir = system_pmd_dir();
        let system_before = system_listing(&pmd_dir);
        let private = private_dir("meson");
        let build = private.join("build");
        let destdir = private.join("stage");
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        run(Command::new("meson")
            .arg("setup")
            .arg(&build)
            .arg(repo.join("meson"))
            .arg(format!("-Dcargo_target_dir={}", target_dir().display())));
        run(Command::new("ninja").arg("-C").arg(&build));
        run(Command::new("ninja")
            .arg("-C")
            .arg(&build)
            .arg("install")
            .env("DESTDIR", &destdir));
        Stage {
            destdir,
            build,
            pmd_dir,
            system_before,
            private,
        }
    })
}

/// A staged file by name, wherever meson's prefix and libdir put it under `DESTDIR`.
fn staged(st: &Stage, name: &str) -> PathBuf {
    fn find(dir: &Path, name: &str) -> Option<PathBuf> {
        for e in fs::read_dir(dir).ok()?.filter_map(Result::ok) {
            let p = e.path();
            if p.file_name().is_some_and(|n| n == name) {
                return Some(p);
            }
            if p.is_dir() {
                if let Some(f) = find(&p, name) {
                    return Some(f);
                }
            }
        }
        None
    }
    find(&st.destdir, name).unwrap_or_else(|| panic!("{name} not staged"))
}

fn pkg_config(st: &Stage, args: &[&str]) -> String {
    let pc = staged(st, "libdpdk-mlx4rs.pc");
    let out = run(Command::new("pkg-config")
        .env("PKG_CONFIG_PATH", pc.parent().unwrap())
        .args(args)
        .arg("libdpdk-mlx4rs"));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Runs a DPDK program to completion with EAL's usual test arguments.
fn run_eal(program: &Path, ld_path: &Path, extra: &[&str], app: &[&str]) -> Output {
    let mut cmd = Command::new(program);
    cmd.current_dir("/")
        .env("LD_LIBRARY_PATH", ld_path)
        .args(EAL_ARGS)
        .arg(format!("--file-prefix={}", file_prefix("meson")))
        .args(extra)
        .arg("--")
        .args(app);
    run_interactive(cmd, &[], LIMIT)
}

/// testpmd with the given EAL plugin options and one `net_mlx4rs` port; shows what it probed.
fn testpmd_with(plugins: &[&Path]) -> Output {
    let mut cmd = Command::new("dpdk-testpmd");
    cmd.current_dir("/")
        .env_remove("LD_LIBRARY_PATH")
        .args(EAL_ARGS)
        .arg(format!("--file-prefix={}", file_prefix("meson-testpmd")));
    for p in plugins {
        cmd.arg("-d").arg(p);
    }
    cmd.args([
        "--vdev",
        "net_mlx4rs0",
        "--",
        "-i",
        "--total-num-mbufs=2048",
    ]);
    run_interactive(
        cmd,
        &[
            Cmd("show port summary all"),
            Cmd("show port info 0"),
            Cmd("quit"),
        ],
        LIMIT,
    )
}

#[test]
fn staged_install_lands_in_eal_driver_dir_with_pkg_config() {
    let st = stage();
    let lib = st.staged_pmd_dir().join(LIB);
    assert!(lib.is_file(), "{} not staged", lib.display());
    assert_eq!(
        fs::read(&lib).unwrap(),
        fs::read(st.build.join(LIB)).unwrap(),
        "the staged plugin is the one ninja built"
    );
    assert_eq!(
        pkg_config(st, &["--variable=pmddir"]),
        st.pmd_dir.to_str().unwrap(),
        "the .pc file names EAL's driver directory"
    );
    let libs = pkg_config(st, &["--libs"]);
    assert!(libs.contains("-lrte_net_mlx4rs"), "{libs}");
    assert!(libs.contains("-lrte_ethdev"), "libdpdk comes along: {libs}");
    st.assert_system_unchanged();
}

#[test]
fn c_app_links_the_staged_driver_and_counts_every_frame() {
    let st = stage();
    let pmd = st.staged_pmd_dir();
    let installed = staged(st, "mlx4rs-txcheck");

    // Also link a fresh copy by hand through the staged .pc, as a user's build would.
    let by_hand = st.private.join("txcheck-pc");
    let pmddir_def = format!("--define-variable=pmddir={}", pmd.display());
    let cflags = pkg_config(st, &["--cflags"]);
    let libs = pkg_config(st, &[&pmddir_def, "--libs"]);
    run(Command::new("cc")
        .arg("-o")
        .arg(&by_hand)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("apps/c_txcheck/txcheck.c"))
        .args(cflags.split_whitespace())
        .args(libs.split_whitespace()));

    for app in [&installed, &by_hand] {
        let out = run_eal(
            app,
            &pmd,
            &["--vdev", "net_mlx4rs0"],
            &["--packets", "1000", "--size", "64"],
        );
        let all = out.all();
        assert!(out.status.success(), "{}:\n{all}", app.display());
        assert!(
            all.contains(
                "txcheck: PASS: port 0 sent 1000 x 64 B: opackets 1000, hca_tx_frames 1000"
            ),
            "{}:\n{all}",
            app.display()
        );
        assert_eq!(
            out.count("already registered"),
            st.system_copies(),
            "one copy only:\n{all}"
        );
    }
    st.assert_system_unchanged();
}

#[test]
fn c_app_fails_clearly_without_a_port() {
    let st = stage();
    let app = st.build.join("mlx4rs-txcheck");
    let out = run_eal(&app, &st.staged_pmd_dir(), &[], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", out.all());
    assert!(
        out.stdout.contains("txcheck: FAIL: no net_mlx4rs port"),
        "{}",
        out.all()
    );
    st.assert_system_unchanged();
}

#[test]
fn testpmd_loads_the_staged_driver_dir_through_eal_plugin_path() {
    let st = stage();
    let pmd = st.staged_pmd_dir();
    assert_eq!(world_writable_ancestor(&pmd), None);
    let out = testpmd_with(&[&pmd]);
    let all = out.all();
    assert!(out.status.success(), "{all}");
    assert!(all.contains("Number of available ports: 1"), "{all}");
    assert!(all.contains("Driver name: net_mlx4rs"), "{all}");
    assert_eq!(out.count("already registered"), st.system_copies(), "{all}");
    assert!(all.contains("Bye..."), "{all}");
    st.assert_system_unchanged();
}

#[test]
fn two_copies_register_once_and_the_explicit_one_wins() {
    let st = stage();
    let dir = st.staged_pmd_dir();
    // An "installed" copy in a driver directory, and an explicit copy of another file.
    let explicit = st.private.join("explicit");
    fs::DirBuilder::new().mode(0o700).create(&explicit).unwrap();
    let explicit = explicit.join(LIB);
    fs::copy(st.build.join(LIB), &explicit).unwrap();

    // EAL loads plugin files before it expands plugin directories, whatever the order.
    for order in [[dir.as_path(), &explicit], [&explicit, dir.as_path()]] {
        let out = testpmd_with(&order);
        let all = out.all();
        assert!(out.status.success(), "{all}");
        assert_eq!(
            out.count("already registered"),
            1 + st.system_copies(),
            "{all}"
        );
        let warning = format!(
            "net_mlx4rs: driver already registered by {}; this copy ({}) stays unregistered",
            explicit.display(),
            dir.join(LIB).display()
        );
        assert!(all.contains(&warning), "expected `{warning}` in:\n{all}");
        assert!(all.contains("Number of available ports: 1"), "{all}");
        assert_eq!(out.count("Driver name: net_mlx4rs"), 1, "{all}");
        assert!(all.contains("Bye..."), "{all}");
    }
    st.assert_system_unchanged();
}
