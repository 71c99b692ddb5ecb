//! The rows of DPDK's mlx4 feature matrix (doc/features.md) through real `dpdk-testpmd`, each with
//! its effect checked in the counters or on the wire: link events, removal, queue start/stop,
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

/// Port 0 sends (txonly) to port 1, which is not promiscuous: after `setup` and `add`, port 1's
/// device takes the frames; after `remove` it drops them, counted in xstat `drops` (`dropped`
/// waits for 1000 of them).
fn passes_then_drops(
    setup: &[&str],
    add: &str,
    remove: &str,
    drops: &str,
    dropped: fn(&str) -> bool,
) -> String {
    fn sent(a: &str) -> bool {
        xstat(a, "hca_rx_frames").is_some_and(|n| n >= 1000)
    }
    let mut steps: Vec<_> = setup.iter().map(|c| Cmd(c)).collect();
    steps.extend([
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
    ]);
    let out = testpmd(
        &CABLED,
        &["--total-num-mbufs=8192", "--forward-mode=txonly"],
        &steps,
        LIMIT,
    );
    let all = ok(&out);
    let (with, without) = all.split_at(all.find(remove).expect("remove step"));
    assert!(
        port_xstat(with, 1, "hca_rx_frames") >= 1000,
        "frames received after {add:?}:\n{all}"
    );
    assert_eq!(port_xstat(with, 1, drops), 0, "{all}");
    assert!(
        port_xstat(without, 1, drops) >= 1000,
        "frames dropped as {drops} after {remove:?}:\n{all}"
    );
    assert_eq!(port_xstat(without, 1, "hca_rx_frames"), 0, "{all}");
    all
}

/// Port 0 sends to `dst` while port 1 has `add` applied, then `remove`: port 1's device takes
/// the frames, then drops them at its MAC filter.
fn filter_passes_then_drops(dst: &str, add: &str, remove: &str) -> String {
    fn dropped(a: &str) -> bool {
        xstat(a, "hca_rx_drops_filter").is_some_and(|n| n >= 1000)
    }
    let peer = format!("set eth-peer 0 {dst}");
    let setup = ["set promisc 1 off", "set allmulti 1 off", &peer];
    passes_then_drops(&setup, add, remove, "hca_rx_drops_filter", dropped)
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
    fn dropped(a: &str) -> bool {
        xstat(a, "hca_rx_drops_vlan").is_some_and(|n| n >= 1000)
    }
    let setup = [
        "set promisc 1 off",
        "mac_addr set 1 02:00:00:00:00:01",
        "set eth-peer 0 02:00:00:00:00:01",
        "port stop 0",
        "tx_vlan set 0 5",
        "port start 0",
        "vlan set filter on 1",
    ];
    passes_then_drops(
        &setup,
        "rx_vlan add 5 1",
        "rx_vlan rm 5 1",
        "hca_rx_drops_vlan",
        dropped,
    );
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

/// Runs testpmd's csum engine from port 0, a TAP interface into which the kernel (in a
/// namespace of its own) sends the frames `frames_py` builds (Python: a list `frames` of
/// bytes), to port 1, whose wire is a pcap file (more testpmd arguments in `app_args`);
/// `port1_cmds` configure port 1 while it is
/// stopped. Waits until port 1's device sent `wire_frames`, then returns testpmd's output and
/// tshark's `fields` of every frame on the wire (checksum validation on, raw sequence numbers).
fn tap_to_pcap(
    tag: &str,
    devargs: &str,
    app_args: &[&str],
    frames_py: &str,
    port1_cmds: &[&str],
    wire_frames: u64,
    fields: &[&str],
) -> (String, Vec<String>) {
    assert!(
        std::path::Path::new("/dev/net/tun").exists(),
        "this test needs /dev/net/tun (and root) for its TAP interface"
    );
    let id = std::process::id() % 100_000;
    let ifname = format!("m4{tag}{id}");
    let ns = format!("mlx4rs-{tag}-{id}");
    let dir = scratch_dir(tag);
    let pcap = dir.join("wire.pcap");
    let quiet_del = || {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &ns])
            .stderr(std::process::Stdio::null())
            .status();
    };
    quiet_del();
    let tap = format!("net_mlx4rs0,wire=tap:{ifname}{devargs}");
    let out_port = format!("net_mlx4rs1,wire=pcap:{}{devargs}", pcap.display());
    let setup = format!(
        "ip netns add {ns} && ip link set {ifname} netns {ns} && \
         ip netns exec {ns} sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 && \
         ip -n {ns} link set {ifname} mtu 9000 up"
    );
    let script = dir.join("send.py");
    std::fs::write(
        &script,
        format!(
            "import socket, struct\n{frames_py}\n\
             s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n\
             s.bind(('{ifname}', 0))\n\
             for f in frames: s.send(f)\n"
        ),
    )
    .unwrap();
    let send = format!("ip netns exec {ns} python3 {}", script.display());
    let mut steps = vec![Shell(&setup), Cmd("port stop 1")];
    steps.extend(port1_cmds.iter().map(|c| Cmd(c)));
    steps.extend([
        Cmd("port start 1"),
        Cmd("set verbose 1"),
        Cmd("start"),
        Shell(&send),
    ]);
    // Until takes a plain fn: poll with a deadline, then check the count below.
    fn sent_some(a: &str) -> bool {
        xstat(a, "hca_tx_frames").is_some_and(|n| n > 0)
    }
    steps.push(Until {
        cmd: "show port xstats 1",
        done: sent_some,
        limit: WAIT,
    });
    steps.extend([
        Cmd("stop"),
        Cmd("set verbose 0"),
        Cmd("port stop all"),
        Cmd("show port xstats 1"),
        Cmd("quit"),
    ]);
    let mut args = vec![
        "--forward-mode=csum",
        "--total-num-mbufs=8192",
        "--max-pkt-len=9018",
        "--enable-scatter",
    ];
    args.extend(app_args);
    let out = testpmd(&[&tap, &out_port], &args, &steps, LIMIT);
    quiet_del();
    let all = ok(&out);
    assert_eq!(
        port_xstat(&all, 1, "hca_tx_frames"),
        wire_frames,
        "frames on port 1's wire:\n{all}"
    );
    let mut cmd = std::process::Command::new("tshark");
    cmd.arg("-r").arg(&pcap).args([
        "-o",
        "ip.check_checksum:TRUE",
        "-o",
        "tcp.check_checksum:TRUE",
        "-o",
        "udp.check_checksum:TRUE",
        "-o",
        "tcp.relative_sequence_numbers:FALSE",
        "-o",
        "eth.check_fcs:TRUE",
        "-T",
        "fields",
    ]);
    if fields.iter().any(|f| f.starts_with("eth.fcs")) {
        cmd.args(["-o", "eth.fcs:Always"]);
    }
    for f in fields {
        cmd.args(["-e", f]);
    }
    let t = cmd
        .output()
        .expect("tshark not found: run scripts/setup.sh (it installs tshark)");
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
    let rows = String::from_utf8_lossy(&t.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    (all, rows)
}

