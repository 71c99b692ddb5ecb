//! The rings the driver shares with the device: the send queue (64-byte TXBBs) and completion
//! queues (32-byte CQEs plus their consumer-index record).
//!
//! Protocol, not locks, keeps driver and device apart: the device reads a WQE only after it
//! sees the owner word the driver stores last (release), and the driver reads a CQE only after
//! it sees the owner bit the device stores last. Words both sides touch concurrently are only
//! ever reached atomically and never lie under a Rust reference to bytes: the owner word and
//! the size word of the TXBB the device polls (dwords 0 and 1 of a WQE's first TXBB, which
//! also carry the stamps), CQE owner bytes and doorbell records. A WQE's other bytes belong to
//! the driver from its completion until its owner word is published; [`WqeMut`] writes them
//! through raw pointers and never hands out a slice over dwords 0 and 1.
//!
//! Per burst, not per packet ([`Poster`]): the contiguous run of TXBBs up to the ring's end is
//! computed once, with at most one pad NOP where a WQE would cross it (a burst never uses a
//! whole ring, so it wraps at most once); the owner word is computed once per run; and each
//! WQE's owner word is stored when the next one is taken, so the last WQE of a burst stays
//! unpublished until the queue has decided its completion request and whether it goes out
//! through BlueFlame.
//!
//! One file per concern: the send ring ([`SqRing`], `sq.rs`), a burst's posting over it
//! ([`Poster`], `poster.rs`), the writer of one WQE's bytes ([`WqeMut`], `wqe_mut.rs`), the
//! completion ring ([`CqRing`], `cq.rs`) and the receive ring ([`RqRing`], `rq.rs`).

use mlx4_prm::TXBB_SIZE;

mod cq;
mod poster;
mod rq;
mod sq;
mod wqe_mut;

pub use cq::CqRing;
pub use poster::{Cursor, LastWqe, Posted, Poster};
pub use rq::RqRing;
pub use sq::SqRing;
pub use wqe_mut::WqeMut;

/// TXBBs a WQE of `bytes` occupies.
pub const fn txbbs_for(bytes: usize) -> u32 {
    bytes.div_ceil(TXBB_SIZE) as u32
}
