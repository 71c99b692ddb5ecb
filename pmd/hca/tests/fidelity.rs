//! The fidelity fixes (doc/c-mlx4.md, items 1-8): queue states, doorbells routed by QPN from any
//! UAR page, send queues with a stride above 64 bytes, aligned QPN ranges, and the BlueFlame page
//! one page after its UAR page. Driven as a driver would, with hand-made WQEs.

mod common;

use common::*;
use mlx4_hca::{Hca, HcaConfig, QueueState, RqOptions, SqAttr, SqOptions, Wire};

fn strict() -> HcaConfig {
    HcaConfig {
        reset_on_create: true,
        ..step_cfg()
    }
}

/// Check a TX CQE's QPN and WQE counter.
fn tx_cqe(cqe: &[u8]) -> (u32, u16) {
    (be32(cqe, 0) & 0xff_ffff, be16(cqe, 24))
}

#[test]
fn a_send_queue_runs_only_once_ready_and_an_errored_one_only_after_a_reset() {
    let (hca, mut cq, mut sq) = sq_rig(strict(), 64, 64);
    assert_eq!(hca.sq_state(sq.info.qpn).unwrap(), QueueState::Reset);
    sq.write(NOP, &ctrl_tail(1, SIGNALED));
    sq.doorbell();
    hca.step();
    assert!(cq.poll().is_none(), "a queue in Reset executes nothing");
    let c = hca.counters();
    assert_eq!(
        (c.doorbells, c.doorbells_not_ready, c.wqe_fetched),
        (1, 1, 0)
    );
    // Ready: the WQE posted before runs at the next doorbell, from slot 0.
    hca.set_sq_state(sq.info.qpn, QueueState::Ready).unwrap();
    sq.doorbell();
    hca.step();
    assert_eq!(tx_cqe(&cq.poll().expect("CQE")), (sq.info.qpn, 0));
    // A bad opcode puts it in error; it cannot go back to Ready without a reset.
    sq.write(0x1d, &ctrl_tail(1, SIGNALED));
    sq.doorbell();
    hca.step();
    assert_eq!(cq.poll().expect("error CQE")[31] & 0x1f, 0x1e);
    assert_eq!(hca.sq_state(sq.info.qpn).unwrap(), QueueState::Error);
    let e = hca
        .set_sq_state(sq.info.qpn, QueueState::Ready)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    // Reset, re-initialise the ring as the driver does, and start again at slot 0.
    hca.set_sq_state(sq.info.qpn, QueueState::Reset).unwrap();
    for i in 0..64 {
        sq.ring.put32(i * 64, u32::MAX);
    }
    sq.prod = 0;
    hca.set_sq_state(sq.info.qpn, QueueState::Ready).unwrap();
    let c0 = sq.write(NOP, &ctrl_tail(1, SIGNALED));
    sq.doorbell();
    hca.step();
    cq.update_ci();
    assert_eq!(
        tx_cqe(&cq.poll().expect("CQE after reset")),
        (sq.info.qpn, c0 as u16)
    );
    assert_eq!(c0, 0);
    assert!(hca.set_sq_state(0x7777, QueueState::Ready).is_err());
}

