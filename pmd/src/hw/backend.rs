//! Opening a port's device, whichever backend it has: the software HCA for a vdev port, rdma-core
//! for the ports of a ConnectX-3 on the PCI bus.

use super::{soft, verbs, Device, HwError};
use crate::devargs::Devargs;
use crate::mem::MemSource;

/// This process's handles to a port's device.
pub struct Handles {
    pub dev: Box<dyn Device>,
    /// Set when the device runs in the polling lcore: what the burst glue calls.
    pub lcore: Option<soft::Lcore>,
}

/// Opens the device behind the vdev port `name`: the software HCA, as the devargs describe it,
/// its queue memory from `source` (a card on the PCI bus opens with [`open_pci`]).
pub fn open(name: &str, args: &Devargs, source: MemSource) -> Result<Handles, HwError> {
    let soft = soft::Soft::open(name, args, source)?;
    Ok(Handles {
        lcore: soft.lcore(),
        dev: Box::new(soft),
    })
}

/// A port of a ConnectX-3 found on the PCI bus.
pub struct PciPort {
    /// As DPDK's mlx4 names it: `mlx4_0 port 1`.
    pub name: String,
    /// Its netdev's MAC, if it has one.
    pub mac: Option<[u8; 6]>,
    pub handles: Handles,
}

/// Opens the Ethernet ports of the ConnectX-3 at PCI address `pci` through rdma-core.
pub fn open_pci(pci: &str) -> Result<Vec<PciPort>, HwError> {
    Ok(verbs::open_pci(pci)?
        .into_iter()
        .map(|(name, v)| PciPort {
            name,
            mac: v.mac(),
            handles: Handles {
                dev: Box::new(v),
                lcore: None,
            },
        })
        .collect())
}
