//! CQ arming and completion events (the Rx interrupt): the CQ doorbell at UAR + 0x20 arms a
//! CQ, the next completion raises one event on its completion channel's fd.

mod common;

use std::os::fd::RawFd;
use std::sync::atomic::{fence, Ordering};
use std::time::Duration;

use common::*;
use mlx4_hca::{Hca, HcaConfig, Wire};

/// The CQ doorbell commands (doc/prm.md 5.3).
const REQ_NOT_SOL: u32 = 1 << 24;
const REQ_NOT: u32 = 2 << 24;
/// srcrb SOLICIT (bit 1) with a completion requested.
const SIGNALED_SOLICITED: u8 = 0x0e;
const SIGNALED_QUIET: u8 = 0x0c;

/// Arm `cqn` through the UAR page at `uar` as DPDK's mlx4 does: the arm record first (the
/// word after `set_ci_db`), then one 64-bit store of `(sn << 28 | cmd | cqn) << 32 | ci`.
fn arm(uar: *mut u8, cq: &TestCq, cmd: u32, sn: u32) {
    let ci = cq.cons & 0xff_ffff;
    cq.db.put32(4, sn << 28 | cmd | ci);
    let v = (u64::from(sn << 28 | cmd | cq.cqn) << 32) | u64::from(ci);
    fence(Ordering::SeqCst);
    // SAFETY: offset 0x20 of a UAR page of the adapter, 8-aligned, device memory valid while
    // the adapter lives.
    unsafe { (uar.add(0x20) as *mut u64).write_volatile(v.to_be()) };
}

fn readable(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: polling one pollfd on an open descriptor.
    unsafe { libc::poll(&mut p, 1, ms) == 1 && p.revents & libc::POLLIN != 0 }
}

/// A looped adapter: an SQ sending frames, an RQ with its CQ bound to a channel.
struct Rig {
    hca: Hca,
    txcq: TestCq,
    sq: TestSq,
    rq: TestRq,
    rxcq: TestCq,
    pkts: Pkts,
    ch: u32,
}

impl Rig {
    fn new(cfg: HcaConfig) -> Rig {
        let hca = Hca::open(cfg).unwrap();
        hca.set_wire(Wire::Loop).unwrap();
        let txcq = TestCq::new(&hca, 64);
        let sq = TestSq::new(&hca, 64, txcq.cqn);
        let rxcq = TestCq::new(&hca, 64);
        let mut rq = TestRq::new(&hca, 64, 1, rxcq.cqn);
        let pkts = Pkts::new(&hca, 1 << 20);
        for i in 0..32u64 {
            rq.post(&[(2048, pkts.lkey, pkts.mem.addr() + 65536 + i * 2048)]);
        }
        let ch = hca.create_comp_channel().unwrap();
        hca.set_cq_channel(rxcq.cqn, Some(ch)).unwrap();
        Rig {
            hca,
            txcq,
            sq,
            rq,
            rxcq,
            pkts,
            ch,
        }
    }

    fn fd(&self) -> RawFd {
        self.hca.comp_channel_fd(self.ch).unwrap()
    }

    /// Post one frame (srcrb as given) and ring.
    fn send(&mut self, srcrb: u8) {
        let frame = hex(TCP4);
        self.pkts.mem.put(0, &frame);
        let mut t = ctrl_tail(2, srcrb);
        t.extend(dseg(
            frame.len() as u32,
            self.pkts.lkey,
            self.pkts.mem.addr(),
        ));
        self.sq.write(SEND, &t);
        self.sq.doorbell();
    }
}

