//! What the device tells the driver without being polled: link up and down and removal (port
//! events), and completion events of armed CQs (on completion channels), each queued behind an
//! event fd (an `eventfd` that is readable while events wait), which a DPDK driver
//! hands to EAL's interrupt thread as it would the fd of a card's interrupt.
//!
//! Changes the driver makes itself (`set_port_up`, a wire plugged in) and injected link flaps
//! are seen at once. Changes at the far end (a cable's peer unplugged or gone with its process,
//! a TAP interface set down, a cable file removed) are found by a process-wide monitor thread
//! that looks at every adapter whose event fd was asked for (`monitor.rs`).
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use parking_lot::Mutex;

use crate::error::HcaError;

/// Events kept for a driver that does not take them.
const MAX_QUEUED: usize = 256;

/// Link up and down, and removal ([`crate::Hca::remove`], or a cable file deleted or cut
/// short). A cable's far end plugged in and up, a TAP interface up, a peer adapter open and up
/// give a carrier; null, loop, pcap and sink wires always have one.
pub use mlx4_prm::PortEvent;

/// The queue of port events and its eventfd.
#[derive(Debug)]
pub(crate) struct Events {
    q: Mutex<VecDeque<PortEvent>>,
    fd: OwnedFd,
}

impl Events {
    pub(crate) fn new() -> Result<Events, HcaError> {
        // SAFETY: plain eventfd(2); the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(HcaError::Io(format!(
                "eventfd: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Events {
            q: Mutex::new(VecDeque::new()),
            // SAFETY: a fresh descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub(crate) fn push(&self, ev: PortEvent) {
        let mut q = self.q.lock();
        if q.len() == MAX_QUEUED {
            // Nobody is listening: keep the latest, which is what the state is now.
            q.pop_front();
        }
        q.push_back(ev);
        signal(self.fd.as_raw_fd());
    }

    /// The oldest event; the fd stops being readable once none is left.
    pub(crate) fn pop(&self) -> Option<PortEvent> {
        let mut q = self.q.lock();
        let ev = q.pop_front();
        if ev.is_some() && q.is_empty() {
            drain(self.fd.as_raw_fd());
        }
        ev
    }
}

/// Add one to an eventfd's counter (making it readable).
pub(crate) fn signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writing 8 bytes to an eventfd; it cannot block below u64::MAX - 1.
    let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Zero a non-blocking eventfd's counter (making it unreadable).
pub(crate) fn drain(fd: RawFd) {
    let mut n: u64 = 0;
    // SAFETY: reading 8 bytes from a non-blocking eventfd into a u64.
    let _ = unsafe { libc::read(fd, (&mut n as *mut u64).cast(), 8) };
}

/// A completion channel: CQs bound to it report their events here, behind an eventfd that is
/// readable while events wait (what `ibv_comp_channel` is to a verbs application).
#[derive(Debug)]
pub(crate) struct Channel {
    q: Mutex<VecDeque<u32>>,
    fd: OwnedFd,
}

/// Events a channel keeps when nobody takes them (the oldest are forgotten).
const MAX_CHANNEL_EVENTS: usize = 4096;

impl Channel {
    pub(crate) fn new() -> Result<Channel, HcaError> {
        // Blocking, as a verbs channel fd is until its user says otherwise: `pop` reads it only
        // while its count is not zero, so never blocks.
        // SAFETY: plain eventfd(2); the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(HcaError::Io(format!(
                "eventfd: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Channel {
            q: Mutex::new(VecDeque::new()),
            // SAFETY: a fresh descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub(crate) fn push(&self, cqn: u32) {
        let mut q = self.q.lock();
        if q.len() == MAX_CHANNEL_EVENTS {
            q.pop_front();
        }
        q.push_back(cqn);
        signal(self.fd.as_raw_fd());
    }

    /// The CQN of the oldest event; the fd is quiet once none is left.
    pub(crate) fn pop(&self) -> Option<u32> {
        let mut q = self.q.lock();
        let cqn = q.pop_front();
        if cqn.is_some() && q.is_empty() {
            drain(self.fd.as_raw_fd());
        }
        cqn
    }
}
