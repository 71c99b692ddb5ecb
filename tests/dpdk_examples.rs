//! DPDK's own example applications, built from the cached DPDK source against the installed
//! DPDK (tests/common/examples.rs), running on our ports.
//!
//! Traffic: `dpdk-testpmd` in a second process is the peer, each of its ports joined to the
//! example's port of the same number by a cable file. It sends 16 bursts of 32 UDP frames on
//! each port (`start tx_first 16`, txonly's frames: 198.18.0.1 -> 198.18.0.2 unless
//! `--tx-ip` says otherwise) and then only receives (`rxonly`, verbose, so each frame's
//! addresses are printed), so what it gets back is exactly what the example sent it. The
//! example's ports have the MACs 02:ee:00:00:00:0<port>.

mod common;

use common::examples::{self, App, Cables};
use common::{numbers_after, xstat, Step::*};
use std::path::Path;
use std::time::Duration;

/// Frames the peer sends on each of its ports.
const PER_PORT: u64 = 16 * 32;
const START: Duration = Duration::from_secs(60);

/// xstat `name` of the peer's port `port`.
fn peer_xstat(all: &str, port: u32, name: &str) -> u64 {
    let head = format!("NIC extended statistics for port {port} ");
    let block = all
        .rsplit_once(&head)
        .map(|(_, rest)| rest.split("###").next().unwrap_or(rest))
        .unwrap_or_else(|| panic!("no xstats of port {port}:\n{all}"));
    xstat(block, name).unwrap_or_else(|| panic!("no {name} for port {port}:\n{all}"))
}

fn rx_total(answer: &str) -> u64 {
    numbers_after(answer, "RX-packets:").iter().sum()
}

fn got_one_port(answer: &str) -> bool {
    rx_total(answer) >= PER_PORT
}

fn got_two_ports(answer: &str) -> bool {
    rx_total(answer) >= 2 * PER_PORT
}

fn links_up(answer: &str) -> bool {
    let up = answer.matches("Link status: up").count();
    up > 0 && up == answer.matches("Link status:").count()
}

/// The peer sends its bursts and receives until `done` holds for `show port stats all`.
fn traffic(cables: &Cables, tx_ip: Option<&str>, done: fn(&str) -> bool) -> String {
    traffic_of(cables, tx_ip, PER_PORT / 32, None, done)
}

/// As [`traffic`], with `bursts` bursts of 32 frames per port.
/// As [`traffic`], with `bursts` of 32 frames; with a `gate`, the peer sends only once that
/// file exists (created by the test when the example is ready for the frames).
fn traffic_of(
    cables: &Cables,
    tx_ip: Option<&str>,
    bursts: u64,
    gate: Option<&Path>,
    done: fn(&str) -> bool,
) -> String {
    let tx_first = format!("start tx_first {bursts}");
    let wait_gate = gate.map(|g| {
        format!(
            "timeout {} sh -c 'until [ -e {} ]; do sleep 0.02; done'",
            START.as_secs(),
            g.display()
        )
    });

    let mut args = vec!["--forward-mode=rxonly"];
    if let Some(ip) = tx_ip {
        args.push(ip);
    }
    // Sending before the example's ports are up would lose frames on the cable.
    let mut steps = vec![Until {
        cmd: "show port info all",
        done: links_up,
        limit: START,
    }];
    steps.extend(wait_gate.as_deref().map(Shell));
    steps.extend([
        Cmd("set verbose 1"),
        Cmd(&tx_first),
        Until {
            cmd: "show port stats all",
            done,
            limit: Duration::from_secs(30),
        },
        Cmd("stop"),
        Cmd("set verbose 0"),
        Cmd("show port xstats all"),
        Cmd("quit"),
    ]);
    let out = examples::peer(cables, &args, &steps);
    let all = out.all();
    assert!(out.status.success(), "peer testpmd:\n{all}");
    all
}

/// Frames the peer printed as received with addresses starting `addrs` (`src=.. - dst=..`,
/// testpmd prints MACs upper case).
fn frames(peer: &str, addrs: &str) -> u64 {
    peer.matches(addrs).count() as u64
}

/// Starts `exe` on the example side of `cables` and waits for `ready` in its output.
fn start(exe: &std::path::Path, lcores: &str, cables: &Cables, args: &[&str], ready: &str) -> App {
    let mut app = App::start(exe, lcores, &cables.example_vdevs(""), args, &[]);
    assert!(
        app.wait_for(|o| o.contains(ready), START),
        "{} never printed {ready:?}:\n{}",
        exe.display(),
        app.output()
    );
    app
}