#[test]
fn an_armed_cq_raises_one_event_per_arming() {
    let mut r = Rig::new(step_cfg());
    let fd = r.fd();
    let uar = r.sq.info.uar;
    // Not armed: completions raise nothing.
    r.send(UNSIGNALED);
    r.hca.step();
    assert_eq!(r.rxcq.drain().len(), 1);
    r.rxcq.update_ci();
    assert!(!readable(fd, 0));
    // Armed at the consumer index: nothing yet, then the next frame raises one event.
    arm(uar, &r.rxcq, REQ_NOT, 1);
    r.hca.step();
    assert!(!readable(fd, 0));
    assert_eq!(r.hca.counters().cq_arms, 1);
    r.send(UNSIGNALED);
    r.hca.step();
    assert!(readable(fd, 0));
    assert_eq!(r.hca.next_cq_event(r.ch).unwrap(), Some(r.rxcq.cqn));
    assert_eq!(r.hca.next_cq_event(r.ch).unwrap(), None);
    assert!(!readable(fd, 0), "quiet once taken");
    // One-shot: the next frame raises nothing until re-armed.
    r.send(UNSIGNALED);
    r.hca.step();
    assert!(!readable(fd, 0));
    // Armed behind completions not yet consumed: the event comes at once, as on hardware
    // (the consumer index the arm carries is behind the producer).
    arm(uar, &r.rxcq, REQ_NOT, 2);
    r.hca.step();
    assert!(readable(fd, 0));
    assert_eq!(r.hca.next_cq_event(r.ch).unwrap(), Some(r.rxcq.cqn));
    assert_eq!(r.rxcq.drain().len(), 2);
    let k = r.hca.counters();
    assert_eq!((k.cq_arms, k.cq_events, k.rx_frames), (2, 2, 3));
    // Any UAR page of the adapter will do; a CQN that is none of its CQs is ignored.
    let page = r.hca.alloc_uar().unwrap();
    r.rxcq.update_ci();
    arm(page.page, &r.rxcq, REQ_NOT, 3);
    r.hca.step();
    let bogus = TestCq {
        cqn: 0x7777,
        ..TestCq::new(&r.hca, 2)
    };
    arm(uar, &bogus, REQ_NOT, 0);
    r.hca.step();
    r.send(UNSIGNALED);
    r.hca.step();
    assert_eq!(r.hca.next_cq_event(r.ch).unwrap(), Some(r.rxcq.cqn));
    let k = r.hca.counters();
    assert_eq!((k.cq_arms, k.cq_arms_bad, k.cq_events), (4, 1, 3));
    assert!(r.hca.destroy_comp_channel(r.ch).is_err(), "a CQ is bound");
    r.hca.set_cq_channel(r.rxcq.cqn, None).unwrap();
    r.hca.destroy_comp_channel(r.ch).unwrap();
    assert!(r.hca.next_cq_event(r.ch).is_err());
}

#[test]
fn solicited_arming_waits_for_a_solicited_or_error_completion() {
    let mut r = Rig::new(step_cfg());
    let fd = r.fd();
    r.hca.set_cq_channel(r.txcq.cqn, Some(r.ch)).unwrap();
    let uar = r.sq.info.uar;
    arm(uar, &r.txcq, REQ_NOT_SOL, 1);
    r.send(SIGNALED_QUIET);
    r.hca.step();
    assert_eq!(r.txcq.drain().len(), 1);
    r.txcq.update_ci();
    // The RX completion of the looped frame is not solicited either.
    assert!(!readable(fd, 0), "neither completion was solicited");
    r.send(SIGNALED_SOLICITED);
    r.hca.step();
    assert_eq!(r.hca.next_cq_event(r.ch).unwrap(), Some(r.txcq.cqn));
    r.txcq.drain();
    r.txcq.update_ci();
    // An error completion raises it too.
    arm(uar, &r.txcq, REQ_NOT_SOL, 2);
    r.sq.write(0x1d, &ctrl_tail(1, SIGNALED_QUIET));
    r.sq.doorbell();
    r.hca.step();
    assert_eq!(r.hca.next_cq_event(r.ch).unwrap(), Some(r.txcq.cqn));
    let _ = &r.rq;
}

/// l3fwd-power's loop: arm, sleep on the fd, wake when a frame arrives. In the polled mode no
/// lcore runs the device while it sleeps; the frame still completes and wakes it.
#[test]
fn a_sleeping_polled_mode_port_is_woken_by_a_frame() {
    let name = format!("cq-ev-{}", std::process::id());
    let r = Rig::new(HcaConfig {
        threaded: false,
        name: name.clone(),
        ..HcaConfig::default()
    });
    let fd = r.fd();
    // A second adapter sends to it over a cable by name.
    let peer = Hca::open(step_cfg()).unwrap();
    peer.set_wire(Wire::Peer(name)).unwrap();
    let cq = TestCq::new(&peer, 8);
    let mut sq = TestSq::new(&peer, 8, cq.cqn);
    let pkts = Pkts::new(&peer, 4096);
    let frame = hex(TCP4);
    pkts.mem.put(0, &frame);
    arm(r.sq.info.uar, &r.rxcq, REQ_NOT, 1);
    std::thread::sleep(Duration::from_millis(5));
    assert!(!readable(fd, 0));
    let mut t = ctrl_tail(2, UNSIGNALED);
    t.extend(dseg(frame.len() as u32, pkts.lkey, pkts.mem.addr()));
    sq.write(SEND, &t);
    sq.doorbell();
    peer.step();
    assert!(readable(fd, 5000), "woken by the frame within 5 s");
    assert_eq!(r.hca.next_cq_event(r.ch).unwrap(), Some(r.rxcq.cqn));
    assert_eq!(r.hca.counters().rx_frames, 1);
}
