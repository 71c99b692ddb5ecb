//! Registration with EAL's vdev bus, probe and remove.

use std::ffi::{c_char, c_int, CStr};
use std::ptr;

use dpdk_sys as sys;

use super::attach::{attach_port, BusDevice, DRIVER_NAME};
use super::eth::Proc;
use super::{mp, ops, queue, release, Error};
use crate::devargs::Devargs;
use crate::hw::Device;
use crate::mem::MemSource;
use crate::pmd_log;
use crate::port::Port;

/// The vdev driver record. EAL links it into its driver list, so it must live for the whole
/// process and have a stable address.
static mut VDEV_DRIVER: sys::rte_vdev_driver = sys::rte_vdev_driver {
    next: sys::rte_vdev_driver__bindgen_ty_1 {
        tqe_next: ptr::null_mut(),
        tqe_prev: ptr::null_mut(),
    },
    driver: sys::rte_driver {
        next: sys::rte_driver__bindgen_ty_1 {
            tqe_next: ptr::null_mut(),
            tqe_prev: ptr::null_mut(),
        },
        name: DRIVER_NAME.as_ptr(),
        alias: ptr::null(),
    },
    probe: Some(vdev_probe),
    remove: Some(vdev_remove),
    dma_map: None,
    dma_unmap: None,
    drv_flags: 0,
};

/// Runs when the library is loaded (by `-d`, from EAL's plugin directory, or linked into an
/// application), which is always before EAL scans the vdev bus.
///
/// A process can load two copies of the library (one from EAL's driver directory, one by `-d`,
/// or one linked in): two entries named `net_mlx4rs` would make EAL probe with whichever it
/// met first while the other copy's state stayed half-alive. The first copy to load keeps the
/// name; later copies withdraw. EAL loads `-d` plugins before its driver directory, so the
/// explicit copy is the one that stays.
#[ctor::ctor]
fn register_driver() {
    crate::log::register();
    let me = ptr::addr_of_mut!(VDEV_DRIVER);
    // SAFETY: runs once per copy, at load time under the loader's lock, before EAL scans; the
    // list entries we read are drivers' static records that live as long as the process.
    unsafe {
        sys::rte_vdev_register(me);
        if let Some(first) = registered_before(me) {
            sys::rte_vdev_unregister(me);
            pmd_log!(
                WARNING,
                "driver already registered by {}; this copy ({}) stays unregistered",
                object_path(first.cast()),
                object_path(me.cast())
            );
            return;
        }
    }
    super::pci::register();
}

/// An entry named like ours that precedes `me` on EAL's vdev driver list. EAL exports no
/// lookup by name, but the list is a BSD tail queue whose head and links share one layout,
/// so from our own (just appended) entry the walk back is `TAILQ_PREV`.
///
/// # Safety
/// `me` must be on the vdev driver list.
unsafe fn registered_before(me: *mut sys::rte_vdev_driver) -> Option<*mut sys::rte_vdev_driver> {
    type Link = sys::rte_vdev_driver__bindgen_ty_1;
    let mut cur = me;
    loop {
        // SAFETY: `tqe_prev` points at the previous link's first word (or the head's), and
        // the word after it leads to that link's predecessor; the head ends the walk with NULL.
        // Every registered driver has a NUL-terminated static name (or none).
        let same = unsafe {
            cur = *(*((*cur).next.tqe_prev as *const Link)).tqe_prev;
            if cur.is_null() {
                return None;
            }
            let name = (*cur).driver.name;
            !name.is_null() && CStr::from_ptr(name) == DRIVER_NAME
        };
        if same {
            return Some(cur);
        }
    }
}

/// The file of the loaded object that holds `addr`, for telling two copies apart in a log.
fn object_path(addr: *const std::ffi::c_void) -> String {
    // SAFETY: `Dl_info` is pointers only, valid all-zero; dladdr only reads the loader's
    // tables and fills `info`, whose file name it leaves NULL or a NUL-terminated string of
    // the loader's.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr, &mut info) == 0 || info.dli_fname.is_null() {
            return "?".into();
        }
        CStr::from_ptr(info.dli_fname)
            .to_str()
            .unwrap_or("")
            .to_owned()
    }
}