/// An example that forwards port 0 <-> port 1 and leaves frames as they are: every frame the
/// peer sent on one port comes back on the other, nothing lost.
fn forwards_pairs_unchanged(dir: &str, bin: &str) {
    let exe = examples::build(dir, bin);
    let cables = Cables::new(dir, 2);
    let app = start(&exe, "0", &cables, &[], "forwarding packets");
    let peer = traffic(&cables, None, got_two_ports);
    let out = app.interrupt();
    for p in [0, 1] {
        assert_eq!(peer_xstat(&peer, p, "tx_good_packets"), PER_PORT);
        assert_eq!(
            peer_xstat(&peer, p, "rx_good_packets"),
            PER_PORT,
            "port {p} got back what the other port sent:\n{peer}\n{}",
            out.all()
        );
        assert_eq!(peer_xstat(&peer, p, "rx_missed_errors"), 0);
    }
    // Unchanged: the peer's own frames (txonly's source is the sending port's MAC).
    assert!(
        frames(&peer, "src=02:EE:") == 0 && frames(&peer, "src=") > 0,
        "no frame carries the example's MAC:\n{peer}"
    );
    assert!(
        out.all().contains("Core 0 forwarding packets"),
        "{}",
        out.all()
    );
}

#[test]
fn skeleton_forwards_port_pairs() {
    forwards_pairs_unchanged("skeleton", "build/basicfwd");
}

#[test]
fn rxtx_callbacks_forwards_through_its_callbacks() {
    // Its TSC-stamping RX callback and latency-computing TX callback are installed; it
    // reports latency only every 100 million frames.
    forwards_pairs_unchanged("rxtx_callbacks", "build/rxtx_callbacks");
}

#[test]
fn l2fwd_forwards_rewrites_macs_and_counts() {
    let exe = examples::build("l2fwd", "build/l2fwd");
    let cables = Cables::new("l2fwd", 2);
    let mut app = start(
        &exe,
        "0",
        &cables,
        &["-p", "0x3", "-P", "-q", "2", "-T", "1"],
        "entering main loop",
    );
    let peer = traffic(&cables, None, got_two_ports);
    // Its statistics, printed every second, reach what it forwarded.
    let counted = |o: &str| {
        numbers_after(o, "Total packets received:").last() == Some(&(2 * PER_PORT))
            && numbers_after(o, "Total packets sent:").last() == Some(&(2 * PER_PORT))
    };
    let stats_ok = app.wait_for(counted, Duration::from_secs(10));
    let out = app.interrupt();
    let text = out.all();
    assert!(stats_ok, "l2fwd's statistics:\n{text}");
    assert_eq!(
        numbers_after(&text, "Total packets dropped:").last(),
        Some(&0)
    );
    assert!(text.contains("Bye..."), "{text}");
    // Port 0's frames left through port 1 to 02:00:00:00:00:01 with port 1's MAC as source,
    // and the other way round.
    for p in [0u32, 1] {
        assert_eq!(peer_xstat(&peer, p, "rx_good_packets"), PER_PORT, "{peer}");
        let n = frames(
            &peer,
            &format!("src=02:EE:00:00:00:0{p} - dst=02:00:00:00:00:0{p} "),
        );
        assert!(
            n >= PER_PORT * 9 / 10,
            "port {p}: {n} rewritten frames printed:\n{peer}"
        );
    }
}

#[test]
fn l3fwd_routes_by_longest_prefix() {
    let exe = examples::build("l3fwd", "build/l3fwd");
    let cables = Cables::new("l3fwd", 2);
    let app = start(
        &exe,
        "0",
        &cables,
        &["-p", "0x3", "-P", "--config=(0,0,0),(1,0,0)"],
        "entering main loop",
    );
    // 198.18.1.0/24 routes to port 1 in l3fwd's LPM table: both ports' frames leave there.
    let peer = traffic(
        &cables,
        Some("--tx-ip=198.18.0.1,198.18.1.2"),
        got_two_ports,
    );
    let out = app.interrupt();
    assert_eq!(
        peer_xstat(&peer, 1, "rx_good_packets"),
        2 * PER_PORT,
        "{peer}\n{}",
        out.all()
    );
    assert_eq!(peer_xstat(&peer, 0, "rx_good_packets"), 0);
    let n = frames(&peer, "src=02:EE:00:00:00:01 - dst=02:00:00:00:00:01 ");
    assert!(
        n >= 2 * PER_PORT * 9 / 10,
        "{n} routed frames printed:\n{peer}"
    );
}

