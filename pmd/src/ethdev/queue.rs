//! Queue setup, release and info, and the burst functions.
//!
//! An ethdev queue entry is a [`Slot`]: the queue, its port id (so that the burst glue can
//! reach the port's device on the rare paths that need it, recovering a queue an error
//! completion stopped, without the queue holding a device), and what other threads read about
//! it. A queue keeps its rings from setup to release; a stopped queue's burst returns 0
//! without touching them.

use std::ffi::{c_int, c_void};

use dpdk_sys as sys;

use super::eth::{given, ops, Eth, EthMut, Proc, Raw};
use super::slot::{point_lcore, RxFixed, RxQ, RxSlot, Slot, TxFixed, TxQ, TxSlot};
use super::{invalid, Error};
use crate::eal::in_dpdk_memory;
use crate::mbuf::{Mbuf, Pool};
use crate::mem::MemSource;
use crate::rxq::RxConfig;

ops! {
    fn tx_queue_setup(qid: u16, nb_desc: u16, socket: u32, conf: *const sys::rte_eth_txconf)
        -> c_int = exclusive tx_setup, "TX queue setup";
    fn tx_queue_release(qid: u16) = exclusive tx_release, "TX queue release";
    fn rx_queue_setup(qid: u16, nb_desc: u16, socket: u32, conf: *const sys::rte_eth_rxconf,
        mp: *mut sys::rte_mempool as Raw<_>) -> c_int = exclusive rx_setup, "RX queue setup";
    fn rx_queue_release(qid: u16) = exclusive rx_release, "RX queue release";
    fn rxq_info_get(qid: u16, info: *mut sys::rte_eth_rxq_info) = shared rxq_info, "RX queue info";
    fn txq_info_get(qid: u16, info: *mut sys::rte_eth_txq_info) = shared txq_info, "TX queue info";
}

fn tx_setup(
    e: &mut EthMut<'_>,
    qid: u16,
    nb_desc: u16,
    socket: u32,
    conf: Option<&sys::rte_eth_txconf>,
) -> Result<(), Error> {
    e.primary_only()?;
    let conf = given(conf)?;
    let offloads = conf.offloads | e.conf.tx_offloads;
    let fast_free = offloads & sys::bits::RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE != 0;
    super::mr::register_pools(e, None)?;
    let p = &*e.port;
    let cfg = p.tx_config(fast_free, socket as i32);
    // SAFETY: the port's device outlives its queues; release and close destroy them on it.
    let mut q = unsafe { TxQ::new(e.dev, p.name.as_str(), qid, nb_desc, cfg, p.mrs.as_slice()) }
        .map_err(|err| with_queue("TX", qid, err))?;
    q.set_db_avoid(p.tx_db_avoid.then(crate::txq::DbAvoid::default_bound));
    let sq = q.sq_desc();
    // Device pages in DPDK memory are at the same address in every process.
    let registers_shared = in_dpdk_memory(sq.doorbell().as_ptr().cast())
        && sq
            .bf()
            .is_none_or(|b| in_dpdk_memory(b.reg.as_ptr().cast()));
    let fixed = TxFixed {
        registers_shared,
        deferred: conf.tx_deferred_start != 0,
        nb_desc: q.nb_desc() as u16,
    };
    let slot = Slot::new(e.conf.port_id, fixed, q.qpn(), q);
    e.install(true, qid, slot)?;
    // Only an installed queue is ever pointed at, so a release finds what it must undo.
    let lcore = e.lcore;
    if let Some((_, q)) = e.stopped_txq(qid) {
        point_lcore(lcore, q, true);
    }
    Ok(())
}

fn tx_release(e: &mut EthMut<'_>, qid: u16) {
    if let Err(err) = e.primary_only() {
        crate::pmd_log!(ERR, "{}: TX queue release: {err}", e.port.name);
        return;
    }
    if let Some(s) = e.take::<TxQ, TxFixed>(true, qid) {
        let mut q = s.into_queue();
        point_lcore(e.lcore, &mut q, false);
        q.destroy(e.dev);
    }
}

