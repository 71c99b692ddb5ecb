//! The rows of DPDK's mlx4 feature matrix (issue 17) through real `dpdk-testpmd`, each with its
//! effect checked in the counters or on the wire: link events, removal, queue start/stop,
//! unicast and multicast MAC filters, the VLAN filter, flow control, the firmware version.

mod common;

use common::{port_xstat, scratch_dir, testpmd, xstat, Output, Step, Step::*};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(90);
/// How long a condition may take to hold once asked for.
const WAIT: Duration = Duration::from_secs(10);

/// Two ports cabled back to back whose devices run on threads of their own, so that a port's
/// filters act on frames even while nobody polls it.
const CABLED: [&str; 2] = [
    "net_mlx4rs0,wire=peer:net_mlx4rs1,device_loop=port",
    "net_mlx4rs1,wire=peer:net_mlx4rs0,device_loop=port",
];

fn link(port: u32, up: bool) -> Step<'static> {
    fn up0(a: &str) -> bool {
        a.contains("Link status: up")
    }
    fn down0(a: &str) -> bool {
        a.contains("Link status: down")
    }
    Until {
        cmd: if port == 0 {
            "show port info 0"
        } else {
            "show port info 1"
        },
        done: if up { up0 } else { down0 },
        limit: WAIT,
    }
}

/// The text after the first occurrence of `marker`.
fn after<'a>(all: &'a str, marker: &str) -> &'a str {
    let i = all
        .find(marker)
        .unwrap_or_else(|| panic!("{marker:?} not in:\n{all}"));
    &all[i + marker.len()..]
}

fn ok(out: &Output) -> String {
    let all = out.all();
    assert!(out.status.success(), "testpmd failed:\n{all}");
    all
}

