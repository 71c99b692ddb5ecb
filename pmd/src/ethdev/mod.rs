//! The binding between DPDK's ethdev/vdev C interfaces and the driver: the one layer that takes
//! callbacks from C.
//!
//! - [`probe`]: the vdev driver record, its registration, probe and remove;
//! - [`attach`]: a probed port's ethdev, with the port, its handles, ops and bursts;
//! - [`pci`]: the PCI driver for the ConnectX-3 family, probed through rdma-core;
//! - [`eth`]: where C's pointers become references: the trampolines ([`eth::ops!`]) that
//!   convert each op's pointers once (an argument as an optional reference, an array with its
//!   count as a `CArray`, a structure that leads on to more through its `FromC` view) and
//!   call a safe function with a shared view of the port (`&Port`, for ops that may run
//!   beside the data path) or an exclusive one (`&mut Port`), and turn its `Result` into the
//!   errno DPDK expects ([`Error::errno`]); the queue slots;
//! - [`ops`]: the device ops table, and configure, start, stop, close, link, MAC, MTU;
//! - [`info`]: what a port tells about itself (device info, packet types);
//! - [`slot`]: what a queue entry holds: the queue, and what other threads may read of it;
//! - [`queue`]: queue setup, release and info, and the burst functions;
//! - [`qctl`]: starting and stopping single queues, deferred start;
//! - [`rss`]: the redirection table and the hash configuration;
//! - [`stats`]: basic and extended statistics;
//! - [`flow`]: `rte_flow` over the device's flow steering;
//! - [`filter`]: more unicast addresses, the multicast list, the VLAN filter, flow control,
//!   the firmware version;
//! - [`intr`]: link status and removal events, link up/down, receive interrupts;
//! - [`mp`]: secondary processes: attaching to the primary's ports, and what they ask it;
//! - [`release`]: what differs between the supported DPDK releases, and nothing else.
//!
//! Raw pointers are converted at the edge only: in the trampolines of `eth` and the views they
//! build (the `rte_flow` pattern and actions in `flow`, the RSS configuration in `rss`), the
//! burst entry points of `queue`, and the bus callbacks of `probe` and `pci`; the EAL services
//! the ops use (process type, memory walks, the interrupt handle, IPC, `rte_flow` errors) are
//! safe functions of `crate::eal`, and the ops themselves are ordinary Rust.

mod attach;
mod eth;
mod filter;
mod flow;
mod info;
mod intr;
mod mp;
mod mr;
mod ops;
mod pci;
mod pmdinfo;
mod probe;
mod qctl;
mod queue;
mod release;
mod rss;
mod slot;
mod stats;

pub use attach::DRIVER_NAME;

/// Why an op failed: the device's error type, whose kind decides the errno DPDK sees.
pub(crate) use crate::hw::HwError as Error;

/// `Error::Invalid` from a format string.
macro_rules! invalid {
    ($($arg:tt)*) => {
        $crate::ethdev::Error::Invalid(format!($($arg)*))
    };
}
pub(crate) use invalid;

/// `aa:bb:cc:dd:ee:ff`.
pub fn fmt_mac(m: &[u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_error_has_its_errno() {
        assert_eq!(invalid!("RETA size {}", 3).errno(), -libc::EINVAL);
        assert_eq!(Error::NoMemory("x".into()).errno(), -libc::ENOMEM);
        assert_eq!(Error::Device("x".into()).errno(), -libc::EIO);
        assert_eq!(Error::Unsupported("x").errno(), -libc::ENOTSUP);
    }
}
