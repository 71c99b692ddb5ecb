//! Generates bindings over the installed DPDK and the driver-SDK headers of the same version.
//!
//! The SDK headers (`ethdev_driver.h`, `bus_vdev_driver.h`, ...) are not installed by Debian;
//! `scripts/setup.sh` unpacks the matching source package. The internal structs they declare
//! must match the runtime exactly, so a version mismatch is a hard error, not a warning.

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

fn sdk_dir(version: &str) -> PathBuf {
    let dir = match env::var_os("MLX4RS_DPDK_SRC") {
        Some(d) => PathBuf::from(d),
        None => {
            let cache = env::var_os("MLX4RS_CACHE").unwrap_or_else(|| "/var/cache/mlx4rs".into());
            Path::new(&cache).join(format!("dpdk-stable-{version}"))
        }
    };
    let needed = [
        "lib/ethdev/ethdev_driver.h",
        "lib/ethdev/ethdev_vdev.h",
        "drivers/bus/vdev/bus_vdev_driver.h",
        "drivers/bus/pci/bus_pci_driver.h",
        "lib/eal/include/dev_driver.h",
        "lib/eal/include/bus_driver.h",
    ];
    for f in needed {
        if !dir.join(f).is_file() {
            panic!(
                "dpdk-sys: driver-SDK header {f} not found under {}: it must come from the DPDK {version} \
                 source package; run scripts/setup.sh (or set MLX4RS_DPDK_SRC)",
                dir.display()
            );
        }
    }
    // The source tree states its version in VERSION; it must be the installed runtime's.
    let src_ver = std::fs::read_to_string(dir.join("VERSION")).unwrap_or_default();
    if src_ver.trim() != version {
        panic!(
            "dpdk-sys: SDK headers in {} are DPDK {:?} but the installed libdpdk is {version}; \
             the driver structs would not match the runtime",
            dir.display(),
            src_ver.trim()
        );
    }
    dir
}

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=glue.h");
    println!("cargo:rerun-if-changed=glue.c");
    println!("cargo:rerun-if-env-changed=MLX4RS_DPDK_SRC");
    println!("cargo:rerun-if-env-changed=MLX4RS_CACHE");

    let version = pkg_config(&["--modversion"]);
    if !version.starts_with("22.11") {
        panic!("dpdk-sys: DPDK 22.11 is required, found {version}");
    }
    let sdk = sdk_dir(&version);
    let sdk_includes = [
        sdk.join("lib/ethdev"),
        sdk.join("drivers/bus/vdev"),
        sdk.join("drivers/bus/pci"),
        sdk.join("lib/eal/include"),
    ];

    let cflags: Vec<String> = shell_split(&pkg_config(&["--cflags"]));
    let mut clang_args: Vec<String> = cflags.clone();
    for inc in &sdk_includes {
        clang_args.push(format!("-I{}", inc.display()));
    }
    clang_args.push("-DALLOW_INTERNAL_API".into());
    clang_args.push("-DALLOW_EXPERIMENTAL_API".into());
    clang_args.push("-I.".into());

    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_args(&clang_args)
        .allowlist_function("rte_.*|mlx4rs_.*")
        .allowlist_type("rte_.*|eth_.*")
        .allowlist_var("RTE_.*|rte_eth_devices|mlx4rs_.*")
        .blocklist_item("per_lcore_.*")
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
    for inc in &sdk_includes {
        build.include(inc);
    }
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
    println!("cargo:version={version}");
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
