//! Send side of the device model, driven by hand-made WQEs (doc/prm.md sections 1-5 and 10).

mod common;

use common::*;
use mlx4_hca::{Hca, HcaConfig, QueueState};

fn rig(cfg: HcaConfig, txbbs: u32, cqes: u32) -> (Hca, TestCq, TestSq) {
    let hca = Hca::open(cfg).unwrap();
    let cq = TestCq::new(&hca, cqes);
    let sq = TestSq::new(&hca, txbbs, cq.cqn);
    (hca, cq, sq)
}

/// Check a TX CQE: S/R set, opcode, WQE counter and QPN.
fn assert_tx_cqe(cqe: &[u8], qpn: u32, opcode: u8, wqe_index: u16) {
    assert_eq!(be32(cqe, 0) & 0xff_ffff, qpn, "qpn");
    assert_eq!(cqe[31] & 0x40, 0x40, "S/R bit");
    assert_eq!(cqe[31] & 0x1f, opcode, "opcode");
    assert_eq!(be16(cqe, 24), wqe_index, "wqe_index");
}

#[test]
fn qpns_and_caps_look_like_hardware() {
    let (hca, _cq, sq) = rig(step_cfg(), 64, 64);
    assert!(sq.info.qpn >= 0x40);
    let caps = hca.caps();
    assert_eq!(caps.max_wqe_size, 1008);
    assert_eq!(caps.max_inline, 928);
    assert_eq!(caps.bf_reg_size, 512);
    assert_eq!(sq.info.bf.unwrap().half_size, 256);
    assert_eq!(caps.fw_ver, 2 << 32 | 42 << 16 | 5000);
    assert_eq!(caps.fw_version(), "2.42.5000");
    assert_eq!((caps.vendor_part_id, caps.tunnel_offloads), (0x1003, false));
    let nobf = Hca::open(HcaConfig {
        bf_reg_size: 0,
        ..step_cfg()
    })
    .unwrap();
    assert_eq!(nobf.caps().bf_reg_size, 0);
    let cq = TestCq::new(&nobf, 4);
    assert!(TestSq::new(&nobf, 4, cq.cqn).info.bf.is_none());
}

#[test]
fn signaled_nop_through_the_doorbell_completes() {
    let (hca, mut cq, mut sq) = rig(step_cfg(), 64, 64);
    // Pass 0: OWNER = 0. NOP, DS 1, C = 0b11.
    sq.write(NOP, &ctrl_tail(1, SIGNALED));
    sq.doorbell();
    assert!(hca.step() > 0);
    let cqe = cq.poll().expect("a CQE");
    assert_eq!(cqe[31] & 0x80, 0, "pass-0 CQE has OWNER 0");
    assert_tx_cqe(&cqe, sq.info.qpn, NOP, 0);
    let c = hca.counters();
    assert_eq!((c.doorbells, c.wqe_fetched, c.txbbs, c.cqes), (1, 1, 1, 1));
    assert_eq!(c.tx_frames, 0, "a NOP moves no frame");
    // The device consumed the doorbell word.
    assert_eq!(hca.step(), 0);
}

#[test]
fn cq_starts_hardware_owned() {
    let (_hca, cq, _sq) = rig(step_cfg(), 8, 8);
    for i in 0..8 {
        assert_eq!(cq.ring.get(i * 32 + 31, 1)[0] & 0x80, 0x80);
    }
}

#[test]
fn wqe_without_doorbell_is_not_executed() {
    let (hca, mut cq, mut sq) = rig(step_cfg(), 64, 64);
    sq.write(NOP, &ctrl_tail(1, SIGNALED));
    assert_eq!(hca.step(), 0);
    assert!(cq.poll().is_none());
    assert_eq!(hca.counters().wqe_fetched, 0);
    sq.doorbell();
    hca.step();
    assert!(cq.poll().is_some());
}

