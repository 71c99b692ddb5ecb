//! Closing a `peer:` partner while its peer transmits: the sender holds the partner's receive
//! buffer for a whole poll, and that buffer lives in the partner's device memory, which its
//! owner frees (munmaps, here) as soon as the adapter is closed.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx4_hca::{Bar, Hca, HcaConfig, Wire};

/// Anonymous memory for a BAR, unmapped by the test itself, as a driver gives its device
/// memory back once the adapter is closed: a write into it afterwards faults.
fn map(len: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping with no address hint; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap of {len} bytes");
    p.cast()
}

#[test]
fn closing_a_peer_while_its_partner_sends_touches_no_freed_memory() {
    // A sends from its own device thread, so that its polls overlap B's close.
    let a = Hca::open(HcaConfig {
        name: "peer_close_a".into(),
        busy_poll: true,
        ..HcaConfig::default()
    })
    .unwrap();
    a.start().unwrap();
    a.set_port_up(true);
    let mut txcq = TestCq::new(&a, 512);
    let mut sq = TestSq::new(&a, 256, txcq.cqn);
    let pkts = Pkts::new(&a, 1 << 16);
    let mut frame = vec![0u8; 1500];
    frame[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
    frame[12..14].copy_from_slice(&[0x08, 0x00]);
    pkts.mem.put(0, &frame);
    a.set_wire(Wire::Peer("peer_close_b".into())).unwrap();
    let mut completed = 0u64;
    for round in 0..300 {
        let cfg = HcaConfig {
            name: "peer_close_b".into(),
            threaded: false,
            ..HcaConfig::default()
        };
        let len = Bar::required_len(&cfg);
        let mem = map(len);
        // SAFETY: page-aligned, readable and writable, unmapped only after the Hca is gone.
        let bar = unsafe { Bar::from_raw(mem, len) }.unwrap();
        let b = Hca::open_on(cfg, bar).unwrap();
        b.set_port_up(true);
        // A burst of 200 frames for B, the last one signaled; B never polls, so its inbox
        // fills and refuses (and counts) the rest, but every frame takes A into B's memory.
        for i in 0..200 {
            let mut t = ctrl_tail(2, if i == 199 { SIGNALED } else { UNSIGNALED });
            t.extend(dseg(frame.len() as u32, pkts.lkey, pkts.mem.addr()));
            sq.write(SEND, &t);
        }
        sq.doorbell();
        // Let A get going on the burst, then close B under it.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_micros(round % 100) {
            std::hint::spin_loop();
        }
        drop(b);
        // SAFETY: the mapping made above; the adapter on it is closed.
        assert_eq!(unsafe { libc::munmap(mem.cast(), len) }, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while txcq.poll().is_none() {
            assert!(
                Instant::now() < deadline,
                "round {round}: A's burst never completed"
            );
            std::thread::yield_now();
        }
        completed += 1;
    }
    assert_eq!(completed, 300);
    let c = a.counters();
    assert_eq!(c.tx_frames + c.tx_drops_wire, 300 * 200, "{c:?}");
}
