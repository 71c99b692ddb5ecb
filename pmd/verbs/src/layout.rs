//! Queue geometry exactly as libmlx4 computes it (stride, spare WQEs, buffer layout, the caps it
//! writes back), so the buffers the application gets through `mlx4dv_init_obj` look as they
//! would on a card.

/// One ring inside a QP buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Ring {
    pub wqe_cnt: u32,
    pub wqe_shift: u32,
    pub offset: u32,
}

/// Control segment, bind segment (the minimum WQE body), inline header, data segment, LSO
/// segment header, remote-address segment: sizes from mlx4dv.h.
const CTRL: u32 = 16;
const BIND: u32 = 32;
const INLINE_HDR: u32 = 4;
const DATA: u32 = 16;
const LSO_HDR: u32 = 4;
const RADDR: u32 = 16;
const INLINE_ALIGN: u32 = 64;

fn align(v: u32, a: u32) -> u32 {
    v.div_ceil(a) * a
}

/// rdma-core's `roundup_pow_of_two` on 32 bits: 0 stays 0 (its 64-bit result truncates).
pub(crate) fn roundup_pow2(n: u32) -> u32 {
    if n == 0 {
        0
    } else {
        n.checked_next_power_of_two().unwrap_or(0)
    }
}

/// Inline headers a RAW_PACKET WQE needs for `data` inline bytes (the first chunk may start
/// 32 bytes into a 64-byte block).
fn inline_segs(data: u32) -> u32 {
    let data = data + (CTRL + RADDR) % INLINE_ALIGN;
    (data + INLINE_ALIGN - INLINE_HDR - 1) / (INLINE_ALIGN - INLINE_HDR)
}

/// The send side of a RAW_PACKET QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendLayout {
    pub sq: Ring,
    pub rq: Ring,
    /// Bytes of the QP buffer (before page rounding).
    pub buf_size: u32,
    /// WQEs kept free for the device's prefetch.
    pub spare: u32,
    /// The caps written back to the caller.
    pub max_send_wr: u32,
    pub max_send_sge: u32,
    pub max_inline: u32,
}

/// Lay out a send-only RAW_PACKET QP (no receive WQEs: rdma-core's `rq.wqe_cnt` is 0).
pub(crate) fn send_qp(
    max_send_wr: u32,
    max_send_sge: u32,
    max_inline: u32,
    max_tso_header: Option<u32>,
) -> SendLayout {
    let by_inline = align(max_inline + inline_segs(max_inline) * INLINE_HDR, DATA) / DATA;
    let sges = by_inline.max(max_send_sge);
    let mut size = (sges * DATA).max(BIND) + CTRL;
    if let Some(h) = max_tso_header {
        size += align(LSO_HDR + h, 16);
    }
    let mut shift = 6;
    while (1u32 << shift) < size {
        shift += 1;
    }
    let spare = (2048 >> shift) + 1;
    let wqe_cnt = roundup_pow2(max_send_wr + spare);
    let rq_shift = 4; // max_recv_sge is taken as 1
    let sq = Ring {
        wqe_cnt,
        wqe_shift: shift,
        offset: 0,
    };
    let rq = Ring {
        wqe_cnt: 0,
        wqe_shift: rq_shift,
        offset: wqe_cnt << shift,
    };
    let body = (1u32 << shift) - CTRL;
    SendLayout {
        sq,
        rq,
        buf_size: wqe_cnt << shift,
        spare,
        max_send_wr: wqe_cnt - spare,
        max_send_sge: body / DATA,
        max_inline: body - INLINE_HDR * (align(body, INLINE_ALIGN) / INLINE_ALIGN),
    }
}

/// A receive WQ: its RQ plus the one-WQE dummy SQ the kernel wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WqLayout {
    pub sq: Ring,
    pub rq: Ring,
    pub buf_size: u32,
    /// Scatter entries per WQE (the RQ stride / 16).
    pub sges: u32,
}

