//! The TAP wire against the kernel: the interface belongs to the wire wherever the operator
//! moves it; its link state, MTU and carrier follow the port; it outlives the adapter within
//! the process. Needs root and /dev/net/tun.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use mlx4_hca::{Hca, Wire};

/// A network namespace of the test's own, deleted on drop (also when the test fails).
struct Netns(String);

impl Netns {
    fn new(name: String) -> Netns {
        let _ = quiet(&["netns", "del", &name]);
        assert!(
            quiet(&["netns", "add", &name]),
            "`ip netns add {name}` failed: this test needs root and iproute2"
        );
        Netns(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = quiet(&["netns", "del", &self.0]);
    }
}

fn quiet(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("iproute2's `ip` is needed");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Frames that reached the port, delivered or not.
fn arrived(hca: &Hca) -> u64 {
    let c = hca.counters();
    c.rx_frames + c.rx_dropped()
}

/// Sends `n` broadcast frames from `ifname` in namespace `ns` with a packet socket; returns how
/// many the kernel took (it refuses them while the TAP has no carrier).
fn kernel_sends(ns: &str, ifname: &str, n: u32) -> u32 {
    let py = format!(
        "import socket\n\
         s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n\
         s.bind(('{ifname}', 0))\n\
         f = b'\\xff' * 6 + b'\\x02\\x00\\x00\\x00\\x00\\x09' + b'\\x88\\xb5' + bytes(50)\n\
         ok = 0\n\
         for _ in range({n}):\n\
         \x20   try:\n\
         \x20       s.send(f); ok += 1\n\
         \x20   except OSError:\n\
         \x20       pass\n\
         print(ok)\n"
    );
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c", &py])
        .output()
        .expect("python3 is needed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn tap_interface_follows_the_port_wherever_it_is() {
    assert!(
        std::path::Path::new("/dev/net/tun").exists(),
        "this test needs /dev/net/tun (and root) for its TAP interface"
    );
    let id = std::process::id() % 100_000;
    let ifname = format!("m4tw{id}");
    let ns = Netns::new(format!("mlx4rs-tapw-{id}"));
    let hca = Hca::open(step_cfg()).unwrap();
    hca.set_rx_filter([2, 0, 0, 0, 0, 1], true, false);
    hca.set_wire(Wire::Tap(ifname.clone())).unwrap();
    hca.set_port_up(true);

    // Moved into a namespace, given an address and brought up there: the driver's namespace
    // no longer has an interface of that name, and the link is up all the same.
    ip(&["link", "set", &ifname, "netns", &ns.0]);
    assert!(!quiet(&["link", "show", &ifname]));
    ip(&[
        "netns",
        "exec",
        &ns.0,
        "sysctl",
        "-q",
        "-w",
        "net.ipv6.conf.all.disable_ipv6=1",
    ]);
    ip(&["-n", &ns.0, "addr", "add", "10.77.0.1/24", "dev", &ifname]);
    assert!(
        !hca.link_up(),
        "the interface is still down in its namespace"
    );
    ip(&["-n", &ns.0, "link", "set", &ifname, "up"]);
    assert!(hca.link_up(), "the interface is up in {}", ns.0);
    let show = ip(&["-n", &ns.0, "link", "show", &ifname]);
    assert!(
        show.contains("LOWER_UP"),
        "carrier on while the port is up: {show}"
    );

    // The MTU follows the port's, in the namespace.
    hca.set_mtu(9000).unwrap();
    let show = ip(&["-n", &ns.0, "link", "show", &ifname]);
    assert!(show.contains("mtu 9000"), "{show}");

    // Frames from the kernel arrive while the port is up.
    assert_eq!(kernel_sends(&ns.0, &ifname, 3), 3);
    wait_for("3 frames from the kernel", Duration::from_secs(5), || {
        hca.step();
        arrived(&hca) == 3
    });

    // Port down: no carrier, the kernel sends nothing, nothing arrives after the port is up
    // again; the interface keeps its namespace and address.
    hca.set_port_up(false);
    assert!(!hca.link_up());
    let show = ip(&["-n", &ns.0, "link", "show", &ifname]);
    assert!(show.contains("NO-CARRIER"), "{show}");
    let _ = kernel_sends(&ns.0, &ifname, 5);
    hca.step();
    hca.set_port_up(true);
    for _ in 0..10 {
        hca.step();
    }
    assert_eq!(arrived(&hca), 3, "frames queued while the port was down");
    let addr = ip(&["-n", &ns.0, "addr", "show", &ifname]);
    assert!(addr.contains("10.77.0.1/24"), "{addr}");
    assert!(hca.link_up());
    assert_eq!(kernel_sends(&ns.0, &ifname, 2), 2);
    wait_for("2 more frames", Duration::from_secs(5), || {
        hca.step();
        arrived(&hca) == 5
    });

    // The kernel side going down is the link going down, wherever the interface is.
    ip(&["-n", &ns.0, "link", "set", &ifname, "down"]);
    assert!(!hca.link_up());
    ip(&["-n", &ns.0, "link", "set", &ifname, "up"]);
    assert!(hca.link_up());

    // A new adapter with a TAP wire of that name (a port closed and probed again, as by Open
    // vSwitch's del-port and add-port) takes the same interface back, where it is.
    drop(hca);
    let show = ip(&["-n", &ns.0, "link", "show", &ifname]);
    assert!(show.contains("NO-CARRIER"), "kept without carrier: {show}");
    let hca = Hca::open(step_cfg()).unwrap();
    hca.set_rx_filter([2, 0, 0, 0, 0, 1], true, false);
    hca.set_wire(Wire::Tap(ifname.clone())).unwrap();
    assert!(!quiet(&["link", "show", &ifname]), "none made anew here");
    hca.set_port_up(true);
    assert!(hca.link_up());
    let addr = ip(&["-n", &ns.0, "addr", "show", &ifname]);
    assert!(
        addr.contains("10.77.0.1/24") && addr.contains("LOWER_UP"),
        "{addr}"
    );
    assert_eq!(kernel_sends(&ns.0, &ifname, 4), 4);
    wait_for(
        "4 frames on the new adapter",
        Duration::from_secs(5),
        || {
            hca.step();
            arrived(&hca) == 4
        },
    );
}
