//! A new port: its ethdev allocated, with the port in DPDK shared memory and this process's
//! handles, ops and burst functions (for the vdev and the PCI driver alike).

use std::ffi::{c_int, CStr};
use std::mem::size_of;
use std::ptr::NonNull;

use dpdk_sys as sys;

use super::eth::Proc;
use super::{fmt_mac, intr, ops, queue, Error};
use crate::eal::intr::IntrHandle;
use crate::hw::Handles;
use crate::mem::{DmaBox, MemSource};
use crate::pmd_log;
use crate::port::Port;

/// Driver name as EAL matches it against `--vdev net_mlx4rs<N>`.
pub const DRIVER_NAME: &CStr = c"net_mlx4rs";

/// The bus device a probe was called with, which a port's ethdev names as its parent.
pub(super) struct BusDevice(NonNull<sys::rte_device>);

impl BusDevice {
    /// # Safety
    /// `device` is the live device EAL is probing, which outlives every port attached to it:
    /// EAL removes a device through the driver's remove, which closes its ports first.
    pub unsafe fn new(device: *mut sys::rte_device) -> Option<BusDevice> {
        NonNull::new(device).map(BusDevice)
    }

    pub fn as_ptr(&self) -> *mut sys::rte_device {
        self.0.as_ptr()
    }
}

/// Allocates the ethdev of bus device `device`: `port` goes into DPDK shared memory as its
/// private data, `handles` are this process's.
pub(super) fn attach_port(
    device: &BusDevice,
    name: &str,
    socket: c_int,
    port: Port,
    handles: Handles,
) -> Result<(), Error> {
    let cname = std::ffi::CString::new(name).expect("vdev names have no NUL");
    let mac = port.mac;
    // ethdev keeps the application's addresses here, one slot per address the port takes.
    let n_macs = (port.caps.max_mac_addrs as usize).clamp(1, crate::port::MAX_MAC_ADDRS);
    // rte_eth_dev_release_port frees `dev_private` and `mac_addrs` with rte_free: both come
    // from rte_zmalloc.
    let private = DmaBox::new(port, MemSource::Dpdk { socket })
        .ok_or_else(|| Error::NoMemory("no DPDK memory for the port".into()))?;
    let events = handles.dev.event_fd();
    let bursts = match handles.lcore {
        Some(_) => queue::Bursts::Lcore,
        None => queue::Bursts::Plain,
    };
    // SAFETY: plain allocation calls with a valid C string; the table is freed again if no
    // ethdev takes it. Then `dev` is freshly allocated and ours, with zeroed data; `device`
    // outlives the port (BusDevice's contract); the port event handler is registered for this
    // port only while its Proc lives (below).
    unsafe {
        let size = n_macs * size_of::<sys::rte_ether_addr>();
        let macs = sys::rte_zmalloc_socket(c"mlx4rs_mac".as_ptr(), size, 0, socket)
            as *mut sys::rte_ether_addr;
        if macs.is_null() {
            return Err(Error::NoMemory("no DPDK memory for the MAC table".into()));
        }
        let dev = sys::rte_eth_dev_allocate(cname.as_ptr());
        if dev.is_null() {
            sys::rte_free(macs.cast());
            return Err(Error::Invalid(
                "cannot allocate an ethdev (name taken or no free port id)".into(),
            ));
        }
        let d = &mut *(*dev).data;
        (*macs).addr_bytes = mac;
        d.dev_private = private.into_raw().as_ptr().cast();
        d.mac_addrs = macs;
        d.numa_node = socket;
        d.dev_flags |= sys::bits::RTE_ETH_DEV_AUTOFILL_QUEUE_XSTATS;
        (*dev).device = device.as_ptr();
        let proc_ = Box::into_raw(Box::new(Proc::new(handles)));
        (*dev).process_private = proc_.cast();
        (*dev).dev_ops = &*ops::OPS;
        queue::set_bursts(&mut *dev, bursts);
        // The port event handler, registered once the port it looks up (by the id it is
        // given) is in place, runs until close takes the handle out of the Proc, before the
        // port and the Proc go.
        match intr::event_fd(name, events)
            .map(|fd| IntrHandle::watch(fd, intr::port_event, usize::from(d.port_id)))
        {
            Some(Ok(h)) => {
                // ethdev's copy of the handle, which close clears before the Proc frees it.
                (*dev).intr_handle = h.as_ptr();
                d.dev_flags |= sys::bits::RTE_ETH_DEV_INTR_LSC | sys::bits::RTE_ETH_DEV_INTR_RMV;
                *(*proc_).intr.lock() = Some(h);
            }
            Some(Err(e)) => pmd_log!(ERR, "{name}: port events: {e}"),
            None => {}
        }
        sys::rte_eth_dev_probing_finish(dev);
        pmd_log!(
            INFO,
            "{name}: port {} ready, MAC {}",
            d.port_id,
            fmt_mac(&mac)
        );
    }
    Ok(())
}
