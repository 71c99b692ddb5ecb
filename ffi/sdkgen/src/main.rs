//! Writes the committed driver-SDK bindings of one DPDK release (`ffi/sdk/v<MAJOR>_<MINOR>.rs`).
//!
//! Debian installs DPDK's public headers but not the driver SDK (`ethdev_driver.h`,
//! `bus_vdev_driver.h`, `bus_pci_driver.h`, `dev_driver.h`, ...), and the source packages of the
//! newer releases cannot be had here. So the SDK's structs are generated once per release from
//! its tagged headers and committed: they record ABI facts (field order, offsets, signatures).
//!
//! Only items defined in the SDK headers are written; what they use from the public headers is
//! left as a name, which the build resolves against its own bindings of the installed copy. The
//! sizes the public types had at generation are written too, so a test can hold the installed
//! headers against them.
//!
//! Usage (`scripts/gen-sdk-bindings.sh` stages the headers and calls this):
//!
//! ```text
//! dpdk-sdkgen --include DIR --tag v24.11.6 --out ffi/sdk/v24_11.rs
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::exit;

/// The headers of the driver SDK, by file name: items defined there are what we commit.
const SDK_FILES: &str =
    r".*/(ethdev_driver|rte_flow_driver|bus_vdev_driver|bus_pci_driver|dev_driver|bus_driver)\.h";

struct Args {
    include: Vec<PathBuf>,
    tag: String,
    out: PathBuf,
    header: PathBuf,
}

fn usage(why: &str) -> ! {
    eprintln!("dpdk-sdkgen: {why}");
    eprintln!("usage: dpdk-sdkgen --include DIR [--include DIR ...] --tag vYY.MM[.N] --out FILE [--header ffi/sdk.h]");
    exit(2)
}

fn args() -> Args {
    let mut a = Args {
        include: Vec::new(),
        tag: String::new(),
        out: PathBuf::new(),
        header: PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../sdk.h")),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{k} needs a value")))
        };
        match k.as_str() {
            "--include" => a.include.push(v().into()),
            "--tag" => a.tag = v(),
            "--out" => a.out = v().into(),
            "--header" => a.header = v().into(),
            _ => usage(&format!("unknown argument {k}")),
        }
    }
    if a.include.is_empty() || a.tag.is_empty() || a.out.as_os_str().is_empty() {
        usage("--include, --tag and --out are required");
    }
    a
}

fn clang_args(a: &Args) -> Vec<String> {
    let mut v: Vec<String> = a
        .include
        .iter()
        .map(|d| format!("-I{}", d.display()))
        .collect();
    // What Debian's libdpdk.pc gives every user of the headers.
    v.extend(
        [
            "-includerte_config.h",
            "-march=corei7",
            "-DALLOW_INTERNAL_API",
            "-DALLOW_EXPERIMENTAL_API",
        ]
        .map(String::from),
    );
    v
}

/// `size_of` of every struct and union as bindgen's layout assertions state them.
fn sizes(text: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let l = line.trim();
        let Some(rest) = l.strip_prefix("[\"Size of ") else {
            continue;
        };
        let Some((name, tail)) = rest.split_once("\"]") else {
            continue;
        };
        let Some(n) = tail
            .rsplit_once(" - ")
            .and_then(|(_, n)| n.split("usize").next())
            .and_then(|n| n.parse().ok())
        else {
            continue;
        };
        out.insert(name.to_owned(), n);
    }
    out
}

/// The identifiers of `text`, for finding which public types the SDK items name.
fn idents(text: &str) -> std::collections::BTreeSet<&str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect()
}

fn main() {
    let a = args();
    let cargs = clang_args(&a);
    let sdk = bindgen::Builder::default()
        .header(a.header.display().to_string())
        .clang_args(&cargs)
        .allowlist_file(SDK_FILES)
        .allowlist_recursively(false)
        .blocklist_item("per_lcore_.*")
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .generate()
        .unwrap_or_else(|e| {
            eprintln!("dpdk-sdkgen: bindgen failed over the SDK headers: {e}");
            exit(1)
        })
        .to_string();

    // The public types as these headers define them, for their sizes only.
    let public = bindgen::Builder::default()
        .header(a.header.display().to_string())
        .clang_args(&cargs)
        .allowlist_type("rte_.*|eth_.*")
        .blocklist_file(SDK_FILES)
        // Packed structs that embed an aligned rte_ether_addr (24.11 on) are not valid Rust.
        .opaque_type("rte_arp_ipv4|rte_arp_hdr")
        .opaque_type("rte_l2tpv2_combined_msg_hdr")
        .opaque_type("rte_gtp_psc_generic_hdr")
        .layout_tests(true)
        .generate_comments(false)
        .generate()
        .unwrap_or_else(|e| {
            eprintln!("dpdk-sdkgen: bindgen failed over the public headers: {e}");
            exit(1)
        })
        .to_string();
    let used = idents(&sdk);
    let defined = sizes(&sdk);
    let public_sizes: Vec<(String, usize)> = sizes(&public)
        .into_iter()
        .filter(|(n, _)| used.contains(n.as_str()) && !defined.contains_key(n))
        .collect();

    let mut out = String::new();
    out.push_str(&format!(
        "// The driver-SDK items of DPDK {tag}, generated by ffi/sdkgen from the release's tagged\n\
         // headers (scripts/gen-sdk-bindings.sh {tag}). ABI facts only: regenerate, do not edit.\n\n",
        tag = a.tag
    ));
    out.push_str(&format!("pub const SDK_TAG: &str = {:?};\n\n", a.tag));
    out.push_str(
        "/// The size every public type that these items embed or name had in the headers they were\n\
         /// generated from; `sdk_public_types_match_the_installed_headers` holds the installed\n\
         /// headers against it.\n",
    );
    out.push_str(
        "#[allow(unused_macros)]\nmacro_rules! sdk_public_sizes {\n    ($check:ident) => {\n",
    );
    for (n, s) in &public_sizes {
        out.push_str(&format!("        $check!({n}, {s});\n"));
    }
    out.push_str("    };\n}\n\n");
    out.push_str(&sdk);
    if let Err(e) = std::fs::write(&a.out, out) {
        eprintln!("dpdk-sdkgen: cannot write {}: {e}", a.out.display());
        exit(1);
    }
    eprintln!(
        "dpdk-sdkgen: {} ({} SDK structs, {} public sizes)",
        a.out.display(),
        defined.len(),
        public_sizes.len()
    );
}
