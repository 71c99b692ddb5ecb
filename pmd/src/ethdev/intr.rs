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
use crate::hw::PortEvent;
use crate::pmd_log;

/// Sets up the port's interrupt handle on the device's event fd and registers the port event
/// handler; the port then offers LSC and RMV. A device without events offers neither.
///
/// # Safety
/// `dev` is a port of this driver being probed in the primary, `events` its device's event fd.
pub(super) unsafe fn install(
    dev: *mut sys::rte_eth_dev,
    name: &str,
    events: Result<std::os::fd::RawFd, Error>,
) {
    let fd = match events {
        Ok(fd) => fd,
        Err(e) => {
            pmd_log!(INFO, "{name}: no link status or removal events: {e}");
            return;
        }
    };
    // SAFETY: plain EAL calls on a handle allocated here and checked; the callback argument
    // is the port id, which the handler looks the port up by.
    unsafe {
        let h = sys::rte_intr_instance_alloc(
            0, /* RTE_INTR_INSTANCE_F_PRIVATE: this process only */
        );
        if h.is_null() {
            pmd_log!(ERR, "{name}: no memory for an interrupt handle");
            return;
        }
        sys::rte_intr_type_set(h, sys::rte_intr_handle_type_RTE_INTR_HANDLE_EXT);
        sys::rte_intr_fd_set(h, fd);
        let port_id = (*(*dev).data).port_id;
        let rc = sys::rte_intr_callback_register(
            h,
            Some(port_event),
            usize::from(port_id) as *mut c_void,
        );
        if rc != 0 {
            pmd_log!(ERR, "{name}: registering the port event handler: {rc}");
            sys::rte_intr_instance_free(h);
            return;
        }
        (*dev).intr_handle = h;
        (*(*dev).data).dev_flags |=
            sys::bits::RTE_ETH_DEV_INTR_LSC | sys::bits::RTE_ETH_DEV_INTR_RMV;
    }
}

/// Undoes [`install`] before the port's device goes away: once this returns the handler does
/// not run and will not.
///
/// # Safety
/// `dev` is a live port of this driver, closing.
pub(super) unsafe fn uninstall(dev: *mut sys::rte_eth_dev) {
    // SAFETY: the handle install made (or NULL), freed once: the slot is cleared.
    unsafe {
        let h = (*dev).intr_handle;
        if h.is_null() {
            return;
        }
        let port_id = (*(*dev).data).port_id;
        sys::rte_intr_callback_unregister_sync(
            h,
            Some(port_event),
            usize::from(port_id) as *mut c_void,
        );
        sys::rte_intr_vec_list_free(h);
        sys::rte_intr_instance_free(h);
        (*dev).intr_handle = ptr::null_mut();
    }
}

/// EAL's interrupt thread: the device's event fd is readable.
unsafe extern "C" fn port_event(arg: *mut c_void) {
    let port_id = arg as usize as u16;
    // SAFETY: registered for a port of ours, unregistered (synchronously) before it closes,
    // so the port and its Proc live while this runs; intr_conf and dev_started are only read;
    // `dev_link` is ethdev's atomic 64-bit word (see `eth::parts`).
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
    while let Some(ev) = proc_.dev.next_event() {
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
    let h = e.conf.intr_handle;
    if h.is_null() {
        return Err(Error::Unsupported("receive interrupts on this device"));
    }
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
    // SAFETY: the port's own handle (install); EAL checks the indices against its sizes.
    unsafe {
        if sys::rte_intr_vec_list_alloc(h, ptr::null(), c_int::from(n)) != 0 {
            return Err(Error::NoMemory(
                "no memory for the interrupt vector list".into(),
            ));
        }
        for (i, fd) in fds.into_iter().enumerate() {
            let i = i as c_int;
            if sys::rte_intr_vec_list_index_set(h, i, sys::RTE_INTR_VEC_RXTX_OFFSET as c_int + i)
                != 0
                || sys::rte_intr_efds_index_set(h, i, fd) != 0
            {
                return Err(invalid!("RX queue {i}: no interrupt vector for it"));
            }
        }
        sys::rte_intr_nb_efd_set(h, c_int::from(n));
    }
    Ok(())
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