fn rx_setup(
    e: &mut EthMut<'_>,
    qid: u16,
    nb_desc: u16,
    socket: u32,
    conf: Option<&sys::rte_eth_rxconf>,
    mp: Raw<sys::rte_mempool>,
) -> Result<(), Error> {
    e.primary_only()?;
    use sys::bits::*;
    let conf = given(conf)?;
    if mp.0.is_null() {
        return Err(Error::Invalid("a NULL argument".into()));
    }
    // SAFETY: ethdev checked that the pool is a pktmbuf pool; the application keeps it until
    // the queue is released (DPDK's contract for rx_queue_setup).
    let (pool, room) = unsafe {
        let pool = Pool::from_raw(mp.0);
        (pool, sys::mlx4rs_pktmbuf_data_room_size(pool.as_ptr()))
    };
    let room = room.saturating_sub(sys::RTE_PKTMBUF_HEADROOM as u16).max(1);
    let offloads = conf.offloads | e.conf.rx_offloads;
    let keep_crc = offloads & RTE_ETH_RX_OFFLOAD_KEEP_CRC != 0;
    // A kept FCS takes buffer room after the frame.
    let max_frame = u32::from(e.conf.mtu) + 18 + if keep_crc { 4 } else { 0 };
    let sges = if offloads & RTE_ETH_RX_OFFLOAD_SCATTER != 0 {
        max_frame
            .div_ceil(u32::from(room))
            .next_power_of_two()
            .min(32)
    } else {
        if max_frame > u32::from(room) {
            return Err(invalid!(
                "RX queue {qid}: mbufs hold {room} bytes, frames up to {max_frame}: enable scatter or use bigger mbufs"
            ));
        }
        1
    };
    let cfg = RxConfig {
        sges,
        csum: offloads
            & (RTE_ETH_RX_OFFLOAD_IPV4_CKSUM
                | RTE_ETH_RX_OFFLOAD_UDP_CKSUM
                | RTE_ETH_RX_OFFLOAD_TCP_CKSUM)
            != 0,
        rss: offloads & RTE_ETH_RX_OFFLOAD_RSS_HASH != 0,
        keep_crc,
        tunnel: e.port.caps.tunnel_offloads,
        port_id: e.conf.port_id,
        source: MemSource::Dpdk {
            socket: socket as i32,
        },
    };
    if qid == 0 {
        e.dev.rq_batch(e.conf.nb_rx_queues);
    }
    super::mr::register_pools(e, Some(pool))?;
    // SAFETY: the port's device outlives its queues; release and close destroy them on it.
    let q = unsafe { RxQ::new(e.dev, qid, nb_desc, cfg, pool, e.port.mrs.as_slice()) }
        .map_err(|err| with_queue("RX", qid, err))?;
    let fixed = RxFixed {
        deferred: conf.rx_deferred_start != 0,
        nb_desc: q.nb_desc() as u16,
        pool: q.pool(),
        scattered: q.sges() > 1,
    };
    let slot = Slot::new(e.conf.port_id, fixed, q.qpn(), q);
    e.install(false, qid, slot)
}

/// Names the queue in an error, keeping its kind.
fn with_queue(dir: &str, qid: u16, e: Error) -> Error {
    match e {
        Error::Invalid(s) => Error::Invalid(format!("{dir} queue {qid}: {s}")),
        Error::NoMemory(s) => Error::NoMemory(format!("{dir} queue {qid}: {s}")),
        Error::Device(s) => Error::Device(format!("{dir} queue {qid}: {s}")),
        u @ Error::Unsupported(_) => u,
    }
}

fn rx_release(e: &mut EthMut<'_>, qid: u16) {
    if let Err(err) = e.primary_only() {
        crate::pmd_log!(ERR, "{}: RX queue release: {err}", e.port.name);
        return;
    }
    if let Some(s) = e.take::<RxQ, RxFixed>(false, qid) {
        s.into_queue().destroy(e.dev);
    }
}

/// At close: every queue destroyed.
pub(super) fn close_queues(e: &mut EthMut<'_>) {
    for i in 0..e.conf.nb_rx_queues {
        if let Some(s) = e.take::<RxQ, RxFixed>(false, i) {
            s.into_queue().destroy(e.dev);
        }
    }
    for i in 0..e.conf.nb_tx_queues {
        if let Some(s) = e.take::<TxQ, TxFixed>(true, i) {
            s.into_queue().destroy(e.dev);
        }
    }
}

