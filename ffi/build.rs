//! Finds the installed DPDK with pkg-config, generates bindings over its public headers, and
//! picks the committed driver-SDK bindings of the same release (`sdk/vYY_MM.rs`).
//!
//! Debian installs the public headers but not the driver SDK (`ethdev_driver.h`,
//! `bus_vdev_driver.h`, ...). The SDK's structs are generated once per release from its tagged
//! headers (`scripts/gen-sdk-bindings.sh`) and committed; everything they use from the public
//! headers resolves against this build's own bindings of the installed copy, and a test holds
//! the two against each other (`sdk_public_types_match_the_installed_headers`).
//!
//! `MLX4RS_DPDK_INCLUDE` (a directory of headers laid out as DPDK installs them) with
//! `MLX4RS_DPDK_VERSION` replaces pkg-config, for `cargo check` against a release that is not
//! installed (`scripts/check-release.sh`).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn pkg_config(args: &[&str]) -> String {
    let out = Command::new("pkg-config")
        .args(args)
        .arg("libdpdk")
        .output()
        .unwrap_or_else(|e| panic!("dpdk-sys: cannot run pkg-config ({e}); run scripts/setup.sh"));
    if !out.status.success() {
        panic!(
            "dpdk-sys: pkg-config {args:?} libdpdk failed: {}; run scripts/setup.sh",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout)
        .expect("pkg-config output is UTF-8")
        .trim()
        .to_owned()
}

/// The releases whose driver-SDK bindings are committed: (series, file under `sdk/`).
const SUPPORTED: &[(&str, &str)] = &[
    ("22.11", "v22_11.rs"),
    ("23.11", "v23_11.rs"),
    ("24.11", "v24_11.rs"),
    ("25.11", "v25_11.rs"),
];

/// Stops the build with one line.
fn fail(msg: &str) -> ! {
    eprintln!("dpdk-sys: {msg}");
    std::process::exit(1)
}

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=glue.h");
    println!("cargo:rerun-if-changed=glue.c");
    println!("cargo:rerun-if-env-changed=MLX4RS_DPDK_INCLUDE");
    println!("cargo:rerun-if-env-changed=MLX4RS_DPDK_VERSION");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let series: Vec<&str> = SUPPORTED.iter().map(|(s, _)| *s).collect();
    println!(
        "cargo::rustc-check-cfg=cfg(dpdk, values({}))",
        series
            .iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let (version, cflags) = match env::var("MLX4RS_DPDK_INCLUDE") {
        Ok(dir) => {
            let v = env::var("MLX4RS_DPDK_VERSION")
                .unwrap_or_else(|_| fail("MLX4RS_DPDK_INCLUDE needs MLX4RS_DPDK_VERSION"));
            let flags = vec![
                format!("-I{dir}"),
                "-includerte_config.h".to_owned(),
                "-march=corei7".to_owned(),
            ];
            (v, flags)
        }
        Err(_) => (
            pkg_config(&["--modversion"]),
            shell_split(&pkg_config(&["--cflags"])),
        ),
    };
    let this = version.split('.').take(2).collect::<Vec<_>>().join(".");
    let Some((_, file)) = SUPPORTED.iter().find(|(s, _)| *s == this) else {
        fail(&format!(
            "DPDK {version} is not supported; supported releases: {}",
            series.join(", ")
        ))
    };
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk").join(file);
    println!("cargo:rerun-if-changed={}", sdk.display());
    println!("cargo:rustc-env=DPDK_SDK_BINDINGS={}", sdk.display());
    println!("cargo:rustc-cfg=dpdk=\"{this}\"");
    // For dependents' build scripts (DEP_RTE_EAL_SERIES): the same cfg in the driver.
    println!("cargo:series={this}");

    // The public headers declare some SDK structs (`struct rte_eth_dev;`): the SDK's full
    // definitions must be the only ones.
    let sdk_text = std::fs::read_to_string(&sdk)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", sdk.display())));
    let sdk_items = defined_items(&sdk_text);

    let mut clang_args: Vec<String> = cflags.clone();
    clang_args.push("-DALLOW_INTERNAL_API".into());
    clang_args.push("-DALLOW_EXPERIMENTAL_API".into());
    clang_args.push("-I.".into());

    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_args(&clang_args)
        .allowlist_function("rte_.*|mlx4rs_.*")
        .allowlist_type("rte_.*|eth_.*|pthread_mutex_t")
        .allowlist_var("RTE_.*|mlx4rs_.*")
        .blocklist_item("per_lcore_.*")
        .blocklist_item(format!("^({})$", sdk_items.join("|")))
        // Written out in src/mbuf.rs, the same for every release.
        .blocklist_type("rte_mbuf")
        // Packed structs that embed an aligned rte_ether_addr (24.11 on) are not valid Rust.
        .opaque_type("rte_arp_ipv4|rte_arp_hdr")
        .opaque_type("rte_l2tpv2_combined_msg_hdr")
        .opaque_type("rte_gtp_psc_generic_hdr")
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .expect("dpdk-sys: bindgen failed over the DPDK headers");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("dpdk-sys: cannot write bindings");

    let mut build = cc::Build::new();
    build.file("glue.c").include(".");
    for f in &cflags {
        build.flag(f);
    }
    build.define("ALLOW_INTERNAL_API", None);
    build.define("ALLOW_EXPERIMENTAL_API", None);
    build.warnings(false);
    build.compile("mlx4rs_glue");

    // Driver libraries are not in `pkg-config --libs libdpdk`; name every one we call.
    for lib in [
        "rte_ethdev",
        "rte_bus_vdev",
        "rte_bus_pci",
        "rte_net",
        "rte_mbuf",
        "rte_mempool",
        "rte_kvargs",
        "rte_eal",
        "rte_ring",
        "rte_telemetry",
    ] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    // Logging moved out of EAL into a library of its own in 23.11.
    if this.as_str() >= "23.11" {
        println!("cargo:rustc-link-lib=dylib=rte_log");
    }
    println!("cargo:version={version}");
}

/// The names a bindings file defines (structs, unions, types, functions, statics, constants).
fn defined_items(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("pub") {
            continue;
        }
        let kind = words.next();
        let name = match kind {
            Some("struct" | "union" | "type" | "fn" | "const") => words.next(),
            Some("static") => words.nth(1),
            _ => None,
        };
        if let Some(n) = name {
            let n: String = n
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !n.is_empty() && !n.starts_with("__Bindgen") {
                out.push(n);
            }
        }
    }
    out
}

/// pkg-config prints flags separated by spaces, with `-include rte_config.h` as two words.
fn shell_split(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut words = s.split_whitespace();
    while let Some(w) = words.next() {
        if w == "-include" {
            if let Some(f) = words.next() {
                out.push(format!("-include{f}"));
            }
        } else if !w.starts_with("-Wl,") && !w.starts_with("-l") {
            out.push(w.to_owned());
        }
    }
    out
}
