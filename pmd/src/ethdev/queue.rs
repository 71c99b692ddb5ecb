//! Queue setup, release and info, and the burst functions.
//!
//! An ethdev queue slot holds the queue and its port id, so that the burst glue can reach the
//! port's device on the rare paths that need it (recovering a queue an error completion
//! stopped) without the queue holding a device.

use std::ffi::{c_int, c_void};

use dpdk_sys as sys;

use super::eth::{self, Eth, RxQ, TxQ};
use super::{invalid, Error};
use crate::mbuf::{Mbuf, Pool};
use crate::mem::MemSource;
use crate::rxq::RxConfig;

/// What a `tx_queues` slot points to.
pub(super) struct TxSlot {
    pub q: TxQ,
    pub port_id: u16,
    /// The queue's doorbell and BlueFlame registers are mapped at the same address in every
    /// process, so a secondary may transmit on it.
    pub registers_shared: bool,
    /// Left stopped at port start (`tx_deferred_start`).
    pub deferred: bool,
}

/// What an `rx_queues` slot points to.
pub(super) struct RxSlot {
    pub q: RxQ,
    pub port_id: u16,
    /// Left stopped at port start (`rx_deferred_start`).
    pub deferred: bool,
}

/// What a queue's setup conf says that the driver uses.
#[derive(Clone, Copy)]
struct QueueConf {
    offloads: u64,
    /// Left stopped at port start.
    deferred: bool,
}

pub(super) unsafe extern "C" fn tx_queue_setup(
    dev: *mut sys::rte_eth_dev,
    qid: u16,
    nb_desc: u16,
    socket: u32,
    conf: *const sys::rte_eth_txconf,
) -> c_int {
    // SAFETY: ethdev passes a valid conf.
    let conf = unsafe {
        QueueConf {
            offloads: (*conf).offloads,
            deferred: (*conf).tx_deferred_start != 0,
        }
    };
    // SAFETY: as for every op; ethdev released any previous queue at this index.
    unsafe {
        eth::run(dev, "TX queue setup", |e| {
            tx_setup(e, qid, nb_desc, socket as i32, conf)
        })
    }
}

fn tx_setup(
    e: &mut Eth<'_>,
    qid: u16,
    nb_desc: u16,
    socket: i32,
    conf: QueueConf,
) -> Result<(), Error> {
    e.primary_only()?;
    let offloads = conf.offloads | e.tx_offloads();
    let fast_free = offloads & sys::bits::RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE != 0;
    super::mr::register_pools(e, None)?;
    let p = &*e.port;
    let cfg = p.tx_config(fast_free, socket);
    let mut q = TxQ::new(e.dev, p.name.as_str(), qid, nb_desc, cfg, p.mrs.as_slice())
        .map_err(|err| with_queue("TX", qid, err.into()))?;
    q.set_db_avoid(p.tx_db_avoid.then(crate::txq::DbAvoid::default_bound));
    let port_id = e.port_id();
    if let Some(l) = e.lcore {
        l.set_sq(qid, Some(q.qpn()));
    }
    let sq = q.sq_desc();
    // Device pages in DPDK memory are at the same address in every process.
    let registers_shared = in_dpdk_memory(sq.doorbell().as_ptr().cast())
        && sq
            .bf()
            .is_none_or(|b| in_dpdk_memory(b.reg.as_ptr().cast()));
    e.install_txq(
        qid,
        TxSlot {
            q,
            port_id,
            registers_shared,
            deferred: conf.deferred,
        },
    )
}

pub(super) unsafe extern "C" fn tx_queue_release(dev: *mut sys::rte_eth_dev, qid: u16) {
    // SAFETY: as for every op; qid < nb_tx_queues (ethdev checks).
    unsafe {
        eth::run(dev, "TX queue release", |e| {
            e.primary_only()?;
            if let Some(l) = e.lcore {
                l.set_sq(qid, None);
            }
            if let Some(s) = e.take_txq(qid) {
                s.q.destroy(e.dev);
            }
            Ok(())
        })
    };
}

pub(super) unsafe extern "C" fn rx_queue_setup(
    dev: *mut sys::rte_eth_dev,
    qid: u16,
    nb_desc: u16,
    socket: u32,
    conf: *const sys::rte_eth_rxconf,
    mp: *mut sys::rte_mempool,
) -> c_int {
    // SAFETY: ethdev passes a valid conf and a valid pktmbuf pool (it checked the pool).
    let (conf, room) = unsafe {
        (
            QueueConf {
                offloads: (*conf).offloads,
                deferred: (*conf).rx_deferred_start != 0,
            },
            sys::mlx4rs_pktmbuf_data_room_size(mp)
                .saturating_sub(sys::RTE_PKTMBUF_HEADROOM as u16)
                .max(1),
        )
    };
    // SAFETY: as for every op; ethdev released any previous queue at this index.
    unsafe {
        eth::run(dev, "RX queue setup", |e| {
            rx_setup(e, qid, nb_desc, socket as i32, conf, Pool(mp), room)
        })
    }
}

