//! A completion hands the WQEs it covers back to the driver, which may write over them at once
//! (stamps, the next pass's WQEs): the device must be done reading a WQE, its frame included,
//! before it writes the completion that covers it.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use mlx4_hca::{Hca, HcaConfig, Wire};

/// TXBBs of the send ring: 256 WQEs of two TXBBs, one stretch of the device's run.
const TXBBS: u32 = 512;
const RX: u32 = 1024;
const BUF: u32 = 2048;
const LEN: usize = 64;
/// What the driver writes over a WQE's frame once a completion covers it.
const POISON: u8 = 0xee;

/// Frame `seq`: looped back to its own port, its sequence number after the Ethernet header and
/// bytes that follow from it, so that a frame read from a WQE being overwritten shows.
fn frame(seq: u32) -> Vec<u8> {
    let mut f = hex("020000000002020000000001");
    f.extend(0x88b5u16.to_be_bytes());
    f.extend(seq.to_be_bytes());
    f.extend((f.len()..LEN).map(|i| (seq as usize + i) as u8 & 0x7f));
    f
}

/// The driver's side on a thread of its own: posts bursts of inline WQEs (a completion every
/// eighth and on the last), one doorbell each, and the moment a completion comes back writes
/// [`POISON`] over the frames of every WQE it covers, as the next pass's WQEs would. Returns
/// how many frames it posted. `qpn` tells the device's poller which queue to run.
fn driver(hca: Hca, bursts: u32, qpn: &AtomicU32, done: &AtomicBool, posted: &AtomicU64) -> u64 {
    let mut cq = TestCq::new(&hca, 256);
    let mut sq = TestSq::new(&hca, TXBBS, cq.cqn);
    qpn.store(sq.info.qpn, Ordering::Release);
    // TXBBs whose completion came back.
    let mut free_to = 0u32;
    let mut seq = 0u32;
    let deadline = Instant::now() + Duration::from_secs(120);
    for _ in 0..bursts {
        let room = (TXBBS - (sq.prod - free_to)) / 2;
        let n = room.min(96);
        for i in 0..n {
            let signaled = i % 8 == 7 || i + 1 == n;
            let srcrb = if signaled { SIGNALED } else { UNSIGNALED };
            sq.write(SEND, &inline_wqe(&frame(seq), srcrb));
            seq += 1;
        }
        if n > 0 {
            posted.store(u64::from(seq), Ordering::Release);
            sq.doorbell();
        }
        // Spin on the CQ as a polling lcore does, until this burst's last completion.
        loop {
            assert!(Instant::now() < deadline, "no completion for {seq} frames");
            let Some(c) = cq.poll() else {
                if sq.prod == free_to {
                    break;
                }
                std::hint::spin_loop();
                continue;
            };
            // Two TXBBs a WQE: the completed one ends two TXBBs after its counter.
            let mut end = (free_to & !0xffff) | u32::from(be16(&c, 24));
            if end < free_to {
                end += 0x1_0000;
            }
            let end = end + 2;
            for t in (free_to..end).step_by(2) {
                let off = (t & (TXBBS - 1)) as usize * 64;
                sq.ring.put(off + 20, &[POISON; 44]);
                sq.ring.put(off + 68, &[POISON; LEN - 44]);
            }
            free_to = end;
            cq.update_ci();
            if sq.prod == free_to {
                break;
            }
        }
    }
    done.store(true, Ordering::Release);
    // The rings go with this thread: the device lets go of them first.
    hca.destroy_sq(sq.info.qpn).unwrap();
    hca.destroy_cq(cq.cqn).unwrap();
    u64::from(seq)
}

#[test]
fn no_frame_is_read_from_a_wqe_after_its_completion() {
    let hca = Hca::open(HcaConfig {
        threaded: false,
        rx_inbox_frames: RX,
        ..HcaConfig::default()
    })
    .unwrap();
    hca.set_wire(Wire::Loop).unwrap();
    let mut rxcq = TestCq::new(&hca, RX);
    let mut rq = TestRq::new(&hca, RX, 1, rxcq.cqn);
    let bufs = Pkts::new(&hca, (RX * BUF) as usize);
    let post = |rq: &mut TestRq| {
        let at = bufs.mem.addr() + u64::from(rq.prod % RX * BUF);
        rq.post(&[(BUF, bufs.lkey, at)]);
    };
    for _ in 0..RX {
        post(&mut rq);
    }
    let (qpn, done) = (
        Arc::new(AtomicU32::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let posted = Arc::new(AtomicU64::new(0));
    let lcore = {
        let (hca, qpn, done, posted) = (hca.clone(), qpn.clone(), done.clone(), posted.clone());
        std::thread::spawn(move || driver(hca, 400, &qpn, &done, &posted))
    };
    // The device, polled here; every frame that arrives is checked against its sequence number.
    let rx_run = hca.rx_runner();
    let mut sq_run = None;
    let (mut received, mut next) = (0u64, 0u32);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let finished = done.load(Ordering::Acquire);
        if sq_run.is_none() {
            sq_run = match qpn.load(Ordering::Acquire) {
                0 => None,
                q => Some(hca.sq_runner(q).unwrap()),
            };
        }
        if let Some(r) = &sq_run {
            r.run();
        }
        rx_run.run();
        for cqe in rxcq.drain() {
            let slot = u32::from(be16(&cqe, 24)) % RX;
            let got = bufs.mem.get((slot * BUF) as usize, LEN);
            let seq = u32::from_be_bytes(got[14..18].try_into().unwrap());
            assert!(
                seq >= next && got == frame(seq),
                "frame {received}: expected {next} or later, got {got:02x?}"
            );
            next = seq + 1;
            received += 1;
            post(&mut rq);
        }
        rxcq.update_ci();
        let c = hca.counters();
        let sent = posted.load(Ordering::Acquire);
        let conserved = c.tx_frames == sent && c.rx_frames + c.rx_dropped() == sent;
        if finished && conserved && received == c.rx_frames {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{sent} posted, {received} received: {c:?}"
        );
    }
    let sent = lcore.join().unwrap();
    let c = hca.counters();
    assert!(
        sent > 30_000 && received > sent / 2,
        "{sent} sent, {received} received: {c:?}"
    );
}
