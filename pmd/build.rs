//! The DPDK release this build is for, as `cfg(dpdk = "24.11")` and the like: the same cfg that
//! `dpdk-sys` is built with, for the driver's version seam (`src/ethdev/release.rs`).
fn main() {
    println!(
        "cargo::rustc-check-cfg=cfg(dpdk, values(\"22.11\", \"23.11\", \"24.11\", \"25.11\"))"
    );
    let series = std::env::var("DEP_RTE_EAL_SERIES")
        .expect("dpdk-sys states the DPDK release it was built for (links = \"rte_eal\")");
    println!("cargo:rustc-cfg=dpdk=\"{series}\"");
}
