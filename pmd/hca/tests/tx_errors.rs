//! Send errors of the device model, driven by hand-made WQEs (doc/prm.md sections 5 and 10):
//! what hardware rejects completes in error with the syndrome it would give, the CQ is never
//! overrun, bad control requests are refused, and garbage in rings or device pages never
//! crashes the device.

mod common;

use common::*;
use mlx4_hca::{Hca, HcaConfig, QueueState};

/// Post `tail` (dword 0 = `opcode`) on a fresh SQ, ring, and return the single CQE it produces.
fn error_case(cfg: HcaConfig, opcode: u8, tail: impl Fn(&Pkts) -> Vec<u8>) -> (u8, Vec<u8>) {
    let (hca, mut cq, mut sq) = sq_rig(cfg, 64, 64);
    let frames = sink(&hca);
    let pkts = Pkts::new(&hca, 4096);
    sq.write(NOP, &ctrl_tail(1, UNSIGNALED));
    // Errors complete even when the WQE did not ask for a CQE.
    let mut t = tail(&pkts);
    t[7] = UNSIGNALED;
    let bad = sq.write(opcode, &t);
    sq.write(NOP, &ctrl_tail(1, SIGNALED));
    sq.doorbell();
    hca.step();
    let cqes = cq.drain();
    assert_eq!(cqes.len(), 1, "only the error CQE; nothing after it runs");
    let cqe = &cqes[0];
    assert_eq!(cqe[31] & 0x1f, 0x1e, "error opcode");
    assert_eq!(be16(cqe, 24), bad as u16, "wqe_index of the bad WQE");
    assert_eq!(be32(cqe, 0) & 0xff_ffff, sq.info.qpn);
    assert_eq!(hca.sq_state(sq.info.qpn).unwrap(), QueueState::Error);
    assert!(frames.lock().is_empty());
    let c = hca.counters();
    assert_eq!((c.error_cqes, c.cqes), (1, 1));

    // More doorbells change nothing on a queue in error.
    sq.write(NOP, &ctrl_tail(1, SIGNALED));
    sq.doorbell();
    hca.step();
    assert!(cq.poll().is_none());

    // Recovery: destroy, clear the ring, recreate, post again.
    hca.destroy_sq(sq.info.qpn).unwrap();
    assert!(hca.sq_state(sq.info.qpn).is_err());
    let ring = std::mem::replace(&mut sq.ring, Mem::new(64));
    ring.fill(0);
    let mut sq = TestSq::on(&hca, ring, 64, cq.cqn);
    assert_eq!(hca.sq_state(sq.info.qpn).unwrap(), QueueState::Ready);
    sq.write(NOP, &ctrl_tail(1, SIGNALED));
    sq.doorbell();
    hca.step();
    let ok = cq.poll().expect("the recreated queue works");
    assert_eq!(ok[31] & 0x1f, NOP);
    (cqe[27], cqe.clone())
}

#[test]
fn error_bad_opcode_is_local_qp_op() {
    // RDMA_WRITE (0x08) on an Ethernet SQ.
    let (syn, _) = error_case(step_cfg(), 0x08, |_| ctrl_tail(1, 0));
    assert_eq!(syn, 0x02);
}

#[test]
fn error_oversized_wqe_is_local_qp_op() {
    let cfg = HcaConfig {
        max_wqe_size: 64,
        ..step_cfg()
    };
    let (syn, _) = error_case(cfg, SEND, |p| {
        let mut t = ctrl_tail(5, 0);
        for _ in 0..4 {
            t.extend(dseg(16, p.lkey, p.mem.addr()));
        }
        t
    });
    assert_eq!(syn, 0x02);
}

#[test]
fn error_wqe_larger_than_the_ring_is_local_qp_op() {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 1, 8);
    // DS 5 (80 bytes, 2 TXBBs) cannot fit a 1-TXBB ring.
    let mut t = ctrl_tail(5, SIGNALED);
    t.extend(inline_hdr(40));
    t.extend([0u8; 40]);
    t.resize(60, 0);
    sq.write(SEND, &t);
    sq.doorbell();
    hca.step();
    assert_eq!(cq.poll().unwrap()[27], 0x02);
}

#[test]
fn error_inline_crossing_64_bytes_is_local_qp_op() {
    let (syn, _) = error_case(step_cfg(), SEND, |_| {
        // Header at 16 with 60 bytes would end at 80.
        let mut t = ctrl_tail(5, 0);
        t.extend(inline_hdr(60));
        t.extend([0x11u8; 60]);
        t
    });
    assert_eq!(syn, 0x02);
}

