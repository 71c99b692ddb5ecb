//! A Linux TAP interface as a wire: frames the device transmits are written to the kernel, frames
//! the kernel sends arrive on the port's RX.
//!
//! The interface belongs to its file descriptor: it lives as long as the wire does, wherever
//! the operator moves it (another network namespace, another name). Everything asked of the
//! kernel side after opening goes through the descriptor: `TUNGETIFF` for the interface's name
//! now, `TUNGETDEVNETNS` for the namespace it is in now, and a control socket made in that
//! namespace for its flags and MTU. The device side of the link is the TAP's carrier
//! (`TUNSETCARRIER`): off while the port is down, so the kernel queues nothing for it.
//!
//! An interface outlives the wire that made it, to the end of the process: a wire dropped
//! (its port closed: Open vSwitch's `del-port` detaches the device) leaves its descriptor in
//! a process-wide list, the interface without carrier, and the next TAP wire of the same name
//! in this process takes it back, in whatever namespace, with its addresses and routes. The
//! kernel removes it when the process exits.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use parking_lot::Mutex;

/// Descriptors of interfaces whose wire was dropped, by the name the wire was opened with.
static KEPT: Mutex<Vec<(String, File)>> = parking_lot::const_mutex(Vec::new());

const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
/// `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// `_IOR('T', 210, unsigned int)`: the interface's current name and TUN flags.
const TUNGETIFF: libc::c_ulong = 0x8004_54d2;
/// `_IOW('T', 226, int)`: the carrier, as the device side of the link (Linux 5.0).
const TUNSETCARRIER: libc::c_ulong = 0x4004_54e2;
/// `_IO('T', 227)`: an fd of the network namespace the interface is in now (Linux 5.2).
const TUNGETDEVNETNS: libc::c_ulong = 0x0000_54e3;

/// `struct ifreq`: the name, then a 24-byte union (flags: a short; MTU: an int).
#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: [u8; 24],
}

impl IfReq {
    fn named(name: &[u8]) -> IfReq {
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            data: [0; 24],
        };
        for (d, s) in req.name.iter_mut().zip(name) {
            *d = *s as libc::c_char;
        }
        req
    }

    fn short(&self) -> libc::c_short {
        libc::c_short::from_ne_bytes([self.data[0], self.data[1]])
    }

    fn set_short(&mut self, v: libc::c_short) {
        self.data[..2].copy_from_slice(&v.to_ne_bytes());
    }

    fn set_int(&mut self, v: libc::c_int) {
        self.data[..4].copy_from_slice(&v.to_ne_bytes());
    }
}

/// A datagram socket in the namespace the interface was last seen in, for its flags and MTU.
#[derive(Debug)]
struct Ctl {
    /// The namespace's identity (device and inode of its nsfs file).
    ns: (u64, u64),
    sock: OwnedFd,
}

/// An open TAP device in non-blocking mode, without packet information headers.
#[derive(Debug)]
pub(crate) struct Tap {
    file: File,
    /// The name it was opened with (what the operator gave, for messages).
    name: String,
    buf: Vec<u8>,
    ctl: Option<Ctl>,
}

/// Largest frame read from the kernel (jumbo frames and then some).
const TAP_MTU: usize = 65536;

