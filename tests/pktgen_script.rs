//! `scripts/pktgen.sh`: which programs it accepts as `PKTGEN`, and (with a real Pktgen-DPDK in
//! `PKTGEN`) a short measurement whose counts must add up; the Pktgen row of
//! `scripts/c-mlx4-bench.sh` likewise.
//!
//! The project holds no Pktgen, so the checks run against small programs built here that look
//! like one in exactly one way less each: a shell script, a program built against another
//! DPDK, one without Lua, and one with everything (which `--check` must accept).

mod common;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Runs `scripts/pktgen.sh` with `PKTGEN` set to `pktgen` (or removed) and the given arguments.
fn run(pktgen: Option<&Path>, args: &[&str]) -> Output {
    run_script("pktgen.sh", pktgen, args)
}

fn run_script(name: &str, pktgen: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("scripts")
            .join(name),
    )
    .args(args)
    .env_remove("PKTGEN");
    if let Some(p) = pktgen {
        cmd.env("PKTGEN", p);
    }
    cmd.output().expect("bash runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Fails with `needle` in the message, and never reached the measuring part.
fn assert_refused(out: &Output, needle: &str) {
    let err = stderr(out);
    assert!(!out.status.success(), "accepted:\n{err}");
    assert!(err.contains(needle), "expected '{needle}' in:\n{err}");
    assert!(!err.contains("== tx-bf"), "went on to measure:\n{err}");
}

fn pkg_config_libdir() -> PathBuf {
    let out = Command::new("pkg-config")
        .args(["--variable=libdir", "libdpdk"])
        .output()
        .expect("pkg-config runs (scripts/setup.sh installs it)");
    assert!(out.status.success(), "pkg-config finds no libdpdk");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn cc(args: &[&str], dir: &Path) {
    let out = Command::new("cc")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("these tests build small programs with cc, which is not installed");
    assert!(
        out.status.success(),
        "cc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Programs that carry Pktgen's version string, built once per test binary.
struct Fakes {
    /// Links a `librte_eal.so.99` that the loader cannot find (built against another DPDK).
    other_dpdk: PathBuf,
    /// Links the installed DPDK's EAL, but no Lua.
    no_lua: PathBuf,
    /// Links the installed EAL and a Lua 5.3: everything the check asks for.
    complete: PathBuf,
    /// A shell script.
    shell: PathBuf,
}

fn fakes() -> &'static Fakes {
    static FAKES: OnceLock<Fakes> = OnceLock::new();
    FAKES.get_or_init(|| {
        let dir = common::scratch_dir("pktgen-fakes");
        fs::write(
            dir.join("fake.c"),
            "const char *version = \"Pktgen 23.06.1\";\nint main(void) { return *version == 0; }\n",
        )
        .unwrap();
        // A stand-in EAL of another ABI: linked against, then removed from the loader's view.
        fs::create_dir_all(dir.join("other")).unwrap();
        fs::write(dir.join("eal.c"), "int rte_eal_init(void) { return 0; }\n").unwrap();
        cc(
            &[
                "-shared",
                "-fPIC",
                "-Wl,-soname,librte_eal.so.99",
                "-o",
                "other/librte_eal.so.99",
                "eal.c",
            ],
            &dir,
        );
        cc(
            &[
                "-o",
                "other-dpdk",
                "fake.c",
                "-Wl,--no-as-needed",
                "other/librte_eal.so.99",
            ],
            &dir,
        );
        let libdir = pkg_config_libdir();
        let eal = libdir.join("librte_eal.so");
        let eal = eal.to_str().unwrap();
        cc(&["-o", "no-lua", "fake.c", "-Wl,--no-as-needed", eal], &dir);
        // Lua as Pktgen links it, a stand-in found through the program's rpath (the machine
        // need not have Lua).
        fs::create_dir_all(dir.join("lua")).unwrap();
        fs::write(dir.join("lua.c"), "int luaL_newstate(void) { return 0; }\n").unwrap();
        cc(
            &[
                "-shared",
                "-fPIC",
                "-Wl,-soname,liblua5.3.so.0",
                "-o",
                "lua/liblua5.3.so.0",
                "lua.c",
            ],
            &dir,
        );
        let rpath = format!("-Wl,-rpath,{}", dir.join("lua").display());
        cc(
            &[
                "-o",
                "complete",
                "fake.c",
                "-Wl,--no-as-needed",
                eal,
                "lua/liblua5.3.so.0",
                &rpath,
            ],
            &dir,
        );
        let shell = dir.join("pktgen.sh-lookalike");
        fs::write(&shell, "#!/bin/sh\n# Pktgen 23.06.1\nexit 0\n").unwrap();
        Command::new("chmod")
            .arg("+x")
            .arg(&shell)
            .status()
            .unwrap();
        Fakes {
            other_dpdk: dir.join("other-dpdk"),
            no_lua: dir.join("no-lua"),
            complete: dir.join("complete"),
            shell,
        }
    })
}

#[test]
fn pktgen_unset_is_refused() {
    assert_refused(&run(None, &[]), "PKTGEN is not set");
}

#[test]
fn pktgen_missing_is_refused() {
    let p = common::scratch_dir("pktgen-missing").join("no-such-pktgen");
    assert_refused(&run(Some(&p), &[]), "is not an executable file");
}

#[test]
fn another_dpdk_program_is_not_pktgen() {
    let testpmd = Path::new("/usr/bin/dpdk-testpmd");
    assert!(
        testpmd.exists(),
        "dpdk-testpmd is not installed (scripts/setup.sh)"
    );
    assert_refused(&run(Some(testpmd), &[]), "is not Pktgen-DPDK");
}

#[test]
fn a_script_is_not_a_linked_pktgen() {
    assert_refused(
        &run(Some(&fakes().shell), &[]),
        "is not a dynamically linked program",
    );
}

#[test]
fn pktgen_of_another_dpdk_is_refused() {
    let out = run(Some(&fakes().other_dpdk), &[]);
    assert_refused(&out, "was not built against the installed DPDK");
    assert!(
        stderr(&out).contains("librte_eal.so.99"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn pktgen_without_lua_is_refused() {
    assert_refused(
        &run(Some(&fakes().no_lua), &[]),
        "was built without Lua support",
    );
}

#[test]
fn check_accepts_pktgen_built_against_this_dpdk() {
    let out = run(Some(&fakes().complete), &["--check"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    let installed = std::process::Command::new("pkg-config")
        .args(["--modversion", "libdpdk"])
        .output()
        .expect("pkg-config not found: run scripts/setup.sh");
    let installed = String::from_utf8_lossy(&installed.stdout);
    assert!(
        said.contains(&format!(
            "is Pktgen 23.06.1, built with Lua against the installed DPDK {}",
            installed.trim()
        )),
        "{said}"
    );
}

#[test]
fn bad_arguments_are_refused() {
    let p = &fakes().complete;
    assert_refused(&run(Some(p), &["--secs", "0"]), "--secs takes");
    assert_refused(&run(Some(p), &["--sizes", "32"]), "outside 64..1518");
    assert_refused(
        &run(Some(p), &["--parts", "rx"]),
        "--parts takes tx, cable and profile",
    );
    assert_refused(&run(Some(p), &["--frobnicate"]), "unknown argument");
}

/// c-mlx4-bench.sh's Pktgen row refuses what pktgen.sh refuses, before it builds or runs
/// anything.
#[test]
fn c_mlx4_bench_refuses_a_missing_pktgen() {
    let out = run_script("c-mlx4-bench.sh", None, &["--parts", "pktgen"]);
    assert_refused(&out, "PKTGEN is not set");
    let err = stderr(&out);
    assert!(!err.contains("c-mlx4-bench: pktgen done"), "ran:\n{err}");
    let out = run_script(
        "c-mlx4-bench.sh",
        Some(&fakes().no_lua),
        &["--parts", "pktgen"],
    );
    assert_refused(&out, "built without Lua support");
}

/// One line a run's Lua script wrote: its kind and `key=value` words (bare words as `tag`).
fn records(path: &Path) -> Vec<(String, HashMap<String, String>)> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| {
            let mut w = l.split_whitespace();
            let kind = w.next().unwrap_or_default().to_owned();
            let fields = w
                .map(|x| match x.split_once('=') {
                    Some((k, v)) => (k.to_owned(), v.to_owned()),
                    None => ("tag".to_owned(), x.to_owned()),
                })
                .collect();
            (kind, fields)
        })
        .collect()
}

fn num(f: &HashMap<String, String>, k: &str) -> u64 {
    f.get(k)
        .unwrap_or_else(|| panic!("no {k} in {f:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("{k} in {f:?} is not a number"))
}

/// A short run with the real Pktgen in `PKTGEN`:
/// `PKTGEN=/path/to/pktgen cargo test --test pktgen_script -- --ignored`.
#[test]
#[ignore = "needs a Pktgen-DPDK binary in PKTGEN"]
fn short_measurement_adds_up() {
    let pktgen = std::env::var_os("PKTGEN")
        .map(PathBuf::from)
        .expect("set PKTGEN to a Pktgen-DPDK built with Lua against the installed DPDK");
    let out_dir = common::scratch_dir("pktgen-report");
    let plugin = common::plugin_dir();
    let args = [
        "--secs",
        "1",
        "--rounds",
        "1",
        "--sizes",
        "64",
        "--out",
        out_dir.to_str().unwrap(),
        "--plugin-dir",
        plugin.to_str().unwrap(),
    ];
    let out = run(Some(&pktgen), &args);
    let report = fs::read_to_string(out_dir.join("report.md")).unwrap_or_default();
    assert!(out.status.success(), "{}\n{report}", stderr(&out));

    // TX: each path sent on both ports, ours on the path asked for.
    for (name, bf) in [("tx-bf", 1), ("tx-doorbell", 0)] {
        let recs = records(&out_dir.join(format!("{name}.res")));
        for port in [0, 1] {
            let r = recs
                .iter()
                .find(|(k, f)| k == "tx" && num(f, "port") == port)
                .unwrap_or_else(|| panic!("{name}: no port {port} trial in {recs:?}"));
            assert!(
                num(&r.1, "opackets") > 0,
                "{name}: port {port} sent nothing"
            );
        }
        let x = &recs
            .iter()
            .find(|(k, _)| k == "xstats")
            .unwrap_or_else(|| panic!("{name}: no xstats in {recs:?}"))
            .1;
        assert_eq!(num(x, "tx_path_bf"), bf, "{name}: {x:?}");
        let writes = if bf == 1 {
            "tx_bf_writes"
        } else {
            "tx_doorbells"
        };
        assert!(num(x, writes) > 0, "{name}: {x:?}");
        // Pktgen's count is the driver's, and the device put every one of them on the wire.
        let sent = recs
            .iter()
            .find(|(k, f)| k == "tx" && num(f, "port") == 0)
            .map(|(_, f)| num(f, "opackets"))
            .unwrap();
        assert_eq!(num(x, "tx_good_packets"), sent, "{name}");
        assert_eq!(num(x, "hca_tx_frames"), sent, "{name}");
    }

    // Cable: in every step, what one port sent the other received or counted in imissed.
    let recs = records(&out_dir.join("cable.res"));
    for kind in ["cable", "slow_rx", "paced"] {
        let trials: Vec<_> = recs
            .iter()
            .filter(|(k, _)| k == kind)
            .map(|(_, f)| f)
            .collect();
        assert!(!trials.is_empty(), "no {kind} step in {recs:?}");
        let mut steps: Vec<_> = trials.iter().map(|f| f.get("step")).collect();
        steps.dedup();
        for step in steps {
            let at = |p: u64| {
                *trials
                    .iter()
                    .find(|f| num(f, "port") == p && f.get("step") == step)
                    .unwrap_or_else(|| panic!("{kind}: no port {p} in step {step:?}"))
            };
            for (a, b) in [(0, 1), (1, 0)] {
                let (s, r) = (at(a), at(b));
                assert_eq!(
                    num(s, "opackets"),
                    num(r, "ipackets") + num(r, "imissed"),
                    "{kind} {a} -> {b}: sent != received + imissed\n{report}"
                );
                assert_eq!(num(r, "ierrors") + num(r, "rx_nombuf"), 0, "{kind}");
            }
        }
    }
    // The slow receiver did lose frames, so the equality above was put to the test.
    let slow_missed: u64 = recs
        .iter()
        .filter(|(k, f)| k == "slow_rx" && num(f, "port") == 1)
        .map(|(_, f)| num(f, "imissed"))
        .sum();
    assert!(slow_missed > 0, "the slow receiver lost nothing\n{report}");
    assert!(
        report.contains("100% delivered"),
        "no paced rate delivered everything\n{report}"
    );
}

/// The Pktgen row of `scripts/c-mlx4-bench.sh` with the real Pktgen in `PKTGEN`:
/// `PKTGEN=/path/to/pktgen cargo test --test pktgen_script -- --ignored`. DPDK's C mlx4 and our
/// two ports, in one Pktgen process on the same software HCA, each sent; ours through the model
/// (bf=off: every WQE fetched from the ring).
#[test]
#[ignore = "needs a Pktgen-DPDK binary in PKTGEN"]
fn c_mlx4_bench_pktgen_row_measures_every_port() {
    let pktgen = std::env::var_os("PKTGEN")
        .map(PathBuf::from)
        .expect("set PKTGEN to a Pktgen-DPDK built with Lua against the installed DPDK");
    let dir = common::scratch_dir("c-mlx4-bench-pktgen");
    let report = dir.join("bench.md");
    let args = [
        "--parts",
        "pktgen",
        "--runs",
        "1",
        "--secs",
        "1",
        "--out",
        report.to_str().unwrap(),
    ];
    let out = run_script("c-mlx4-bench.sh", Some(&pktgen), &args);
    let text = fs::read_to_string(&report).unwrap_or_default();
    let _ = fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}\n{text}", stderr(&out));
    for (port, fetched) in [
        ("net_mlx4 (DPDK's C driver)", None),
        ("net_mlx4rs (bf=auto)", Some(0.0..=1.0)),
        ("net_mlx4rs (bf=off)", Some(1.0..=1.0)),
    ] {
        let cells: Vec<&str> = text
            .lines()
            .find(|l| l.starts_with(&format!("| {port} |")))
            .unwrap_or_else(|| panic!("no row for {port}:\n{text}"))
            .split('|')
            .map(str::trim)
            .collect();
        let mpps: f64 = cells[2].parse().expect("Mpps");
        assert!(mpps > 0.0, "{port} sent nothing:\n{text}");
        if let Some(range) = fetched {
            let f: f64 = cells[8].parse().expect("WQEs fetched per packet");
            assert!(range.contains(&f), "{port}: {f} WQEs fetched/pkt:\n{text}");
        }
    }
}