/// TCP segmentation on the wire: the kernel sends one IPv4 and one IPv6 TCP frame of 3000
/// payload bytes (TCP checksums left zero); the csum engine forwards them with TSO at an MSS
/// of 1000: three segments each on the wire, 1000 payload bytes apiece, consecutive sequence
/// numbers, valid checksums.
#[test]
fn tso_cuts_tcp_over_ipv4_and_ipv6_into_mss_segments_on_the_wire() {
    let frames = "
pay = bytes(i % 251 for i in range(3000))
tcp = struct.pack('!HHIIBBHHH', 1234, 80, 1000, 1, 0x50, 0x18, 65535, 0, 0)
l2 = bytes.fromhex('020000000001020000000002')
v4 = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 40 + len(pay), 7, 0x4000, 64, 6, 0, bytes([10,0,0,1]), bytes([10,0,0,2]))
v6 = struct.pack('!IHBB16s16s', 0x60000000, 20 + len(pay), 6, 64, bytes(15) + b'\\x01', bytes(15) + b'\\x02')
frames = [l2 + b'\\x08\\x00' + v4 + tcp + pay, l2 + b'\\x86\\xdd' + v6 + tcp + pay]
";
    let (all, rows) = tap_to_pcap(
        "tso",
        "",
        &[],
        frames,
        &["csum set ip hw 1", "csum set tcp hw 1", "tso set 1000 1"],
        6,
        &[
            "ipv6.version",
            "ip.checksum.status",
            "tcp.checksum.status",
            "tcp.seq",
            "tcp.len",
        ],
    );
    assert_eq!(port_xstat(&all, 1, "tx_good_packets"), 2, "{all}");
    let want: Vec<String> = ["", "6"]
        .iter()
        .flat_map(|v6| {
            let ip = if v6.is_empty() { "1" } else { "" };
            [1000, 2000, 3000].map(|seq| format!("{v6}\t{ip}\t1\t{seq}\t1000"))
        })
        .collect();
    assert_eq!(
        rows, want,
        "segments on the wire (ipv6, ip csum, tcp csum, seq, len)\n{all}"
    );
}

