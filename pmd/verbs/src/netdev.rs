//! The port's kernel netdev: what `mlx4_en` would be on a real machine. DPDK's C mlx4 reads the
//! MAC from it, sets its MTU and flags with ioctls and takes the link state from its flags and
//! `ETHTOOL_GSET`; the stand-in follows its MTU and up/running state into the model.
//!
//! When the configured netdev does not exist, the stand-in creates a TAP interface of that name
//! and holds it open (a TAP has carrier while a process holds it, so `IFF_RUNNING` follows
//! `IFF_UP` as on a cabled NIC); it disappears with the process.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
/// `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let bytes = c.as_bytes_with_nul();
    if bytes.len() > libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name:?} too long"),
        ));
    }
    // SAFETY: `ifreq` is plain old data; all-zero is a valid value.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok(r)
}

fn ctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ioctl(sock: &OwnedFd, req: libc::c_ulong, r: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: the interface ioctls read and write one `struct ifreq`, which `r` is.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), req as _, r as *mut libc::ifreq) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether an interface of this name exists.
pub(crate) fn exists(name: &str) -> bool {
    let Ok(c) = CString::new(name) else {
        return false;
    };
    // SAFETY: `c` is a NUL-terminated string.
    unsafe { libc::if_nametoindex(c.as_ptr()) != 0 }
}

/// Create a TAP interface and hold it (with carrier) until the returned file is dropped;
/// optionally give it `mac` first.
pub(crate) fn create_tap(name: &str, mac: Option<[u8; 6]>) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")?;
    let mut r = ifreq(name)?;
    r.ifr_ifru.ifru_flags = IFF_TAP | IFF_NO_PI;
    // SAFETY: TUNSETIFF reads and writes one `struct ifreq`; the fd is open.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut r as *mut libc::ifreq) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if let Some(mac) = mac {
        let mut r = ifreq(name)?;
        // SAFETY: writing the `ifru_hwaddr` member of a zeroed union.
        unsafe {
            r.ifr_ifru.ifru_hwaddr.sa_family = libc::ARPHRD_ETHER;
            for (d, s) in r.ifr_ifru.ifru_hwaddr.sa_data.iter_mut().zip(mac) {
                *d = s as libc::c_char;
            }
        }
        ioctl(&ctl_socket()?, libc::SIOCSIFHWADDR, &mut r)?;
    }
    Ok(file)
}

/// What the model follows from the netdev.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct State {
    /// `IFF_UP` and `IFF_RUNNING`: the port passes traffic.
    pub up: bool,
    pub mtu: u32,
    /// `IFF_UP` alone: set up by its user, carrier or not.
    pub admin: bool,
}

/// Read the netdev's flags and MTU.
pub(crate) fn state(name: &str) -> io::Result<State> {
    let sock = ctl_socket()?;
    let mut r = ifreq(name)?;
    ioctl(&sock, libc::SIOCGIFFLAGS, &mut r)?;
    // SAFETY: SIOCGIFFLAGS filled the flags member.
    let flags = unsafe { r.ifr_ifru.ifru_flags } as libc::c_int;
    let mut r = ifreq(name)?;
    ioctl(&sock, libc::SIOCGIFMTU, &mut r)?;
    // SAFETY: SIOCGIFMTU filled the mtu member.
    let mtu = unsafe { r.ifr_ifru.ifru_mtu };
    Ok(State {
        up: flags & libc::IFF_UP != 0 && flags & libc::IFF_RUNNING != 0,
        mtu: mtu.max(0) as u32,
        admin: flags & libc::IFF_UP != 0,
    })
}

/// `_IOW('T', 226, int)`: set a TAP interface's carrier.
const TUNSETCARRIER: libc::c_ulong = 0x4004_54e2;

/// Turn the carrier of the TAP interface behind `tap` on or off: its `IFF_RUNNING` (operational
/// state) follows, as a card's netdev follows its PHY.
pub(crate) fn set_carrier(tap: &File, on: bool) -> io::Result<()> {
    let v: libc::c_int = on.into();
    // SAFETY: TUNSETCARRIER reads one int; the fd is an attached TAP.
    let rc = unsafe {
        libc::ioctl(
            tap.as_raw_fd(),
            TUNSETCARRIER as _,
            &v as *const libc::c_int,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A socket that wakes its reader when any link changes (rtnetlink `RTMGRP_LINK`), so the
/// watcher follows the netdev without polling it.
pub(crate) struct LinkEvents {
    fd: OwnedFd,
}

impl LinkEvents {
    pub(crate) fn open(timeout: Duration) -> io::Result<LinkEvents> {
        // SAFETY: plain socket(2) call; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: `sockaddr_nl` is plain old data.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        sa.nl_groups = libc::RTMGRP_LINK as u32;
        // SAFETY: binding a netlink socket to a `sockaddr_nl` of the right length.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let tv = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: timeout.subsec_micros() as libc::suseconds_t,
        };
        // SAFETY: SO_RCVTIMEO takes a `timeval` of this size.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(LinkEvents { fd })
    }

    /// Wait for a link message, `other` to become readable, or `timeout`; link messages are
    /// taken (the caller reads the state it cares about), `other` is left to its owner.
    pub(crate) fn wait_with(&self, other: libc::c_int, timeout: Duration) {
        let mut fds = [
            libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: other,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: polling two pollfds of open descriptors.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout.as_millis() as libc::c_int) };
        if fds[0].revents & libc::POLLIN != 0 {
            let mut buf = [0u8; 8192];
            // SAFETY: reading into a buffer of the given length, without blocking.
            let _ = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_interfaces() {
        assert!(!exists("mlx4rs-none0"));
        assert!(state("mlx4rs-none0").is_err());
        assert!(ifreq("0123456789abcdefgh").is_err());
        assert!(exists("lo"));
        let s = state("lo").unwrap();
        assert!(s.up && s.mtu > 0);
    }
}
