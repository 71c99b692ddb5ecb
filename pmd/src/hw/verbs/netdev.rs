//! The kernel side of a ConnectX-3 port: its PCI address and netdev as sysfs shows them under
//! the verbs device (`<ibdev_path>/device`), and the netdev's flags, MTU and MAC by ioctl, as
//! DPDK's mlx4 drives them (the port's MTU and link belong to `mlx4_en`'s netdev).

use std::ffi::c_int;
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// `PCI_SLOT_NAME` of the verbs device's PCI function (`<ibdev_path>/device/uevent`).
pub fn pci_slot(ibdev_path: &Path) -> Option<String> {
    let uevent = fs::read_to_string(ibdev_path.join("device/uevent")).ok()?;
    uevent
        .lines()
        .find_map(|l| l.strip_prefix("PCI_SLOT_NAME="))
        .map(|s| s.trim().to_lowercase())
}

/// The netdev of physical port `port` (1-based): the interface under `device/net` whose
/// `dev_port` is `port - 1`.
pub fn netdev_of(ibdev_path: &Path, port: u32) -> Option<String> {
    let net = ibdev_path.join("device/net");
    let mut found = None;
    for e in fs::read_dir(net).ok()?.flatten() {
        let dev_port = fs::read_to_string(e.path().join("dev_port")).ok();
        if dev_port.as_deref().map(str::trim) == Some(&(port - 1).to_string()) {
            found = e.file_name().to_str().map(str::to_owned);
            break;
        }
    }
    found.filter(|n| n.len() < libc::IFNAMSIZ)
}

/// An ioctl socket and one interface name.
pub struct Netdev {
    name: String,
    sock: OwnedFd,
}

impl Netdev {
    pub fn open(name: &str) -> std::io::Result<Netdev> {
        // SAFETY: plain socket(2) call; the result is checked.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Netdev {
            name: name.to_owned(),
            // SAFETY: a fresh descriptor we own.
            sock: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn req(&self) -> libc::ifreq {
        // SAFETY: ifreq is plain data, valid all-zero.
        let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in r.ifr_name.iter_mut().zip(self.name.bytes()) {
            *d = s as libc::c_char;
        }
        r
    }

    fn ioctl(&self, op: libc::c_ulong, r: &mut libc::ifreq) -> std::io::Result<()> {
        // SAFETY: the socket is ours and `r` a whole ifreq naming our interface.
        let rc: c_int = unsafe { libc::ioctl(self.sock.as_raw_fd(), op, r as *mut libc::ifreq) };
        if rc < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    fn flags(&self) -> std::io::Result<c_int> {
        let mut r = self.req();
        self.ioctl(libc::SIOCGIFFLAGS, &mut r)?;
        // SAFETY: SIOCGIFFLAGS filled the flags member.
        Ok(c_int::from(unsafe { r.ifr_ifru.ifru_flags }))
    }

    /// Administratively up (`IFF_UP`), as DPDK's mlx4 forces it at probe: the port passes no
    /// traffic while `mlx4_en` holds its netdev down.
    pub fn set_up(&self) -> std::io::Result<()> {
        let flags = self.flags()?;
        if flags & libc::IFF_UP != 0 {
            return Ok(());
        }
        let mut r = self.req();
        r.ifr_ifru.ifru_flags = (flags | libc::IFF_UP) as libc::c_short;
        self.ioctl(libc::SIOCSIFFLAGS, &mut r)
    }

    pub fn mtu(&self) -> std::io::Result<u32> {
        let mut r = self.req();
        self.ioctl(libc::SIOCGIFMTU, &mut r)?;
        // SAFETY: SIOCGIFMTU filled the MTU member.
        Ok(unsafe { r.ifr_ifru.ifru_mtu } as u32)
    }

    /// Sets the MTU, unless it already is that (which needs no privilege).
    pub fn set_mtu(&self, mtu: u32) -> std::io::Result<()> {
        if self.mtu()? == mtu {
            return Ok(());
        }
        let mut r = self.req();
        r.ifr_ifru.ifru_mtu = mtu as c_int;
        self.ioctl(libc::SIOCSIFMTU, &mut r)
    }

    pub fn mac(&self) -> std::io::Result<[u8; 6]> {
        let mut r = self.req();
        self.ioctl(libc::SIOCGIFHWADDR, &mut r)?;
        // SAFETY: SIOCGIFHWADDR filled the hardware address member.
        let sa = unsafe { r.ifr_ifru.ifru_hwaddr };
        let mut mac = [0u8; 6];
        for (m, b) in mac.iter_mut().zip(sa.sa_data.iter()) {
            *m = *b as u8;
        }
        Ok(mac)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_pci_slot_and_the_netdev_of_each_port() {
        let dir = std::env::temp_dir().join(format!("mlx4rs-netdev-{}", std::process::id()));
        let pci = dir.join("pci/0000:00:07.0");
        fs::create_dir_all(pci.join("net/ethA")).unwrap();
        fs::create_dir_all(pci.join("net/ethB")).unwrap();
        fs::write(
            pci.join("uevent"),
            "DRIVER=mlx4_core\nPCI_SLOT_NAME=0000:00:07.0\n",
        )
        .unwrap();
        fs::write(pci.join("net/ethA/dev_port"), "1\n").unwrap();
        fs::write(pci.join("net/ethB/dev_port"), "0\n").unwrap();
        let ib = dir.join("ib/mlx4_0");
        fs::create_dir_all(&ib).unwrap();
        std::os::unix::fs::symlink(&pci, ib.join("device")).unwrap();
        assert_eq!(pci_slot(&ib).as_deref(), Some("0000:00:07.0"));
        assert_eq!(netdev_of(&ib, 1).as_deref(), Some("ethB"));
        assert_eq!(netdev_of(&ib, 2).as_deref(), Some("ethA"));
        assert_eq!(netdev_of(&ib, 3), None);
        assert_eq!(pci_slot(&dir.join("ib/none")), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_loopback_interface_answers() {
        let lo = Netdev::open("lo").unwrap();
        assert!(lo.mtu().unwrap() >= 1500);
        assert_eq!(lo.mac().unwrap(), [0; 6]);
        // Already up: no privilege needed, nothing changes.
        lo.set_up().unwrap();
        let mtu = lo.mtu().unwrap();
        lo.set_mtu(mtu).unwrap();
    }
}