#[test]
fn a_receive_queue_drops_frames_until_ready() {
    let hca = Hca::open(strict()).unwrap();
    hca.set_wire(Wire::Loop).unwrap();
    let txcq = TestCq::new(&hca, 64);
    let mut sq = TestSq::new(&hca, 64, txcq.cqn);
    let mut rxcq = TestCq::new(&hca, 64);
    let mut rq = TestRq::new(&hca, 64, 1, rxcq.cqn);
    let pkts = Pkts::new(&hca, 1 << 16);
    rq.post(&[(2048, pkts.lkey, pkts.mem.addr() + 4096)]);
    hca.set_sq_state(sq.info.qpn, QueueState::Ready).unwrap();
    let frame = hex(TCP4);
    let send = |sq: &mut TestSq| {
        pkts.mem.put(0, &frame);
        let mut t = ctrl_tail(2, UNSIGNALED);
        t.extend(dseg(frame.len() as u32, pkts.lkey, pkts.mem.addr()));
        sq.write(SEND, &t);
        sq.doorbell();
        hca.step();
    };
    send(&mut sq);
    assert!(rxcq.poll().is_none());
    assert_eq!(hca.counters().rx_drops_not_ready, 1);
    assert_eq!(
        hca.counters().rx_missed(),
        1,
        "a missed frame, as a NIC counts it"
    );
    hca.set_rq_state(rq.qpn, QueueState::Ready).unwrap();
    send(&mut sq);
    let cqe = rxcq.poll().expect("received once ready");
    assert_eq!(be32(&cqe, 20) as usize, frame.len());
    assert_eq!(pkts.mem.get(4096, frame.len()), frame);
}

#[test]
fn a_doorbell_on_any_uar_page_runs_the_queue_it_names() {
    let (hca, mut cq, mut a) = sq_rig(step_cfg(), 64, 64);
    let b = TestSq::new(&hca, 64, cq.cqn);
    assert_ne!(a.info.uar, b.info.uar);
    a.write(NOP, &ctrl_tail(1, SIGNALED));
    // A's QPN rung on B's page: a card routes by QPN, and so does the model.
    let v = (a.info.qpn << 8).to_be();
    // SAFETY: B's UAR page is device memory valid while the adapter lives; 0x14 is aligned.
    unsafe { (b.info.uar.add(0x14) as *mut u32).write_volatile(v) };
    hca.step();
    assert_eq!(tx_cqe(&cq.poll().expect("A ran")), (a.info.qpn, 0));
    // A QPN that is no send queue of the adapter is counted and ignored.
    // SAFETY: as above.
    unsafe { (b.info.uar.add(0x14) as *mut u32).write_volatile((0x7777u32 << 8).to_be()) };
    hca.step();
    let c = hca.counters();
    assert_eq!((c.doorbells, c.doorbells_bad_qpn), (2, 1));
}

/// Send queues of one context on one shared UAR page, as libmlx4 puts them.
#[test]
fn queues_share_a_uar_page_and_merged_doorbells_are_made_up_and_counted() {
    let hca = Hca::open(step_cfg()).unwrap();
    let uar = hca.alloc_uar().unwrap();
    let mut cq = TestCq::new(&hca, 64);
    let on_uar = |cqn| {
        let ring = Mem::new(64 * 64);
        for i in 0..64 {
            ring.put32(i * 64, u32::MAX);
        }
        let attr = SqAttr {
            buf: ring.ptr(),
            txbb_cnt: 64,
            cqn,
        };
        let opts = SqOptions {
            uar: Some(uar.index),
            ..SqOptions::default()
        };
        // SAFETY: the ring lives in the returned TestSq.
        let info = unsafe { hca.create_sq_with(&attr, &opts) }.unwrap();
        TestSq {
            ring,
            cnt: 64,
            info,
            prod: 0,
            bf_half: 0,
        }
    };
    let mut a = on_uar(cq.cqn);
    let mut b = on_uar(cq.cqn);
    assert_eq!((a.info.uar, b.info.uar), (uar.page, uar.page));
    assert_eq!((a.info.uar_index, b.info.uar_index), (uar.index, uar.index));
    // Each gets a BlueFlame register of the page's BlueFlame page, the next page.
    let bf_page = uar.bf_page.expect("BlueFlame page") as usize;
    assert_eq!(bf_page, uar.page as usize + 4096);
    let (ra, rb) = (
        a.info.bf.unwrap().reg as usize,
        b.info.bf.unwrap().reg as usize,
    );
    assert_ne!(ra, rb);
    assert!((bf_page..bf_page + 4096).contains(&ra) && (bf_page..bf_page + 4096).contains(&rb));
    // Each rings its own QPN on the page: both run.
    a.write(NOP, &ctrl_tail(1, SIGNALED));
    a.doorbell();
    hca.step();
    b.write(NOP, &ctrl_tail(1, SIGNALED));
    b.doorbell();
    hca.step();
    let got: Vec<_> = cq.drain().iter().map(|c| tx_cqe(c)).collect();
    assert_eq!(got, [(a.info.qpn, 0), (b.info.qpn, 0)]);
    assert_eq!(hca.counters().doorbells_inferred, 0);
    // Both ring before the device looks: B's write replaces A's in the one word. The device
    // walks A too (a card would have seen both writes) and says so.
    a.write(NOP, &ctrl_tail(1, SIGNALED));
    b.write(NOP, &ctrl_tail(1, SIGNALED));
    a.doorbell();
    b.doorbell();
    hca.step();
    let mut got: Vec<_> = cq.drain().iter().map(|c| tx_cqe(c)).collect();
    got.sort();
    let mut want = vec![(a.info.qpn, 1), (b.info.qpn, 1)];
    want.sort();
    assert_eq!(got, want);
    let c = hca.counters();
    assert_eq!((c.doorbells, c.doorbells_inferred), (3, 1));
    // The page cannot be freed under its queues.
    assert!(hca.free_uar(uar.index).is_err());
    hca.destroy_sq(a.info.qpn).unwrap();
    hca.destroy_sq(b.info.qpn).unwrap();
    hca.free_uar(uar.index).unwrap();
    assert!(hca.free_uar(uar.index).is_err());
}

