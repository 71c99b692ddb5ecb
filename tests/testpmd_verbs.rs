//! `net_mlx4rs` on the PCI bus, driving a ConnectX-3 through its rdma-core backend, under real
//! `dpdk-testpmd`. No card is attached here, so the card is the software HCA behind our verbs
//! stand-in (`pmd/verbs`): `scripts/c-mlx4-env.sh` presents each function to EAL through a sysfs
//! tree of the test's own (`SYSFS_PCI_DEVICES`) and its verbs device through `MLX4RS_VERBS`, and
//! the stand-in is `libibverbs.so.1`/`libmlx4.so.1` first on `LD_LIBRARY_PATH`. The port is
//! reached the way a card is (PCI probe, `-a <pci>`), not through the vdev.
//!
//! The model's counters (written when the last verbs context closes) are the card's view: every
//! frame testpmd counts as sent is on the wire, and every frame on a cable is received or
//! counted as dropped by the far end.

mod c_mlx4;
mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use c_mlx4::CDevice;
use common::{every_port_sent, number_after, Output, Step, Step::*, SENT, TRAFFIC_LIMIT};

const LIMIT: Duration = Duration::from_secs(120);
const CX3: u16 = 0x1003;

/// ConnectX-3 functions presented together: one sysfs PCI directory with all of them, and the
/// stand-in's device list naming each (the second is `mlx4_1`, and so on).
struct Cards {
    devs: Vec<CDevice>,
    sysfs: PathBuf,
    verbs: String,
}

fn cards(tag: &str, wires: &[String]) -> Cards {
    let devs: Vec<CDevice> = wires.iter().map(|w| CDevice::new(tag, w, CX3)).collect();
    let sysfs = common::scratch_dir(&format!("{tag}-pci"));
    let mut verbs = Vec::new();
    for (i, d) in devs.iter().enumerate() {
        let func = std::fs::canonicalize(d.sysfs_pci.join(&d.pci)).unwrap();
        let link = sysfs.join(&d.pci);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&func, &link).unwrap();
        let ibdev = d.ibdev.with_file_name(format!("mlx4_{i}"));
        if !ibdev.exists() {
            std::os::unix::fs::symlink(func.join("infiniband/mlx4_0"), &ibdev).unwrap();
        }
        verbs.push(format!(
            "ibdev={},name=card{i},wire={},stats={}",
            ibdev.display(),
            d.wire,
            d.stats.display()
        ));
    }
    Cards {
        devs,
        sysfs,
        verbs: verbs.join(";"),
    }
}

impl Cards {
    /// testpmd with the cards allowed (`-a`), `load` (the `-d` arguments, in order), extra
    /// environment and EAL arguments.
    fn testpmd(
        &self,
        load: &[&str],
        env: &[(&str, &str)],
        eal: &[&str],
        app: &[&str],
        steps: &[Step],
    ) -> Output {
        let mut cmd = Command::new("stdbuf");
        cmd.args(["-oL", "dpdk-testpmd"])
            .current_dir(std::env::temp_dir())
            .env(
                "LD_LIBRARY_PATH",
                format!(
                    "{}:{}",
                    self.devs[0].libdir.display(),
                    common::plugin_dir().display()
                ),
            )
            .env("SYSFS_PCI_DEVICES", &self.sysfs)
            .env("MLX4RS_VERBS", &self.verbs)
            .envs(env.iter().copied())
            .args(["-l", "0-1", "--no-huge", "-m", "512"])
            .arg(format!("--file-prefix={}", common::file_prefix("verbs")));
        for d in &self.devs {
            cmd.args(["-a", &d.pci]);
        }
        cmd.args(load)
            .args(eal)
            .arg("--log-level=pmd.net.mlx4rs:info")
            // EAL's "Probe PCI driver" line: bus.pci's own INFO from 24.11 (EAL's before).
            .arg("--log-level=bus.pci:info")
            .arg("--")
            .arg("-i")
            .args(app);
        common::run_interactive(cmd, steps, LIMIT)
    }

