//! Registration with EAL's PCI bus for the ConnectX-3 family, and probe through rdma-core.
//!
//! EAL offers each PCI device to the registered drivers in registration order and the first
//! whose ID table matches gets it (a probe error is final; only a positive answer passes the
//! device on). Debian's own C `net_mlx4` claims the same IDs from EAL's driver directory, which
//! EAL loads after every `-d` plugin: so `-d librte_net_mlx4rs.so` makes this driver the one
//! that probes a ConnectX-3, and `-d` of Debian's `librte_net_mlx4.so` before ours gives the card
//! to the C driver. With both only in the driver directory the order is the directory's (see
//! doc/rdma-core.md).

use std::ffi::{c_int, CStr};
use std::ptr;

use dpdk_sys as sys;

use super::attach::{attach_port, BusDevice, DRIVER_NAME};
use crate::devargs::{Devargs, DeviceLoop};
use crate::mem::MemSource;
use crate::pmd_log;
use crate::port::Port;

/// The ConnectX-3 family as DPDK's mlx4 lists it: vendor, device.
pub const PCI_IDS: [(u16, u16); 3] = [
    (0x15b3, 0x1003), // ConnectX-3
    (0x15b3, 0x1007), // ConnectX-3 Pro
    (0x15b3, 0x1004), // ConnectX-3 Virtual Function
];

/// Devargs a card takes: the software HCA's own (wire, wc, busy_poll, device_loop) mean
/// nothing there.
pub const PCI_KEYS: [&str; 4] = ["bf", "txq_inline", "mac", "tx_db_avoid"];

const fn id(vendor: u16, device: u16) -> sys::rte_pci_id {
    sys::rte_pci_id {
        class_id: 0x00ff_ffff, // RTE_CLASS_ANY_ID
        vendor_id: vendor,
        device_id: device,
        subsystem_vendor_id: sys::RTE_PCI_ANY_ID as u16,
        subsystem_device_id: sys::RTE_PCI_ANY_ID as u16,
    }
}

/// EAL's ID table: the family, then the all-zero terminator.
static PCI_ID_TABLE: [sys::rte_pci_id; 4] = [
    id(PCI_IDS[0].0, PCI_IDS[0].1),
    id(PCI_IDS[1].0, PCI_IDS[1].1),
    id(PCI_IDS[2].0, PCI_IDS[2].1),
    sys::rte_pci_id {
        class_id: 0,
        vendor_id: 0,
        device_id: 0,
        subsystem_vendor_id: 0,
        subsystem_device_id: 0,
    },
];

/// The PCI driver record; EAL links it into its list, so it lives as long as the process.
static mut PCI_DRIVER: sys::rte_pci_driver = sys::rte_pci_driver {
    next: sys::rte_pci_driver__bindgen_ty_1 {
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
    probe: Some(pci_probe),
    remove: Some(pci_remove),
    dma_map: None,
    dma_unmap: None,
    id_table: ptr::addr_of!(PCI_ID_TABLE).cast(),
    drv_flags: 0,
};

/// Registers the PCI driver; called once, by the copy of the library that keeps the name.
pub(super) fn register() {
    // SAFETY: at load time, before EAL scans; the record is a static that outlives EAL.
    unsafe { sys::rte_pci_register(ptr::addr_of_mut!(PCI_DRIVER)) };
}

/// Parses a card's devargs: the keys of [`PCI_KEYS`], strictly as for a vdev.
pub fn parse_pci_devargs(args: &str) -> Result<Devargs, String> {
    for item in args.split(',').filter(|i| !i.is_empty()) {
        let key = item.split_once('=').map_or(item, |(k, _)| k);
        if !PCI_KEYS.contains(&key) && crate::devargs::KEYS.iter().any(|(k, _)| *k == key) {
            return Err(format!(
                "devarg {}= applies to the software HCA (--vdev net_mlx4rs) only; a ConnectX-3 \
                 takes {}",
                key.escape_debug(),
                PCI_KEYS.join(", ")
            ));
        }
    }
    let mut d: Devargs = args.parse().map_err(|e| format!("{e}"))?;
    // Nothing runs a device in the polling lcore: the card runs by itself.
    d.device_loop = DeviceLoop::PortThread;
    Ok(d)
}

fn pci_name(a: &sys::rte_pci_addr) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        a.domain, a.bus, a.devid, a.function
    )
}