fn rxq_info(e: &Eth<'_>, qid: u16, info: Option<&mut sys::rte_eth_rxq_info>) {
    if let (Some(s), Some(info)) = (e.rxq(qid), info) {
        info.mp = s.x.pool.as_ptr();
        info.nb_desc = s.x.nb_desc;
        info.scattered_rx = u8::from(s.x.scattered);
        info.conf.offloads = e.conf.rx_offloads;
        info.conf.rx_deferred_start = u8::from(s.x.deferred);
    }
}

fn txq_info(e: &Eth<'_>, qid: u16, info: Option<&mut sys::rte_eth_txq_info>) {
    if let (Some(s), Some(info)) = (e.txq(qid), info) {
        info.nb_desc = s.x.nb_desc;
        info.conf.offloads = e.conf.tx_offloads;
        info.conf.tx_deferred_start = u8::from(s.x.deferred);
    }
}

/// Which burst functions a process installs.
pub(super) enum Bursts {
    /// The device runs by itself (a card, a device thread).
    Plain,
    /// The device runs in the polling lcore: the glue runs it around the queue's burst.
    Lcore,
    /// A secondary process: it never runs the device, and transmits only on queues whose
    /// registers it can reach.
    Secondary,
}

/// Installs this process's burst functions. Separate functions rather than a test per burst,
/// so the threaded modes pay nothing.
pub(super) fn set_bursts(dev: &mut sys::rte_eth_dev, which: Bursts) {
    let (rx, tx): (sys::eth_rx_burst_t, sys::eth_tx_burst_t) = match which {
        Bursts::Plain => (Some(rx_burst), Some(tx_burst)),
        Bursts::Lcore => (Some(rx_burst_lcore), Some(tx_burst_lcore)),
        Bursts::Secondary => (Some(rx_burst), Some(tx_burst_secondary)),
    };
    dev.rx_pkt_burst = rx;
    dev.tx_pkt_burst = tx;
}

/// Generates the entry points ethdev calls with a queue (the bursts, `tx_done_cleanup`): each
/// converts the queue, and its other pointers, once (`= body(args)`: the arguments after
/// the slot and its queue), and a stopped queue answers 0 before its queue is touched.
macro_rules! queue_entries {
    ($($vis:vis fn $name:ident($slot:ty $(, $a:ident: $t:ty)*) -> $r:ty = $body:ident($($arg:expr),*);)*) => {$(
        $vis unsafe extern "C" fn $name(q: *mut c_void $(, $a: $t)*) -> $r {
            // SAFETY: `q` is a slot a queue setup installed, which lives until its release;
            // `pkts` holds (TX) or has room for (RX) `n` mbuf pointers (TX may pass NULL with
            // none), and `Mbuf` is a transparent pointer. The queue is this lcore's alone
            // (ethdev's rule: one lcore per queue) while it is started.
            unsafe {
                let s = &*(q as *const $slot);
                if !s.started() {
                    return 0;
                }
                $body(s, s.queue() $(, $arg)*)
            }
        }
    )*};
}

// An empty TX burst may pass NULL; its test is the one tx_plain makes anyway.
queue_entries! {
    fn tx_burst(TxSlot, pkts: *mut *mut sys::rte_mbuf, n: u16) -> u16 = tx_plain(
        if n == 0 { &[] } else { std::slice::from_raw_parts(pkts.cast::<Mbuf>(), usize::from(n)) }
    );
    fn tx_burst_lcore(TxSlot, pkts: *mut *mut sys::rte_mbuf, n: u16) -> u16 = tx_lcore(
        if n == 0 { &[] } else { std::slice::from_raw_parts(pkts.cast::<Mbuf>(), usize::from(n)) }
    );
    fn tx_burst_secondary(TxSlot, pkts: *mut *mut sys::rte_mbuf, n: u16) -> u16 = tx_secondary(
        if n == 0 { &[] } else { std::slice::from_raw_parts(pkts.cast::<Mbuf>(), usize::from(n)) }
    );
    fn rx_burst(RxSlot, pkts: *mut *mut sys::rte_mbuf, n: u16) -> u16 = rx_plain(
        std::slice::from_raw_parts_mut(pkts.cast::<Mbuf>(), usize::from(n))
    );
    fn rx_burst_lcore(RxSlot, pkts: *mut *mut sys::rte_mbuf, n: u16) -> u16 = rx_lcore(
        std::slice::from_raw_parts_mut(pkts.cast::<Mbuf>(), usize::from(n))
    );
    pub(super) fn tx_done_cleanup(TxSlot, free_cnt: u32) -> c_int = tx_cleanup(free_cnt);
}