fn rx_setup(
    e: &mut Eth<'_>,
    qid: u16,
    nb_desc: u16,
    socket: i32,
    conf: QueueConf,
    pool: Pool,
    room: u16,
) -> Result<(), Error> {
    e.primary_only()?;
    use sys::bits::*;
    let offloads = conf.offloads | e.rx_offloads();
    let keep_crc = offloads & RTE_ETH_RX_OFFLOAD_KEEP_CRC != 0;
    // A kept FCS takes buffer room after the frame.
    let max_frame = u32::from(e.mtu()) + 18 + if keep_crc { 4 } else { 0 };
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
        port_id: e.port_id(),
        source: MemSource::Dpdk { socket },
    };
    if qid == 0 {
        e.dev.rq_batch(e.nb_rx_queues());
    }
    super::mr::register_pools(e, Some(pool.0))?;
    let q = RxQ::new(e.dev, qid, nb_desc, cfg, pool, e.port.mrs.as_slice())
        .map_err(|err| with_queue("RX", qid, err.into()))?;
    let port_id = e.port_id();
    e.install_rxq(
        qid,
        RxSlot {
            q,
            port_id,
            deferred: conf.deferred,
        },
    )
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

pub(super) unsafe extern "C" fn rx_queue_release(dev: *mut sys::rte_eth_dev, qid: u16) {
    // SAFETY: as for every op; qid < nb_rx_queues (ethdev checks).
    unsafe {
        eth::run(dev, "RX queue release", |e| {
            e.primary_only()?;
            if let Some(s) = e.take_rxq(qid) {
                s.q.destroy(e.dev);
            }
            Ok(())
        })
    };
}

pub(super) unsafe extern "C" fn rxq_info_get(
    dev: *mut sys::rte_eth_dev,
    qid: u16,
    info: *mut sys::rte_eth_rxq_info,
) {
    // SAFETY: ethdev checked qid and passes a zeroed info of its own.
    let info = unsafe { &mut *info };
    // SAFETY: as for every op.
    unsafe {
        eth::query(dev, |e| {
            let offloads = e.rx_offloads();
            if let Some(s) = e.rxq(qid) {
                info.mp = s.q.pool().0;
                info.nb_desc = s.q.nb_desc() as u16;
                info.scattered_rx = u8::from(s.q.sges() > 1);
                info.conf.offloads = offloads;
                info.conf.rx_deferred_start = u8::from(s.deferred);
            }
        })
    };
}

