//! Firmware-command side of the hardware boundary: creating device queues on memory the
//! driver allocated, registering memory, and wrapping the device pages a queue is given.

use mlx4_hca::{CqAttr, Hca, SqAttr, SqInfo};

use crate::mem::Mr;
use crate::mmio::{BfReg, Copy64, SendDoorbell};
use crate::ring::{CqRing, SqRing};

/// Creates a CQ on `cq` and an SQ on `sq` completing into it.
pub fn create_sq_cq(hca: &Hca, sq: &SqRing, cq: &CqRing) -> Result<(u32, SqInfo), String> {
    let cq_attr = CqAttr {
        buf: cq.buf_ptr(),
        cqe_cnt: cq.cqe_cnt(),
        set_ci_db: cq.set_ci_db_ptr(),
    };
    // SAFETY: the CQ memory and its record belong to `cq`, which the queue keeps alive until
    // after destroy_cq returns (the device stops touching it before that returns).
    let cqn = unsafe { hca.create_cq(&cq_attr) }.map_err(|e| format!("create CQ: {e}"))?;
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

/// Registers `[start, end)` with the device. The caller (port set-up) passes only ranges
/// that stay mapped for the life of the device: DPDK memseg lists, or test arenas.
pub fn reg_mr_range(hca: &Hca, start: usize, end: usize) -> Result<Mr, String> {
    // SAFETY: see above; the device only reads inside the range, and only for WQEs the driver
    // posts with buffers it owns.
    let lkey = unsafe { hca.reg_mr(start as *const u8, end - start) }
        .map_err(|e| format!("register memory {start:#x}..{end:#x}: {e}"))?;
    Ok(Mr { start, end, lkey })
}
