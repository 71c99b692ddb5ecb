//! Send side of the device model, driven by hand-made WQEs (doc/prm.md sections 1-5 and 10):
//! rings, ownership and stamping, inline and gather sends, checksum, VLAN and LSO offloads.
//! Error completions are in `tx_errors`, BlueFlame in `tx_blueflame`.

mod common;

use common::*;
use mlx4_hca::{Hca, HcaConfig, QueueState};

#[test]
fn qpns_and_caps_look_like_hardware() {
    let (hca, _cq, sq) = sq_rig(step_cfg(), 64, 64);
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
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 64, 64);
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
    let (_hca, cq, _sq) = sq_rig(step_cfg(), 8, 8);
    for i in 0..8 {
        assert_eq!(cq.ring.get(i * 32 + 31, 1)[0] & 0x80, 0x80);
    }
}

#[test]
fn wqe_without_doorbell_is_not_executed() {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 64, 64);
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
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 64, 64);
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
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 4, 4);
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
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 4, 8);
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

#[test]
fn inline_send_split_at_64_bytes_and_wrapping_the_ring() {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 4, 8);
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
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 64, 64);
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
    let (hca, _cq, mut sq) = sq_rig(step_cfg(), 64, 64);
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
    let (hca, _cq, mut sq) = sq_rig(step_cfg(), 64, 64);
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
    let (hca, _cq, mut sq) = sq_rig(step_cfg(), 64, 64);
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
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 64, 64);
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
fn stamp_inside_a_multi_txbb_wqe_is_flagged() {
    let (hca, mut cq, mut sq) = sq_rig(step_cfg(), 64, 64);
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
