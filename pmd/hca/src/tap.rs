//! A Linux TAP interface as a wire: frames the device transmits are written to the kernel, frames
//! the kernel sends arrive on the port's RX.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;

const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
/// `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// An open TAP device in non-blocking mode, without packet information headers.
#[derive(Debug)]
pub(crate) struct Tap {
    file: File,
    name: String,
    buf: Vec<u8>,
}

/// Largest frame read from the kernel (jumbo frames and then some).
const TAP_MTU: usize = 65536;

impl Tap {
    pub(crate) fn open(ifname: &str) -> io::Result<Tap> {
        let cname = CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in interface name"))?;
        let bytes = cname.as_bytes_with_nul();
        if bytes.len() > libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "interface name {ifname:?} longer than {}",
                    libc::IFNAMSIZ - 1
                ),
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")?;
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: IFF_TAP | IFF_NO_PI,
            _pad: [0; 22],
        };
        for (d, s) in req.name.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which `IfReq` lays out (name,
        // then the flags union member, padded to the kernel's 40 bytes); the fd is open.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req as *mut IfReq) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Tap {
            file,
            name: ifname.to_owned(),
            buf: vec![0; TAP_MTU],
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Whether the interface is up (`IFF_UP`): the kernel side of the link. False if it cannot
    /// be asked.
    pub(crate) fn is_up(&self) -> bool {
        // SAFETY: a datagram socket only to ask for interface flags; closed below.
        let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if sock < 0 {
            return false;
        }
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: 0,
            _pad: [0; 22],
        };
        for (d, s) in req.name.iter_mut().zip(self.name.bytes()) {
            *d = s as libc::c_char;
        }
        // SAFETY: SIOCGIFFLAGS fills the flags of one `struct ifreq`, which `IfReq` lays out.
        let rc = unsafe { libc::ioctl(sock, libc::SIOCGIFFLAGS as _, &mut req as *mut IfReq) };
        // SAFETY: our own socket.
        unsafe { libc::close(sock) };
        rc == 0 && req.flags & libc::IFF_UP as libc::c_short != 0
    }

    /// Send one frame; false if the kernel would not take it now (interface down, queue full).
    pub(crate) fn send(&mut self, frame: &[u8]) -> bool {
        matches!(self.file.write(frame), Ok(n) if n == frame.len())
    }

    /// Receive one frame; `None` when nothing is pending.
    pub(crate) fn recv(&mut self) -> Option<(&[u8], usize)> {
        match self.file.read(&mut self.buf) {
            Ok(n) if n > 0 => Some((&self.buf[..], n)),
            _ => None,
        }
    }
}