pub(super) unsafe extern "C" fn txq_info_get(
    dev: *mut sys::rte_eth_dev,
    qid: u16,
    info: *mut sys::rte_eth_txq_info,
) {
    // SAFETY: ethdev checked qid and passes a zeroed info of its own.
    let info = unsafe { &mut *info };
    // SAFETY: as for every op.
    unsafe {
        eth::query(dev, |e| {
            let offloads = e.tx_offloads();
            if let Some(s) = e.txq(qid) {
                info.nb_desc = s.q.nb_desc() as u16;
                info.conf.offloads = offloads;
                info.conf.tx_deferred_start = u8::from(s.deferred);
            }
        })
    };
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

/// Whether `p` lies in DPDK memory (mapped at the same address in every process).
fn in_dpdk_memory(p: *const c_void) -> bool {
    // SAFETY: a lookup in EAL's memory map, which exists whenever a port does.
    !unsafe { sys::rte_mem_virt2memseg_list(p) }.is_null()
}

/// `tx_pkt_burst` in a secondary process: the queue's registers must be reachable from here.
/// The software HCA's device pages live in the primary's heap today, so a secondary takes
/// nothing from the application (its rings, CQ and buffers are shared; its doorbell is not).
unsafe extern "C" fn tx_burst_secondary(
    q: *mut c_void,
    pkts: *mut *mut sys::rte_mbuf,
    n: u16,
) -> u16 {
    // SAFETY: `q` is a slot tx_queue_setup installed in the primary, in shared memory.
    let s = unsafe { &*(q as *const TxSlot) };
    if !s.registers_shared {
        refuse_secondary_tx(s.port_id);
        return 0;
    }
    // SAFETY: as for tx_burst, whose contract this shares.
    unsafe { tx_burst(q, pkts, n) }
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

/// `tx_pkt_burst` with the device run in the polling lcore: after the queue posted, the
/// device executes it.
unsafe extern "C" fn tx_burst_lcore(q: *mut c_void, pkts: *mut *mut sys::rte_mbuf, n: u16) -> u16 {
    // SAFETY: as for tx_burst, whose contract this shares.
    let sent = unsafe { tx_burst(q, pkts, n) };
    // An empty burst may have rung again (`TxQueue::kick`).
    if sent > 0 || n == 0 {
        // SAFETY: `q` is a slot of a port of this driver, which outlives its queues.
        let s = unsafe { &*(q as *const TxSlot) };
        // SAFETY: as above.
        if let Some(l) = unsafe { eth::proc_of(s.port_id) }.and_then(|p| p.lcore.as_ref()) {
            l.after_tx(s.q.qid);
        }
    }
    sent
}

/// `rx_pkt_burst` with the device run in the polling lcore: before the queue polls, the
/// device delivers what waits at the port.
unsafe extern "C" fn rx_burst_lcore(q: *mut c_void, pkts: *mut *mut sys::rte_mbuf, n: u16) -> u16 {
    // SAFETY: `q` is a slot of a port of this driver, which outlives its queues.
    let s = unsafe { &*(q as *const RxSlot) };
    // SAFETY: as above.
    if let Some(l) = unsafe { eth::proc_of(s.port_id) }.and_then(|p| p.lcore.as_ref()) {
        l.before_rx();
    }
    // SAFETY: as for rx_burst, whose contract this shares.
    unsafe { rx_burst(q, pkts, n) }
}

/// `tx_pkt_burst`.
unsafe extern "C" fn tx_burst(q: *mut c_void, pkts: *mut *mut sys::rte_mbuf, n: u16) -> u16 {
    if n == 0 {
        // An empty burst looks after WQEs a lost doorbell may have stranded.
        // SAFETY: as below.
        let s = unsafe { &mut *(q as *mut TxSlot) };
        s.q.kick();
        if s.q.failed() {
            recover_txq(s);
        }
        return 0;
    }
    // SAFETY: `q` is a slot tx_queue_setup installed, used by one lcore at a time (ethdev's
    // contract); `pkts` holds `n` valid mbuf pointers, and `Mbuf` is a transparent pointer.
    let (s, pkts) = unsafe {
        (
            &mut *(q as *mut TxSlot),
            std::slice::from_raw_parts(pkts as *const Mbuf, usize::from(n)),
        )
    };
    let sent = s.q.burst(pkts) as u16;
    if s.q.failed() {
        recover_txq(s);
    }
    sent
}

/// `rx_pkt_burst`.
unsafe extern "C" fn rx_burst(q: *mut c_void, pkts: *mut *mut sys::rte_mbuf, n: u16) -> u16 {
    // SAFETY: `q` is a slot rx_queue_setup installed, used by one lcore at a time; `pkts` has
    // room for `n` mbuf pointers, and `Mbuf` is a transparent pointer.
    let (s, out) = unsafe {
        (
            &mut *(q as *mut RxSlot),
            std::slice::from_raw_parts_mut(pkts as *mut Mbuf, usize::from(n)),
        )
    };
    let got = s.q.burst(out) as u16;
    if s.q.needs_recovery() {
        recover_rxq(s);
    }
    got
}

pub(super) unsafe extern "C" fn tx_done_cleanup(q: *mut c_void, free_cnt: u32) -> c_int {
    // SAFETY: as for tx_burst.
    let s = unsafe { &mut *(q as *mut TxSlot) };
    let n = s.q.done_cleanup(free_cnt) as c_int;
    if s.q.failed() {
        recover_txq(s);
    }
    n
}

/// Restarts an RX queue an error completion stopped, with this process's handle to its
/// port's device. The lcore that owns the queue runs this, between bursts.
#[cold]
fn recover_rxq(s: &mut RxSlot) {
    // SAFETY: a queue's port outlives it and is a port of this driver.
    if let Some(p) = unsafe { eth::proc_of(s.port_id) } {
        s.q.recover(p.dev.as_ref());
    }
}

/// Recreates a TX queue an error completion stopped, with this process's handle to its
/// port's device. The lcore that owns the queue runs this, between bursts.
#[cold]
fn recover_txq(s: &mut TxSlot) {
    // SAFETY: a queue's port outlives it and is a port of this driver.
    if let Some(p) = unsafe { eth::proc_of(s.port_id) } {
        if s.q.recover(p.dev.as_ref()) {
            if let Some(l) = &p.lcore {
                l.set_sq(s.q.qid, Some(s.q.qpn()));
            }
        }
    }
}
