//! `rte_mbuf` as the TX path sees it: a chain of segments with offload flags. The per-packet
//! work is plain field reads on the bindgen struct; freeing is one C call per batch.

use std::ptr;

use dpdk_sys::{self as sys, bits};

use crate::rxq::{RxBuf, RxMeta};
use crate::txq::TxBuf;
use crate::wqe::TxOffloads;

/// A pointer to an mbuf the application handed to `tx_burst`. `repr(transparent)`, so the
/// burst's `struct rte_mbuf **` array is a `&[Mbuf]`.
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct Mbuf(pub *mut sys::rte_mbuf);

impl Default for Mbuf {
    fn default() -> Self {
        Mbuf(ptr::null_mut())
    }
}

// SAFETY: an mbuf handed to tx_burst belongs to the queue until freed; queues are per lcore.
unsafe impl Send for Mbuf {}

struct Segs<'a> {
    m: *const sys::rte_mbuf,
    _life: std::marker::PhantomData<&'a ()>,
}

impl<'a> Iterator for Segs<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.m.is_null() {
            return None;
        }
        // SAFETY: every segment of a chain handed to tx_burst is a valid mbuf whose data
        // (buf_addr + data_off, data_len bytes) is readable until the mbuf is freed, which
        // happens only after the queue is done with it.
        unsafe {
            let m = &*self.m;
            self.m = m.next;
            Some(std::slice::from_raw_parts(
                (m.buf_addr as *const u8).add(usize::from(m.data_off)),
                usize::from(m.data_len),
            ))
        }
    }
}

impl TxBuf for Mbuf {
    #[inline]
    fn pkt_len(&self) -> u32 {
        // SAFETY: valid mbuf (see Segs).
        unsafe { (*self.0).pkt_len }
    }

    #[inline]
    fn segs(&self) -> impl Iterator<Item = &[u8]> {
        Segs {
            m: self.0,
            _life: std::marker::PhantomData,
        }
    }

    #[inline]
    fn offloads(&self) -> TxOffloads {
        // SAFETY: valid mbuf (see Segs).
        let (fl, tci) = unsafe { ((*self.0).ol_flags, (*self.0).vlan_tci) };
        TxOffloads {
            ip_csum: fl & bits::RTE_MBUF_F_TX_IP_CKSUM != 0,
            l4_csum: fl & bits::RTE_MBUF_F_TX_L4_MASK != 0,
            vlan: (fl & bits::RTE_MBUF_F_TX_VLAN != 0).then_some(tci),
        }
    }

    fn free_bulk(bufs: &[Self]) {
        // SAFETY: the queue owns these mbufs and frees each exactly once; `Mbuf` is a
        // transparent pointer, so the slice is an array of `struct rte_mbuf *`.
        unsafe {
            sys::rte_pktmbuf_free_bulk(bufs.as_ptr() as *mut *mut sys::rte_mbuf, bufs.len() as u32)
        };
    }

    fn free_bulk_fast(bufs: &[Self]) {
        // SAFETY: as above; the application promised one pool and refcnt 1 for this queue.
        unsafe {
            let single = bufs
                .iter()
                .all(|b| (*b.0).nb_segs == 1 && (*b.0).next.is_null());
            if !single || bufs.is_empty() {
                return <Self as TxBuf>::free_bulk(bufs);
            }
            sys::mlx4rs_mempool_put_bulk(
                (*bufs[0].0).pool,
                bufs.as_ptr() as *const *mut _,
                bufs.len() as u32,
            );
        }
    }
}

/// The mempool an RX queue refills from.
#[derive(Clone, Copy, Debug)]
pub struct Pool(pub *mut sys::rte_mempool);

// SAFETY: a mempool is multi-thread safe by DPDK's contract; the queue uses it from one lcore.
unsafe impl Send for Pool {}

impl RxBuf for Mbuf {
    type Pool = Pool;

    fn alloc_bulk(pool: Pool, out: &mut [Self]) -> bool {
        // SAFETY: `out` is an array of mbuf pointers (transparent), filled by DPDK on success.
        unsafe {
            sys::mlx4rs_pktmbuf_alloc_bulk(pool.0, out.as_mut_ptr().cast(), out.len() as u32) == 0
        }
    }

    fn free_bulk(bufs: &[Self]) {
        <Mbuf as TxBuf>::free_bulk(bufs)
    }

    #[inline]
    fn data_area(&self) -> (usize, u32) {
        // SAFETY: a buffer the queue allocated and still owns.
        unsafe {
            let m = &*self.0;
            (
                m.buf_addr as usize + usize::from(m.data_off),
                u32::from(m.buf_len - m.data_off),
            )
        }
    }

    #[inline]
    fn set_segment(&mut self, len: u32, next: Option<Self>) {
        // SAFETY: as above; the queue hands the buffer to the application right after.
        unsafe {
            let m = &mut *self.0;
            m.data_len = len as u16;
            m.next = next.map_or(ptr::null_mut(), |n| n.0);
        }
    }

    #[inline]
    fn set_packet(&mut self, pkt_len: u32, nb_segs: u16, port: u16, meta: &RxMeta) {
        // SAFETY: as above.
        unsafe {
            let m = &mut *self.0;
            m.pkt_len = pkt_len;
            m.nb_segs = nb_segs;
            m.port = port;
            m.ol_flags = meta.ol_flags;
            m.__bindgen_anon_1.packet_type = meta.packet_type;
            m.__bindgen_anon_2.hash.rss = meta.rss_hash;
        }
    }
}