#[test]
fn ethtool_answers_and_echoes() {
    let exe = examples::build("ethtool", "ethtool-app/build/ethtool");
    let lib = exe.parent().unwrap().join("../../lib/build");
    let cables = Cables::new("ethtool", 1);
    let mut app = App::start(&exe, "0-1", &cables.example_vdevs(""), &[], &[lib]);
    assert!(
        app.wait_for(|o| o.contains("EthApp>"), START),
        "{}",
        app.output()
    );
    for cmd in [
        "drvinfo",
        "ringparam 0",
        "pause 0",
        "macaddr 0",
        "validate 02:00:00:00:00:01",
    ] {
        app.type_line(cmd);
    }
    // It is not promiscuous: the peer sends to its address. While the peer is plugged in,
    // the link is up; once it left, down. The peer sends, and so leaves, only once the app
    // has seen the link up (the gate), however fast its session runs.
    let gate = cables.dir.join("link-seen");
    let mut link_up = false;
    let peer = std::thread::scope(|s| {
        let peer = s.spawn(|| {
            traffic_of(
                &cables,
                Some("--eth-peer=0,02:ee:00:00:00:00"),
                PER_PORT / 32,
                Some(&gate),
                got_one_port,
            )
        });
        let until = std::time::Instant::now() + START;
        while !link_up && !peer.is_finished() && std::time::Instant::now() < until {
            app.type_line("link");
            link_up = app.wait_for(|o| o.contains("Port 0: Up"), Duration::from_millis(300));
        }
        std::fs::write(&gate, b"").unwrap();
        peer.join().unwrap()
    });
    app.type_line("link");
    app.type_line("portstats 0");
    let stats = |o: &str| o.contains("Port 0 stats");
    let got_stats = app.wait_for(stats, Duration::from_secs(10));
    app.type_line("mtu 0 1400");
    app.type_line("quit");
    let out = app.finish(Duration::from_secs(20));
    let text = out.all();
    assert!(got_stats, "{text}");
    assert!(text.contains("Port 0 driver: net_mlx4rs"), "{text}");
    assert!(link_up, "{text}");
    let after = &text[text.rfind("Port 0: Up").unwrap()..];
    assert!(
        after.contains("Port 0: Down"),
        "the peer gone, down:\n{text}"
    );
    assert!(text.contains("Port 0 ring parameters"), "{text}");
    assert!(
        text.contains("Port 0 MAC Address: 02:EE:00:00:00:00"),
        "{text}"
    );
    assert!(text.contains("Address is unicast"), "{text}");
    assert!(text.contains("Port 0: MTU set to 1400"), "{text}");
    let port_stats = &text[text.find("Port 0 stats").unwrap()..];
    assert_eq!(
        numbers_after(port_stats, "In:").first(),
        Some(&PER_PORT),
        "{text}"
    );
    assert_eq!(
        numbers_after(port_stats, "Out:").first(),
        Some(&PER_PORT),
        "{text}"
    );
    // Echoed: back to the sender, from the example's MAC.
    assert_eq!(peer_xstat(&peer, 0, "rx_good_packets"), PER_PORT, "{peer}");
    let n = frames(&peer, "src=02:EE:00:00:00:00 - dst=");
    assert!(n >= PER_PORT * 9 / 10, "{n} echoed frames printed:\n{peer}");
}

#[test]
fn flow_filtering_steers_its_destination_to_queue_1() {
    let exe = examples::build("flow_filtering", "build/flow");
    let cables = Cables::new("flow_filtering", 1);
    // Its RX rings hold 512 frames: half of that per batch, so that none is lost while it
    // waits for the CPU.
    const N: u64 = 256;
    // It starts only once its link is up: the peer must be plugged in by then. It creates its
    // rule after that, and says nothing when it has: our debug log line is the sign. Frames
    // sent before it would rightly take the default queue.
    let mut app = App::start_with(
        &exe,
        "0",
        &cables.example_vdevs(""),
        &["--log-level=pmd.net.mlx4rs:debug"],
        &[],
        &[],
    );
    // Its rule: IPv4 to 192.168.1.1 -> queue 1. Frames to another address take the default.
    let ruled = |o: &str| o.contains("flow rule created, in force");
    let gate = cables.dir.join("ruled");
    let on_1 = |o: &str| o.matches(" - queue=0x1").count() as u64 >= N;
    let steered = std::thread::scope(|s| {
        s.spawn(|| {
            traffic_of(
                &cables,
                Some("--tx-ip=10.0.0.1,192.168.1.1"),
                N / 32,
                Some(&gate),
                |_| true,
            )
        });
        assert!(
            app.wait_for(ruled, START),
            "flow_filtering never created its rule:\n{}",
            app.output()
        );
        std::fs::write(&gate, b"").unwrap();
        app.wait_for(on_1, START)
    });
    traffic_of(
        &cables,
        Some("--tx-ip=10.0.0.1,192.168.1.2"),
        N / 32,
        None,
        |_| true,
    );
    let on_0 = |o: &str| o.matches(" - queue=0x0").count() as u64 >= N;
    let defaulted = app.wait_for(on_0, START);
    let out = app.interrupt();
    let text = out.all();
    assert!(!text.contains("Flow can't be created"), "{text}");
    assert!(steered && defaulted, "{text}");
    assert_eq!(text.matches(" - queue=0x1").count() as u64, N, "{text}");
    assert_eq!(text.matches(" - queue=0x0").count() as u64, N, "{text}");
    // The frames to 192.168.1.1 (sent first) all went to queue 1, the others to queue 0.
    assert!(
        text.rfind(" - queue=0x1") < text.find(" - queue=0x0"),
        "{text}"
    );
}

