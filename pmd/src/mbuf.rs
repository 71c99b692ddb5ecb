//! Packet buffers: `rte_mbuf` as the TX and RX paths see it. The slots queues keep buffers in
//! live in [`crate::buf`] (re-exported here), so that the queues need nothing from this module.
//!
//! An [`Mbuf`] can only be made by `unsafe` code that vouches for it (the ethdev glue, from the
//! arrays DPDK passes to the burst functions), and only `unsafe` code can free one or hand it
//! to a TX queue, which frees it later ([`crate::txq::TxQueue::burst`]), so every `Mbuf` safe
//! code holds points to a live mbuf. The per-packet work is plain field reads on
//! the bindgen struct; freeing and allocating are one C call per batch.

use std::mem::MaybeUninit;
use std::ptr;

use dpdk_sys::{self as sys, bits};

pub use crate::buf::{BufBatch, BufRing, Pusher};
pub use crate::rxq::{alloc_dma, alloc_into};
use crate::rxq::{RxBuf, RxMeta};
use crate::txq::TxBuf;
use crate::wqe::TxOffloads;

/// A pointer to an mbuf handed to `tx_burst` or allocated for RX. `repr(transparent)`, so a
/// burst's `struct rte_mbuf **` array is a `&[Mbuf]`.
///
/// `Copy`, as the pointer in DPDK's arrays is: what keeps one mbuf from being freed twice is
/// that the calls that take ownership are `unsafe`, sending two copies among them:
///
/// ```compile_fail
/// use mlx4rs::{mbuf::Mbuf, txq::TxQueue};
/// fn send_twice(q: &mut TxQueue<Mbuf>, m: Mbuf) -> usize {
///     q.burst(&[m, m])
/// }
/// ```
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct Mbuf(*mut sys::rte_mbuf);

// SAFETY: an mbuf belongs to one queue at a time, and queues are used by one lcore at a time.
unsafe impl Send for Mbuf {}

/// The offload flags the TX path acts on; a packet with none of them (and one segment) is
/// plain and takes the straight-line path.
const TX_FLAGS: u64 = bits::RTE_MBUF_F_TX_IP_CKSUM
    | bits::RTE_MBUF_F_TX_L4_MASK
    | bits::RTE_MBUF_F_TX_VLAN
    | bits::RTE_MBUF_F_TX_TCP_SEG
    | bits::RTE_MBUF_F_TX_TUNNEL_MASK
    | bits::RTE_MBUF_F_TX_OUTER_IP_CKSUM;

impl Mbuf {
    /// # Safety
    /// `m` must point to a valid mbuf owned by the caller, and stay valid until the mbuf is
    /// freed, which only `unsafe` code (a queue's release, under its own contract) does. Each
    /// of its first `nb_segs` segments reached through `next` must be a valid mbuf (or NULL),
    /// with `buf_len` bytes readable from `buf_addr`: DPDK's contract for an mbuf it hands a
    /// driver. What the driver does not assume, and checks itself on TX: that `data_off +
    /// data_len` stays within `buf_len`, that `pkt_len` is the segments' sum, that the chain
    /// has `nb_segs` segments and no cycle ([`TxBuf::check`]). One thing it assumes unchecked
    /// on the straight-line path: a one-segment mbuf's `next` is NULL (DPDK's own free walks
    /// it).
    pub unsafe fn from_raw(m: *mut sys::rte_mbuf) -> Mbuf {
        Mbuf(m)
    }

    pub fn as_ptr(self) -> *mut sys::rte_mbuf {
        self.0
    }

    #[inline(always)]
    fn get(&self) -> &sys::rte_mbuf {
        // SAFETY: every Mbuf points to a live mbuf (the constructor's contract).
        unsafe { &*self.0 }
    }
}

