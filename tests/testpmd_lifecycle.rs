//! Port lifecycle through testpmd: receive and transmit keep working after every
//! stop/start, queue and ring reconfiguration, MTU and promiscuous change, and after attaching
//! and detaching ports; no mbuf is leaked or lost, and the process does not grow.
//!
//! Each cycle forwards with `io` after `start tx_first` on a looped port and on a cabled pair,
//! and checks that every port both received and sent. After `port stop all`, `dump_mempool`
//! must show exactly the receive rings' buffers in use (ports x RX queues x descriptors).

mod common;

use std::fmt::Write as _;
use std::time::Duration;

use common::{file_prefix, in_use, testpmd_in, Step};

const MBUFS: u64 = 65536;

/// After `start tx_first`: traffic on every port since its stats were cleared. It asks
/// `show port stats all`: the forwarding statistics are what the test reads.
const WAIT_TRAFFIC: Step<'static> = Step::Until {
    cmd: "show port stats all",
    done: common::every_port_moved::<1>,
    limit: common::TRAFFIC_LIMIT,
};

/// (port, RX-packets, TX-packets) of each "Forward statistics for port" block, in order.
fn forward_stats(text: &str) -> Vec<(u16, u64, u64)> {
    let mut v = Vec::new();
    let mut rest = text;
    let key = "Forward statistics for port ";
    while let Some(i) = rest.find(key) {
        rest = &rest[i + key.len()..];
        let port = common::number_after(rest, "").unwrap() as u16;
        let rx = common::number_after(rest, "RX-packets:").unwrap();
        let tx = common::number_after(rest, "TX-packets:").unwrap();
        v.push((port, rx, tx));
    }
    v
}

/// Resident set size of the testpmd running with `prefix`, in KiB, appended to `log`.
fn rss_probe(prefix: &str, log: &std::path::Path) -> String {
    format!(
        "pid=$(pgrep -of -- '--file-prefix={prefix}') && grep VmRSS /proc/$pid/status >> {}",
        log.display()
    )
}

fn rss_samples(log: &std::path::Path) -> Vec<u64> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    common::numbers_after(&text, "VmRSS:")
}