#[test]
fn error_inline_longer_than_ds_is_local_length() {
    let (syn, _) = error_case(step_cfg(), SEND, |_| {
        // DS 2 = 32 bytes, but the inline segment claims 20 bytes from offset 16.
        let mut t = ctrl_tail(2, 0);
        t.extend(inline_hdr(20));
        t.extend([0x22u8; 12]);
        t
    });
    assert_eq!(syn, 0x01);
}

#[test]
fn error_bad_lkey_is_local_prot() {
    let (syn, _) = error_case(step_cfg(), SEND, |p| {
        let mut t = ctrl_tail(2, 0);
        t.extend(dseg(64, p.lkey ^ 0x0010_0000, p.mem.addr()));
        t
    });
    assert_eq!(syn, 0x04);
}

#[test]
fn error_address_outside_the_region_is_local_prot() {
    let (syn, _) = error_case(step_cfg(), SEND, |p| {
        let mut t = ctrl_tail(2, 0);
        t.extend(dseg(64, p.lkey, p.mem.addr() + p.mem.len() as u64 - 10));
        t
    });
    assert_eq!(syn, 0x04);
    let (syn, _) = error_case(step_cfg(), SEND, |p| {
        let mut t = ctrl_tail(2, 0);
        t.extend(dseg(64, p.lkey, p.mem.addr() - 64));
        t
    });
    assert_eq!(syn, 0x04);
    let (syn, _) = error_case(step_cfg(), SEND, |p| {
        let mut t = ctrl_tail(2, 0);
        t.extend(dseg(64, p.lkey, u64::MAX - 10));
        t
    });
    assert_eq!(syn, 0x04);
}

#[test]
fn deregistered_region_is_local_prot() {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 64, 64);
    let pkts = Pkts::new(&hca, 4096);
    hca.dereg_mr(pkts.lkey).unwrap();
    assert!(hca.dereg_mr(pkts.lkey).is_err());
    let mut t = ctrl_tail(2, SIGNALED);
    t.extend(dseg(64, pkts.lkey, pkts.mem.addr()));
    sq.write(SEND, &t);
    sq.doorbell();
    hca.step();
    assert_eq!(cq.poll().unwrap()[27], 0x04);
}

#[test]
fn cq_is_never_overrun() {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 64, 2);
    for _ in 0..5 {
        sq.write(NOP, &ctrl_tail(1, SIGNALED));
    }
    sq.doorbell();
    hca.step();
    assert_eq!(cq.drain().len(), 2, "two CQEs fit");
    let c = hca.counters();
    assert_eq!((c.cqes, c.cq_full_stalls, c.wqe_fetched), (2, 1, 2));
    // Nothing more until the consumer index moves, however often we look.
    hca.step();
    hca.step();
    assert!(cq.poll().is_none());
    cq.update_ci();
    hca.step();
    let more = cq.drain();
    assert_eq!(more.len(), 2);
    assert_eq!(be16(&more[0], 24), 2);
    assert_eq!(more[0][31] & 0x80, 0x80, "second pass of a 2-entry CQ");
    cq.update_ci();
    hca.step();
    assert_eq!(cq.drain().len(), 1);
    assert_eq!(hca.counters().cqes, 5);
}

#[test]
fn control_path_rejects_bad_requests() {
    let hca = Hca::open(step_cfg()).unwrap();
    let m = Mem::new(8192);
    let cq = TestCq::new(&hca, 4);
    let bad_cq = |buf: *mut u8, cnt: u32, db: *mut u32| {
        let a = mlx4_hca::CqAttr {
            buf,
            cqe_cnt: cnt,
            set_ci_db: db,
        };
        // SAFETY: every request here is refused before the device keeps the pointers.
        unsafe { hca.create_cq(&a) }
    };
    assert!(bad_cq(m.ptr(), 3, m.ptr().wrapping_add(4096) as *mut u32).is_err());
    assert!(bad_cq(std::ptr::null_mut(), 4, m.ptr() as *mut u32).is_err());
    assert!(bad_cq(m.ptr().wrapping_add(8), 4, m.ptr() as *mut u32).is_err());
    assert!(bad_cq(m.ptr(), 4, m.ptr().wrapping_add(4098) as *mut u32).is_err());
    let sq = |buf: *mut u8, n: u32, cqn: u32| {
        let a = mlx4_hca::SqAttr {
            buf,
            txbb_cnt: n,
            cqn,
        };
        // SAFETY: refused requests keep no pointers; the one accepted ring lives in `m`.
        unsafe { hca.create_sq(&a) }
    };
    assert!(sq(m.ptr(), 6, cq.cqn).is_err());
    assert!(sq(m.ptr().wrapping_add(32), 4, cq.cqn).is_err());
    assert!(sq(m.ptr(), 4, 0x1234).is_err());
    assert!(sq(m.ptr(), 1 << 20, cq.cqn).is_err());
    let ok = sq(m.ptr(), 4, cq.cqn).unwrap();
    assert!(
        hca.destroy_cq(cq.cqn).is_err(),
        "CQ busy while an SQ reports to it"
    );
    assert!(hca.destroy_sq(0x9999).is_err());
    assert!(hca.destroy_rq(ok.qpn).is_err(), "an SQ is not an RQ");
    hca.destroy_sq(ok.qpn).unwrap();
    hca.destroy_cq(cq.cqn).unwrap();
    assert!(hca.destroy_cq(cq.cqn).is_err());
    // SAFETY: refused.
    assert!(unsafe { hca.reg_mr(std::ptr::null(), 10) }.is_err());
    // SAFETY: refused.
    assert!(unsafe { hca.reg_mr(m.ptr(), 0) }.is_err());
    assert!(Hca::open(HcaConfig {
        bf_reg_size: 100,
        ..step_cfg()
    })
    .is_err());
    assert!(Hca::open(HcaConfig {
        max_wqe_size: 1024,
        ..step_cfg()
    })
    .is_err());
}