/// libmlx4's layout for a QP with inline caps: 128-byte slots, one WQE each, later 64-byte
/// blocks of a slot stamped 0xffffffff, ownership and counters in slots.
#[test]
fn a_send_queue_with_128_byte_slots_runs_one_wqe_per_slot() {
    let hca = Hca::open(step_cfg()).unwrap();
    let mut cq = TestCq::new(&hca, 64);
    let slots = 8u32;
    let ring = Mem::new(slots as usize * 128);
    for i in 0..slots as usize {
        ring.put32(i * 128, 0x8000_0000);
        ring.put(i * 128 + 7, &[8]);
        ring.put32(i * 128 + 64, u32::MAX);
    }
    let attr = SqAttr {
        buf: ring.ptr(),
        txbb_cnt: slots * 2,
        cqn: cq.cqn,
    };
    let opts = SqOptions {
        stride_shift: 7,
        ..SqOptions::default()
    };
    // SAFETY: `ring` outlives the adapter's use of it (the queue is destroyed below).
    let info = unsafe { hca.create_sq_with(&attr, &opts) }.unwrap();
    let frames = sink(&hca);
    let pkts = Pkts::new(&hca, 1 << 16);
    let frame = hex(TCP4);
    pkts.mem.put(0, &frame);
    // Two passes over the ring: a one-TXBB gather WQE, or a two-TXBB inline one, per slot.
    for n in 0..2 * slots {
        let off = (n % slots) as usize * 128;
        let owner = if n & slots != 0 { 0x8000_0000 } else { 0 };
        if n % 2 == 0 {
            let mut t = ctrl_tail(2, SIGNALED);
            t.extend(dseg(frame.len() as u32, pkts.lkey, pkts.mem.addr()));
            ring.put(off + 4, &t);
        } else {
            // 64 bytes inline: 44 in the first TXBB, 20 behind a header at 64.
            let mut w = ctrl_tail(6, SIGNALED);
            w.extend(inline_hdr(44));
            w.extend(&frame[..44]);
            w.extend(inline_hdr(20));
            w.extend(&frame[44..64]);
            ring.put(off + 4, &w);
        }
        ring.put32(off, owner | u32::from(SEND));
        let v = (info.qpn << 8).to_be();
        // SAFETY: the queue's UAR page, valid while the adapter lives.
        unsafe { (info.uar.add(0x14) as *mut u32).write_volatile(v) };
        hca.step();
        let cqe = cq.poll().unwrap_or_else(|| panic!("CQE for WQE {n}"));
        assert_eq!(tx_cqe(&cqe), (info.qpn, n as u16), "slot counter");
        assert_eq!(cqe[31] & 0x1f, SEND, "no error");
        cq.update_ci();
        // The second pass: the slot's old WQE (previous parity) must not run again.
        hca.step();
        assert!(cq.poll().is_none());
    }
    let got = frames.lock();
    assert_eq!(got.len(), 2 * slots as usize);
    for (n, f) in got.iter().enumerate() {
        let want = if n % 2 == 0 { &frame[..] } else { &frame[..64] };
        assert_eq!(&f[..], want, "frame {n}");
    }
    let c = hca.counters();
    assert_eq!((c.wqe_fetched, c.error_cqes), (16, 0));
    // Strides the device does not have are refused.
    for bad in [5, 12] {
        let o = SqOptions {
            stride_shift: bad,
            ..SqOptions::default()
        };
        // SAFETY: refused before the ring is used.
        let refused = unsafe { hca.create_sq_with(&attr, &o) }.is_err();
        assert!(refused, "stride {bad}");
    }
    hca.destroy_sq(info.qpn).unwrap();
}