unsafe extern "C" fn vdev_probe(vdev: *mut sys::rte_vdev_device) -> c_int {
    // SAFETY: EAL passes a live vdev device, which it removes only through vdev_remove, after
    // closing its port; its devargs, when set, are EAL's parsed copy, alive as long as the
    // device; its name and arguments are NULL or NUL-terminated.
    let (name, args, socket, device) = unsafe {
        let device = ptr::addr_of_mut!((*vdev).device);
        let d = &*device;
        let args = d
            .devargs
            .as_ref()
            .map_or(std::ptr::null(), |a| a.__bindgen_anon_1.args);
        let text = |p: *const c_char| match p.is_null() {
            true => String::new(),
            false => CStr::from_ptr(p).to_str().unwrap_or("").to_owned(),
        };
        (
            text(d.name),
            text(args),
            d.numa_node,
            BusDevice::new(device),
        )
    };
    let Some(device) = device else {
        return -libc::EINVAL;
    };
    let devargs: Devargs = match args
        .parse()
        .and_then(|d: Devargs| d.check_targets().map(|()| d))
    {
        Ok(d) => d,
        Err(e) => {
            pmd_log!(ERR, "{name}: {e}");
            return -libc::EINVAL;
        }
    };
    pmd_log!(INFO, "{name}: probing with devargs {args:?}");
    if mp::secondary() {
        return match attach_secondary(&device, &name) {
            Ok(()) => 0,
            Err(e) => {
                pmd_log!(ERR, "{name}: {e}");
                e.errno()
            }
        };
    }
    mp::serve();
    // Every memseg list, registered once per port so that the data path never registers
    // memory.
    let mem = crate::eal::memseg_ranges();
    let source = MemSource::Dpdk { socket };
    let opened = crate::hw::open(&name, &devargs, source).and_then(|h| {
        Ok((
            Port::open(&name, &devargs, source, &mem, h.dev.as_ref())?,
            h,
        ))
    });
    let (port, handles) = match opened {
        Ok(p) => p,
        Err(e) => {
            pmd_log!(ERR, "{name}: cannot open: {e}");
            return e.errno();
        }
    };
    match attach_port(&device, &name, socket, port, handles) {
        Ok(()) => 0,
        Err(e) => {
            pmd_log!(ERR, "{name}: {e}");
            e.errno()
        }
    }
}

/// In a secondary process: attaches to the primary's port of this name and creates nothing.
/// The port and its queues are read from shared memory; this process gets its own handles
/// (a [`mp::Remote`] device that asks the primary what only its device knows), ops and burst
/// functions.
fn attach_secondary(device: &BusDevice, name: &str) -> Result<(), Error> {
    let cname = std::ffi::CString::new(name).expect("vdev names have no NUL");
    // SAFETY: a plain ethdev call with a valid C string; an attached ethdev shares the
    // primary's data, whose private data is the Port the primary's probe wrote, which this
    // process only reads here. Its per-process fields are this process's to set; `device`
    // outlives the port (BusDevice's contract).
    let port_id = unsafe {
        let dev = sys::rte_eth_dev_attach_secondary(cname.as_ptr());
        if dev.is_null() {
            return Err(Error::Invalid(
                "the primary process drives no port of this name".into(),
            ));
        }
        let d = &*(*dev).data;
        let port = (d.dev_private as *const Port)
            .as_ref()
            .ok_or_else(|| Error::Invalid("the primary's port is closed".into()))?;
        let remote = mp::Remote::new(d.port_id, port.caps);
        // A device the primary runs in its polling lcore must now run by itself.
        remote.secondary_attached(true);
        let proc_ = Proc::new(crate::hw::Handles {
            dev: Box::new(remote),
            lcore: None,
        });
        (*dev).process_private = Box::into_raw(Box::new(proc_)).cast();
        (*dev).device = device.as_ptr();
        (*dev).dev_ops = &*ops::OPS;
        queue::set_bursts(&mut *dev, queue::Bursts::Secondary);
        release::fill_secondary_fast_path(&mut *dev);
        sys::rte_eth_dev_probing_finish(dev);
        d.port_id
    };
    pmd_log!(NOTICE, "{name}: attached to the primary's port {port_id}");
    Ok(())
}

unsafe extern "C" fn vdev_remove(vdev: *mut sys::rte_vdev_device) -> c_int {
    // SAFETY: EAL passes a live vdev device. The lookup by name answers NULL when the primary
    // released the port; a secondary's lookup still finds a port it closed (shared data
    // outlives its per-process state), whose state says so. An application that exits with
    // the port started (dpdk-test's pmd_perf_autotest does) gets here from EAL cleanup:
    // ethdev refuses to close a started port, and its device would then run on in memory
    // that EAL frees next, so a primary stops it first; a secondary leaves the primary's port
    // alone. A live port's close runs our dev_close and releases it.
    unsafe {
        let dev = sys::rte_eth_dev_allocated((*vdev).device.name);
        if dev.is_null() || (*dev).state == sys::rte_eth_dev_state_RTE_ETH_DEV_UNUSED {
            return 0;
        }
        let port = (*(*dev).data).port_id;
        if (*(*dev).data).dev_started() != 0 && !mp::secondary() {
            sys::rte_eth_dev_stop(port);
        }
        sys::rte_eth_dev_close(port)
    }
}
