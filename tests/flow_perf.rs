//! DPDK's `dpdk-test-flow-perf` on our port: it configures the port with `rss_hf =
//! RTE_ETH_RSS_IP` unmasked (which ethdev refused before the IPv6 `_EX` types), then inserts
//! and deletes rte_flow rules and prints the rates. A short run; the figures are printed.

mod common;

use std::process::Command;

fn rate(out: &str, what: &str) -> f64 {
    out.lines()
        .find(|l| l.contains("Core 0") && l.contains(what))
        .and_then(|l| {
            l.split("->")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {what} in:\n{out}"))
}

#[test]
fn flow_perf_inserts_and_deletes_rules_on_a_port_configured_for_rss_ip() {
    let prefix = common::file_prefix("flowperf");
    // EAL refuses a -d path under a world-writable directory (a clone in /tmp): the plugin
    // goes by its bare name, found through LD_LIBRARY_PATH.
    let out = Command::new("dpdk-test-flow-perf")
        .current_dir(std::env::temp_dir())
        .env("LD_LIBRARY_PATH", common::plugin_dir())
        .args(["--no-huge", "-m", "512", "--no-pci", "-l", "0-1"])
        .args(["-d", common::PLUGIN])
        .args([
            "--vdev=net_mlx4rs0,wire=loop",
            &format!("--file-prefix={prefix}"),
        ])
        .args([
            "--",
            "--ingress",
            "--ether",
            "--ipv4",
            "--queue",
            "--rules-count=1000",
            "--rules-batch=100",
            "--deletion",
        ])
        .output()
        .expect("dpdk-test-flow-perf is in Debian's dpdk-dev (scripts/setup.sh installs it)");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(std::path::Path::new("/var/run/dpdk").join(&prefix));
    assert!(out.status.success(), "{all}");
    assert!(!all.contains("invalid rss_hf"), "{all}");
    assert!(all.contains(":: Flows Count per port: 1000"), "{all}");
    let (ins, del) = (rate(&all, "insertion rate"), rate(&all, "deletion rate"));
    assert!(ins > 0.0 && del > 0.0, "{all}");
    println!(
        "flow-perf ether/ipv4/queue: insertion {ins:.1} K rules/s, deletion {del:.1} K rules/s"
    );
}