/// A segment's data, if it lies inside its buffer (`data_off + data_len <= buf_len`).
#[inline(always)]
fn seg_data(m: &sys::rte_mbuf) -> Option<&[u8]> {
    if u32::from(m.data_off) + u32::from(m.data_len) > u32::from(m.buf_len) {
        return None;
    }
    // SAFETY: a valid mbuf's buffer is buf_len bytes from buf_addr, readable until it is freed
    // (the constructor's contract), and the data lies inside it (checked above). Saying that
    // the data's address is not NULL (buf_addr is not) spares the caller a test for None.
    unsafe {
        let p = (m.buf_addr as *const u8).add(usize::from(m.data_off));
        std::hint::assert_unchecked(!p.is_null());
        Some(std::slice::from_raw_parts(p, usize::from(m.data_len)))
    }
}

/// The segments of a chain, at most `left` of them (`nb_segs`), in order; a segment whose data
/// leaves its buffer ends the walk (a chain [`TxBuf::check`] accepted has none).
struct Segs<'a> {
    m: *const sys::rte_mbuf,
    left: u16,
    _life: std::marker::PhantomData<&'a ()>,
}

impl<'a> Iterator for Segs<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.m.is_null() || self.left == 0 {
            return None;
        }
        self.left -= 1;
        // SAFETY: one of the first nb_segs segments of a chain handed to tx_burst: a valid
        // mbuf until the queue is done with the packet (the constructor's contract).
        let m = unsafe { &*self.m };
        self.m = m.next;
        let data = seg_data(m);
        if data.is_none() {
            self.left = 0;
        }
        data
    }
}

/// How a chain handed to `tx_burst` is malformed, or its length: see [`TxBuf::check`].
fn check_chain(head: &sys::rte_mbuf) -> Option<u32> {
    let n = head.nb_segs;
    if n == 0 {
        return None;
    }
    let mut sum = 0u32;
    let mut m: *const sys::rte_mbuf = head;
    for _ in 0..n {
        if m.is_null() {
            return None;
        }
        // SAFETY: one of the first nb_segs segments (the constructor's contract).
        let seg = unsafe { &*m };
        sum += u32::from(seg_data(seg)?.len() as u16);
        m = seg.next;
    }
    // Exactly nb_segs segments: the last one ends the chain (which also rules out a cycle).
    if !m.is_null() {
        return None;
    }
    if head.ol_flags & TX_FLAGS == 0 && n == 1 {
        // Plain: the straight-line path sends data_len bytes and never reads pkt_len; the
        // general path does the same for the same packet.
        return Some(sum);
    }
    (head.pkt_len == sum).then_some(sum)
}

/// Cuts a chain the queue refused after its first `nb_segs` distinct segments (fewer if it
/// ends before, or loops back), so that freeing it frees each of those once and stops.
///
/// A segment is marked as kept by setting bit 0 of its `next` (mbufs are cache-line aligned),
/// which a later segment pointing back to it shows; the marks go again before the cut. No
/// segment past the first `nb_segs` is read.
///
/// # Safety
/// The caller owns the chain (the queue took it), and its first nb_segs segments are valid
/// mbufs or NULL (the constructor's contract).
unsafe fn cut_chain(head: *mut sys::rte_mbuf) {
    let tagged = |p: *mut sys::rte_mbuf| p as usize & 1 != 0;
    let untag = |p: *mut sys::rte_mbuf| (p as usize & !1) as *mut sys::rte_mbuf;
    // Below, `head` and every segment dereferenced are among the first `limit` segments of a
    // chain the caller owns; the walk stops at `limit`.
    // SAFETY: `head` is a valid mbuf the caller owns.
    let limit = usize::from(unsafe { (*head).nb_segs }).max(1);
    let mut m = head;
    let mut kept = 1;
    loop {
        // SAFETY: see above.
        let nx = unsafe { (*m).next };
        // SAFETY: see above.
        unsafe { (*m).next = (nx as usize | 1) as *mut sys::rte_mbuf };
        // SAFETY: `nx` is segment `kept` (< limit) when it is read.
        if nx.is_null() || kept == limit || tagged(unsafe { (*nx).next }) {
            break;
        }
        m = nx;
        kept += 1;
    }
    // The marks go, in the order they were made; the last one kept ends the chain.
    let mut p = head;
    for _ in 1..kept {
        // SAFETY: see above.
        let nx = untag(unsafe { (*p).next });
        // SAFETY: see above.
        unsafe { (*p).next = nx };
        p = nx;
    }
    debug_assert!(p == m);
    // SAFETY: see above.
    unsafe { (*m).next = ptr::null_mut() };
}