#[test]
fn an_aligned_qpn_range_holds_an_rss_tables_queues() {
    let hca = Hca::open(step_cfg()).unwrap();
    let cq = TestCq::new(&hca, 64);
    // Take a few numbers first so the range cannot start at the first QPN by luck.
    let loose: Vec<TestRq> = (0..3).map(|_| TestRq::new(&hca, 8, 1, cq.cqn)).collect();
    let base = hca.reserve_qpns(8).unwrap();
    assert_eq!(base % 8, 0, "aligned to its size");
    assert!(loose.iter().all(|r| !(base..base + 8).contains(&r.qpn)));
    let mut mems = Vec::new();
    let mut in_range = Vec::new();
    for k in (0..8).rev() {
        let ring = Mem::new(8 * 16);
        let db = Mem::new(4);
        let attr = mlx4_hca::RqAttr {
            buf: ring.ptr(),
            wqe_cnt: 8,
            sges: 1,
            cqn: cq.cqn,
            db_rec: db.ptr() as *mut u32,
        };
        let opts = RqOptions {
            qpn: Some(base + k),
            ..RqOptions::default()
        };
        // SAFETY: the memory lives in `mems` until the end of the test.
        in_range.push(unsafe { hca.create_rq_with(&attr, &opts) }.unwrap());
        mems.push((ring, db));
    }
    in_range.sort();
    assert_eq!(in_range, (base..base + 8).collect::<Vec<_>>());
    // A number of the range is taken only once, and queues created without one stay outside.
    let outside = TestRq::new(&hca, 8, 1, cq.cqn);
    assert!(!(base..base + 8).contains(&outside.qpn));
    assert!(hca.set_rx_steering(&in_range).is_ok());
    // A number outside any range cannot be asked for.
    let ring = Mem::new(8 * 16);
    let db = Mem::new(4);
    let attr = mlx4_hca::RqAttr {
        buf: ring.ptr(),
        wqe_cnt: 8,
        sges: 1,
        cqn: cq.cqn,
        db_rec: db.ptr() as *mut u32,
    };
    for q in [base, base + 8, 0x7000] {
        let opts = RqOptions {
            qpn: Some(q),
            ..RqOptions::default()
        };
        // SAFETY: refused before the ring is used.
        let refused = unsafe { hca.create_rq_with(&attr, &opts) }.is_err();
        assert!(refused, "{q:#x}");
    }
    assert!(
        hca.release_qpns(base).is_err(),
        "busy while its queues live"
    );
    hca.set_rx_steering(&[]).unwrap();
    for q in in_range {
        hca.destroy_rq(q).unwrap();
    }
    hca.release_qpns(base).unwrap();
    assert!(hca.reserve_qpns(6).is_err(), "not a power of two");
}
