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

use dpdk_sys as sys;

use super::eth::{self, Eth};
use super::ops::op;
use super::{invalid, Error};
use crate::hw::PortEvent;
use crate::pmd_log;

/// Sets up the port's interrupt handle on the device's event fd and registers the port event
/// handler; the port then offers LSC and RMV. A device without events offers neither.
///
/// # Safety
/// `dev` is a port of this driver being probed in the primary, its `process_private` set.
pub(super) unsafe fn install(dev: *mut sys::rte_eth_dev, name: &str) {
    // SAFETY: the caller's port; process_private is its Proc.
    let Some(proc_) = (unsafe { ((*dev).process_private as *const eth::Proc).as_ref() }) else {
        return;
    };
    let fd = match proc_.dev.event_fd() {
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
    // SAFETY: registered for a port of ours, unregistered (synchronously) before it closes.
    let dev = unsafe { eth::dev_of(port_id) };
    // SAFETY: as above: the port's Proc lives until after the handler is unregistered.
    let Some(proc_) = (unsafe { eth::proc_of(port_id) }) else {
        return;
    };
    // SAFETY: a live port's data; intr_conf and dev_started are only read.
    let (lsc, rmv) = unsafe {
        let c = &(*(*dev).data).dev_conf.intr_conf;
        (c.lsc() != 0, c.rmv() != 0)
    };
    while let Some(ev) = proc_.dev.next_event() {
        match ev {
            PortEvent::LinkUp | PortEvent::LinkDown => {
                // SAFETY: as above.
                let started = unsafe { (*(*dev).data).dev_started() } != 0;
                let up = started && ev == PortEvent::LinkUp;
                // SAFETY: a live port; ethdev stores the link atomically.
                unsafe { eth::publish_link(dev, up) };
                if lsc {
                    // SAFETY: a live port; ethdev runs the application's callbacks.
                    unsafe {
                        sys::rte_eth_dev_callback_process(
                            dev,
                            sys::rte_eth_event_type_RTE_ETH_EVENT_INTR_LSC,
                            ptr::null_mut(),
                        )
                    };
                }
            }
            PortEvent::Removed => {
                pmd_log!(WARNING, "port {port_id}: the device was removed");
                if rmv {
                    // SAFETY: as above.
                    unsafe {
                        sys::rte_eth_dev_callback_process(
                            dev,
                            sys::rte_eth_event_type_RTE_ETH_EVENT_INTR_RMV,
                            ptr::null_mut(),
                        )
                    };
                }
            }
        }
    }
}

op!(dev_set_link_up, "set link up", |e| set_link(e, true));
op!(dev_set_link_down, "set link down", |e| set_link(e, false));

fn set_link(e: &mut Eth<'_>, up: bool) -> Result<(), Error> {
    e.primary_only()?;
    e.dev.set_link(up)?;
    let now = e.port.link_up(e.dev);
    e.set_link(now);
    Ok(())
}

/// With `intr_conf.rxq`: a completion channel per RX queue, its fd in the interrupt handle.
/// Called at start, once the queues exist.
pub(super) fn setup_rx(e: &mut Eth<'_>) -> Result<(), Error> {
    if !e.intr_conf_rxq() {
        return Ok(());
    }
    let h = e.intr_handle();
    if h.is_null() {
        return Err(Error::Unsupported("receive interrupts on this device"));
    }
    let n = e.nb_rx_queues();
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

pub(super) unsafe extern "C" fn rx_queue_intr_enable(
    dev: *mut sys::rte_eth_dev,
    qid: u16,
) -> c_int {
    // SAFETY: as for every op; called from the queue's lcore between its bursts.
    unsafe {
        eth::run(dev, "RX interrupt on", |e| {
            let Some((ch, _)) = e.port.rx_intr[usize::from(qid)].channel else {
                return Err(invalid!(
                    "RX queue {qid}: receive interrupts were not configured (intr_conf.rxq)"
                ));
            };
            let sn = e.port.rx_intr[usize::from(qid)].sn;
            let dev = e.dev;
            let q = &e
                .rxq(qid)
                .ok_or_else(|| invalid!("RX queue {qid} not set up"))?
                .q;
            let (cq, ci) = q.cq_arm_point();
            Ok(dev.arm_cq(cq, ci, sn, ch)?)
        })
    }
}

pub(super) unsafe extern "C" fn rx_queue_intr_disable(
    dev: *mut sys::rte_eth_dev,
    qid: u16,
) -> c_int {
    // SAFETY: as above.
    unsafe {
        eth::run(dev, "RX interrupt off", |e| {
            let intr = &mut e.port.rx_intr[usize::from(qid)];
            let Some((ch, _)) = intr.channel else {
                return Err(invalid!(
                    "RX queue {qid}: receive interrupts were not configured (intr_conf.rxq)"
                ));
            };
            // Each event taken moves the arm sequence on, as an acknowledged CQ event does.
            while e.dev.next_cq_event(ch).is_some() {
                intr.sn = intr.sn.wrapping_add(1) & 3;
            }
            Ok(())
        })
    }
}