impl TxBuf for Mbuf {
    #[inline]
    fn pkt_len(&self) -> u32 {
        self.get().pkt_len
    }

    #[inline]
    fn segs(&self) -> impl Iterator<Item = &[u8]> {
        Segs {
            m: self.0,
            left: self.get().nb_segs,
            _life: std::marker::PhantomData,
        }
    }

    #[inline]
    fn check(&self) -> Option<u32> {
        check_chain(self.get())
    }

    unsafe fn refuse(&self) {
        // SAFETY: the queue took this chain (the caller's contract); its first nb_segs
        // segments are valid (the constructor's).
        unsafe { cut_chain(self.0) }
    }

    #[inline]
    fn offloads(&self) -> TxOffloads {
        let m = self.get();
        let fl = m.ol_flags;
        let ip = fl & bits::RTE_MBUF_F_TX_IP_CKSUM != 0;
        let l4 = fl & bits::RTE_MBUF_F_TX_L4_MASK != 0;
        let tunnel = fl & bits::RTE_MBUF_F_TX_TUNNEL_MASK != 0;
        let lens = m.tx_offload;
        // l2_len:7 l3_len:9 l4_len:8 tso_segsz:16 outer_l3_len:9 outer_l2_len:7.
        let field = |shift: u32, bits: u32| ((lens >> shift) & ((1 << bits) - 1)) as u16;
        let tso = (fl & bits::RTE_MBUF_F_TX_TCP_SEG != 0).then(|| {
            let mut hdr = field(0, 7) + field(7, 9) + field(16, 8);
            if tunnel {
                hdr += field(49, 7) + field(40, 9);
            }
            crate::wqe::Tso {
                mss: field(24, 16),
                hdr_len: hdr,
            }
        });
        TxOffloads {
            // In a tunnel, the offload flags name the inner headers; the outer IP checksum
            // has a flag of its own.
            ip_csum: if tunnel {
                fl & bits::RTE_MBUF_F_TX_OUTER_IP_CKSUM != 0
            } else {
                ip
            },
            l4_csum: l4 && !tunnel,
            vlan: (fl & bits::RTE_MBUF_F_TX_VLAN != 0).then_some(m.vlan_tci),
            tso,
            inner_ip_csum: ip && tunnel,
            inner_l4_csum: l4 && tunnel,
        }
    }

    #[inline(always)]
    fn plain(&self) -> Option<&[u8]> {
        let m = self.get();
        if m.ol_flags & TX_FLAGS != 0 || m.nb_segs != 1 {
            return None;
        }
        // Data outside the buffer goes the general way, which refuses it: the one look at
        // lengths on the straight-line path, where data_len is read anyway.
        if u32::from(m.data_off) + u32::from(m.data_len) > u32::from(m.buf_len) {
            return None;
        }
        // SAFETY: as in seg_data: a valid one-segment mbuf whose data lies in its buffer, and
        // whose buf_addr is not NULL.
        Some(unsafe {
            std::hint::assert_unchecked(!m.buf_addr.is_null());
            std::slice::from_raw_parts(
                (m.buf_addr as *const u8).add(usize::from(m.data_off)),
                usize::from(m.data_len),
            )
        })
    }