#[test]
fn unsignaled_wqes_complete_silently_and_one_doorbell_covers_a_burst() {
    let (hca, mut cq, mut sq) = rig(step_cfg(), 64, 64);
    for _ in 0..7 {
        sq.write(NOP, &ctrl_tail(1, UNSIGNALED));
    }
    let last = sq.write(NOP, &ctrl_tail(1, SIGNALED));
    sq.doorbell();
    hca.step();
    let cqes = cq.drain();
    assert_eq!(cqes.len(), 1);
    assert_tx_cqe(&cqes[0], sq.info.qpn, NOP, last as u16);
    let c = hca.counters();
    assert_eq!((c.doorbells, c.wqe_fetched), (1, 8));
}

#[test]
fn ownership_parity_across_ring_and_cq_wraps() {
    let (hca, mut cq, mut sq) = rig(step_cfg(), 4, 4);
    for i in 0..11u32 {
        let counter = sq.write(NOP, &ctrl_tail(1, SIGNALED));
        assert_eq!(counter, i);
        sq.doorbell();
        hca.step();
        let cqe = cq.poll().unwrap_or_else(|| panic!("CQE for WQE {i}"));
        assert_eq!(cqe[31] & 0x80 != 0, i & 4 != 0, "CQE owner parity at {i}");
        assert_tx_cqe(&cqe, sq.info.qpn, NOP, i as u16);
        cq.update_ci();
    }
    // A slot still holding a WQE with the previous pass's parity is not the device's.
    let next = sq.prod;
    let stale_owner = sq.owner(next) ^ 0x8000_0000;
    sq.write_at(next, stale_owner, &ctrl_tail(1, SIGNALED));
    sq.doorbell();
    hca.step();
    assert!(cq.poll().is_none());
    assert_eq!(hca.counters().wqe_fetched, 11);
}

#[test]
fn stamped_txbbs_are_never_executed() {
    let (hca, mut cq, mut sq) = rig(step_cfg(), 4, 8);
    // rdma-core's initial ring: owner_opcode BE32(1 << 31), fence_size = 1: invalid in pass 0.
    for s in 0..4 {
        sq.write_at(s, 0x8000_0000, &ctrl_tail(1, SIGNALED));
    }
    sq.doorbell();
    hca.step();
    assert!(cq.poll().is_none());
    // Run pass 0 for real, then stamp every TXBB with 0x7fffffff | (parity 0 << 31).
    for _ in 0..4 {
        sq.write(NOP, &ctrl_tail(1, SIGNALED));
    }
    sq.doorbell();
    hca.step();
    assert_eq!(cq.drain().len(), 4);
    cq.update_ci();
    for s in 0..4 {
        sq.ring.put32(s * 64, 0x7fff_ffff);
    }
    sq.doorbell();
    hca.step();
    assert!(
        cq.poll().is_none(),
        "stamped pass-0 TXBBs are invalid in pass 1"
    );
    // A stamp with the wrong parity bit (0xffffffff in pass 0 of the next round) is not run either.
    for s in 0..4 {
        sq.ring.put32(s * 64, 0xffff_ffff);
    }
    hca.step();
    assert!(cq.poll().is_none());
    assert_eq!(hca.counters().wqe_fetched, 4);
    assert_eq!(hca.sq_state(sq.info.qpn).unwrap(), QueueState::Ready);
}

/// A frame as an inline WQE split at the 64-byte boundary: 44 bytes after the control segment,
/// the rest behind a second header at offset 64.
fn inline_wqe(frame: &[u8], srcrb: u8) -> Vec<u8> {
    let first = frame.len().min(44);
    let mut size = 16 + 4 + first;
    if frame.len() > 44 {
        size = 64 + 4 + (frame.len() - 44);
    }
    let ds = size.div_ceil(16) as u8;
    let mut t = ctrl_tail(ds, srcrb);
    t.extend(inline_hdr(first));
    t.extend(&frame[..first]);
    if frame.len() > 44 {
        assert!(frame.len() - 44 <= 60);
        t.extend(inline_hdr(frame.len() - 44));
        t.extend(&frame[44..]);
    }
    t.resize(usize::from(ds) * 16 - 4, 0);
    t
}