pub(crate) fn wq(max_wr: u32, max_sge: u32) -> WqLayout {
    let (max_wr, max_sge) = (max_wr.max(1), max_sge.max(1));
    let mut rq_shift = 4;
    while (1u32 << rq_shift) < max_sge * DATA {
        rq_shift += 1;
    }
    let rq_cnt = roundup_pow2(max_wr);
    let (sq_cnt, sq_shift) = (1u32, 6u32);
    let (sq_off, rq_off) = if rq_shift > sq_shift {
        (rq_cnt << rq_shift, 0)
    } else {
        (0, sq_cnt << sq_shift)
    };
    WqLayout {
        sq: Ring {
            wqe_cnt: sq_cnt,
            wqe_shift: sq_shift,
            offset: sq_off,
        },
        rq: Ring {
            wqe_cnt: rq_cnt,
            wqe_shift: rq_shift,
            offset: rq_off,
        },
        buf_size: (rq_cnt << rq_shift) + (sq_cnt << sq_shift),
        sges: 1 << (rq_shift - 4),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpdk_mlx4_txq() {
        // DPDK's mlx4 TX queue of 512 descriptors: 1 SGE, no inline.
        let l = send_qp(512, 1, 0, None);
        assert_eq!(
            l.sq,
            Ring {
                wqe_cnt: 1024,
                wqe_shift: 6,
                offset: 0
            }
        );
        assert_eq!(
            l.rq.offset, 65536,
            "DPDK takes the SQ size as rq.offset - sq.offset"
        );
        assert_eq!(l.buf_size, 65536);
        assert_eq!((l.spare, l.max_send_wr), (33, 991));
        assert_eq!((l.max_send_sge, l.max_inline), (3, 44));
        // The flow drop QP: everything zero.
        let d = send_qp(0, 0, 0, None);
        assert_eq!(d.sq.wqe_cnt, 64);
    }

    #[test]
    fn strides_grow_with_inline_and_tso() {
        // 104 inline bytes: three headers in the worst placement, 128 bytes of body.
        assert_eq!(send_qp(64, 1, 104, None).sq.wqe_shift, 8);
        assert_eq!(send_qp(64, 1, 104, None).max_inline, 224);
        assert_eq!(send_qp(64, 1, 40, None).sq.wqe_shift, 6);
        assert_eq!(send_qp(64, 1, 48, None).sq.wqe_shift, 7);
        assert_eq!(send_qp(64, 1, 0, Some(192)).sq.wqe_shift, 8);
        assert_eq!(send_qp(64, 8, 0, None).sq.wqe_shift, 8);
        assert_eq!(send_qp(64, 8, 0, None).spare, 9);
    }

    #[test]
    fn dpdk_mlx4_rxq() {
        let w = wq(512, 1);
        assert_eq!(
            w.rq,
            Ring {
                wqe_cnt: 512,
                wqe_shift: 4,
                offset: 64
            }
        );
        assert_eq!(w.sq.offset, 0);
        assert_eq!(w.buf_size, 512 * 16 + 64);
        assert_eq!(w.sges, 1);
        // Scattered RX (8 segments): the RQ stride exceeds the SQ's, so the RQ comes first.
        let s = wq(64, 8);
        assert_eq!(
            (s.rq.offset, s.rq.wqe_shift, s.sq.offset, s.sges),
            (0, 7, 8192, 8)
        );
        assert_eq!(wq(0, 0).rq.wqe_cnt, 1);
        assert_eq!(
            wq(5, 3).rq,
            Ring {
                wqe_cnt: 8,
                wqe_shift: 6,
                offset: 64
            }
        );
    }

    #[test]
    fn pow2() {
        assert_eq!(
            [0, 1, 2, 3, 545, 1024].map(roundup_pow2),
            [0, 1, 2, 4, 1024, 1024]
        );
    }
}