fn ioctl_ptr<T>(fd: RawFd, req: libc::c_ulong, arg: &mut T) -> io::Result<libc::c_int> {
    // SAFETY: every caller passes a request whose argument is one `T` (an `IfReq` laid out as
    // `struct ifreq`), valid and writable for the call; `fd` is open.
    let rc = unsafe { libc::ioctl(fd, req as _, arg as *mut T) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A datagram socket made in the network namespace `ns` refers to: a short-lived thread enters
/// the namespace (which changes that thread alone) and makes it; a socket stays in the
/// namespace it was made in.
fn socket_in(ns: &OwnedFd) -> io::Result<OwnedFd> {
    let ns = ns.try_clone()?;
    std::thread::Builder::new()
        .name("mlx4hca-tapns".into())
        .spawn(move || {
            // SAFETY: `ns` is an open nsfs fd; setns changes only this thread's namespace.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
                return Err(io::Error::last_os_error());
            }
            new_socket()
        })?
        .join()
        .map_err(|_| io::Error::other("namespace thread panicked"))?
}

fn new_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

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
        let kept = {
            let mut kept = KEPT.lock();
            kept.iter()
                .position(|(n, _)| n == ifname)
                .map(|i| kept.swap_remove(i).1)
        };
        let mut req = IfReq::named(&[]);
        // One the operator deleted meanwhile has no interface any more: made anew.
        let file = match kept.filter(|f| ioctl_ptr(f.as_raw_fd(), TUNGETIFF, &mut req).is_ok()) {
            Some(f) => f,
            None => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                    .open("/dev/net/tun")?;
                let mut req = IfReq::named(bytes);
                req.set_short(IFF_TAP | IFF_NO_PI);
                ioctl_ptr(file.as_raw_fd(), TUNSETIFF, &mut req)?;
                file
            }
        };
        let mut tap = Tap {
            file,
            name: ifname.to_owned(),
            buf: vec![0; TAP_MTU],
            ctl: None,
        };
        // The port is down until started: no carrier yet.
        tap.set_carrier(false);
        Ok(tap)
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The interface's name now (it may have been renamed), asked through the descriptor.
    fn current_name(&self) -> io::Result<IfReq> {
        let mut req = IfReq::named(&[]);
        ioctl_ptr(self.file.as_raw_fd(), TUNGETIFF, &mut req)?;
        Ok(req)
    }

    /// The control socket for the namespace the interface is in now, made anew when it moved.
    /// Kernels without `TUNGETDEVNETNS` get a socket in this thread's namespace.
    fn ctl(&mut self) -> io::Result<RawFd> {
        // SAFETY: TUNGETDEVNETNS takes no argument and returns a new fd.
        let nsfd = unsafe { libc::ioctl(self.file.as_raw_fd(), TUNGETDEVNETNS as _) };
        if nsfd < 0 {
            if self.ctl.is_none() {
                self.ctl = Some(Ctl {
                    ns: (0, 0),
                    sock: new_socket()?,
                });
            }
            return Ok(self.ctl.as_ref().map_or(-1, |c| c.sock.as_raw_fd()));
        }
        // SAFETY: a new fd nothing else owns.
        let ns = unsafe { OwnedFd::from_raw_fd(nsfd) };
        // SAFETY: `st` is plain data fstat fills.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: an open fd and a stat buffer of our own.
        if unsafe { libc::fstat(ns.as_raw_fd(), &mut st) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let id = (st.st_dev, st.st_ino);
        if self.ctl.as_ref().map(|c| c.ns) != Some(id) {
            self.ctl = Some(Ctl {
                ns: id,
                sock: socket_in(&ns)?,
            });
        }
        Ok(self.ctl.as_ref().map_or(-1, |c| c.sock.as_raw_fd()))
    }

    /// Whether the interface is up (`IFF_UP`) wherever it is now: the kernel side of the link.
    /// False if it cannot be asked.
    pub(crate) fn is_up(&mut self) -> bool {
        let Ok(mut req) = self.current_name() else {
            return false;
        };
        let Ok(sock) = self.ctl() else {
            return false;
        };
        ioctl_ptr(sock, libc::SIOCGIFFLAGS, &mut req).is_ok()
            && req.short() & libc::IFF_UP as libc::c_short != 0
    }

    /// Give the interface this MTU, wherever it is now.
    pub(crate) fn set_mtu(&mut self, mtu: u16) -> io::Result<()> {
        let mut req = self.current_name()?;
        let sock = self.ctl()?;
        req.set_int(libc::c_int::from(mtu));
        ioctl_ptr(sock, libc::SIOCSIFMTU, &mut req).map(|_| ())
    }

    /// The device side of the link: with the carrier off the kernel sends nothing to the
    /// device (the interface shows NO-CARRIER) and keeps its addresses and routes.
    pub(crate) fn set_carrier(&mut self, on: bool) {
        let mut v = libc::c_int::from(on);
        // Kernels before 5.0 have no TUNSETCARRIER: the interface then keeps its carrier and
        // what it queues while the port is down is discarded at the next start.
        let _ = ioctl_ptr(self.file.as_raw_fd(), TUNSETCARRIER, &mut v);
    }

    /// Read and discard whatever the kernel has queued; returns how many frames.
    pub(crate) fn drain(&mut self) -> u64 {
        let mut n = 0;
        while self.recv().is_some() {
            n += 1;
        }
        n
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

impl Drop for Tap {
    /// The interface stays (see the module documentation): no carrier, nothing queued.
    fn drop(&mut self) {
        self.set_carrier(false);
        self.drain();
        if let Ok(f) = self.file.try_clone() {
            KEPT.lock().push((self.name.clone(), f));
        }
    }
}