unsafe extern "C" fn pci_probe(
    _drv: *mut sys::rte_pci_driver,
    pdev: *mut sys::rte_pci_device,
) -> c_int {
    // SAFETY: EAL passes a live PCI device, which it removes only through pci_remove, after
    // closing its ports; its devargs are NULL or a live record whose args are NULL or a
    // NUL-terminated string.
    let (pci, args, socket, device) = unsafe {
        let d = &mut *pdev;
        let da = d.device.devargs;
        let args = if da.is_null() || (*da).__bindgen_anon_1.args.is_null() {
            String::new()
        } else {
            CStr::from_ptr((*da).__bindgen_anon_1.args)
                .to_string_lossy()
                .into_owned()
        };
        (
            pci_name(&d.addr),
            args,
            d.device.numa_node,
            BusDevice::new(ptr::addr_of_mut!(d.device)),
        )
    };
    let Some(device) = device else {
        return -libc::EINVAL;
    };
    let devargs = match parse_pci_devargs(&args) {
        Ok(d) => d,
        Err(e) => {
            pmd_log!(ERR, "{pci}: {e}");
            return -libc::EINVAL;
        }
    };
    if super::eth::secondary() {
        pmd_log!(
            ERR,
            "{pci}: secondary processes cannot attach to a ConnectX-3 port yet (the verbs \
             backend does not map the primary's UAR)"
        );
        return -libc::ENOTSUP;
    }
    pmd_log!(INFO, "{pci}: probing a ConnectX-3 through rdma-core");
    let ports = match crate::hw::open_pci(&pci) {
        Ok(p) => p,
        Err(e) => {
            pmd_log!(ERR, "{pci}: {e}");
            return e.errno();
        }
    };
    let source = MemSource::Dpdk { socket };
    let mut status = 0;
    let mut up = 0;
    for crate::hw::PciPort { name, mac, handles } in ports {
        let mut args = devargs.clone();
        args.mac = args.mac.or(mac);
        // Packet buffers are registered per mempool chunk when queues are set up, not as
        // memseg lists here: a card pins what it registers, and a hugepage memseg list is
        // mostly address space with nothing behind it.
        let port = match Port::open(&name, &args, source, &[], handles.dev.as_ref()) {
            Ok(p) => p,
            Err(e) => {
                pmd_log!(ERR, "{name}: cannot open: {e}");
                status = e.errno();
                continue;
            }
        };
        match attach_port(&device, &name, socket, port, handles) {
            Ok(()) => up += 1,
            Err(e) => {
                pmd_log!(ERR, "{name}: {e}");
                status = e.errno();
            }
        }
    }
    if up > 0 {
        0
    } else {
        status
    }
}

unsafe extern "C" fn pci_remove(pdev: *mut sys::rte_pci_device) -> c_int {
    let mut rc = 0;
    // SAFETY: EAL passes a live PCI device; ethdev looks up the ports whose parent it is, and
    // closing runs our dev_close and releases each port.
    unsafe {
        let device = ptr::addr_of!((*pdev).device);
        let mut id = sys::rte_eth_find_next_of(0, device);
        while u32::from(id) < sys::RTE_MAX_ETHPORTS {
            rc |= sys::rte_eth_dev_close(id);
            id = sys::rte_eth_find_next_of(id + 1, device);
        }
    }
    if rc == 0 {
        0
    } else {
        -libc::EIO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_card_takes_its_keys_and_refuses_the_models() {
        let d =
            parse_pci_devargs("bf=off,txq_inline=0,mac=02:00:00:00:00:05,tx_db_avoid=1").unwrap();
        assert_eq!(d.bf, crate::devargs::BfMode::Off);
        assert_eq!(d.txq_inline, 0);
        assert!(d.tx_db_avoid);
        assert_eq!(d.device_loop, DeviceLoop::PortThread);
        for k in [
            "wire=loop",
            "wc=off",
            "busy_poll=1",
            "device_loop=lcore",
            "faults=tx_error:10",
        ] {
            let e = parse_pci_devargs(k).unwrap_err();
            assert!(
                e.contains("software HCA") && e.contains("bf, txq_inline, mac, tx_db_avoid"),
                "{e}"
            );
        }
        let e = parse_pci_devargs("colour=red").unwrap_err();
        assert!(e.contains("unknown key"), "{e}");
        assert!(parse_pci_devargs("").is_ok());
    }

    #[test]
    fn the_id_table_is_the_family_then_a_terminator() {
        let ids: Vec<(u16, u16)> = PCI_ID_TABLE
            .iter()
            .map(|i| (i.vendor_id, i.device_id))
            .collect();
        assert_eq!(&ids[..3], &PCI_IDS[..]);
        assert_eq!(ids[3], (0, 0));
        assert_eq!(
            pci_name(&sys::rte_pci_addr {
                domain: 0,
                bus: 5,
                devid: 0x1f,
                function: 1
            }),
            "0000:05:1f.1"
        );
    }
}