    unsafe fn free_bulk(bufs: &[Self]) {
        if let Some(pool) = direct_pool(bufs) {
            // SAFETY: as in free_bulk_fast: each of these is what rte_pktmbuf_free_bulk would
            // put into `pool` unchanged (direct_pool's finding), and the caller owns them.
            unsafe {
                sys::mlx4rs_mempool_put_bulk(
                    pool,
                    bufs.as_ptr() as *const *mut _,
                    bufs.len() as u32,
                )
            };
            return;
        }
        // SAFETY: the caller owns these mbufs and frees each once (the trait's contract);
        // `Mbuf` is a transparent pointer, so the slice is an array of `struct rte_mbuf *`.
        unsafe {
            sys::rte_pktmbuf_free_bulk(bufs.as_ptr() as *mut *mut sys::rte_mbuf, bufs.len() as u32)
        };
    }

    unsafe fn free_bulk_fast(bufs: &[Self]) {
        let Some(first) = bufs.first() else { return };
        // SAFETY: as above; the contract adds one segment each, reference count 1 and one
        // pool (the application's MBUF_FAST_FREE promise), so they go straight back to it.
        unsafe {
            sys::mlx4rs_mempool_put_bulk(
                first.get().pool,
                bufs.as_ptr() as *const *mut _,
                bufs.len() as u32,
            )
        };
    }
}

/// The pool all of `bufs` come from, if freeing each one is exactly putting it back there:
/// reference count 1, direct (no attached or external buffer), one segment, `next` NULL.
/// For such an mbuf `rte_pktmbuf_free_bulk` writes nothing and puts it into its pool, and
/// this is the common case on TX (what an application allocates, fills and sends); telling
/// it apart costs a few loads per mbuf, against DPDK's per-segment walk. Any other batch
/// goes the general way whole, so that each mbuf is still freed once, and as DPDK frees it.
#[inline(always)]
fn direct_pool(bufs: &[Mbuf]) -> Option<*mut sys::rte_mempool> {
    const NOT_DIRECT: u64 = sys::RTE_MBUF_F_INDIRECT | sys::RTE_MBUF_F_EXTERNAL;
    let pool = bufs.first()?.get().pool;
    let mut odd = 0u64;
    for b in bufs {
        let m = b.get();
        // SAFETY: the reference count of a live mbuf (the constructor's contract), which
        // another holder of a reference may change concurrently: read atomically, as DPDK's
        // rte_mbuf_refcnt_read does.
        let refcnt =
            unsafe { std::sync::atomic::AtomicU16::from_ptr(ptr::addr_of!(m.refcnt).cast_mut()) }
                .load(std::sync::atomic::Ordering::Relaxed);
        odd |= (m.pool as u64 ^ pool as u64)
            | (m.ol_flags & NOT_DIRECT)
            | m.next as u64
            | u64::from(refcnt ^ 1)
            | u64::from(m.nb_segs ^ 1);
    }
    (odd == 0).then_some(pool)
}

/// The mempool an RX queue refills from. Only `unsafe` code can name one, since safe code
/// allocates from it ([`RxBuf::alloc_bulk`]):
///
/// ```compile_fail
/// let _ = mlx4rs::mbuf::Pool(std::ptr::null_mut());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Pool(*mut sys::rte_mempool);

impl Pool {
    /// # Safety
    /// `mp` must point to a pktmbuf pool (made by `rte_pktmbuf_pool_create` or with its
    /// layout) that stays valid until every queue refilling from it and every mbuf allocated
    /// from it are gone.
    pub unsafe fn from_raw(mp: *mut sys::rte_mempool) -> Pool {
        Pool(mp)
    }

    pub fn as_ptr(self) -> *mut sys::rte_mempool {
        self.0
    }
}

// SAFETY: a mempool is multi-thread safe by DPDK's contract; the queue uses it from one lcore.
unsafe impl Send for Pool {}

