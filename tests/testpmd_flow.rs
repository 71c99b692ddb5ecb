//! rte_flow through real `dpdk-testpmd`: rules created, validated, listed, queried, destroyed
//! and flushed steer real frames. The traffic is testpmd's own `flowgen` on a looped port:
//! UDP 10.254.0.0:1000 -> 10.253.x.y:1001 to 00:01:02:03:04:01, the destination address
//! cycling over 1024 values (10.253.0.0 to 10.253.3.255), sent on every TX queue and
//! received, counted and freed on every RX queue. Each phase runs the traffic until the
//! device has received enough frames, stops, and reads the per-queue and device counters.

mod common;

use common::{testpmd, xstat, Output, Step, Step::*};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);
/// Frames a phase sends, at least (all of them come back: the wire is a loop).
const FRAMES: u64 = 20_000;

fn enough(answer: &str) -> bool {
    xstat(answer, "hca_tx_frames").is_some_and(|n| n >= FRAMES)
}

/// One phase: the port restarted (which empties the receive rings of frames the last phase
/// left in flight; testpmd flushes a port's rules when it stops it), `stopped` run before the
/// start, `rules` after it, then the traffic until enough frames went round, and the
/// counters shown.
fn phase(steps: &mut Vec<Step<'static>>, stopped: &[&'static str], rules: &[&'static str]) {
    steps.push(Cmd("port stop 0"));
    steps.extend(stopped.iter().map(|c| Cmd(c)));
    steps.extend([Cmd("port start 0"), Cmd("clear port xstats 0")]);
    steps.extend(rules.iter().map(|c| Cmd(c)));
    steps.extend([
        Cmd("start"),
        Until {
            cmd: "show port xstats 0",
            done: enough,
            limit: Duration::from_secs(20),
        },
        Cmd("stop"),
        Cmd("show port xstats 0"),
    ]);
}

fn looped_session(steps: Vec<Step<'_>>) -> Output {
    testpmd(
        &["net_mlx4rs0,wire=loop"],
        &[
            "--rxq=4",
            "--txq=4",
            "--total-num-mbufs=8192",
            "--forward-mode=flowgen",
        ],
        &steps,
        LIMIT,
    )
}

/// The counters each phase ended with: the xstats shown after each `stop`.
fn phases(all: &str) -> Vec<Counters> {
    all.split("Telling cores to stop")
        .skip(1)
        .map(|chunk| {
            let from = chunk
                .find("NIC extended statistics for port 0")
                .unwrap_or_else(|| panic!("no xstats after stop:\n{chunk}"));
            let block = &chunk[from..];
            let end = block.find("testpmd>").unwrap_or(block.len());
            Counters(block[..end].to_owned())
        })
        .collect()
}

struct Counters(String);

impl Counters {
    fn get(&self, name: &str) -> u64 {
        xstat(&self.0, name).unwrap_or_else(|| panic!("no {name} in\n{}", self.0))
    }

    fn queues(&self) -> [u64; 4] {
        [0, 1, 2, 3].map(|q| self.get(&format!("rx_q{q}_packets")))
    }
}

