//! What the device tells the application without being polled: link changes and removal (the
//! LSC and RMV events) and receive interrupts, all through the port's `intr_handle`, as DPDK's
//! mlx4 does it.
//!
//! - Port events: the device's event fd is the handle's fd (type `EXT`: EAL watches it and
//!   calls [`port_event`] in its interrupt thread without reading it; taking the events
//!   empties it). The handler publishes the link and runs the application's callbacks.
//! - Receive interrupts: with `intr_conf.rxq`, each RX queue gets a completion channel whose fd
//!   is the handle's event fd of that queue (`efds[i]`, vector `RTE_INTR_VEC_RXTX_OFFSET + i`).
//!   `rx_queue_intr_enable` arms the queue's CQ; the next frame makes the fd readable, which
//!   wakes an application sleeping in `rte_epoll_wait`; `rx_queue_intr_disable` takes the
//!   events, which empties the fd again.
//!
//! Everything here is the primary's: a secondary has no handle and no device events.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::AtomicU64;

use dpdk_sys as sys;

use super::eth::{self, ops, Eth, EthMut};
use super::{invalid, Error};
use crate::eal::intr::VectorError;
use crate::hw::PortEvent;
use crate::pmd_log;

/// The device's event fd, for the port's interrupt handle, or None (logged) for a device
/// without events, which then offers neither LSC nor RMV.
pub(super) fn event_fd(
    name: &str,
    events: Result<std::os::fd::RawFd, Error>,
) -> Option<std::os::fd::RawFd> {
    events
        .map_err(|e| pmd_log!(INFO, "{name}: no link status or removal events: {e}"))
        .ok()
}

/// EAL's interrupt thread: the device's event fd is readable. Registered with its port's id
/// as the argument, for as long as the port's Proc holds the handle (close takes it first).
pub(super) unsafe extern "C" fn port_event(arg: *mut c_void) {
    let port_id = arg as usize as u16;
    // SAFETY: registered for a port of ours, unregistered (synchronously) by its close before
    // the port goes, so the port and its Proc live while this runs;
    // intr_conf and dev_started are only read; `dev_link` is ethdev's atomic 64-bit word (see
    // `eth::parts`).
    let Some((dev, proc_, dev_link, lsc, rmv)) = (unsafe {
        eth::port_of(port_id).and_then(|(dev, _, p)| {
            let d = (*dev.as_ptr()).data;
            let link = AtomicU64::from_ptr(ptr::addr_of_mut!((*d).dev_link).cast::<u64>());
            let c = &(*d).dev_conf.intr_conf;
            Some((dev, p?, link, c.lsc() != 0, c.rmv() != 0))
        })
    }) else {
        return;
    };
    while let Some(ev) = proc_.handles.dev.next_event() {
        let (link, kind) = match ev {
            PortEvent::LinkUp | PortEvent::LinkDown => (
                Some(ev == PortEvent::LinkUp),
                lsc.then_some(sys::rte_eth_event_type_RTE_ETH_EVENT_INTR_LSC),
            ),
            PortEvent::Removed => {
                pmd_log!(WARNING, "port {port_id}: the device was removed");
                (
                    None,
                    rmv.then_some(sys::rte_eth_event_type_RTE_ETH_EVENT_INTR_RMV),
                )
            }
        };
        // SAFETY: as above: a plain read of the live port's data, then ethdev runs the
        // application's callbacks.
        unsafe {
            if let Some(up) = link {
                let started = (*(*dev.as_ptr()).data).dev_started() != 0;
                eth::publish_link(dev_link, started && up);
            }
            if let Some(kind) = kind {
                sys::rte_eth_dev_callback_process(dev.as_ptr(), kind, ptr::null_mut());
            }
        }
    }
}

ops! {
    fn dev_set_link_up() -> c_int = exclusive link_up, "set link up";
    fn dev_set_link_down() -> c_int = exclusive link_down, "set link down";
    fn rx_queue_intr_enable(qid: u16) -> c_int = shared intr_enable, "RX interrupt on";
    fn rx_queue_intr_disable(qid: u16) -> c_int = shared intr_disable, "RX interrupt off";
}

fn link_up(e: &mut EthMut<'_>) -> Result<(), Error> {
    set_link(e, true)
}

fn link_down(e: &mut EthMut<'_>) -> Result<(), Error> {
    set_link(e, false)
}

fn set_link(e: &mut EthMut<'_>, up: bool) -> Result<(), Error> {
    e.primary_only()?;
    e.dev.set_link(up)?;
    let now = e.port.link_up(e.dev);
    e.set_link(now);
    Ok(())
}

/// With `intr_conf.rxq`: a completion channel per RX queue, its fd in the interrupt handle.
/// Called at start, once the queues exist.
pub(super) fn setup_rx(e: &mut EthMut<'_>) -> Result<(), Error> {
    if !e.conf.intr_conf_rxq {
        return Ok(());
    }
    let intr = e.intr.lock();
    let Some(h) = intr.as_ref() else {
        return Err(Error::Unsupported("receive interrupts on this device"));
    };
    let n = e.conf.nb_rx_queues;
    let mut fds = Vec::with_capacity(usize::from(n));
    for i in 0..n {
        let fd = match e.port.rx_intr[usize::from(i)].channel {
            Some((_, fd)) => fd,
            None => {
                let (ch, fd) = e.dev.create_comp_channel()?;
                e.port.rx_intr[usize::from(i)].channel = Some((ch, fd));
                fd
            }
        };
        fds.push(fd);
    }
    h.set_rx_vectors(&fds).map_err(|e| match e {
        VectorError::NoMemory => Error::NoMemory("no memory for the interrupt vector list".into()),
        VectorError::Queue(i) => invalid!("RX queue {i}: no interrupt vector for it"),
    })
}

/// Arms the queue's CQ; called from the queue's lcore between its bursts.
fn intr_enable(e: &Eth<'_>, qid: u16) -> Result<(), Error> {
    let intr = &e.port.rx_intr[usize::from(qid)];
    let Some((ch, _)) = intr.channel else {
        return Err(invalid!(
            "RX queue {qid}: receive interrupts were not configured (intr_conf.rxq)"
        ));
    };
    let s = e
        .rxq(qid)
        .ok_or_else(|| invalid!("RX queue {qid} not set up"))?;
    // SAFETY: the queue's own lcore calls this between its bursts (ethdev's rule for
    // rte_eth_dev_rx_intr_enable), so it has the queue to itself.
    let (cq, ci) = unsafe { s.queue() }.cq_arm_point();
    e.dev.arm_cq(cq, ci, intr.sn(), ch)
}

fn intr_disable(e: &Eth<'_>, qid: u16) -> Result<(), Error> {
    let intr = &e.port.rx_intr[usize::from(qid)];
    let Some((ch, _)) = intr.channel else {
        return Err(invalid!(
            "RX queue {qid}: receive interrupts were not configured (intr_conf.rxq)"
        ));
    };
    // Each event taken moves the arm sequence on, as an acknowledged CQ event does.
    while e.dev.next_cq_event(ch).is_some() {
        intr.next_sn();
    }
    Ok(())
}