/// This process's handles to a queue's port (a queue's port outlives it).
fn handles(port_id: u16) -> Option<&'static Proc> {
    // SAFETY: a port closes only after its queues are released, and no lcore polls then.
    unsafe { super::eth::port_of(port_id) }.and_then(|(_, _, p)| p)
}

#[inline(always)]
fn tx_plain(s: &TxSlot, q: &mut TxQ, pkts: &[Mbuf]) -> u16 {
    let sent = if pkts.is_empty() {
        // An empty burst looks after WQEs a lost doorbell may have stranded.
        q.kick();
        0
    } else {
        // SAFETY: `pkts` is the array the application passed to `rte_eth_tx_burst` (only the
        // burst trampolines call this): DPDK's contract hands each mbuf over once, and the
        // taken ones are the driver's.
        unsafe { q.burst(pkts) as u16 }
    };
    if q.failed() {
        recover_txq(s, q);
    }
    sent
}

/// With the device run in the polling lcore: after the queue posted, the device executes it.
fn tx_lcore(s: &TxSlot, q: &mut TxQ, pkts: &[Mbuf]) -> u16 {
    let sent = tx_plain(s, q, pkts);
    // An empty burst may have rung again (`TxQueue::kick`).
    if sent > 0 || pkts.is_empty() {
        if let Some(l) = handles(s.port_id).and_then(|p| p.handles.lcore.as_ref()) {
            l.after_tx(q.qid);
        }
    }
    sent
}

/// In a secondary process: the queue's registers must be reachable from here. The software
/// HCA's device pages live in the primary's heap today, so a secondary takes nothing from the
/// application (its rings, CQ and buffers are shared; its doorbell is not).
fn tx_secondary(s: &TxSlot, q: &mut TxQ, pkts: &[Mbuf]) -> u16 {
    if !s.x.registers_shared {
        refuse_secondary_tx(s.port_id);
        return 0;
    }
    tx_plain(s, q, pkts)
}

#[cold]
fn refuse_secondary_tx(port_id: u16) {
    static LOGGED: std::sync::Once = std::sync::Once::new();
    LOGGED.call_once(|| {
        crate::pmd_log!(
            ERR,
            "port {port_id}: a secondary process cannot transmit: the device's doorbell pages are \
             not in shared memory (the software HCA keeps them in the primary's heap)"
        )
    });
}

#[inline(always)]
fn rx_plain(s: &RxSlot, q: &mut RxQ, out: &mut [Mbuf]) -> u16 {
    let got = q.burst(out) as u16;
    if q.needs_recovery() {
        recover_rxq(s, q);
    }
    got
}

/// With the device run in the polling lcore: before the queue polls, the device delivers
/// what waits at the port.
fn rx_lcore(s: &RxSlot, q: &mut RxQ, out: &mut [Mbuf]) -> u16 {
    if let Some(l) = handles(s.port_id).and_then(|p| p.handles.lcore.as_ref()) {
        l.before_rx();
    }
    rx_plain(s, q, out)
}

/// `rte_eth_tx_done_cleanup`, from the queue's lcore.
fn tx_cleanup(s: &TxSlot, q: &mut TxQ, free_cnt: u32) -> c_int {
    let n = q.done_cleanup(free_cnt) as c_int;
    if q.failed() {
        recover_txq(s, q);
    }
    n
}

/// Restarts an RX queue an error completion stopped, with this process's handle to its
/// port's device. The lcore that owns the queue runs this, between bursts.
#[cold]
fn recover_rxq(s: &RxSlot, q: &mut RxQ) {
    if let Some(p) = handles(s.port_id) {
        q.recover(p.handles.dev.as_ref());
    }
}

/// Restarts a TX queue an error completion stopped, with this process's handle to its
/// port's device (on its own rings; a device without send queue states gives a new SQ, whose
/// number the slot and the lcore learn). The lcore that owns the queue runs this, between
/// bursts.
#[cold]
fn recover_txq(s: &TxSlot, q: &mut TxQ) {
    if let Some(p) = handles(s.port_id) {
        if q.recover(p.handles.dev.as_ref()) {
            s.set_qpn(q.qpn());
            point_lcore(p.handles.lcore.as_ref(), q, true);
        }
    }
}