#[test]
fn inline_send_split_at_64_bytes_and_wrapping_the_ring() {
    let (hca, mut cq, mut sq) = rig(step_cfg(), 4, 8);
    let frames = sink(&hca);
    for _ in 0..3 {
        sq.write(NOP, &ctrl_tail(1, UNSIGNALED));
    }
    sq.doorbell();
    hca.step();
    // Counter 3 is the last slot: the WQE's second TXBB is slot 0 of the next pass.
    let frame: Vec<u8> = (0..60u8).collect();
    let wqe = inline_wqe(&frame, SIGNALED);
    assert_eq!(wqe[3], 6, "DS: 16 + 4 + 44 + 4 + 16 = 84 -> 6");
    let c = sq.write(SEND, &wqe);
    assert_eq!(c, 3);
    sq.doorbell();
    hca.step();
    assert_eq!(frames.lock().as_slice(), &[frame]);
    let cqes = cq.drain();
    assert_eq!(cqes.len(), 1);
    assert_tx_cqe(&cqes[0], sq.info.qpn, SEND, 3);
    let c = hca.counters();
    assert_eq!((c.tx_frames, c.tx_bytes, c.txbbs), (1, 60, 5));
}

#[test]
fn gather_send_mixes_inline_and_data_segments_and_skips_zero_length() {
    let (hca, mut cq, mut sq) = rig(step_cfg(), 64, 64);
    let frames = sink(&hca);
    let pkts = Pkts::new(&hca, 8192);
    let payload: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
    pkts.mem.put(1000, &payload[..150]);
    pkts.mem.put(5000, &payload[150..]);
    let hdr = [0xaau8; 12];
    // ctrl | inline 12 B (padded to 16) | data 150 B | zero-length entry | data 50 B => DS 5.
    let mut t = ctrl_tail(5, SIGNALED);
    t.extend(inline_hdr(12));
    t.extend(hdr);
    t.extend(dseg(150, pkts.lkey, pkts.mem.addr() + 1000));
    t.extend(dseg(0x8000_0000, 0, 0));
    t.extend(dseg(50, pkts.lkey, pkts.mem.addr() + 5000));
    sq.write(SEND, &t);
    sq.doorbell();
    hca.step();
    let mut want = hdr.to_vec();
    want.extend(&payload);
    assert_eq!(frames.lock().as_slice(), &[want]);
    assert_eq!(cq.drain().len(), 1);
    assert_eq!(hca.counters().dma_read_bytes, 200);
}

#[test]
fn null_wire_counts_without_copying() {
    let (hca, _cq, mut sq) = rig(step_cfg(), 64, 64);
    let pkts = Pkts::new(&hca, 4096);
    for _ in 0..10 {
        let mut t = ctrl_tail(2, UNSIGNALED);
        t.extend(dseg(64, pkts.lkey, pkts.mem.addr()));
        sq.write(SEND, &t);
    }
    sq.doorbell();
    hca.step();
    let c = hca.counters();
    assert_eq!((c.tx_frames, c.tx_bytes), (10, 640));
    assert_eq!(hca.wire(), "null");
}

#[test]
fn checksum_offload_fills_known_ipv4_tcp_checksums() {
    let (hca, _cq, mut sq) = rig(step_cfg(), 64, 64);
    let frames = sink(&hca);
    let pkts = Pkts::new(&hca, 4096);
    let good = hex(TCP4);
    let mut zeroed = good.clone();
    zeroed[24..26].copy_from_slice(&[0, 0]); // IPv4 header checksum
    zeroed[50..52].copy_from_slice(&[0xde, 0xad]); // TCP checksum: garbage, must be ignored
    pkts.mem.put(0, &zeroed);
    let mut t = ctrl_tail(2, UNSIGNALED | IP_CSUM | L4_CSUM);
    t.extend(dseg(zeroed.len() as u32, pkts.lkey, pkts.mem.addr()));
    sq.write(SEND, &t);
    // Without the flags the frame goes out untouched.
    let mut t = ctrl_tail(2, UNSIGNALED);
    t.extend(dseg(zeroed.len() as u32, pkts.lkey, pkts.mem.addr()));
    sq.write(SEND, &t);
    sq.doorbell();
    hca.step();
    let f = frames.lock();
    assert_eq!(be16(&f[0], 24), 0x1490);
    assert_eq!(be16(&f[0], 50), 0x6d20);
    assert_eq!(f[0], good);
    assert_eq!(f[1], zeroed);
}