#[test]
fn rules_steer_drop_spread_and_isolate_real_frames() {
    const UDP_TO_2: &str =
        "flow create 0 ingress pattern eth / ipv4 / udp dst is 1001 / end actions queue index 2 / count / end";
    const DROP_HALF: &str = "flow create 0 ingress pattern eth / ipv4 dst spec 10.253.0.0 dst mask 255.255.254.0 / end actions drop / end";
    let mut s = Vec::new();
    // 1: every UDP frame to port 1001 on queue 2, counted.
    phase(
        &mut s,
        &[],
        &[
            "flow validate 0 ingress pattern eth / ipv4 / udp dst is 1001 / end actions queue index 2 / count / end",
            UDP_TO_2,
            "flow list 0",
        ],
    );
    s.push(Cmd("flow query 0 0 count"));
    // 2: half the destinations dropped; the queue rule destroyed, so the rest spread by the
    // port's RSS.
    phase(&mut s, &[], &[UDP_TO_2, DROP_HALF, "flow destroy 0 rule 0"]);
    // 3: after a flush, an RSS context of the rule's own, over queues 1 and 3.
    phase(
        &mut s,
        &[],
        &[
            DROP_HALF,
            UDP_TO_2,
            "flow flush 0",
            "flow create 0 ingress pattern eth / ipv4 / udp / end actions rss queues 1 3 end / end",
        ],
    );
    // 4: tagged frames; rules on the VLAN ID made while the port is stopped, given to the
    // device at start; the one on another VLAN, though checked first, takes nothing.
    phase(
        &mut s,
        &[
            "tx_vlan set 0 5",
            "flow create 0 priority 1 ingress pattern eth / vlan vid is 5 / end actions queue index 1 / end",
            "flow create 0 priority 0 ingress pattern eth / vlan vid is 6 / end actions drop / end",
        ],
        &[],
    );
    // 5: isolated: nothing without a rule; 6: what the one rule (on the destination MAC)
    // takes, on its queue.
    phase(&mut s, &["tx_vlan reset 0"], &["flow isolate 0 1"]);
    phase(
        &mut s,
        &[],
        &["flow create 0 ingress pattern eth dst is 00:01:02:03:04:01 / end actions queue index 3 / end"],
    );
    s.push(Cmd("quit"));

    let out = looped_session(s);
    let all = out.all();
    assert!(out.status.success(), "{all}");
    assert!(all.contains("Flow rule validated"), "{all}");
    assert!(
        all.contains("0\t0\t0\ti--\tETH IPV4 UDP => QUEUE COUNT"),
        "flow list shows the rule:\n{all}"
    );
    let p = phases(&all);
    assert_eq!(p.len(), 6, "six phases ran:\n{all}");

    // 1: all on queue 2, and the rule counted at least what queue 2 handed up.
    let q = p[0].queues();
    assert!(q[2] > 0 && q[0] + q[1] + q[3] == 0, "queue rule: {q:?}");
    let hits = common::number_after(&all, "hits:").expect("flow query answered");
    assert!(hits >= q[2], "count {hits} covers queue 2's {}", q[2]);

    // 2: half dropped by the rule, the rest on all four queues.
    // Of every frame that went round (a queue that cannot take its share drops after the
    // rules, as rx_drops_no_wqe, so the frames delivered are not the whole other half).
    let (total, dropped) = (p[1].get("hca_tx_frames"), p[1].get("hca_rx_drops_flow"));
    assert!(
        dropped * 100 >= total * 45 && dropped * 100 <= total * 55,
        "drop rule took {dropped} of {total}"
    );
    assert!(
        p[1].queues().iter().all(|&n| n > 0),
        "RSS: {:?}",
        p[1].queues()
    );

    // 3: queues 1 and 3 only, both used; the flushed drop rule dropped nothing.
    let q = p[2].queues();
    assert!(q[1] > 0 && q[3] > 0 && q[0] + q[2] == 0, "rss rule: {q:?}");
    assert_eq!(p[2].get("hca_rx_drops_flow"), 0);

    // 4: VLAN 5 frames on queue 1, none dropped by the VLAN 6 rule.
    let q = p[3].queues();
    assert!(q[1] > 0 && q[0] + q[2] + q[3] == 0, "vlan rule: {q:?}");
    assert_eq!(p[3].get("hca_rx_drops_flow"), 0);

    // 5: isolated without rules: the device dropped everything.
    assert_eq!(p[4].queues(), [0; 4]);
    assert!(p[4].get("hca_rx_drops_filter") >= FRAMES);
    // 6: ... and with one, what it takes arrives on its queue.
    let q = p[5].queues();
    assert!(
        q[3] > 0 && q[0] + q[1] + q[2] == 0,
        "isolated, MAC rule: {q:?}"
    );
    assert_eq!(p[5].get("hca_rx_drops_filter"), 0);
}

#[test]
fn what_the_device_cannot_match_is_refused_with_a_reason() {
    let out = looped_session(vec![
        Cmd("flow validate 0 ingress pattern eth src is 02:00:00:00:00:01 / end actions queue index 1 / end"),
        Cmd("flow validate 0 ingress pattern eth / ipv4 proto is 17 / end actions drop / end"),
        Cmd("flow validate 0 ingress pattern eth / vlan pcp is 3 / end actions drop / end"),
        Cmd("flow validate 0 ingress pattern eth / ipv6 / end actions drop / end"),
        Cmd("flow validate 0 ingress pattern eth / end actions queue index 9 / end"),
        Cmd("flow validate 0 ingress pattern eth / end actions mark id 3 / queue index 0 / end"),
        Cmd("flow validate 0 egress pattern eth / end actions drop / end"),
        Cmd("flow validate 0 ingress pattern eth / end actions queue index 0 / drop / end"),
        Cmd("flow create 0 ingress pattern eth / end actions count / end"),
        Cmd("flow list 0"),
        Cmd("show port info 0"),
        Cmd("quit"),
    ]);
    let all = out.all();
    assert!(out.status.success(), "{all}");
    for (why, errno) in [
        (
            "only the destination MAC can be matched",
            "Operation not supported",
        ),
        (
            "only the source and destination addresses can be matched",
            "Operation not supported",
        ),
        ("PCP and DEI cannot be matched", "Operation not supported"),
        (
            "item not supported: mlx4 matches eth, vlan, ipv4, tcp and udp",
            "Operation not supported",
        ),
        ("queue: no such RX queue set up", "Invalid argument"),
        (
            "action not supported: mlx4 does queue, rss, drop and count",
            "Operation not supported",
        ),
        ("only ingress rules", "Operation not supported"),
        ("one fate per rule", "Operation not supported"),
        ("a rule needs a fate", "Operation not supported"),
    ] {
        let line = all
            .lines()
            .find(|l| l.contains("Caught PMD error") && l.contains(why))
            .unwrap_or_else(|| panic!("no refusal {why:?}:\n{all}"));
        assert!(line.ends_with(errno), "{line}");
    }
    assert!(!all.contains("Flow rule validated"), "{all}");
    assert!(!all.contains("Flow rule #0 created"), "{all}");
    // Rules outlive a restart (testpmd flushes them anyway when it stops a port).
    assert!(all.contains("FLOW_RULE_KEEP"), "{all}");
}