#[test]
fn garbage_rings_never_crash_the_device() {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 8, 64);
    let _pkts = Pkts::new(&hca, 4096);
    // Pseudo-random bytes everywhere, with valid-looking ownership so the device parses them.
    let mut x: u32 = 0x1234_5678;
    for round in 0..200 {
        let mut t = Vec::with_capacity(508);
        for _ in 0..508 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            t.push(x as u8);
        }
        let op = [NOP, SEND, 0x0e, 0x1f][round % 4];
        sq.write(op, &t);
        sq.doorbell();
        hca.step();
        cq.drain();
        cq.update_ci();
        if hca.sq_state(sq.info.qpn).unwrap() == QueueState::Error {
            hca.destroy_sq(sq.info.qpn).unwrap();
            let ring = std::mem::replace(&mut sq.ring, Mem::new(64));
            ring.fill(0);
            sq = TestSq::on(&hca, ring, 8, cq.cqn);
        }
    }
}

#[test]
fn lso_with_a_non_tcp_template_is_local_qp_op() {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 64, 64);
    let pkts = Pkts::new(&hca, 4096);
    let mut hdr = hex(TCP4)[..54].to_vec();
    hdr[23] = 17; // UDP
    let mut t = ctrl_tail(6, UNSIGNALED);
    t.extend(((1000u32 << 16) | 54).to_be_bytes());
    t.extend(&hdr);
    t.resize(76, 0);
    t.extend(dseg(100, pkts.lkey, pkts.mem.addr()));
    sq.write(0x4e, &t);
    sq.doorbell();
    hca.step();
    assert_eq!(cq.poll().unwrap()[27], 0x02);
}

#[test]
fn garbage_in_device_pages_never_crashes_the_device() {
    for wc in [true, false] {
        let (hca, mut cq, mut sq) = sq_rig(HcaConfig { wc, ..step_cfg() }, 16, 64);
        let bf = sq.info.bf.unwrap();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for round in 0..500u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Random ring contents with the right owner bit, a random BF first qword that
            // sometimes names our QPN and a nearby counter, random doorbell values.
            let mut t: Vec<u8> = (0..124).map(|i| (x >> (i % 57)) as u8).collect();
            t[3] = (x as u8) & 0x3f;
            sq.write((x >> 8) as u8 & 0x1f, &t);
            let mut q = x.to_be_bytes();
            if round % 2 == 0 {
                let qpn = sq.info.qpn;
                q[4..7].copy_from_slice(&[(qpn >> 16) as u8, (qpn >> 8) as u8, qpn as u8]);
                q[1] = 0;
                q[2] = (round % 16) as u8;
            }
            let half = (round as usize) % 2;
            // SAFETY: the first qword of a BF half, inside the register.
            unsafe {
                (bf.reg.add(half * bf.half_size) as *mut u64).write_volatile(u64::from_ne_bytes(q))
            };
            if round % 3 == 0 {
                // SAFETY: the doorbell word of our UAR page.
                unsafe { (sq.info.uar.add(0x14) as *mut u32).write_volatile(x as u32) };
            }
            hca.step();
            cq.drain();
            cq.update_ci();
            if hca.sq_state(sq.info.qpn).unwrap() == QueueState::Error {
                hca.destroy_sq(sq.info.qpn).unwrap();
                let ring = std::mem::replace(&mut sq.ring, Mem::new(64));
                ring.fill(0);
                sq = TestSq::on(&hca, ring, 16, cq.cqn);
            }
        }
        let c = hca.counters();
        assert!(c.bf_bursts > 0 && c.doorbells > 0);
    }
}
