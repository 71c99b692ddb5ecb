//! Faults injected by the software HCA (`faults=` devarg) while testpmd forwards: an error
//! completion every N send WQEs, a receive buffer error every N frames, the link going down and up,
//! lost doorbells, lost or repeated send completions. After each, the queues work again (the fault
//! fires again only on WQEs or frames the recovered queue handled), the counters say what happened
//! and conserve frames, and once the ports are stopped the mbufs in use are exactly the RX rings'
//! (nothing leaked; a double free would corrupt the pool's counts or crash).
//!
//! Conservation, per direction of a cable from port A to port B, read after `port stop all`
//! (the transmit queues are drained, the receivers have taken what reached them):
//! - A's `tx_good_packets - tx_flushed` (packets posted and not lost with a failed queue) are
//!   the frames A's device sent: `hca_tx_frames + hca_tx_drops_wire`;
//! - A's `hca_tx_frames` are the frames B's device took: `hca_rx_frames` plus every
//!   `hca_rx_drops_*`.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{file_prefix, in_use, testpmd_in, Step};

const RXD: u64 = 512;

/// The xstats of `port` in the last `show port xstats` of `text` that covers it.
fn port_xstats(text: &str, port: u16) -> HashMap<String, u64> {
    let key = format!("NIC extended statistics for port {port} ");
    let i = text
        .rfind(&key)
        .unwrap_or_else(|| panic!("no xstats of port {port} in:\n{text}"));
    let block = &text[i + key.len()..];
    let end = ["NIC extended statistics", "testpmd> "]
        .iter()
        .filter_map(|k| block.find(k))
        .min()
        .unwrap_or(block.len());
    block[..end]
        .lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            Some((k.trim().to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

/// One port's counters, read by name (a missing name fails the test, saying which).
struct Port {
    id: u16,
    x: HashMap<String, u64>,
}

impl Port {
    fn get(&self, name: &str) -> u64 {
        *self
            .x
            .get(name)
            .unwrap_or_else(|| panic!("port {}: no xstat {name}: {:?}", self.id, self.x))
    }

    /// Frames the device took at the port: delivered to a queue, or dropped and counted.
    fn hca_rx_arrived(&self) -> u64 {
        self.get("hca_rx_frames")
            + self
                .x
                .iter()
                .filter(|(k, _)| k.starts_with("hca_rx_drops_"))
                .map(|(_, v)| v)
                .sum::<u64>()
    }

    /// Posted packets that were not lost with a failed queue are the frames the device sent
    /// or dropped at its wire; the packets lost are `oerrors`.
    fn check_tx_conserved(&self) {
        let posted = self.get("tx_good_packets");
        let flushed = self.get("tx_flushed");
        assert_eq!(
            posted - flushed,
            self.get("hca_tx_frames") + self.get("hca_tx_drops_wire"),
            "port {}: posted {posted}, flushed {flushed}: {:?}",
            self.id,
            self.x
        );
        assert_eq!(self.get("tx_errors"), flushed, "port {}", self.id);
        assert_eq!(
            self.get("tx_error_cqes"),
            self.get("tx_queue_resets"),
            "port {}: every error completion recreated its queue",
            self.id
        );
    }
}

/// Both ports' TX counts, and both directions of the cable.
fn check_conserved(a: &Port, b: &Port) {
    for p in [a, b] {
        p.check_tx_conserved();
    }
    check_cable(a, b);
    check_cable(b, a);
}

/// Frames `from` put on the cable are what `to` took.
fn check_cable(from: &Port, to: &Port) {
    assert_eq!(
        from.get("hca_tx_frames"),
        to.hca_rx_arrived(),
        "port {} -> port {}: {:?}\n{:?}",
        from.id,
        to.id,
        from.x,
        to.x
    );
}

/// Runs testpmd on two cabled ports (`faults` on the first, `extra` devargs on both),
/// forwarding with `fwd`, started with `start`, until `done` holds for `show port xstats 0`;
/// then stops, reads both ports' xstats and the mempool. Returns both ports' counters after
/// the stop.
fn cable_run(
    tag: &str,
    faults: &str,
    extra: &str,
    fwd: &str,
    start: &str,
    done: fn(&str) -> bool,
) -> [Port; 2] {
    let prefix = file_prefix(tag);
    let p0 = format!("net_mlx4rs0,wire=peer:net_mlx4rs1,faults={faults}{extra}");
    let p1 = format!("net_mlx4rs1,wire=peer:net_mlx4rs0{extra}");
    let steps = [
        Step::Cmd(start),
        Step::Until {
            cmd: "show port xstats 0",
            done,
            limit: Duration::from_secs(60),
        },
        Step::Cmd("stop"),
        Step::Quick("port stop all"),
        Step::Quick("show port xstats all"),
        Step::Quick(common::dump_mempool()),
        Step::Cmd("quit"),
    ];
    let out = testpmd_in(
        &prefix,
        1024,
        &[&p0, &p1],
        &[
            &format!("--forward-mode={fwd}"),
            "--total-num-mbufs=16384",
            &format!("--rxd={RXD}"),
            &format!("--txd={RXD}"),
        ],
        &steps,
        Duration::from_secs(120),
    );
    let all = out.all();
    assert!(out.status.success(), "testpmd failed:\n{all}");
    assert!(
        all.contains(&format!("injects faults {faults}")),
        "the probe names the faults:\n{all}"
    );
    let used = in_use(&out.stdout);
    assert_eq!(
        used.last().copied(),
        Some(2 * RXD),
        "after stop only the RX rings hold mbufs:\n{}",
        tail(&all)
    );
    // The last xstats block of each port is the one after the stop.
    let ports = [0, 1].map(|id| Port {
        id,
        x: port_xstats(&out.stdout, id),
    });
    let p = &ports[0];
    let shown = [
        "tx_good_packets",
        "tx_flushed",
        "tx_error_cqes",
        "tx_queue_resets",
        "tx_doorbell_rerings",
        "rx_good_packets",
        "rx_missed_errors",
        "rx_error_cqes",
        "rx_queue_resets",
        "hca_tx_frames",
        "hca_tx_drops_wire",
        "hca_inj_tx_errors",
        "hca_inj_rx_errors",
        "hca_inj_doorbells_dropped",
        "hca_inj_link_downs",
        "tx_cqe_mismatches",
        "hca_inj_cqe_drops",
        "hca_inj_cqe_dups",
    ];
    let line: Vec<String> = shown.iter().map(|n| format!("{n}={}", p.get(n))).collect();
    eprintln!("{tag} ({faults}): port 0 {}", line.join(" "));
    ports
}

fn at_least(text: &str, name: &str, n: u64) -> bool {
    common::xstat(text, name).is_some_and(|v| v >= n)
}

#[test]
fn error_completion_every_n_send_wqes() {
    let [a, b] = cable_run("faults-tx", "tx_error:5000", "", "txonly", "start", |t| {
        at_least(t, "tx_queue_resets", 3)
    });
    // Each injected error needs 5000 more WQEs executed on the queue that replaced the failed
    // one: three of them prove it sent again after each recovery.
    assert!(a.get("hca_inj_tx_errors") >= 3);
    assert_eq!(a.get("tx_error_cqes"), a.get("hca_inj_tx_errors"));
    assert!(a.get("tx_flushed") >= a.get("tx_error_cqes"), "{:?}", a.x);
    assert!(a.get("hca_tx_frames") >= 3 * 4999);
    check_conserved(&a, &b);
}

#[test]
fn receive_buffer_error_every_n_frames() {
    // io over the cable: port 0's receive queue fails every 3000th frame and is restarted in
    // place; what circulates keeps circulating.
    let [a, b] = cable_run(
        "faults-rx",
        "rx_error:3000",
        "",
        "io",
        "start tx_first 16",
        |t| at_least(t, "rx_queue_resets", 3),
    );
    let inj = a.get("hca_inj_rx_errors");
    assert!(inj >= 3);
    // Each error stopped the queue; each stop was seen, counted and undone.
    assert_eq!(a.get("rx_error_cqes"), inj, "{:?}", a.x);
    assert_eq!(a.get("rx_queue_resets"), inj, "{:?}", a.x);
    assert_eq!(a.get("rx_errors"), inj, "ierrors");
    // The failed frames and those that met the stopped queue are missed, as a NIC says.
    assert_eq!(
        a.get("rx_missed_errors"),
        a.get("hca_rx_drops_error")
            + a.get("hca_rx_drops_no_wqe")
            + a.get("hca_rx_drops_wire")
            + a.get("hca_rx_drops_cq_full")
            + a.get("hca_rx_drops_not_ready")
    );
    assert!(a.get("hca_rx_drops_error") >= inj);
    assert!(a.get("rx_good_packets") <= a.get("hca_rx_frames"));
    assert_eq!(b.get("rx_error_cqes"), 0);
    check_conserved(&a, &b);
}

#[test]
fn link_down_and_up() {
    // Down after every 20000 frames sent, up again after 2000 more were sent into it.
    let [a, b] = cable_run(
        "faults-flap",
        "flap:20000+2000",
        "",
        "txonly",
        "start",
        |t| at_least(t, "hca_inj_link_downs", 3),
    );
    assert!(a.get("hca_inj_link_downs") >= 3);
    // Two flaps completed: at least 2 x 2000 frames lost at the wire, and counted.
    assert!(a.get("hca_tx_drops_wire") >= 2 * 2000, "{:?}", a.x);
    assert!(a.get("hca_tx_frames") >= 3 * 20000);
    assert_eq!(a.get("tx_error_cqes"), 0);
    check_conserved(&a, &b);
}

#[test]
fn lost_doorbells() {
    // The doorbell path only (BlueFlame writes carry their own doorbell): every 7th is lost.
    // The next burst's doorbell covers what the lost one announced, and the drain at port
    // stop rings again for the last: nothing is stranded, nothing lost.
    let [a, b] = cable_run(
        "faults-db",
        "db_drop:7",
        ",bf=off",
        "txonly",
        "start",
        |t| at_least(t, "hca_inj_doorbells_dropped", 200),
    );
    assert!(a.get("hca_inj_doorbells_dropped") >= 200);
    assert_eq!(a.get("tx_flushed"), 0);
    assert_eq!(
        a.get("tx_good_packets"),
        a.get("hca_tx_frames") + a.get("hca_tx_drops_wire"),
        "every posted packet left: {:?}",
        a.x
    );
    check_conserved(&a, &b);
}

#[test]
fn lost_and_repeated_send_completions() {
    // Every 97th completion is lost, every 89th written one comes twice: the driver pairs
    // completions to its requests by WQE index, so a later one covers a lost one and a repeat
    // is ignored; the queue never looks full for good.
    let [a, b] = cable_run(
        "faults-cqe",
        "cqe_drop:97/cqe_dup:89",
        "",
        "txonly",
        "start",
        |t| at_least(t, "hca_inj_cqe_drops", 200) && at_least(t, "hca_inj_cqe_dups", 200),
    );
    let (drops, dups) = (a.get("hca_inj_cqe_drops"), a.get("hca_inj_cqe_dups"));
    assert!(drops >= 200 && dups >= 200, "{:?}", a.x);
    // Each lost one counts once a later one arrived: all but perhaps the very last, which
    // the stop's reset reclaimed.
    let mismatches = a.get("tx_cqe_mismatches");
    assert!(
        mismatches <= drops + dups && mismatches + 1 >= drops + dups,
        "{:?}",
        a.x
    );
    assert_eq!((a.get("tx_flushed"), a.get("tx_error_cqes")), (0, 0));
    assert_eq!(b.get("tx_cqe_mismatches"), 0);
    check_conserved(&a, &b);
}

#[test]
fn every_fault_at_once_while_io_forwards() {
    let [a, b] = cable_run(
        "faults-all",
        "tx_error:20000/rx_error:15000/db_drop:50/flap:60000+100",
        ",bf=off",
        "io",
        "start tx_first 16",
        |t| {
            [
                "hca_inj_tx_errors",
                "hca_inj_rx_errors",
                "hca_inj_doorbells_dropped",
                "hca_inj_link_downs",
            ]
            .iter()
            .all(|n| at_least(t, n, 1))
                && at_least(t, "rx_queue_resets", 1)
                && at_least(t, "tx_queue_resets", 1)
        },
    );
    assert_eq!(a.get("rx_queue_resets"), a.get("hca_inj_rx_errors"));
    assert_eq!(a.get("tx_error_cqes"), a.get("hca_inj_tx_errors"));
    check_conserved(&a, &b);
}

#[test]
fn testpmd_set_link_down_and_up() {
    // The operator's version of a flap: `set link-down` while txonly runs drops what the
    // port sends (counted at the wire), `set link-up` lets it through again.
    let link_of = |text: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("Link status:"))
            .map(|s| s.trim().to_owned())
            .collect()
    };
    let steps = [
        Step::Cmd("start"),
        Step::Cmd("set link-down port 0"),
        Step::Cmd("show port info 0"),
        Step::Until {
            cmd: "show port xstats 0",
            done: |t| at_least(t, "hca_tx_drops_wire", 10_000),
            limit: Duration::from_secs(60),
        },
        Step::Cmd("set link-up port 0"),
        Step::Cmd("show port info 0"),
        Step::Cmd("clear port xstats 0"),
        Step::Until {
            cmd: "show port xstats 0",
            done: |t| at_least(t, "hca_tx_frames", 10_000),
            limit: Duration::from_secs(60),
        },
        Step::Cmd("stop"),
        Step::Quick("port stop all"),
        Step::Quick("show port xstats 0"),
        Step::Quick(common::dump_mempool()),
        Step::Cmd("quit"),
    ];
    let out = testpmd_in(
        &file_prefix("faults-link"),
        1024,
        &[
            "net_mlx4rs0,wire=peer:net_mlx4rs1",
            "net_mlx4rs1,wire=peer:net_mlx4rs0",
        ],
        &[
            "--forward-mode=txonly",
            "--total-num-mbufs=16384",
            &format!("--rxd={RXD}"),
            &format!("--txd={RXD}"),
        ],
        &steps,
        Duration::from_secs(150),
    );
    let all = out.all();
    assert!(out.status.success(), "testpmd failed:\n{all}");
    assert_eq!(link_of(&out.stdout), ["down", "up"], "{}", tail(&all));
    let a = Port {
        id: 0,
        x: port_xstats(&out.stdout, 0),
    };
    // After link-up (and the counters cleared) frames reach the wire again.
    assert!(a.get("hca_tx_frames") >= 10_000, "{:?}", a.x);
    assert_eq!(in_use(&out.stdout).last().copied(), Some(2 * RXD));
}

#[test]
fn a_bad_fault_spec_fails_that_ports_probe_only() {
    let out = testpmd_in(
        &file_prefix("faults-bad"),
        512,
        &[
            "net_mlx4rs0,wire=loop,faults=tx_error:+5",
            "net_mlx4rs1,wire=loop",
        ],
        &[],
        &[Step::Cmd("show port summary all"), Step::Cmd("quit")],
        Duration::from_secs(60),
    );
    let all = out.all();
    assert!(
        all.contains("invalid devarg faults=\"tx_error:+5\"") && all.contains("is not a count"),
        "{all}"
    );
    assert!(all.contains("net_mlx4rs1"), "the other port probed:\n{all}");
}

fn tail(s: &str) -> &str {
    &s[s.len().saturating_sub(6000)..]
}
