//! mlx4rs: a DPDK poll-mode driver for mlx4-class NICs (ConnectX-3).
//!
//! `tx_burst` writes inline WQEs either into a write-combining BlueFlame page or into the send
//! ring followed by one UAR doorbell per burst; a capability check at device init decides which
//! path is live. The hardware is, on our machines, the software HCA ([`hca`]), which the
//! driver cannot tell from a card.
//!
//! Layout:
//! - the data path: [`txq`] and [`wqe`] (TX), [`rxq`] (RX), [`ring`] (views of the rings a device
//!   hands over), [`mmio`] (doorbell and BlueFlame stores), [`mbuf`] (mbufs as buffers), [`buf`] (the slots queues keep buffers in), [`mem`]
//!   (memory for the device and shared arrays);
//! - the hardware boundary: [`hw`], the control trait, and its backends ([`hw::soft`], the
//!   software HCA; [`hw::verbs`], a ConnectX-3 through rdma-core);
//! - the capability check: [`wc`];
//! - plain Rust configuration: [`devargs`], [`port`], [`stats`] (counter definitions);
//! - C callbacks: `ethdev`, the only layer DPDK calls into, and `eal`, the safe entries to
//!   the EAL services it uses (process type, memory walks). `mbuf`, `mem` and `log` call DPDK
//!   functions too (buffers, memory, logging), but take no callbacks.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod buf;
pub mod devargs;
#[allow(unsafe_code)]
mod eal;
#[allow(unsafe_code)]
pub mod hw;
#[allow(unsafe_code)]
pub mod log;
#[allow(unsafe_code)]
pub mod mbuf;
#[allow(unsafe_code)]
pub mod mem;
#[allow(unsafe_code)]
pub mod mmio;
pub mod port;
#[allow(unsafe_code)]
pub mod ring;
pub mod rxq;
pub mod stats;
pub mod txq;
pub mod wc;
pub mod wqe;

#[allow(unsafe_code)]
mod ethdev;

pub use ethdev::DRIVER_NAME;
pub use hw::soft::hca;
pub use mlx4_prm as prm;

/// Keeps the driver (and its EAL constructor) in an application that links this crate as an
/// rlib: call it once, before `rte_eal_init`, or reference it from `main`.
pub fn link() -> &'static std::ffi::CStr {
    DRIVER_NAME
}