    /// The model's counters of card `i`, written when its last verbs context closed.
    fn model(&self, i: usize, out: &Output) -> HashMap<String, u64> {
        assert!(
            self.devs[i].stats.exists(),
            "card {i}'s counters were not written (its verbs contexts were not closed):\n{}",
            c_mlx4::diagnose(out)
        );
        self.devs[i].counters()
    }
}

/// The last `NIC statistics for port <p>` block.
fn port_stats(all: &str, p: u32) -> &str {
    let marker = format!("NIC statistics for port {p} ");
    let i = all
        .rfind(&marker)
        .unwrap_or_else(|| panic!("no port {p} statistics:\n{all}"));
    let rest = &all[i..];
    // The block ends with a line of '#'s after its header line.
    let body = rest.find('\n').map_or(rest.len(), |n| n + 1);
    let end = rest[body..].find("  ####").map_or(rest.len(), |e| body + e);
    &rest[..end]
}

fn stat(block: &str, key: &str) -> u64 {
    number_after(block, key).unwrap_or_else(|| panic!("no {key} in:\n{block}"))
}

/// Every frame that reached a card's port: handed to a queue or dropped, with the reason.
fn rx_total(m: &HashMap<String, u64>) -> u64 {
    m["rx_frames"]
        + m.iter()
            .filter(|(k, _)| k.starts_with("rx_drops_"))
            .map(|(_, v)| v)
            .sum::<u64>()
}

fn ours() -> [&'static str; 2] {
    ["-d", common::PLUGIN]
}

fn assert_ours(out: &Output, cards: &Cards, ports: usize) {
    let all = out.all();
    for d in &cards.devs {
        assert!(
            all.contains(&format!(
                "Probe PCI driver: net_mlx4rs (15b3:1003) device: {}",
                d.pci
            )),
            "EAL did not hand {} to net_mlx4rs:\n{}",
            d.pci,
            c_mlx4::diagnose(out)
        );
    }
    for p in 0..ports {
        assert!(
            all.contains(&format!("mlx4_{p} port 1: port {p} ready")),
            "port {p} not probed:\n{all}"
        );
    }
}

