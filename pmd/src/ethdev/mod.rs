//! The binding between DPDK's ethdev/vdev C interfaces and the driver: the one layer that takes
//! callbacks from C.
//!
//! - [`probe`]: the vdev driver record, its registration, probe and remove;
//! - [`pci`]: the PCI driver for the ConnectX-3 family, probed through rdma-core;
//! - [`eth`]: a small safe wrapper over `rte_eth_dev` that hands each op one `&mut Port` and the
//!   port's queues, and turns every op's `Result` into the errno DPDK expects ([`errno`]);
//! - [`ops`]: the device ops (configure, start, stop, close, info, link, filters, MTU);
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
//! `unsafe` lives at the edge only: converting the raw pointers DPDK passes in `probe`, `eth`
//! and the `extern "C"` functions; everything they call is ordinary Rust.

use std::ffi::c_int;
use std::fmt;

use crate::hw::HwError;

mod eth;
mod filter;
mod flow;
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
mod stats;

pub use probe::DRIVER_NAME;

/// Why an op failed. Its kind decides the errno DPDK sees.
#[derive(Debug)]
pub(crate) enum Error {
    /// A configuration the driver or the device does not accept.
    Invalid(String),
    /// Host memory ran out.
    NoMemory(String),
    /// The device failed.
    Device(String),
    /// Not supported (by this backend, or in this process).
    Unsupported(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid(s) | Error::NoMemory(s) | Error::Device(s) => f.write_str(s),
            Error::Unsupported(what) => write!(f, "{what} is not supported here"),
        }
    }
}

impl From<HwError> for Error {
    fn from(e: HwError) -> Error {
        match e {
            HwError::Invalid(s) => Error::Invalid(s),
            HwError::NoMemory(s) => Error::NoMemory(s),
            HwError::Device(s) => Error::Device(s),
            HwError::Unsupported(s) => Error::Unsupported(s),
        }
    }
}

/// `Error::Invalid` from a format string.
macro_rules! invalid {
    ($($arg:tt)*) => {
        $crate::ethdev::Error::Invalid(format!($($arg)*))
    };
}
pub(crate) use invalid;

/// The negative errno DPDK expects for an error: `EINVAL` for a bad configuration, `ENOMEM`
/// only for memory, `EIO` for the device. Every op's failure goes through here.
pub(crate) fn errno(e: &Error) -> c_int {
    -match e {
        Error::Invalid(_) => libc::EINVAL,
        Error::NoMemory(_) => libc::ENOMEM,
        Error::Device(_) => libc::EIO,
        Error::Unsupported(_) => libc::ENOTSUP,
    }
}

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
        assert_eq!(errno(&invalid!("RETA size {}", 3)), -libc::EINVAL);
        assert_eq!(errno(&Error::NoMemory("x".into())), -libc::ENOMEM);
        assert_eq!(errno(&Error::Device("x".into())), -libc::EIO);
        assert_eq!(errno(&Error::Unsupported("x")), -libc::ENOTSUP);
        assert_eq!(
            errno(&HwError::NoMemory("ring".into()).into()),
            -libc::ENOMEM,
            "a device error keeps its kind"
        );
        assert_eq!(
            errno(&HwError::Invalid("cqe_cnt".into()).into()),
            -libc::EINVAL
        );
        assert_eq!(
            errno(&HwError::Device("create SQ".into()).into()),
            -libc::EIO
        );
    }
}