#[test]
fn link_down_and_up_raise_link_state_change_events() {
    let out = testpmd(
        &["net_mlx4rs0,wire=loop"],
        &["--total-num-mbufs=4096"],
        &[
            link(0, true),
            Cmd("set link-down port 0"),
            link(0, false),
            Cmd("set link-up port 0"),
            link(0, true),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = ok(&out);
    let down = after(&all, "set link-down port 0");
    let (down, up) = down.split_at(down.find("set link-up port 0").expect("link-up"));
    assert!(
        down.contains("Link status: down") && down.contains("Port 0: link state change event"),
        "link down: a status and an LSC event:\n{all}"
    );
    assert!(
        up.contains("Link status: up") && up.contains("Port 0: link state change event"),
        "link up: a status and an LSC event:\n{all}"
    );
}

#[test]
fn a_stopped_peer_takes_the_link_down_with_an_event() {
    let out = testpmd(
        &CABLED,
        &["--total-num-mbufs=8192"],
        &[
            link(0, true),
            Cmd("port stop 1"),
            link(0, false),
            Cmd("port start 1"),
            link(0, true),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = ok(&out);
    let stopped = after(&all, "port stop 1");
    let stopped = &stopped[..stopped.find("port start 1").expect("port start")];
    assert!(
        stopped.contains("Port 0: link state change event"),
        "port 0 heard of its peer going down:\n{all}"
    );
}

#[test]
fn deleting_the_cable_file_raises_removal_events() {
    let dir = scratch_dir("rmv");
    let cable = dir.join("cable");
    let a = format!(
        "net_mlx4rs0,wire=cable:{},device_loop=port",
        cable.display()
    );
    let b = format!(
        "net_mlx4rs1,wire=cable:{},device_loop=port",
        cable.display()
    );
    let rm = format!("rm {}", cable.display());
    fn removed(a: &str) -> bool {
        a.contains("device removal event")
    }
    let out = testpmd(
        &[&a, &b],
        &["--total-num-mbufs=8192"],
        &[
            link(0, true),
            Shell(&rm),
            Until {
                cmd: "show port summary all",
                done: removed,
                limit: WAIT,
            },
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = ok(&out);
    for p in 0..2 {
        assert!(
            all.contains(&format!("Port {p}: device removal event")),
            "port {p} heard of its removal:\n{all}"
        );
    }
}

/// Port 0 sends to `dst` (txonly) while port 1, not promiscuous, has `add` applied, then
/// `remove`: port 1's device takes the frames, then drops them at its MAC filter.
fn filter_passes_then_drops(dst: &str, add: &str, remove: &str) -> String {
    fn sent(a: &str) -> bool {
        xstat(a, "hca_rx_frames").is_some_and(|n| n >= 1000)
    }
    fn dropped(a: &str) -> bool {
        xstat(a, "hca_rx_drops_filter").is_some_and(|n| n >= 1000)
    }
    let peer = format!("set eth-peer 0 {dst}");
    let out = testpmd(
        &CABLED,
        &["--total-num-mbufs=8192", "--forward-mode=txonly"],
        &[
            Cmd("set promisc 1 off"),
            Cmd("set allmulti 1 off"),
            Cmd(&peer),
            Cmd(add),
            Cmd("clear port xstats 1"),
            Cmd("start"),
            Until {
                cmd: "show port xstats 1",
                done: sent,
                limit: WAIT,
            },
            Cmd("stop"),
            Cmd("show port xstats 1"),
            Cmd(remove),
            Cmd("clear port xstats 1"),
            Cmd("start"),
            Until {
                cmd: "show port xstats 1",
                done: dropped,
                limit: WAIT,
            },
            Cmd("stop"),
            Cmd("show port xstats 1"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = ok(&out);
    let (with, without) = all.split_at(all.find(remove).expect("remove step"));
    assert!(
        port_xstat(with, 1, "hca_rx_frames") >= 1000,
        "frames to {dst} received after {add:?}:\n{all}"
    );
    assert_eq!(port_xstat(with, 1, "hca_rx_drops_filter"), 0, "{all}");
    assert!(
        port_xstat(without, 1, "hca_rx_drops_filter") >= 1000,
        "frames to {dst} dropped after {remove:?}:\n{all}"
    );
    assert_eq!(port_xstat(without, 1, "hca_rx_frames"), 0, "{all}");
    all
}

#[test]
fn an_added_unicast_mac_is_received_and_a_removed_one_dropped() {
    filter_passes_then_drops(
        "02:00:00:00:00:99",
        "mac_addr add 1 02:00:00:00:00:99",
        "mac_addr remove 1 02:00:00:00:00:99",
    );
}

#[test]
fn a_multicast_list_address_is_received_and_dropped_once_removed() {
    filter_passes_then_drops(
        "01:00:5e:00:00:07",
        "mcast_addr add 1 01:00:5e:00:00:07",
        "mcast_addr remove 1 01:00:5e:00:00:07",
    );
}

#[test]
fn the_vlan_filter_drops_tags_not_in_the_table_and_counts_them() {
    fn passed(a: &str) -> bool {
        xstat(a, "hca_rx_frames").is_some_and(|n| n >= 1000)
    }
    fn dropped(a: &str) -> bool {
        xstat(a, "hca_rx_drops_vlan").is_some_and(|n| n >= 1000)
    }
    let out = testpmd(
        &CABLED,
        &["--total-num-mbufs=8192", "--forward-mode=txonly"],
        &[
            Cmd("set promisc 1 off"),
            Cmd("mac_addr set 1 02:00:00:00:00:01"),
            Cmd("set eth-peer 0 02:00:00:00:00:01"),
            Cmd("port stop 0"),
            Cmd("tx_vlan set 0 5"),
            Cmd("port start 0"),
            Cmd("vlan set filter on 1"),
            Cmd("rx_vlan add 5 1"),
            Cmd("clear port xstats 1"),
            Cmd("start"),
            Until {
                cmd: "show port xstats 1",
                done: passed,
                limit: WAIT,
            },
            Cmd("stop"),
            Cmd("show port xstats 1"),
            Cmd("rx_vlan rm 5 1"),
            Cmd("clear port xstats 1"),
            Cmd("start"),
            Until {
                cmd: "show port xstats 1",
                done: dropped,
                limit: WAIT,
            },
            Cmd("stop"),
            Cmd("show port xstats 1"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = ok(&out);
    let (with, without) = all.split_at(all.find("rx_vlan rm 5 1").expect("rm step"));
    assert!(port_xstat(with, 1, "hca_rx_frames") >= 1000, "{all}");
    assert_eq!(port_xstat(with, 1, "hca_rx_drops_vlan"), 0, "{all}");
    assert!(port_xstat(without, 1, "hca_rx_drops_vlan") >= 1000, "{all}");
    assert_eq!(port_xstat(without, 1, "hca_rx_frames"), 0, "{all}");
}

#[test]
fn a_stopped_rx_queue_takes_no_frame_until_started() {
    fn not_ready(a: &str) -> bool {
        xstat(a, "hca_rx_drops_not_ready").is_some_and(|n| n >= 1000)
    }
    fn received(a: &str) -> bool {
        xstat(a, "hca_rx_frames").is_some_and(|n| n >= 512)
    }
    let out = testpmd(
        &["net_mlx4rs0,wire=loop,device_loop=port"],
        &["--total-num-mbufs=4096", "--forward-mode=txonly"],
        &[
            Cmd("port 0 rxq 0 stop"),
            Cmd("show rxq info 0 0"),
            Cmd("start"),
            Until {
                cmd: "show port xstats 0",
                done: not_ready,
                limit: WAIT,
            },
            Cmd("stop"),
            Cmd("show port xstats 0"),
            Cmd("port 0 rxq 0 start"),
            Cmd("show rxq info 0 0"),
            Cmd("clear port xstats 0"),
            Cmd("start"),
            Until {
                cmd: "show port xstats 0",
                done: received,
                limit: WAIT,
            },
            Cmd("stop"),
            Cmd("show port xstats 0"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = ok(&out);
    let (stopped, started) = all.split_at(all.find("port 0 rxq 0 start").expect("start"));
    assert!(stopped.contains("Rx queue state: stopped"), "{all}");
    assert!(started.contains("Rx queue state: started"), "{all}");
    assert_eq!(port_xstat(stopped, 0, "hca_rx_frames"), 0, "{all}");
    assert!(
        port_xstat(stopped, 0, "hca_rx_drops_not_ready") >= 1000,
        "{all}"
    );
    assert!(port_xstat(started, 0, "hca_rx_frames") >= 512, "{all}");
    assert_eq!(port_xstat(started, 0, "hca_rx_drops_not_ready"), 0, "{all}");
}

/// testpmd's txonly leaves a stopped queue alone, so what is checked is the state ethdev
/// reports and that the queue, started again (or at last, when deferred), sends.
#[test]
fn tx_queues_stop_start_and_defer() {
    fn sent(a: &str) -> bool {
        xstat(a, "hca_tx_frames").is_some_and(|n| n >= 1000)
    }
    let out = testpmd(
        &["net_mlx4rs0,wire=null,device_loop=port"],
        &["--total-num-mbufs=4096", "--forward-mode=txonly"],
        &[
            Cmd("start"),
            Until {
                cmd: "show port xstats 0",
                done: sent,
                limit: WAIT,
            },
            Cmd("stop"),
            Cmd("port 0 txq 0 stop"),
            Cmd("show txq info 0 0"),
            Cmd("port 0 txq 0 start"),
            Cmd("show txq info 0 0"),
            Cmd("clear port xstats 0"),
            Cmd("start"),
            Until {
                cmd: "show port xstats 0",
                done: sent,
                limit: WAIT,
            },
            Cmd("stop"),
            Cmd("port stop 0"),
            Cmd("port 0 txq 0 deferred_start on"),
            Cmd("port start 0"),
            Cmd("show txq info 0 0"),
            Cmd("port 0 txq 0 start"),
            Cmd("clear port xstats 0"),
            Cmd("start"),
            Until {
                cmd: "show port xstats 0",
                done: sent,
                limit: WAIT,
            },
            Cmd("stop"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = ok(&out);
    let states: Vec<&str> = all
        .lines()
        .filter_map(|l| l.strip_prefix("Tx queue state: "))
        .collect();
    assert_eq!(states, ["stopped", "started", "stopped"], "{all}");
    let restarted = after(&all, "port 0 txq 0 start");
    assert!(port_xstat(restarted, 0, "hca_tx_frames") >= 1000, "{all}");
    let deferred = after(&all, "deferred_start on");
    let deferred = after(deferred, "port 0 txq 0 start");
    assert!(port_xstat(deferred, 0, "hca_tx_frames") >= 1000, "{all}");
}

#[test]
fn flow_control_is_stored_and_reported_and_fw_version_shown() {
    let out = testpmd(
        &["net_mlx4rs0,wire=loop"],
        &["--total-num-mbufs=4096"],
        &[
            Cmd("show port 0 flow_ctrl"),
            Cmd("set flow_ctrl rx off tx on 100 50 300 1 mac_ctrl_frame_fwd off autoneg off 0"),
            Cmd("show port 0 flow_ctrl"),
            Cmd("show port info 0"),
            Cmd("quit"),
        ],
        LIMIT,
    );
    let all = ok(&out);
    let (before, after_set) = all.split_at(all.find("set flow_ctrl").expect("set"));
    assert!(
        before.contains("Rx pause: on") && before.contains("Tx pause: on"),
        "{all}"
    );
    for want in [
        "Rx pause: off",
        "Tx pause: on",
        "High waterline: 0x64",
        "Low waterline: 0x32",
        "Pause time: 0x12c",
        "Send XON: on",
    ] {
        assert!(after_set.contains(want), "{want}:\n{all}");
    }
    assert!(all.contains("Firmware-version: 2.42.5000"), "{all}");
    assert!(
        all.contains("Maximum number of MAC addresses: 128"),
        "{all}"
    );
}
