//! Port events the driver hears of without polling: link down and up (the port set down, an
//! injected flap, a cable's far end unplugged, down or gone with its process, a TAP interface
//! set down) and removal, through the port's event fd.

mod common;

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use mlx4_hca::{Faults, Hca, HcaConfig, PortEvent, Wire};

const DEADLINE: Duration = Duration::from_secs(10);

fn cable_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "mlx4_hca_events_{tag}_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ))
}

/// Whether `fd` becomes readable within `ms` milliseconds.
fn readable(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: polling one pollfd on an open descriptor.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n == 1 && p.revents & libc::POLLIN != 0
}

/// Wait for the fd to fire (as EAL's interrupt thread would), then take every event.
fn wait_events(hca: &Hca, fd: RawFd) -> Vec<PortEvent> {
    assert!(
        readable(fd, DEADLINE.as_millis() as i32),
        "no port event within {DEADLINE:?}"
    );
    let v: Vec<_> = std::iter::from_fn(|| hca.next_event()).collect();
    assert!(
        !readable(fd, 0),
        "the fd is quiet once every event is taken"
    );
    v
}

fn cable_end(path: &Path) -> Hca {
    let hca = Hca::open(step_cfg()).unwrap();
    hca.set_wire(Wire::Cable(path.into())).unwrap();
    hca
}

#[test]
fn setting_the_port_down_and_up_is_an_event_each_time() {
    let hca = Hca::open(step_cfg()).unwrap();
    let fd = hca.event_fd().unwrap();
    assert!(!readable(fd, 0), "nothing happened yet");
    assert!(hca.link_up());
    hca.set_port_up(false);
    assert_eq!(wait_events(&hca, fd), [PortEvent::LinkDown]);
    assert!(!hca.link_up());
    hca.set_port_up(false);
    assert!(!readable(fd, 0), "no change, no event");
    hca.set_port_up(true);
    assert_eq!(wait_events(&hca, fd), [PortEvent::LinkUp]);
    assert!(hca.link_up());
}

#[test]
fn an_injected_flap_takes_the_link_down_and_back_up() {
    let hca = Hca::open(HcaConfig {
        faults: Faults {
            link_flap_every: 2,
            link_flap_frames: 1,
            ..Faults::default()
        },
        ..step_cfg()
    })
    .unwrap();
    let fd = hca.event_fd().unwrap();
    let _frames = sink(&hca);
    let mut cq = TestCq::new(&hca, 64);
    let mut sq = TestSq::new(&hca, 64, cq.cqn);
    let pkts = Pkts::new(&hca, 4096);
    let frame = hex(TCP4);
    pkts.mem.put(0, &frame);
    let mut events = Vec::new();
    for _ in 0..3 {
        let mut t = ctrl_tail(2, SIGNALED);
        t.extend(dseg(frame.len() as u32, pkts.lkey, pkts.mem.addr()));
        sq.write(SEND, &t);
        sq.doorbell();
        hca.step();
        cq.drain();
        cq.update_ci();
        events.extend(std::iter::from_fn(|| hca.next_event()));
    }
    assert_eq!(events, [PortEvent::LinkDown, PortEvent::LinkUp]);
    assert_eq!(hca.counters().inj_link_downs, 1);
    assert!(!readable(fd, 0));
}