#[test]
fn two_hundred_restarts_keep_receive_and_transmit_alive() {
    const CYCLES: usize = 200;
    let prefix = file_prefix("lifecycle");
    let dir = common::scratch_dir("lifecycle");
    let rss_log = dir.join("rss");
    let probe = rss_probe(&prefix, &rss_log);
    // Port 0 is looped; ports 1 and 2 are cabled.
    let vdevs = [
        "net_mlx4rs0,wire=loop",
        "net_mlx4rs1,wire=peer:net_mlx4rs2",
        "net_mlx4rs2,wire=peer:net_mlx4rs1",
    ];
    let mut script: Vec<String> = Vec::new();
    // What each cycle changes before it starts the ports again, and the RX rings it leaves:
    // (queues per port, descriptors per queue).
    let mut expect_rings: Vec<(u64, u64)> = Vec::new();
    let (mut rxq, mut rxd) = (1u64, 512u64);
    for c in 0..CYCLES {
        script.push("port stop all".into());
        match c % 10 {
            1 | 6 => {
                rxq = [1, 2, 3, 4][(c / 10) % 4];
                script.push(format!("port config all rxq {rxq}"));
                script.push(format!("port config all txq {rxq}"));
            }
            2 | 7 => {
                rxd = [64, 128, 1024, 4096][(c / 10) % 4];
                script.push(format!("port config all rxd {rxd}"));
                script.push(format!("port config all txd {rxd}"));
            }
            3 => script.push(format!(
                "port config mtu 0 {}",
                [1500, 1400, 2000][(c / 10) % 3]
            )),
            4 => {
                script.push("set promisc all off".into());
                script.push("set promisc all on".into());
            }
            _ => {}
        }
        script.push("port start all".into());
        script.push("clear port stats all".into());
        script.push("start tx_first".into());
        script.push("#wait".into());
        script.push("stop".into());
        script.push("port stop all".into());
        script.push(common::dump_mempool().into());
        expect_rings.push((rxq, rxd));
        script.push("port start all".into());
        if c == 20 || c == CYCLES - 1 {
            script.push("#rss".into());
        }
    }
    let mut steps = Vec::new();
    for line in &script {
        match line.as_str() {
            "#wait" => steps.push(WAIT_TRAFFIC),
            "#rss" => steps.push(Step::Shell(&probe)),
            l => steps.push(Step::Quick(l)),
        }
    }
    steps.push(Step::Cmd("quit"));
    let out = testpmd_in(
        &prefix,
        1024,
        &vdevs,
        &[
            "--forward-mode=io",
            &format!("--total-num-mbufs={MBUFS}"),
            "--rxd=512",
            "--txd=512",
        ],
        &steps,
        Duration::from_secs(600),
    );
    let all = out.all();
    assert!(out.status.success(), "testpmd failed:\n{all}");
    let stats = forward_stats(&out.stdout);
    assert_eq!(
        stats.len(),
        CYCLES * 3,
        "one stats block per port per cycle:\n{all}"
    );
    for (c, cycle) in stats.chunks(3).enumerate() {
        for &(port, rx, tx) in cycle {
            assert!(
                rx > 0 && tx > 0,
                "cycle {c}: port {port} received {rx} and sent {tx}:\n{}",
                tail(&all)
            );
        }
    }
    let used = in_use(&out.stdout);
    assert_eq!(used.len(), CYCLES, "{all}");
    let mut report = String::new();
    for (c, (&u, &(q, d))) in used.iter().zip(&expect_rings).enumerate() {
        // Every RX queue keeps its ring of buffers posted; nothing else is held.
        assert_eq!(
            u,
            3 * q * d,
            "cycle {c}: mbufs in use after stop ({q} queues of {d})"
        );
    }
    let rss = rss_samples(&rss_log);
    assert_eq!(rss.len(), 2, "two RSS samples");
    let _ = writeln!(
        report,
        "lifecycle: {CYCLES} cycles; testpmd RSS {} KiB at cycle 20, {} KiB at cycle {CYCLES}",
        rss[0], rss[1]
    );
    eprintln!("{report}");
    assert!(
        rss[1] <= rss[0] + 16 * 1024,
        "process grew by {} KiB over {} cycles",
        rss[1] - rss[0],
        CYCLES - 20
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_hundred_attach_detach_cycles_with_traffic() {
    const CYCLES: usize = 100;
    let prefix = file_prefix("attach");
    let dir = common::scratch_dir("attach");
    let rss_log = dir.join("rss");
    let probe = rss_probe(&prefix, &rss_log);
    let mut script: Vec<String> = Vec::new();
    for c in 0..CYCLES {
        let name = format!("net_mlx4rs{}", 10 + c % 3);
        script.push(format!("port attach {name},wire=loop"));
        script.push("port start all".into());
        script.push("clear port stats all".into());
        script.push("start tx_first".into());
        script.push("#wait".into());
        script.push("stop".into());
        script.push("port stop 1".into());
        script.push("port close 1".into());
        script.push(format!("device detach {name}"));
        script.push("port stop 0".into());
        script.push(common::dump_mempool().into());
        script.push("port start 0".into());
        if c == 10 || c == CYCLES - 1 {
            script.push("#rss".into());
        }
    }
    let mut steps = Vec::new();
    for line in &script {
        match line.as_str() {
            "#wait" => steps.push(WAIT_TRAFFIC),
            "#rss" => steps.push(Step::Shell(&probe)),
            l => steps.push(Step::Quick(l)),
        }
    }
    steps.push(Step::Cmd("quit"));
    let out = testpmd_in(
        &prefix,
        1024,
        &["net_mlx4rs0,wire=loop"],
        &[
            "--forward-mode=io",
            &format!("--total-num-mbufs={MBUFS}"),
            "--rxd=512",
            "--txd=512",
        ],
        &steps,
        Duration::from_secs(600),
    );
    let all = out.all();
    assert!(out.status.success(), "testpmd failed:\n{all}");
    assert_eq!(all.matches("is attached").count(), CYCLES, "{}", tail(&all));
    assert_eq!(all.matches("is detached").count(), CYCLES, "{}", tail(&all));
    let stats = forward_stats(&out.stdout);
    assert_eq!(stats.len(), CYCLES * 2, "{}", tail(&all));
    for (c, cycle) in stats.chunks(2).enumerate() {
        for &(port, rx, tx) in cycle {
            assert!(rx > 0 && tx > 0, "cycle {c}: port {port} rx {rx} tx {tx}");
        }
    }
    // With the attached port gone and port 0 stopped, only port 0's ring is in use.
    let used = in_use(&out.stdout);
    assert_eq!(used.len(), CYCLES);
    for (c, &u) in used.iter().enumerate() {
        assert_eq!(u, 512, "cycle {c}: mbufs in use after detach");
    }
    let rss = rss_samples(&rss_log);
    assert_eq!(rss.len(), 2);
    eprintln!(
        "attach/detach: {CYCLES} cycles; testpmd RSS {} KiB at cycle 10, {} KiB at cycle {CYCLES}",
        rss[0], rss[1]
    );
    assert!(
        rss[1] <= rss[0] + 16 * 1024,
        "grew by {} KiB",
        rss[1] - rss[0]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn tail(s: &str) -> &str {
    &s[s.len().saturating_sub(6000)..]
}