#[test]
fn txonly_stats_and_restart_on_a_verbs_port() {
    let dir = common::scratch_dir("verbs-pcap");
    let pcap = dir.join("card.pcap");
    let c = cards("verbs-tx", &[format!("pcap:{}", pcap.display())]);
    let out = c.testpmd(
        &ours(),
        &[],
        &[],
        &["--forward-mode=txonly", "--total-num-mbufs=8192"],
        &[
            Cmd("show port info 0"),
            Cmd("start"),
            Until {
                cmd: "show fwd stats all",
                done: every_port_sent::<2000>,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("port stop 0"),
            Cmd("port start 0"),
            Cmd("start"),
            SENT,
            Cmd("stop"),
            Cmd("port stop 0"),
            Cmd("show port stats 0"),
            Cmd("show port xstats 0"),
            Cmd("port close 0"),
            Cmd("quit"),
        ],
    );
    assert!(out.status.success(), "{}", c_mlx4::diagnose(&out));
    assert_ours(&out, &c, 1);
    let all = out.all();
    assert!(all.contains("Device name: mlx4_0 port 1"), "{all}");
    assert!(all.contains("Driver name: net_mlx4rs"), "{all}");
    let sent = stat(port_stats(&all, 0), "TX-packets:");
    assert!(sent > 1000, "txonly sent only {sent}:\n{all}");
    let m = c.model(0, &out);
    assert_eq!(
        m["tx_frames"], sent,
        "every frame testpmd counted reached the wire"
    );
    assert_eq!(m["error_cqes"], 0, "the card refused no WQE");
    assert_eq!(m["doorbells_bad_qpn"], 0);
    assert_eq!(
        common::read_pcap(&pcap).len() as u64,
        sent,
        "the pcap wire holds every frame"
    );
    assert_eq!(
        common::xstat(&all, "tx_path_bf"),
        Some(0),
        "no BF page through the stand-in"
    );
    assert!(
        !all.contains("still open at close"),
        "verbs objects leaked:\n{all}"
    );
}

/// Each of the four receive queues of both ports has received.
fn every_queue_received(xstats: &str) -> bool {
    (0..4).all(|q| {
        let n = common::numbers_after(xstats, &format!("rx_q{q}_packets:"));
        n.len() == 2 && n.iter().all(|&n| n > 0)
    })
}

#[test]
fn io_rss_filter_and_mtu_across_a_cable_of_verbs_ports() {
    let c = cards(
        "verbs-io",
        &["peer:card1".to_owned(), "peer:card0".to_owned()],
    );
    let mtu_check = format!(
        "test \"$(cat /sys/class/net/{}/mtu)\" = 256",
        c.devs[1].netdev
    );
    let out = c.testpmd(
        &ours(),
        &[],
        &[],
        &[
            "--forward-mode=io",
            "--rxq=4",
            "--txq=4",
            "--txonly-multi-flow",
            "--total-num-mbufs=32768",
        ],
        &[
            // io over the cable, spread by RSS over four queues a side.
            Cmd("start tx_first 4"),
            Until {
                cmd: "show port xstats all",
                done: every_queue_received,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("port stop all"),
            Cmd("show port xstats all"),
            // MTU 256 on port 1 (its netdev's): 300-byte frames are dropped by the card.
            Cmd("port config mtu 1 256"),
            Until {
                cmd: "show port info 1",
                done: |a| a.contains("MTU: 256"),
                limit: Duration::from_secs(20),
            },
            Shell(&mtu_check),
            Cmd("port start all"),
            Cmd("set fwd txonly"),
            Cmd("set txpkts 300"),
            // Enough frames that port 1's card has taken some while it runs.
            Cmd("start"),
            Until {
                cmd: "show fwd stats all",
                done: every_port_sent::<4096>,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("port stop all"),
            Cmd("port config mtu 1 1500"),
            // Promiscuous off on port 1: txonly's frames are for another MAC.
            Cmd("set txpkts 64"),
            Cmd("set promisc 1 off"),
            Cmd("port start all"),
            // Enough frames that port 1's card has taken some while it runs.
            Cmd("start"),
            Until {
                cmd: "show fwd stats all",
                done: every_port_sent::<4096>,
                limit: TRAFFIC_LIMIT,
            },
            Cmd("stop"),
            Cmd("port stop all"),
            Cmd("show port stats all"),
            Cmd("show port 1 rss reta 128 (0xffffffffffffffff,0xffffffffffffffff)"),
            Cmd("quit"),
        ],
    );
    assert!(out.status.success(), "{}", c_mlx4::diagnose(&out));
    assert_ours(&out, &c, 2);
    let all = out.all();
    let first_xstats = &all[..all.find("port config mtu 1 256").unwrap_or(all.len())];
    for port in [0u32, 1] {
        let marker = format!("NIC extended statistics for port {port}");
        let at = first_xstats
            .rfind(&marker)
            .unwrap_or_else(|| panic!("no xstats of port {port}:\n{all}"));
        let block = &first_xstats[at..];
        let block = &block[..block[marker.len()..]
            .find("NIC extended statistics")
            .map_or(block.len(), |e| e + marker.len())];
        for q in 0..4 {
            let n = common::xstat(block, &format!("rx_q{q}_packets")).unwrap_or(0);
            assert!(n > 0, "port {port} queue {q} received nothing:\n{block}");
        }
    }
    assert!(
        all.contains("RSS RETA configuration: hash index=3, queue=3"),
        "{all}"
    );
    let (a, b) = (c.model(0, &out), c.model(1, &out));
    for (m, p) in [(&a, 0u32), (&b, 1)] {
        // The receiving port is not polled in txonly mode: what its device cannot take, the
        // cable drops and counts.
        let sent = stat(port_stats(&all, p), "TX-packets:");
        assert_eq!(
            m["tx_frames"] + m["tx_drops_wire"],
            sent,
            "port {p}: the card executed all testpmd sent"
        );
        assert_eq!(m["error_cqes"], 0, "port {p}");
    }
    // A frame the cable drops is counted by both ends (tx_drops_wire, rx_drops_wire).
    let out_of = |m: &HashMap<String, u64>| m["tx_frames"] + m["tx_drops_wire"];
    assert_eq!(
        rx_total(&b),
        out_of(&a),
        "card 1 received or counted all card 0 sent"
    );
    assert_eq!(
        rx_total(&a),
        out_of(&b),
        "card 0 received or counted all card 1 sent"
    );
    assert!(
        b["rx_drops_mtu"] > 0,
        "MTU 256 dropped 300-byte frames: {b:?}"
    );
    assert!(
        b["rx_drops_filter"] > 0,
        "promiscuous off dropped foreign frames: {b:?}"
    );
}

#[test]
fn rss_over_three_queues_is_refused_and_nothing_leaks() {
    // mlx4 indirection tables cover a power-of-two run of queues: port start fails with a
    // line saying why, the port still closes cleanly, and every verbs object goes.
    let c = cards("verbs-rss3", &["null".to_owned()]);
    let out = c.testpmd(
        &ours(),
        &[],
        &[],
        &["--rxq=3", "--txq=3", "--total-num-mbufs=8192"],
        &[Cmd("port start 0"), Cmd("show port info 0"), Cmd("quit")],
    );
    let all = out.all();
    assert!(
        all.contains("mlx4_0 port 1: start: mlx4 spreads received frames over a power-of-two run"),
        "{all}"
    );
    assert!(all.contains("Fail to start port 0"), "{all}");
    assert!(all.contains("mlx4_0 port 1: closed"), "{all}");
    assert!(
        !all.contains("still open at close"),
        "verbs objects leaked:\n{all}"
    );
    let m = c.model(0, &out);
    assert_eq!((m["tx_frames"], m["error_cqes"]), (0, 0), "{m:?}");
}

fn flowgen_went_round(answer: &str) -> bool {
    number_after(answer, "RX-packets:").is_some_and(|n| n >= 4096)
}

fn flowgen_sent(answer: &str) -> bool {
    number_after(answer, "TX-packets:").is_some_and(|n| n >= 4096)
}

/// rte_flow on the rdma-core backend: a rule is a hash QP over its queue (or a QP without
/// receive queue, to drop) and an `ibv_create_flow` of Ethernet, IPv4 and UDP specs; the
/// stand-in makes it a model rule. testpmd's flowgen on a looped card sends UDP to port 1001,
/// to 10.253.0.0 and 10.253.0.1 in turn: the first half is dropped, the rest lands on queue 2.
/// (In turn, frame by frame: the looped wire drops runs of frames when the port cannot take
/// them in time, which leaves the halves even.)
#[test]
fn rte_flow_rules_steer_on_a_verbs_port() {
    let c = cards("verbs-flow", &["loop".to_owned()]);
    let out = c.testpmd(
        &ours(),
        &[],
        &[],
        &[
            "--rxq=4",
            "--txq=4",
            "--total-num-mbufs=8192",
            "--rxd=1024",
            "--forward-mode=flowgen",
            "--flowgen-flows=2",
        ],
        &[
            Cmd("flow create 0 priority 1 ingress pattern eth / ipv4 / udp dst is 1001 / end actions queue index 2 / end"),
            Cmd("flow create 0 priority 0 ingress pattern eth / ipv4 dst is 10.253.0.0 / end actions drop / end"),
            Cmd("flow create 0 ingress pattern eth / vlan / end actions drop / end"),
            Cmd("start"),
            Until {
                cmd: "show port stats 0",
                done: flowgen_went_round,
                limit: Duration::from_secs(30),
            },
            Cmd("stop"),
            Cmd("show port xstats 0"),
            // Isolated, with no rule: the port's own flows are gone too, nothing arrives. (The
            // restart empties the rings of what the rules steered; testpmd flushes the rules.)
            Cmd("port stop 0"),
            Cmd("flow isolate 0 1"),
            Cmd("port start 0"),
            Cmd("clear port xstats 0"),
            Cmd("start"),
            Until {
                cmd: "show port stats 0",
                done: flowgen_sent,
                limit: Duration::from_secs(30),
            },
            Cmd("stop"),
            Cmd("show port xstats 0"),
            Cmd("quit"),
        ],
    );
    assert!(out.status.success(), "{}", c_mlx4::diagnose(&out));
    // testpmd's answers (stdout) come first, the driver's log (stderr) after them.
    let both = out.all();
    let (all, isolated) = both.split_at(both.find("now restricted").expect("isolated"));
    assert!(all.contains("Flow rule #1 created"), "{all}");
    assert!(
        both.contains("matching any VLAN tag (verbs matches a VLAN ID) is not supported here"),
        "a rule verbs cannot express is refused, saying why:\n{both}"
    );
    let q = [0, 1, 2, 3].map(|i| common::xstat(all, &format!("rx_q{i}_packets")).unwrap());
    assert!(
        q[2] >= 4096 && q[0] + q[1] + q[3] == 0,
        "{q:?}, the model's counters {:?}\n{all}",
        c.model(0, &out)
    );
    let polled = q[2];
    let q = [0, 1, 2, 3].map(|i| common::xstat(isolated, &format!("rx_q{i}_packets")).unwrap());
    assert_eq!(q, [0; 4], "isolated:\n{isolated}");
    let m = c.model(0, &out);
    assert!(m["rx_drops_filter"] > 0, "{m:?}");
    // The drop rule took as many as the queue rule (the looped wire drops what the port
    // cannot take in time, rx_drops_wire, before either sees it): at least what queue 2's
    // polls counted, and at most that plus what its 1024 buffers held unpolled at `stop` and
    // what found them all taken. Not the model's `rx_frames`: testpmd flushes the rules at
    // `port stop` before it stops the port, and the frames still on the loop then take the
    // port's default way, RSS over the four queues, into buffers nobody polls (up to 2240 of
    // them in runs beside a busy CI, which made the halves look 40-60).
    // The halves are even only up to the wire's drops: a run of an odd number of frames that
    // the loop drops leaves one flow a frame ahead (CI saw the drops 4 past the bound). A
    // rule that matched the wrong flow, or none, would be thousands off.
    let dropped = m["rx_drops_flow"];
    let slack = polled / 64;
    assert!(
        dropped + slack >= polled && dropped <= polled + 1024 + m["rx_drops_no_wqe"] + slack,
        "the drop rule took {dropped}, queue 2 polled {polled}: {m:?}"
    );
}

#[test]
fn the_driver_loaded_first_gets_the_card() {
    let c_mlx4 = c_mlx4::pmd_dir().join("librte_net_mlx4.so");
    let c_mlx4 = c_mlx4.to_str().unwrap().to_owned();
    let c = cards("verbs-two", &["null".to_owned()]);
    let steps = [Cmd("show port info 0"), Cmd("quit")];
    // Ours by -d; Debian's from EAL's driver directory, loaded after every -d plugin.
    let app = ["--total-num-mbufs=8192"];
    let out = c.testpmd(&ours(), &[], &[], &app, &steps);
    assert!(out.status.success(), "{}", c_mlx4::diagnose(&out));
    assert_ours(&out, &c, 1);
    assert!(
        out.all().contains("Driver name: net_mlx4rs"),
        "{}",
        out.all()
    );
    // Debian's named first by -d: it registers first and gets the card; ours stays loaded.
    let out = c.testpmd(
        &["-d", &c_mlx4, "-d", common::PLUGIN],
        &[],
        &[],
        &app,
        &steps,
    );
    let all = out.all();
    assert!(out.status.success(), "{}", c_mlx4::diagnose(&out));
    assert!(
        all.contains(&format!(
            "Probe PCI driver: net_mlx4 (15b3:1003) device: {}",
            c.devs[0].pci
        )),
        "{all}"
    );
    assert!(all.contains("Driver name: net_mlx4\n"), "{all}");
    assert!(
        !all.contains("net_mlx4rs: 0000"),
        "ours never probed:\n{all}"
    );
}

#[test]
fn without_rdma_core_or_a_verbs_device_the_probe_says_what_is_missing() {
    // The plugin does not link rdma-core: it loads, and the model works, without it.
    let plugin = common::plugin_dir().join(common::PLUGIN);
    let dynamic = Command::new("readelf")
        .arg("-d")
        .arg(&plugin)
        .output()
        .unwrap();
    let dynamic = String::from_utf8_lossy(&dynamic.stdout);
    assert!(dynamic.contains("(NEEDED)"), "{dynamic}");
    assert!(
        !dynamic.contains("libibverbs") && !dynamic.contains("libmlx4"),
        "the plugin must not need rdma-core to load:\n{dynamic}"
    );
    let c = cards("verbs-none", &["null".to_owned()]);
    let empty = common::scratch_dir("no-rdma-core");
    let steps = [
        Cmd("start"),
        SENT,
        Cmd("stop"),
        Cmd("show port stats 0"),
        Cmd("quit"),
    ];
    let vdev = ["--vdev", "net_mlx4rs0,wire=null"];
    let app = ["--forward-mode=txonly", "--total-num-mbufs=8192"];
    let missing = [(rdma_dir(), empty.to_str().unwrap())];
    let out = c.testpmd(&ours(), &missing, &vdev, &app, &steps);
    let all = out.all();
    let pci = &c.devs[0].pci;
    let lines: Vec<&str> = all
        .lines()
        .filter(|l| l.contains(&format!("net_mlx4rs: {pci}:")))
        .collect();
    let why: Vec<&&str> = lines.iter().filter(|l| !l.contains("probing")).collect();
    assert_eq!(why.len(), 1, "one line says why:\n{all}");
    assert!(
        why[0].contains("rdma-core is not installed")
            && why[0].contains("libibverbs.so.1")
            && why[0].contains("apt-get install ibverbs-providers"),
        "{all}"
    );
    assert!(
        stat(port_stats(&all, 0), "TX-packets:") > 0,
        "the vdev port works:\n{all}"
    );

    // rdma-core present (the stand-in) but no verbs device for the PCI function.
    let out = c.testpmd(&ours(), &[("MLX4RS_VERBS", "")], &[], &app, &[Cmd("quit")]);
    let all = out.all();
    let why: Vec<&str> = all
        .lines()
        .filter(|l| l.contains(&format!("net_mlx4rs: {pci}:")) && !l.contains("probing"))
        .collect();
    assert_eq!(why.len(), 1, "one line says why:\n{all}");
    assert!(
        why[0].contains(&format!("no verbs device is PCI {pci}"))
            && why[0].contains("modprobe mlx4_ib"),
        "{all}"
    );
}

#[test]
fn dpdk_pmdinfo_lists_name_kernel_modules_pci_ids_and_devargs() {
    let plugin = common::plugin_dir().join(common::PLUGIN);
    // The script's own interpreter (/usr/bin/python3), where Debian's pyelftools lives.
    let out = Command::new("dpdk-pmdinfo.py")
        .arg(&plugin)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "dpdk-pmdinfo.py failed (python3-pyelftools missing? run scripts/setup.sh): {err}"
    );
    let at = text
        .find("\"name\": \"net_mlx4rs\"")
        .unwrap_or_else(|| panic!("net_mlx4rs not listed:\n{text}"));
    let entry = &text[at..];
    let entry = &entry[..entry.find("\n  }").unwrap_or(entry.len())];
    assert!(
        entry.contains("\"kmod\": \"* ib_uverbs & mlx4_en & mlx4_core & mlx4_ib\""),
        "{entry}"
    );
    for dev in ["1003", "1007", "1004"] {
        assert!(
            entry.contains(&format!(
                "\"vendor\": \"15b3\",\n        \"device\": \"{dev}\""
            )),
            "15b3:{dev} in:\n{entry}"
        );
    }
    for p in [
        "wire=",
        "bf=auto|on|off",
        "txq_inline=",
        "mac=",
        "device_loop=",
    ] {
        assert!(entry.contains(p), "params lack {p}:\n{entry}");
    }
}

/// The variable naming where the backend loads rdma-core from (see `hw::verbs`).
fn rdma_dir() -> &'static str {
    "MLX4RS_RDMA_CORE"
}