/// The headroom the RX path posts and hands up with, whatever `data_off` a previous user left:
/// a reset's (`RTE_PKTMBUF_HEADROOM`). A pool whose buffers are smaller has no data room
/// ([`RxBuf::data_area`] says 0), and the RX queue refuses it at setup, so no buffer with less
/// room is ever posted.
const RX_HEADROOM: u16 = sys::RTE_PKTMBUF_HEADROOM as u16;

/// `data_off`, `refcnt`, `nb_segs` and `port`, adjacent from offset 16 (the 8-byte aligned
/// group C calls `rearm_data`), in one store.
///
/// # Safety
/// `m` is an mbuf the caller owns, no reference to which is live.
#[inline(always)]
unsafe fn rearm(m: *mut sys::rte_mbuf, data_off: u16, nb_segs: u16, port: u16) {
    // SAFETY: the four u16 fields follow one another from offset 16 of the 64-byte aligned
    // mbuf (the layout test in dpdk-sys); the caller's mbuf.
    unsafe {
        ptr::addr_of_mut!((*m).data_off)
            .cast::<[u16; 4]>()
            .write([data_off, 1, nb_segs, port])
    }
}

/// The one `ol_flags` bit an mbuf keeps across uses (what a reset keeps): its buffer is
/// external memory, which its free must know.
const KEPT_FLAGS: u64 = sys::RTE_MBUF_F_EXTERNAL;

// SAFETY: `alloc_bulk` initialises every entry when DPDK's bulk get succeeds (it is all or
// nothing) and reports false otherwise.
//
// The mbufs come from the pool as the pool keeps them, without a reset: reference count 1, one
// segment, `next` NULL (what DPDK's free guarantees and its raw allocation asserts), the other
// fields as their last user left them. Every field a reset would set and a receiver reads is
// written before the mbuf is handed up: `data_off`, `nb_segs`, `port`, `ol_flags` (its external
// bit kept), `packet_type`, `pkt_len`, `data_len`, `vlan_tci`, `hash`, `next`.
unsafe impl RxBuf for Mbuf {
    type Pool = Pool;

    fn alloc_bulk(pool: Pool, out: &mut [MaybeUninit<Self>]) -> bool {
        // SAFETY: `out` is room for `out.len()` mbuf pointers (`Mbuf` is transparent), which
        // DPDK fills with mbufs of the pool the caller then owns, or leaves alone on failure.
        unsafe {
            sys::mlx4rs_mbuf_raw_alloc_bulk(pool.0, out.as_mut_ptr().cast(), out.len() as u32) == 0
        }
    }

    unsafe fn free_bulk(bufs: &[Self]) {
        // SAFETY: the caller's contract is TxBuf::free_bulk's.
        unsafe { <Mbuf as TxBuf>::free_bulk(bufs) }
    }

    #[inline]
    fn data_area(&self) -> (usize, u32) {
        let m = self.get();
        (
            m.buf_addr as usize + usize::from(RX_HEADROOM),
            u32::from(m.buf_len.saturating_sub(RX_HEADROOM)),
        )
    }

    #[inline]
    fn set_segment(&mut self, len: u32, next: Option<Self>) {
        // SAFETY: a buffer the queue allocated and still owns; the queue hands it to the
        // application right after, and no other reference to it exists meanwhile.
        unsafe {
            let m = self.0;
            rearm(m, RX_HEADROOM, 1, sys::RTE_MBUF_PORT_INVALID as u16);
            let m = &mut *m;
            m.ol_flags &= KEPT_FLAGS;
            m.packet_type = 0;
            m.pkt_len = 0;
            m.data_len = len as u16;
            m.vlan_tci = 0;
            m.next = next.map_or(ptr::null_mut(), |n| n.0);
        }
    }