/// VXLAN on a ConnectX-3 Pro (`pro=1`): the kernel sends a VXLAN frame whose outer IP and
/// inner IP and TCP checksums are zero; port 0 reports it as a tunnel with inner types, and
/// the csum engine (parse-tunnel, inner IP/TCP and outer IP in hardware) forwards it: on the
/// wire, all three checksums are valid.
#[test]
fn vxlan_inner_and_outer_checksums_on_the_wire_and_inner_types_on_receive() {
    let frames = "
pay = bytes(i % 251 for i in range(200))
tcp = struct.pack('!HHIIBBHHH', 1234, 80, 1000, 1, 0x50, 0x18, 65535, 0, 0)
inner = bytes.fromhex('0200000000aa0200000000bb0800') + struct.pack('!BBHHHBBH4s4s', 0x45, 0, 40 + len(pay), 9, 0, 64, 6, 0, bytes([192,168,0,1]), bytes([192,168,0,2])) + tcp + pay
vx = struct.pack('!II', 0x08000000, 42 << 8) + inner
udp = struct.pack('!HHHH', 40000, 4789, 8 + len(vx), 0) + vx
outer = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 3, 0, 64, 17, 0, bytes([10,0,0,1]), bytes([10,0,0,2])) + udp
frames = [bytes.fromhex('020000000001020000000002') + b'\\x08\\x00' + outer]
";
    let (all, rows) = tap_to_pcap(
        "vx",
        ",pro=1",
        &[],
        frames,
        &[
            "csum parse-tunnel on 1",
            "csum set ip hw 1",
            "csum set tcp hw 1",
            "csum set outer-ip hw 1",
        ],
        1,
        &["ip.checksum.status", "tcp.checksum.status", "vxlan.vni"],
    );
    assert_eq!(
        rows,
        ["1,1\t1\t42"],
        "outer and inner IP, inner TCP, VNI\n{all}"
    );
    assert!(
        all.contains("TUNNEL_VXLAN") && all.contains("INNER_L4_TCP"),
        "port 0 reported the tunnel and the inner types:\n{all}"
    );
}

/// IEEE 802.3 CRC-32 (reflected, polynomial 0xedb88320): the FCS of `data`.
fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// KEEP_CRC (`--disable-crc-strip`): port 0 hands up each frame with its 4-byte FCS, which the
/// csum engine forwards as data (after rewriting the MAC addresses, so the FCS no longer
/// matches the frame it trails): on port 1's wire the frame is 4 bytes longer and ends with
/// the CRC-32 of the frame the kernel sent.
#[test]
fn keep_crc_leaves_the_fcs_after_the_frame() {
    let sent: Vec<u8> = [
        &[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x88, 0xb5][..],
        &(0..86u8).map(|i| i % 251).collect::<Vec<_>>(),
    ]
    .concat();
    let frames = "
frames = [bytes.fromhex('020000000001020000000002') + b'\\x88\\xb5' + bytes(i % 251 for i in range(86))]
";
    let (all, rows) = tap_to_pcap(
        "crc",
        "",
        &["--disable-crc-strip"],
        frames,
        &[],
        1,
        &["frame.len", "eth.fcs"],
    );
    // The FCS goes least significant byte first; tshark shows the four bytes as one
    // big-endian number.
    assert_eq!(
        rows,
        [format!("104\t{:#010x}", crc32(&sent).swap_bytes())],
        "100-byte frame + its FCS\n{all}"
    );
}

/// RSS RETA and key update: every bucket of port 1's redirection table to queue 1, and a key
/// of its own; then flows spread by port 0 all land in port 1's queue 1, and the key reads back.
#[test]
fn rss_reta_and_key_updates_steer_and_read_back() {
    // testpmd takes at most 128 characters of entries per command.
    let buckets: Vec<String> = (0..128).map(|h| format!("({h},1)")).collect();
    let reta: Vec<String> = buckets
        .chunks(12)
        .map(|c| format!("port config 1 rss reta {}", c.join(",")))
        .collect();
    let key = "11".repeat(40);
    let set_key = format!("port config 1 rss-hash-key ipv4-udp {key}");
    fn moved(a: &str) -> bool {
        xstat(a, "rx_q1_packets").is_some_and(|n| n >= 1000)
    }
    let mut steps: Vec<Step> = reta.iter().map(|c| Cmd(c)).collect();
    steps.extend([
        Cmd(&set_key),
        Cmd("show port 1 rss-hash key"),
        Cmd("show port 1 rss reta 128 (0xffffffffffffffff,0xffffffffffffffff)"),
        Cmd("start tx_first 2"),
        Until {
            cmd: "show port xstats 1",
            done: moved,
            limit: WAIT,
        },
        Cmd("stop"),
        Cmd("port stop all"),
        Cmd("show port xstats 1"),
        Cmd("quit"),
    ]);
    let out = testpmd(
        &CABLED,
        &[
            "--forward-mode=io",
            "--rxq=2",
            "--txq=2",
            "--txonly-multi-flow",
            "--total-num-mbufs=16384",
        ],
        &steps,
        LIMIT,
    );
    let all = ok(&out);
    assert!(port_xstat(&all, 1, "rx_q1_packets") >= 1000, "{all}");
    assert_eq!(port_xstat(&all, 1, "rx_q0_packets"), 0, "{all}");
    assert!(
        all.contains(&key.to_uppercase()),
        "the new key read back:\n{all}"
    );
}