#[test]
fn link_status_interrupt_sees_the_peer_go_down_and_up() {
    let exe = examples::build("link_status_interrupt", "build/link_status_interrupt");
    let cables = Cables::new("lsi", 2);
    let mut app = start(
        &exe,
        "0",
        &cables,
        &["-p", "0x3", "-q", "2", "-T", "1"],
        "entering main loop",
    );
    // A peer comes (link up), forwards through it, and goes (link down); another comes.
    let peer = traffic(&cables, None, got_two_ports);
    let down = |o: &str| {
        o.find("Port 0 Link up at")
            .is_some_and(|up| o[up..].contains("Port 0 Link down"))
    };
    let went_down = app.wait_for(down, Duration::from_secs(10));
    // The second peer stays plugged in until the example saw it (or 30 s passed): one that
    // came and went within the device's monitor period would be no event at all.
    let seen = cables.dir.join("seen");
    let wait_seen = format!(
        "i=0; while [ ! -e {} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done",
        seen.display()
    );
    // Its callback prints the link it finds on each event.
    let up_again = |o: &str| {
        let first = o.find("Port 0 Link up at").unwrap_or(o.len());
        o[first..]
            .find("Port 0 Link down")
            .is_some_and(|d| o[first + d..].contains("Port 0 Link up at"))
    };
    let (again, came_back) = std::thread::scope(|s| {
        let peer = s.spawn(|| {
            examples::peer(
                &cables,
                &["--forward-mode=rxonly"],
                &[
                    Until {
                        cmd: "show port info all",
                        done: links_up,
                        limit: START,
                    },
                    Shell(&wait_seen),
                    Cmd("quit"),
                ],
            )
        });
        let came_back = app.wait_for(up_again, START);
        std::fs::write(&seen, b"").unwrap();
        (peer.join().unwrap(), came_back)
    });
    assert!(again.status.success(), "{}", again.all());
    let text = app.interrupt().all();
    assert!(
        went_down && came_back,
        "LSC callbacks for port 0 going up, down and up:\n{text}"
    );
    assert!(text.contains("Event type: LSC interrupt"), "{text}");
    // Its forwarding (l2fwd's) worked while the link was up.
    for p in [0, 1] {
        assert_eq!(peer_xstat(&peer, p, "rx_good_packets"), PER_PORT, "{peer}");
    }
}

#[test]
fn l3fwd_power_sleeps_and_wakes_on_rx_interrupts() {
    let exe = examples::build("l3fwd-power", "build/l3fwd-power");
    let cables = Cables::new("l3fwd_power", 2);
    // The device runs in the polling lcore (the default): while that lcore sleeps, the
    // device's monitor runs it, so a frame that arrives completes on the armed CQ and wakes it.
    let mut app = App::start(
        &exe,
        "0",
        &cables.example_vdevs(""),
        &[
            "-p",
            "0x3",
            "-P",
            "--config=(0,0,0),(1,0,0)",
            "--interrupt-only",
        ],
        &[],
    );
    let ready = app.wait_for(|o| o.contains("entering main interrupt loop"), START);
    assert!(ready, "{}", app.output());
    // 2.1.1.0/24 routes to port 1 in its LPM table.
    let peer = traffic(&cables, Some("--tx-ip=1.1.1.1,2.1.1.2"), got_two_ports);
    // Woken by an interrupt, it says so; when it next sleeps, it says that too.
    let woke_and_slept = |o: &str| {
        o.find("is waked up from rx interrupt")
            .is_some_and(|w| o[w..].contains("sleeps until interrupt triggers"))
    };
    let cycled = app.wait_for(woke_and_slept, Duration::from_secs(10));
    let out = app.interrupt();
    let text = out.all();
    assert!(cycled, "{text}");
    assert_eq!(
        peer_xstat(&peer, 1, "rx_good_packets"),
        2 * PER_PORT,
        "{peer}\n{text}"
    );
}