    #[inline]
    fn set_packet(&mut self, pkt_len: u32, nb_segs: u16, port: u16, meta: &RxMeta) {
        // SAFETY: as above.
        unsafe {
            let m = self.0;
            rearm(m, RX_HEADROOM, nb_segs, port);
            let m = &mut *m;
            m.pkt_len = pkt_len;
            m.ol_flags = meta.ol_flags | (m.ol_flags & KEPT_FLAGS);
            m.packet_type = meta.packet_type;
            m.hash.rss = meta.rss_hash;
        }
    }

    /// What `set_segment(len, None)` and `set_packet(len, 1, ..)` write that a receiver reads,
    /// with the adjacent fields as wide stores: `rearm`, `packet_type` with `pkt_len`,
    /// `data_len` with `vlan_tci`. `next` is NULL already (the pool's state).
    #[inline(always)]
    fn set_single(&mut self, len: u32, port: u16, meta: &RxMeta) {
        // SAFETY: as in set_segment. `packet_type`, `pkt_len`, `data_len` and `vlan_tci`
        // follow one another from offset 32 of the 64-byte aligned mbuf (the layout test in
        // dpdk-sys).
        unsafe {
            let m = self.0;
            rearm(m, RX_HEADROOM, 1, port);
            let fields = ptr::addr_of_mut!((*m).packet_type);
            fields.cast::<[u32; 2]>().write([meta.packet_type, len]);
            ptr::addr_of_mut!((*m).data_len)
                .cast::<[u16; 2]>()
                .write([len as u16, 0]);
            (*m).ol_flags = meta.ol_flags | ((*m).ol_flags & KEPT_FLAGS);
            (*m).hash.rss = meta.rss_hash;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mbufs as a pool keeps them: reference count 1, one segment, direct, `next` NULL, in
    /// the pool `pool` names (never dereferenced here).
    fn pooled(n: usize, pool: usize) -> Vec<sys::rte_mbuf> {
        (0..n)
            .map(|_| {
                // SAFETY: rte_mbuf is plain data, for which all zeroes is a valid value.
                let mut m: sys::rte_mbuf = unsafe { std::mem::zeroed() };
                (m.refcnt, m.nb_segs) = (1, 1);
                m.pool = pool as *mut sys::rte_mempool;
                m
            })
            .collect()
    }

    fn verdict(ms: &mut [sys::rte_mbuf]) -> Option<usize> {
        // SAFETY: live mbufs the test owns, never freed.
        let bufs: Vec<Mbuf> = ms
            .iter_mut()
            .map(|m| unsafe { Mbuf::from_raw(m) })
            .collect();
        direct_pool(&bufs).map(|p| p as usize)
    }

    #[test]
    fn only_batches_that_a_put_frees_exactly_go_straight_to_the_pool() {
        let mut ms = pooled(4, 0x1000);
        assert_eq!(verdict(&mut ms), Some(0x1000));
        assert_eq!(verdict(&mut []), None);
        // Each departure from the pooled state, on the last mbuf, sends the whole batch
        // through rte_pktmbuf_free_bulk.
        let spoil: [fn(&mut sys::rte_mbuf); 6] = [
            |m| m.refcnt = 2,
            |m| m.nb_segs = 2,
            |m| m.ol_flags = sys::RTE_MBUF_F_INDIRECT,
            |m| m.ol_flags = sys::RTE_MBUF_F_EXTERNAL,
            |m| m.next = 0x1040 as *mut sys::rte_mbuf,
            |m| m.pool = 0x2000 as *mut sys::rte_mempool,
        ];
        for (k, f) in spoil.iter().enumerate() {
            let mut ms = pooled(4, 0x1000);
            f(&mut ms[3]);
            assert_eq!(verdict(&mut ms), None, "departure {k}");
        }
        // Flags that say nothing about the buffer keep the fast way.
        let mut ms = pooled(2, 0x1000);
        ms[1].ol_flags = bits::RTE_MBUF_F_TX_IP_CKSUM;
        assert_eq!(verdict(&mut ms), Some(0x1000));
    }
}
