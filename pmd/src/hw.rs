//! Firmware-command side of the hardware boundary: creating device queues on memory the
//! driver allocated, registering memory, and wrapping the device pages a queue is given.

use mlx4_hca::{CqAttr, Hca, RqAttr, SqAttr, SqInfo};

use crate::mem::{DmaBuf, DmaRange, Mr};
use crate::mmio::{BfReg, Copy64, SendDoorbell};
use crate::ring::{CqRing, SqRing};

// The port's RSS key is the device's, byte for byte.
const _: () = assert!(crate::port::RSS_KEY_LEN == mlx4_hca::RSS_KEY_LEN);

fn create_cq(hca: &Hca, cq: &CqRing) -> Result<u32, String> {
    let attr = CqAttr {
        buf: cq.buf_ptr(),
        cqe_cnt: cq.cqe_cnt(),
        set_ci_db: cq.set_ci_db_ptr(),
    };
    // SAFETY: the CQ memory and its record belong to `cq`, which the queue keeps alive until
    // after destroy_cq returns (the device stops touching it before that returns).
    unsafe { hca.create_cq(&attr) }.map_err(|e| format!("create CQ: {e}"))
}

/// Creates a CQ on `cq` and an RQ of `wqe_cnt` WQEs of `sges` entries on `rq`, whose doorbell
/// record sits at `db_off`. Returns (cqn, qpn).
pub fn create_rq_cq(
    hca: &Hca,
    rq: &DmaBuf,
    wqe_cnt: u32,
    sges: u32,
    cq: &CqRing,
    db_off: usize,
) -> Result<(u32, u32), String> {
    assert!(db_off + 4 <= rq.len() && wqe_cnt as usize * sges as usize * 16 <= db_off);
    let cqn = create_cq(hca, cq)?;
    let attr = RqAttr {
        buf: rq.as_ptr(),
        wqe_cnt,
        sges,
        cqn,
        // SAFETY: in bounds (asserted above).
        db_rec: unsafe { rq.as_ptr().add(db_off) }.cast(),
    };
    // SAFETY: the ring and record belong to `rq`, kept alive by the queue until after
    // destroy_rq returns.
    match unsafe { hca.create_rq(&attr) } {
        Ok(qpn) => Ok((cqn, qpn)),
        Err(e) => {
            let _ = hca.destroy_cq(cqn);
            Err(format!("create RQ: {e}"))
        }
    }
}

/// Creates a CQ on `cq` and an SQ on `sq` completing into it.
pub fn create_sq_cq(hca: &Hca, sq: &SqRing, cq: &CqRing) -> Result<(u32, SqInfo), String> {
    let cqn = create_cq(hca, cq)?;
    let sq_attr = SqAttr {
        buf: sq.buf().as_ptr(),
        txbb_cnt: sq.txbb_cnt(),
        cqn,
    };
    // SAFETY: as above, for the ring owned by `sq`.
    match unsafe { hca.create_sq(&sq_attr) } {
        Ok(info) => Ok((cqn, info)),
        Err(e) => {
            let _ = hca.destroy_cq(cqn);
            Err(format!("create SQ: {e}"))
        }
    }
}

pub fn doorbell(info: &SqInfo) -> SendDoorbell {
    // SAFETY: the device maps the SQ's UAR page until the SQ is destroyed, and the queue
    // drops its doorbell together with the SQ.
    unsafe { SendDoorbell::new(info.uar, info.qpn) }
}

pub fn bf_reg(info: &SqInfo, copy: Copy64) -> Option<BfReg> {
    let bf = info.bf.as_ref()?;
    // SAFETY: the device gives each SQ a 64-byte aligned register of two halves that lives
    // as long as the SQ, like the UAR page.
    Some(unsafe { BfReg::new(bf.reg, bf.half_size, copy) })
}

/// Registers a range with the device.
pub fn reg_mr_range(hca: &Hca, range: DmaRange) -> Result<Mr, String> {
    let (start, end) = (range.start(), range.end());
    // SAFETY: a `DmaRange` stays mapped for the device's life (its constructor's contract).
    let lkey = unsafe { hca.reg_mr(start as *const u8, end - start) }
        .map_err(|e| format!("register memory {start:#x}..{end:#x}: {e}"))?;
    Ok(Mr { start, end, lkey })
}