/// Receive interrupts: DPDK's l3fwd-power (built from the cached source against the installed
/// DPDK) in `--interrupt-only` mode sleeps on port 0's RX interrupt fd; each of five frames the
/// kernel sends into the TAP wakes it once, and it goes back to sleep.
#[test]
fn rx_interrupts_wake_l3fwd_power_once_per_frame() {
    use std::process::Command;
    use std::time::Instant;
    let src = std::path::Path::new("/var/cache/mlx4rs/dpdk-stable-22.11.11/examples/l3fwd-power");
    assert!(
        src.join("main.c").is_file(),
        "{} missing: scripts/setup.sh unpacks the DPDK source package",
        src.display()
    );
    let dir = scratch_dir("l3pw");
    let bin = dir.join("l3fwd-power");
    let flags = |what: &str| -> Vec<String> {
        let o = Command::new("pkg-config")
            .args([what, "libdpdk"])
            .output()
            .expect("pkg-config");
        String::from_utf8(o.stdout)
            .unwrap()
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let cc = Command::new("cc")
        .args(["-O1", "-w", "-DALLOW_EXPERIMENTAL_API"])
        .args(flags("--cflags"))
        .args(["main.c", "perf_core.c", "-o"])
        .arg(&bin)
        .args(flags("--libs"))
        .current_dir(src)
        .output()
        .expect("cc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );

    let id = std::process::id() % 100_000;
    let (ifname, ns) = (format!("m4i{id}"), format!("mlx4rs-intr-{id}"));
    let log = dir.join("out.txt");
    let file = std::fs::File::create(&log).unwrap();
    // Its log lines (RTE_LOG) go to stderr; both streams into one file.
    let mut app = Command::new(&bin)
        .current_dir(std::env::temp_dir())
        .env("LD_LIBRARY_PATH", common::plugin_dir())
        .args(["-l", "0", "--no-huge", "-m", "512", "--no-pci"])
        .arg(format!("--file-prefix={}", common::file_prefix("l3pw")))
        .args(["-d", common::PLUGIN, "--vdev"])
        .arg(format!("net_mlx4rs0,wire=tap:{ifname}"))
        .args(["--", "-p", "0x1", "--config=(0,0,0)", "--interrupt-only"])
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .expect("l3fwd-power");
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let wait_for = |what: &dyn Fn(&str) -> bool| {
        let start = Instant::now();
        while !what(&text()) && start.elapsed() < WAIT * 2 {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let sh = |c: &str| {
        let ok = Command::new("sh")
            .arg("-c")
            .arg(c)
            .status()
            .unwrap()
            .success();
        assert!(ok, "{c}");
    };
    // The TAP interface exists once the port started.
    wait_for(&|_| std::path::Path::new(&format!("/sys/class/net/{ifname}")).exists());
    sh(&format!(
        "ip netns add {ns} && ip link set {ifname} netns {ns} && \
         ip netns exec {ns} sysctl -qw net.ipv6.conf.{ifname}.disable_ipv6=1 && \
         ip -n {ns} link set {ifname} up"
    ));
    // IPv6 off on the kernel's side: its router solicitations and MLD reports would be frames
    // of their own, and wake the application besides the five sent here.
    wait_for(&|t| t.contains("entering main interrupt loop"));
    sh(&format!(
        "ip netns exec {ns} python3 -c \"
import socket, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); s.bind(('{ifname}', 0))
f = bytes.fromhex('ffffffffffff02aabbccddee08004500002e000100004011f96a0a0000010a000002') + bytes(26)
for i in range(5): s.send(f); time.sleep(0.5)
\""
    ));
    let woken = |t: &str| {
        t.matches("is waked up from rx interrupt on port 0 queue 0")
            .count()
    };
    wait_for(&|t| woken(t) >= 5);
    let _ = app.kill();
    let _ = app.wait();
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    let out = text();
    assert_eq!(woken(&out), 5, "one wake-up per frame:\n{out}");
    assert!(
        out.matches("sleeps until interrupt triggers").count() >= 4,
        "asleep again between frames:\n{out}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
