//! TCP and UDP checksum offload proven on the wire: `csumcheck` sends IPv4 TCP and UDP
//! frames prepared as DPDK specifies for offload, in every size class and segment count, through
//! each TX path and inline threshold onto a pcap wire, and checks every byte itself; tshark then
//! decodes the same file with IPv4, TCP and UDP checksum validation on, an independent verdict.

mod common;

use std::process::Command;

use common::{plugin_dir, scratch_dir};

/// (TX path devargs, what the capability check must have chosen).
const PATHS: [(&str, &str); 3] = [
    ("wc=on", "BlueFlame"),
    ("wc=off,bf=on", "BlueFlame"),
    ("wc=off", "doorbell"),
];
const INLINE: [&str; 3] = ["txq_inline=104", "txq_inline=0", "txq_inline=928"];

fn tshark_statuses(pcap: &std::path::Path) -> Vec<(String, String, String)> {
    let out = Command::new("tshark")
        .args(["-r"])
        .arg(pcap)
        .args([
            "-o",
            "ip.check_checksum:TRUE",
            "-o",
            "udp.check_checksum:TRUE",
            "-o",
            "tcp.check_checksum:TRUE",
            "-T",
            "fields",
            "-e",
            "ip.checksum.status",
            "-e",
            "udp.checksum.status",
            "-e",
            "tcp.checksum.status",
        ])
        .output()
        .expect("tshark not found: run scripts/setup.sh (it installs tshark)");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let at = |i: usize| f.get(i).copied().unwrap_or("").to_owned();
            (at(0), at(1), at(2))
        })
        .collect()
}

#[test]
fn tcp_and_udp_checksums_are_complete_on_the_wire_on_every_path() {
    let bin = plugin_dir().join("csumcheck");
    assert!(
        bin.is_file(),
        "{} not built: run `cargo build --workspace` first",
        bin.display()
    );
    let dir = scratch_dir("l4csum");
    for (path, expect) in PATHS {
        for inline in INLINE {
            let devargs = format!("{path},{inline}");
            let pcap = dir.join(format!("{}.pcap", devargs.replace([',', '='], "_")));
            let out = Command::new(&bin)
                .args(["--devargs", &devargs, "--out"])
                .arg(&pcap)
                .current_dir(&dir)
                .output()
                .unwrap();
            let text = format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "csumcheck {devargs}:\n{text}");
            let pass = text
                .lines()
                .find(|l| l.starts_with("csumcheck: PASS"))
                .unwrap_or_else(|| panic!("no PASS line for {devargs}:\n{text}"));
            assert!(pass.contains(&format!("TX path {expect}")), "{pass}");
            let frames: usize = pass
                .trim_start_matches("csumcheck: PASS ")
                .split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap();
            let st = tshark_statuses(&pcap);
            assert_eq!(st.len(), frames, "{devargs}: tshark saw every frame");
            let (mut udp, mut tcp) = (0, 0);
            for (i, (ip, u, t)) in st.iter().enumerate() {
                // Wireshark's checksum status: 1 good, 0 bad, 2 unverified.
                assert_eq!(ip, "1", "{devargs}: frame {}: IPv4 checksum", i + 1);
                match (u.as_str(), t.as_str()) {
                    ("1", "") => udp += 1,
                    ("", "1") => tcp += 1,
                    other => panic!("{devargs}: frame {}: L4 checksum status {other:?}", i + 1),
                }
            }
            assert!(udp > 0 && tcp > 0, "{devargs}: {udp} UDP, {tcp} TCP");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
