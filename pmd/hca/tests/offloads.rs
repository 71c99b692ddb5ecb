//! Receive offloads beyond the basic ones: the FCS kept on request (KEEP_CRC).

mod common;

use common::*;
use mlx4_hca::{Hca, RqOptions, Wire};

/// CRC-32 bit by bit (IEEE 802.3), independent of the model's table.
fn fcs(data: &[u8]) -> [u8; 4] {
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
    (!c).to_le_bytes()
}

/// A looped adapter whose RQ has `sges` entries per WQE and keeps the FCS.
struct Rig {
    hca: Hca,
    _txcq: TestCq,
    sq: TestSq,
    rq: TestRq,
    rxcq: TestCq,
    pkts: Pkts,
}

fn rig(sges: u32) -> Rig {
    let hca = Hca::open(step_cfg()).unwrap();
    hca.set_wire(Wire::Loop).unwrap();
    let txcq = TestCq::new(&hca, 64);
    let sq = TestSq::new(&hca, 64, txcq.cqn);
    let rxcq = TestCq::new(&hca, 64);
    let ring = Mem::new(64 * sges as usize * 16);
    let db = Mem::new(4);
    let attr = mlx4_hca::RqAttr {
        buf: ring.ptr(),
        wqe_cnt: 64,
        sges,
        cqn: rxcq.cqn,
        db_rec: db.ptr() as *mut u32,
    };
    let opts = RqOptions {
        scatter_fcs: true,
        ..RqOptions::default()
    };
    // SAFETY: the memory lives in the returned rig.
    let qpn = unsafe { hca.create_rq_with(&attr, &opts) }.unwrap();
    let rq = TestRq {
        ring,
        db,
        cnt: 64,
        sges,
        qpn,
        prod: 0,
    };
    let pkts = Pkts::new(&hca, 1 << 20);
    Rig {
        hca,
        _txcq: txcq,
        sq,
        rq,
        rxcq,
        pkts,
    }
}

impl Rig {
    fn send(&mut self, frame: &[u8]) {
        self.pkts.mem.put(0, frame);
        let mut t = ctrl_tail(2, UNSIGNALED);
        t.extend(dseg(
            frame.len() as u32,
            self.pkts.lkey,
            self.pkts.mem.addr(),
        ));
        self.sq.write(SEND, &t);
        self.sq.doorbell();
        self.hca.step();
    }
}

#[test]
fn keep_crc_leaves_a_real_fcs_after_the_frame() {
    let mut r = rig(1);
    let frame = hex(TCP4);
    let buf = 65536u64;
    r.rq.post(&[(2048, r.pkts.lkey, r.pkts.mem.addr() + buf)]);
    r.send(&frame);
    let cqe = r.rxcq.poll().expect("received");
    assert_eq!(cqe[31] & 0x1f, 0x01, "no error");
    assert_eq!(
        be32(&cqe, 20) as usize,
        frame.len() + 4,
        "byte_cnt counts the FCS"
    );
    let got = r.pkts.mem.get(buf as usize, frame.len() + 4);
    assert_eq!(&got[..frame.len()], &frame[..]);
    assert_eq!(&got[frame.len()..], &fcs(&frame), "CRC-32, LSB first");
    // Checksum verdicts are about the frame, not the FCS.
    assert_eq!(be32(&cqe, 16) & (1 << 28 | 1 << 2), 1 << 28 | 1 << 2);
    let c = r.hca.counters();
    assert_eq!(
        (c.rx_bytes, c.dma_write_bytes),
        (frame.len() as u64, frame.len() as u64 + 4)
    );
    // Off again: the frame alone.
    r.hca.set_rq_scatter_fcs(r.rq.qpn, false).unwrap();
    r.rq.post(&[(2048, r.pkts.lkey, r.pkts.mem.addr() + buf + 4096)]);
    r.send(&frame);
    r.rxcq.update_ci();
    let cqe = r.rxcq.poll().expect("received");
    assert_eq!(be32(&cqe, 20) as usize, frame.len());
    assert!(r.hca.set_rq_scatter_fcs(0x7777, true).is_err());
}

#[test]
fn the_fcs_may_straddle_scatter_entries_and_needs_room() {
    let mut r = rig(2);
    let frame = hex(TCP4);
    let n = frame.len();
    let (a, b) = (65536usize, 70000usize);
    // The first buffer takes the frame and two FCS bytes, the second the rest.
    r.rq.post(&[
        ((n + 2) as u32, r.pkts.lkey, r.pkts.mem.addr() + a as u64),
        (64, r.pkts.lkey, r.pkts.mem.addr() + b as u64),
    ]);
    r.send(&frame);
    let cqe = r.rxcq.poll().expect("received");
    assert_eq!(be32(&cqe, 20) as usize, n + 4);
    let f = fcs(&frame);
    assert_eq!(r.pkts.mem.get(a, n + 2)[n..], f[..2]);
    assert_eq!(r.pkts.mem.get(b, 2), f[2..]);
    // Room for the frame but not its FCS: a length error, the queue goes on.
    r.rq.post(&[((n + 3) as u32, r.pkts.lkey, r.pkts.mem.addr() + a as u64)]);
    r.send(&frame);
    let cqe = r.rxcq.poll().expect("error CQE");
    assert_eq!((cqe[31] & 0x1f, cqe[27]), (0x1e, 0x01), "LOCAL_LENGTH");
    assert_eq!(r.hca.counters().rx_drops_too_long, 1);
}