#[test]
fn a_cables_far_end_unplugged_down_or_back_is_seen_without_polling() {
    let path = cable_path("unplug");
    let a = cable_end(&path);
    let fd = a.event_fd().unwrap();
    // Alone on the cable: no carrier yet.
    assert!(!a.link_up());
    assert_eq!(wait_events(&a, fd), [PortEvent::LinkDown]);
    let b = cable_end(&path);
    assert_eq!(wait_events(&a, fd), [PortEvent::LinkUp]);
    assert!(a.link_up() && b.link_up());
    // The far end set down, then up.
    b.set_port_up(false);
    assert_eq!(wait_events(&a, fd), [PortEvent::LinkDown]);
    b.set_port_up(true);
    assert_eq!(wait_events(&a, fd), [PortEvent::LinkUp]);
    // Unplugged (the far adapter closed).
    drop(b);
    assert_eq!(wait_events(&a, fd), [PortEvent::LinkDown]);
    let b = cable_end(&path);
    assert_eq!(wait_events(&a, fd), [PortEvent::LinkUp]);
    drop(b);
    assert_eq!(wait_events(&a, fd), [PortEvent::LinkDown]);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn deleting_the_cable_file_removes_the_adapter() {
    let path = cable_path("rm");
    let a = cable_end(&path);
    let b = cable_end(&path);
    let fd = a.event_fd().unwrap();
    assert!(a.link_up());
    // Down while alone on the cable, up once `b` plugged in.
    assert_eq!(
        wait_events(&a, fd),
        [PortEvent::LinkDown, PortEvent::LinkUp]
    );
    std::fs::remove_file(&path).unwrap();
    assert_eq!(
        wait_events(&a, fd),
        [PortEvent::LinkDown, PortEvent::Removed]
    );
    assert!(a.removed() && !a.link_up() && !a.port_up());
    // Nothing runs on a removed adapter.
    let mut cq = TestCq::new(&a, 8);
    let mut sq = TestSq::new(&a, 8, cq.cqn);
    sq.write(NOP, &ctrl_tail(1, SIGNALED));
    sq.doorbell();
    assert_eq!(a.step(), 0);
    assert!(cq.poll().is_none());
    drop(b);
}

#[test]
fn remove_is_a_surprise_removal() {
    let hca = Hca::open(step_cfg()).unwrap();
    let fd = hca.event_fd().unwrap();
    hca.remove();
    assert_eq!(
        wait_events(&hca, fd),
        [PortEvent::LinkDown, PortEvent::Removed]
    );
    hca.set_port_up(true);
    assert!(!hca.port_up() && !hca.link_up(), "removed for good");
    hca.remove();
    assert!(!readable(fd, 0), "removed once");
}

const ENV: &str = "MLX4_HCA_EVENTS_CHILD";

/// The far end of `a_cable_peer_whose_process_dies...`: plug in, say so, then wait to be killed.
#[test]
#[ignore = "run by a_cable_peer_whose_process_dies_takes_the_link_down"]
fn events_child() {
    let path = std::env::var(ENV).expect("MLX4_HCA_EVENTS_CHILD: run by the parent test only");
    let _end = cable_end(Path::new(&path));
    println!("plugged");
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn a_cable_peer_whose_process_dies_takes_the_link_down() {
    let path = cable_path("kill");
    let a = cable_end(&path);
    let fd = a.event_fd().unwrap();
    assert_eq!(wait_events(&a, fd), [PortEvent::LinkDown]);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "events_child", "--nocapture"])
        .env(ENV, &path)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("the test binary runs again as the other process");
    let up = wait_events(&a, fd);
    // Killed without a chance to unplug: its side lock goes with the process.
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(up, [PortEvent::LinkUp]);
    let start = Instant::now();
    assert_eq!(wait_events(&a, fd), [PortEvent::LinkDown]);
    assert!(start.elapsed() < Duration::from_secs(1));
    std::fs::remove_file(&path).unwrap();
}

/// Needs root and /dev/net/tun (a TAP interface is the wire).
#[test]
fn a_tap_interface_set_down_and_up_is_seen() {
    assert!(
        Path::new("/dev/net/tun").exists(),
        "this test needs /dev/net/tun and root (a TAP interface is the wire)"
    );
    let name = format!("m4ev{}", std::process::id() % 100_000);
    let hca = Hca::open(step_cfg()).unwrap();
    hca.set_wire(Wire::Tap(name.clone())).unwrap();
    let fd = hca.event_fd().unwrap();
    let ip = |state: &str| {
        let ok = std::process::Command::new("ip")
            .args(["link", "set", &name, state])
            .status()
            .expect("ip (iproute2)")
            .success();
        assert!(ok, "ip link set {name} {state}");
    };
    assert_eq!(wait_events(&hca, fd), [PortEvent::LinkDown], "created down");
    ip("up");
    assert_eq!(wait_events(&hca, fd), [PortEvent::LinkUp]);
    ip("down");
    assert_eq!(wait_events(&hca, fd), [PortEvent::LinkDown]);
    hca.set_wire(Wire::Null).unwrap();
    assert_eq!(
        wait_events(&hca, fd),
        [PortEvent::LinkUp],
        "null has a carrier"
    );
}