#[test]
fn vlan_insert_then_udp_ipv6_checksum() {
    let (hca, _cq, mut sq) = rig(step_cfg(), 64, 64);
    let frames = sink(&hca);
    let tagged = hex(UDP6_VLAN);
    // The same frame untagged, with the UDP checksum zeroed.
    let mut untagged = tagged[..12].to_vec();
    untagged.extend(&tagged[16..]);
    let csum_at = 14 + 40 + 6;
    untagged[csum_at..csum_at + 2].copy_from_slice(&[0, 0]);
    let mut wqe = inline_wqe(&untagged, UNSIGNALED | L4_CSUM);
    // Insert C-VLAN 100: vlan_tag BE16 at bytes 4-5, ins_vlan 0x40 at byte 6.
    wqe[0..3].copy_from_slice(&[0x00, 0x64, 0x40]);
    sq.write(SEND, &wqe);
    sq.doorbell();
    hca.step();
    let f = frames.lock();
    assert_eq!(be16(&f[0], csum_at + 4), 0x0d23);
    assert_eq!(f[0], tagged);
    assert_eq!(hca.counters().tx_bytes, tagged.len() as u64);
}

/// Post `tail` (dword 0 = `opcode`) on a fresh SQ, ring, and return the single CQE it produces.
fn error_case(cfg: HcaConfig, opcode: u8, tail: impl Fn(&Pkts) -> Vec<u8>) -> (u8, Vec<u8>) {
    let (hca, mut cq, mut sq) = rig(cfg, 64, 64);
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
    let hca = Hca::open(step_cfg()).unwrap();
    let mut cq = TestCq::new(&hca, 8);
    let mut sq = TestSq::new(&hca, 1, cq.cqn);
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
    let (hca, mut cq, mut sq) = rig(step_cfg(), 64, 64);
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
    let (hca, mut cq, mut sq) = rig(step_cfg(), 64, 2);
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

// ------------------------------------------------------------------ BlueFlame

#[test]
fn blueflame_halves_alternate_and_are_the_doorbell() {
    let (hca, mut cq, mut sq) = rig(step_cfg(), 64, 64);
    let frames = sink(&hca);
    for i in 0..4u8 {
        let frame = vec![i; 60];
        let c = sq.write(SEND, &inline_wqe(&frame, SIGNALED));
        let wqe = sq.wqe_bytes(c);
        sq.bf_copy(c, wqe);
        hca.step();
        let cqe = cq.poll().expect("BF write acts as the doorbell");
        assert_eq!(be16(&cqe, 24), c as u16);
    }
    assert_eq!(frames.lock().len(), 4);
    let c = hca.counters();
    assert_eq!(c.doorbells, 0);
    assert_eq!(
        (c.bf_bursts, c.wqe_from_bf, c.wqe_fetched, c.bf_torn),
        (4, 4, 0, 0)
    );
}

#[test]
fn blueflame_runs_earlier_wqes_from_memory_and_stops_at_its_counter() {
    let (hca, mut cq, mut sq) = rig(step_cfg(), 64, 64);
    sq.write(NOP, &ctrl_tail(1, SIGNALED));
    sq.write(NOP, &ctrl_tail(1, SIGNALED));
    let c = sq.write(NOP, &ctrl_tail(1, SIGNALED));
    let wqe = sq.wqe_bytes(c);
    sq.bf_copy(c, wqe);
    // Written after the BF copy and never doorbelled: must not run.
    sq.write(NOP, &ctrl_tail(1, SIGNALED));
    hca.step();
    let idx: Vec<u16> = cq.drain().iter().map(|q| be16(q, 24)).collect();
    assert_eq!(idx, [0, 1, 2]);
    let k = hca.counters();
    assert_eq!((k.wqe_fetched, k.wqe_from_bf), (2, 1));
}

#[test]
fn blueflame_for_another_qpn_or_a_consumed_wqe_is_ignored() {
    let (hca, mut cq, mut sq) = rig(step_cfg(), 64, 64);
    let c = sq.write(NOP, &ctrl_tail(1, SIGNALED));
    sq.doorbell();
    hca.step();
    assert_eq!(cq.drain().len(), 1);
    // Late copy of the WQE already executed.
    let wqe = sq.wqe_bytes(c);
    sq.bf_copy(c, wqe.clone());
    // Copy naming another QPN.
    let real = sq.info.qpn;
    sq.info.qpn = real + 1;
    sq.write(NOP, &ctrl_tail(1, SIGNALED));
    sq.bf_copy(1, sq.wqe_bytes(1));
    sq.info.qpn = real;
    hca.step();
    assert!(cq.poll().is_none());
    assert_eq!(hca.counters().bf_ignored, 2);
}

/// The WC self-test: ring memory holds an unsignaled NOP, the BF copy the same NOP with
/// CQ_UPDATE. Only a device that used the copy writes a CQE.
fn wc_self_test(wc: bool) -> (usize, mlx4_hca::Counters) {
    let (hca, mut cq, mut sq) = rig(HcaConfig { wc, ..step_cfg() }, 64, 64);
    let c = sq.write(NOP, &ctrl_tail(1, UNSIGNALED));
    let mut copy = sq.wqe_bytes(c);
    copy[11] = SIGNALED;
    sq.bf_copy(c, copy);
    hca.step();
    (cq.drain().len(), hca.counters())
}

#[test]
fn wc_self_test_sees_a_completion_only_with_write_combining() {
    let (n, c) = wc_self_test(true);
    assert_eq!(n, 1);
    assert_eq!(
        (c.bf_bursts, c.bf_torn, c.wqe_from_bf, c.wqe_fetched),
        (1, 0, 1, 0)
    );

    let (n, c) = wc_self_test(false);
    assert_eq!(n, 0, "without WC the copy is never executed");
    assert_eq!((c.bf_bursts, c.bf_torn, c.bf_pieces), (1, 1, 8));
    assert_eq!((c.wqe_from_bf, c.wqe_fetched, c.txbbs), (0, 1, 1));
}

#[test]
fn torn_blueflame_copy_is_not_used() {
    let (hca, mut cq, mut sq) = rig(step_cfg(), 64, 64);
    let frames = sink(&hca);
    let frame = vec![0x5a; 60];
    let c = sq.write(SEND, &inline_wqe(&frame, SIGNALED));
    let mut copy = sq.wqe_bytes(c);
    copy[40] ^= 0xff; // the rest of the burst never matched ring memory
    sq.bf_copy(c, copy);
    hca.step();
    assert_eq!(cq.drain().len(), 1);
    assert_eq!(
        frames.lock().as_slice(),
        &[frame],
        "ring memory, not the copy"
    );
    let k = hca.counters();
    assert_eq!(
        (k.bf_bursts, k.bf_torn, k.wqe_from_bf, k.wqe_fetched),
        (1, 1, 0, 1)
    );
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
    let (hca, mut cq, mut sq) = rig(step_cfg(), 8, 64);
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
fn blueflame_keeps_working_when_the_16_bit_counter_wraps() {
    // With 1-TXBB WQEs and alternating halves, the copy written 65536 posts later into the same
    // half has the very same first qword; the device must still see it as a new arrival.
    let (hca, mut cq, mut sq) = rig(step_cfg(), 2, 4);
    let n = 65536 + 4;
    for i in 0..n {
        let c = sq.write(NOP, &ctrl_tail(1, SIGNALED));
        let wqe = sq.wqe_bytes(c);
        sq.bf_copy(c, wqe);
        hca.step();
        let cqe = cq
            .poll()
            .unwrap_or_else(|| panic!("no completion for BF post {i}"));
        assert_eq!(be16(&cqe, 24), i as u16);
        cq.update_ci();
    }
    let k = hca.counters();
    assert_eq!((k.bf_bursts, k.wqe_from_bf), (n as u64, n as u64));
}

/// Internet checksum over `parts`, for checking what the device computed.
fn inet_csum(parts: &[&[u8]]) -> u16 {
    let mut all = Vec::new();
    for p in parts {
        all.extend_from_slice(p);
    }
    if all.len() % 2 == 1 {
        all.push(0);
    }
    let mut s: u32 = all.chunks(2).map(|c| u32::from(be16(c, 0))).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

#[test]
fn lso_cuts_a_tcp_payload_into_mss_segments() {
    let (hca, mut cq, mut sq) = rig(step_cfg(), 64, 64);
    let frames = sink(&hca);
    let pkts = Pkts::new(&hca, 8192);
    // Header template: the known TCP/IPv4 frame's 54 header bytes, flags FIN|PSH|ACK|CWR.
    let mut hdr = hex(TCP4)[..54].to_vec();
    hdr[47] = 0x99;
    let payload: Vec<u8> = (0..2500u32).map(|i| (i % 251) as u8).collect();
    pkts.mem.put(0, &payload);
    // ctrl | BE32(mss << 16 | 54) | 54 header bytes, padded to 80 | data segment => DS 6.
    let mut t = ctrl_tail(6, SIGNALED | IP_CSUM | L4_CSUM);
    t.extend(((1000u32 << 16) | 54).to_be_bytes());
    t.extend(&hdr);
    t.resize(80 - 4, 0);
    t.extend(dseg(2500, pkts.lkey, pkts.mem.addr()));
    // LSO opcode 0x0e with bit 6, as drivers post it.
    sq.write(0x4e, &t);
    sq.doorbell();
    hca.step();
    let cqe = cq.poll().expect("LSO completion");
    assert_eq!(cqe[31] & 0x1f, 0x0e);
    let f = frames.lock();
    assert_eq!(f.len(), 3);
    let mut seq = 1u32;
    for (i, seg) in f.iter().enumerate() {
        let pay = if i < 2 { 1000 } else { 500 };
        assert_eq!(seg.len(), 54 + pay);
        assert_eq!(&seg[..12], &hdr[..12]);
        assert_eq!(be16(seg, 16) as usize, 40 + pay, "IPv4 total length");
        assert_eq!(be16(seg, 18), 0x1234 + i as u16, "IPv4 ID");
        assert_eq!(inet_csum(&[&seg[14..34]]), 0, "IPv4 header checksum");
        assert_eq!(be32(seg, 38), seq, "TCP sequence");
        let flags = seg[47];
        let want = match i {
            0 => 0x90,
            1 => 0x10,
            _ => 0x19,
        };
        assert_eq!(flags, want, "TCP flags of segment {i}");
        let tcp_len = (20 + pay) as u16;
        let pseudo = [&seg[26..34], &[0, 6], &tcp_len.to_be_bytes()[..]].concat();
        assert_eq!(inet_csum(&[&pseudo, &seg[34..]]), 0, "TCP checksum");
        assert_eq!(&seg[54..], &payload[i * 1000..i * 1000 + pay]);
        seq += pay as u32;
    }
    let c = hca.counters();
    assert_eq!((c.tx_frames, c.tx_bytes), (3, 3 * 54 + 2500));
}

#[test]
fn lso_with_a_non_tcp_template_is_local_qp_op() {
    let (hca, mut cq, mut sq) = rig(step_cfg(), 64, 64);
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
        let (hca, mut cq, mut sq) = rig(HcaConfig { wc, ..step_cfg() }, 16, 64);
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

#[test]
fn stamp_inside_a_multi_txbb_wqe_is_flagged() {
    let (hca, mut cq, mut sq) = rig(step_cfg(), 64, 64);
    let _frames = sink(&hca);
    // A 2-TXBB inline SEND whose second TXBB still starts with a stamp instead of its header:
    // the driver published the owner too early. The inline header there is garbage, so the WQE
    // completes in error, and the analyser counts the stamp.
    let frame = vec![1u8; 60];
    let mut t = inline_wqe(&frame, SIGNALED);
    t[60..64].copy_from_slice(&[0x7f, 0xff, 0xff, 0xff]);
    sq.write(SEND, &t);
    sq.doorbell();
    hca.step();
    assert!(cq.poll().is_some());
    assert_eq!(hca.counters().wqe_stamp_seen, 1);
}

/// A WQE as mlx4_en and rdma-core leave it in the ring when they post through BlueFlame: the
/// QPN (`bf_qpn`) in bytes 4-6, over vlan_tag and ins_vlan.
fn inline_wqe_with_bf_qpn(frame: &[u8], srcrb: u8, qpn: u32) -> Vec<u8> {
    let mut t = inline_wqe(frame, srcrb);
    t[0..3].copy_from_slice(&[(qpn >> 16) as u8, (qpn >> 8) as u8, qpn as u8]);
    t
}

#[test]
fn blueflame_wqe_carrying_bf_qpn_in_the_ring_goes_out_untagged() {
    for wc in [true, false] {
        let hca = Hca::open(HcaConfig { wc, ..step_cfg() }).unwrap();
        let mut cq = TestCq::new(&hca, 64);
        // 0x40 reads as ins_vlan = C-VLAN, 0x41 as an ins_vlan value no device knows: neither is
        // a VLAN request in a BlueFlame-posted WQE.
        let mut sqs = [TestSq::new(&hca, 64, cq.cqn), TestSq::new(&hca, 64, cq.cqn)];
        assert_eq!(
            sqs.iter().map(|s| s.info.qpn & 0xff).collect::<Vec<_>>(),
            [0x40, 0x41]
        );
        let frames = sink(&hca);
        for (i, sq) in sqs.iter_mut().enumerate() {
            let frame = vec![0x30 + i as u8; 60];
            let c = sq.write(SEND, &inline_wqe_with_bf_qpn(&frame, SIGNALED, sq.info.qpn));
            let wqe = sq.wqe_bytes(c);
            sq.bf_copy(c, wqe);
            hca.step();
            let cqe = cq.poll().expect("a completion");
            assert_tx_cqe(&cqe, sq.info.qpn, SEND, c as u16);
            assert_eq!(hca.sq_state(sq.info.qpn).unwrap(), QueueState::Ready);
            assert_eq!(frames.lock().pop(), Some(frame), "wc={wc}: sent as posted");
        }
        let k = hca.counters();
        assert_eq!(k.error_cqes, 0);
        let (bf, ring) = if wc { (2, 0) } else { (0, 2) };
        assert_eq!((k.wqe_from_bf, k.wqe_fetched), (bf, ring), "wc={wc}");

        // The same bytes rung through the doorbell are a VLAN request again: C-VLAN 0x0000 on
        // the first queue, an unknown ins_vlan (an error) on the second.
        let frame = vec![0x50; 60];
        let sq = &mut sqs[0];
        sq.write(SEND, &inline_wqe_with_bf_qpn(&frame, SIGNALED, sq.info.qpn));
        sq.doorbell();
        hca.step();
        assert_eq!(cq.poll().unwrap()[31] & 0x1f, SEND);
        let mut tagged = frame[..12].to_vec();
        tagged.extend([0x81, 0x00, 0x00, 0x00]);
        tagged.extend(&frame[12..]);
        assert_eq!(frames.lock().pop(), Some(tagged));
        let sq = &mut sqs[1];
        sq.write(SEND, &inline_wqe_with_bf_qpn(&frame, SIGNALED, sq.info.qpn));
        sq.doorbell();
        hca.step();
        let cqe = cq.poll().unwrap();
        assert_eq!((cqe[31] & 0x1f, cqe[27]), (0x1e, 0x02), "LOCAL_QP_OP");
        assert_eq!(hca.sq_state(sq.info.qpn).unwrap(), QueueState::Error);
    }
}

#[test]
fn blueflame_write_keeps_vlan_semantics_of_the_earlier_wqes_it_runs() {
    let (hca, mut cq, mut sq) = rig(step_cfg(), 64, 64);
    let frames = sink(&hca);
    // Not announced by the BF write (it names the next WQE): its VLAN request stands.
    let a = vec![0xaa; 60];
    let mut t = inline_wqe(&a, SIGNALED);
    t[0..3].copy_from_slice(&[0x00, 0x64, 0x40]);
    sq.write(SEND, &t);
    let b = vec![0xbb; 60];
    let c = sq.write(SEND, &inline_wqe_with_bf_qpn(&b, SIGNALED, sq.info.qpn));
    sq.bf_copy(c, sq.wqe_bytes(c));
    hca.step();
    assert_eq!(cq.drain().len(), 2);
    let mut tagged = a[..12].to_vec();
    tagged.extend([0x81, 0x00, 0x00, 0x64]);
    tagged.extend(&a[12..]);
    assert_eq!(frames.lock().as_slice(), &[tagged, b]);
    // The announcement is used up: the slot's next occupant (after a wrap) rung through the
    // doorbell gets its VLAN again.
    for _ in 0..62 {
        sq.write(NOP, &ctrl_tail(1, UNSIGNALED));
    }
    sq.doorbell();
    hca.step();
    frames.lock().clear();
    let d = vec![0xdd; 60];
    let mut t = inline_wqe(&d, SIGNALED);
    t[0..3].copy_from_slice(&[0x00, 0x07, 0x40]);
    // a and b took 2 TXBBs each, the NOPs 62: this is counter 66, the slot of `c`.
    let f = sq.write(SEND, &t);
    assert_eq!((f, f % 64), (66, c % 64));
    sq.doorbell();
    hca.step();
    let got = frames.lock();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0][12..16], [0x81, 0x00, 0x00, 0x07]);
}

/// A BlueFlame write names the WQEs up to its own as posted. On x86 the copy (a `movdir64b`
/// or write-combining store) can become visible before the ring stores that came first, so a
/// device that finds the WQE not yet in ring memory must come back to it, not forget it: no
/// other doorbell will come.
#[test]
fn a_blueflame_copy_that_overtakes_its_ring_write_is_not_lost() {
    for wc in [false, true] {
        let (hca, mut cq, mut sq) = rig(HcaConfig { wc, ..step_cfg() }, 64, 64);
        let frames = sink(&hca);
        let frame = vec![0x42; 60];
        let tail = inline_wqe(&frame, SIGNALED);
        // The copy the driver will write, made from what the ring will hold.
        let c = sq.write(SEND, &tail);
        let wqe = sq.wqe_bytes(c);
        // Undo the ring write's visibility: the owner word still says "not yours".
        let owner = be32(&wqe, 0);
        sq.ring.put32(0, owner ^ 0x8000_0000);
        sq.bf_copy(c, wqe);
        hca.step();
        assert!(cq.poll().is_none(), "wc={wc}: not in ring memory yet");
        // The ring store lands; no further doorbell or BlueFlame write.
        sq.ring.put32(0, owner);
        hca.step();
        let cqe = cq
            .poll()
            .unwrap_or_else(|| panic!("wc={wc}: the WQE was forgotten"));
        assert_eq!((be16(&cqe, 24), cqe[31] & 0x1f), (c as u16, SEND));
        assert_eq!(frames.lock().as_slice(), std::slice::from_ref(&frame));
        let k = hca.counters();
        assert_eq!((k.bf_bursts, k.tx_frames), (1, 1), "wc={wc}");
    }
}
