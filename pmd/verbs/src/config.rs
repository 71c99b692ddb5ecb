//! Which devices the stand-in presents, from the environment.
//!
//! `MLX4RS_VERBS` lists the devices, `;` between devices and `,` between `key=value` words:
//!
//! ```text
//! MLX4RS_VERBS="ibdev=/tmp/t/sys/class/infiniband/mlx4_0,wire=pcap:/tmp/t/c.pcap,stats=/tmp/t/c.stats"
//! ```
//!
//! | key | meaning | default |
//! |---|---|---|
//! | `ibdev` | the verbs device's sysfs directory (rdma-core's `ibdev_path`); its last component is the device name, `device` under it is the PCI function | required |
//! | `wire` | what the port is cabled to, as the `net_mlx4rs` devarg (`null`, `loop`, `pcap:<path>`, `tap:<if>`, `peer:<name>`, ...) | `null` |
//! | `name` | the adapter's name, so other adapters of this copy of the model can cable to it | none |
//! | `wc` | the platform maps BlueFlame pages write-combining (`on`/`off`) | `on` |
//! | `bf_reg_size` | BlueFlame register size, 0 = none | 512 |
//! | `busy_poll` | the device loop spins without backing off (`0`/`1`) | 0 |
//! | `mac` | MAC of the netdev the stand-in creates when the port's netdev does not exist | kernel's choice |
//! | `stats` | file the model's counters are written to when the last context closes | none |
//!
//! Everything else about the device is read from the sysfs tree, the way the C driver reads it:
//! the PCI slot from `device/uevent`, the part number from `device/device`, and the port's
//! netdev from `device/net/<ifname>/dev_port` (0 for port 1).

use std::fmt;
use std::path::{Path, PathBuf};

/// The environment variable naming the devices.
pub(crate) const ENV: &str = "MLX4RS_VERBS";

/// One configured device, as parsed (sysfs not yet read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceConf {
    pub ibdev: PathBuf,
    pub wire: String,
    pub name: String,
    pub wc: bool,
    pub bf_reg_size: u32,
    pub busy_poll: bool,
    pub mac: Option<[u8; 6]>,
    pub stats: Option<PathBuf>,
}

/// A configuration mistake, with the offending word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConfError(pub String);

impl fmt::Display for ConfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{ENV}: {}", self.0)
    }
}

fn parse_bool(key: &str, v: &str) -> Result<bool, ConfError> {
    match v {
        "1" | "on" | "yes" | "true" => Ok(true),
        "0" | "off" | "no" | "false" => Ok(false),
        _ => Err(ConfError(format!("{key}={v}: expected on or off"))),
    }
}

pub(crate) fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

fn parse_device(text: &str) -> Result<DeviceConf, ConfError> {
    let mut d = DeviceConf {
        ibdev: PathBuf::new(),
        wire: "null".into(),
        name: String::new(),
        wc: true,
        bf_reg_size: 512,
        busy_poll: false,
        mac: None,
        stats: None,
    };
    let mut seen = Vec::new();
    for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let (key, value) = word
            .split_once('=')
            .ok_or_else(|| ConfError(format!("{word:?} is not key=value")))?;
        if seen.contains(&key) {
            return Err(ConfError(format!("{key} given twice")));
        }
        seen.push(key);
        match key {
            "ibdev" => d.ibdev = PathBuf::from(value),
            "wire" => d.wire = value.to_owned(),
            "name" => d.name = value.to_owned(),
            "wc" => d.wc = parse_bool(key, value)?,
            "busy_poll" => d.busy_poll = parse_bool(key, value)?,
            "bf_reg_size" => {
                d.bf_reg_size = value
                    .parse()
                    .map_err(|_| ConfError(format!("bf_reg_size={value}: not a number")))?
            }
            "mac" => {
                d.mac =
                    Some(parse_mac(value).ok_or_else(|| {
                        ConfError(format!("mac={value}: expected xx:xx:xx:xx:xx:xx"))
                    })?)
            }
            "stats" => d.stats = Some(PathBuf::from(value)),
            _ => {
                return Err(ConfError(format!(
                    "unknown key {key:?} (known: ibdev, wire, name, wc, bf_reg_size, busy_poll, \
                     mac, stats)"
                )))
            }
        }
    }
    if d.ibdev.as_os_str().is_empty() {
        return Err(ConfError(format!("{text:?} has no ibdev=<sysfs path>")));
    }
    Ok(d)
}

/// Parse the whole variable: every device, or the first mistake.
pub(crate) fn parse(text: &str) -> Result<Vec<DeviceConf>, ConfError> {
    let devs: Vec<DeviceConf> = text
        .split(';')
        .filter(|d| !d.trim().is_empty())
        .map(parse_device)
        .collect::<Result<_, _>>()?;
    for (i, d) in devs.iter().enumerate() {
        if devs[..i].iter().any(|e| e.ibdev == d.ibdev) {
            return Err(ConfError(format!("{} listed twice", d.ibdev.display())));
        }
    }
    Ok(devs)
}

/// What the sysfs tree says about a configured device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sysfs {
    /// The verbs device name (`mlx4_0`).
    pub name: String,
    /// `PCI_SLOT_NAME` from `device/uevent`.
    pub pci_slot: String,
    /// PCI device ID (0x1003 ConnectX-3, 0x1007 Pro, 0x1004 VF), reported as the part number.
    pub part_id: u32,
    /// The netdev of port 1.
    pub netdev: String,
}

fn read_trim(p: &Path) -> Result<String, ConfError> {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_owned())
        .map_err(|e| ConfError(format!("{}: {e}", p.display())))
}

/// Read what the C driver will read: `device/uevent`, `device/device` and the netdev whose
/// `dev_port` is 0.
pub(crate) fn read_sysfs(ibdev: &Path) -> Result<Sysfs, ConfError> {
    let name = ibdev
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty() && n.len() < 64)
        .ok_or_else(|| ConfError(format!("{}: no device name", ibdev.display())))?
        .to_owned();
    let dev = ibdev.join("device");
    let uevent = read_trim(&dev.join("uevent"))?;
    let pci_slot = uevent
        .lines()
        .find_map(|l| l.strip_prefix("PCI_SLOT_NAME="))
        .ok_or_else(|| {
            ConfError(format!(
                "{}: no PCI_SLOT_NAME= line",
                dev.join("uevent").display()
            ))
        })?
        .to_owned();
    let id = read_trim(&dev.join("device"))?;
    let part_id = u32::from_str_radix(id.trim_start_matches("0x"), 16).map_err(|_| {
        ConfError(format!(
            "{}: {id:?} is not hex",
            dev.join("device").display()
        ))
    })?;
    let net = dev.join("net");
    let entries = std::fs::read_dir(&net).map_err(|e| {
        ConfError(format!(
            "{}: {e} (one directory per netdev, holding dev_port)",
            net.display()
        ))
    })?;
    let mut netdev = None;
    for e in entries.flatten() {
        let port = read_trim(&e.path().join("dev_port")).ok();
        if port.as_deref() == Some("0") {
            netdev = e.file_name().to_str().map(str::to_owned);
            break;
        }
    }
    let netdev = netdev.ok_or_else(|| {
        ConfError(format!(
            "{}: no netdev with dev_port 0 (port 1)",
            net.display()
        ))
    })?;
    if netdev.len() >= libc::IFNAMSIZ {
        return Err(ConfError(format!(
            "netdev name {netdev:?} longer than {} bytes",
            libc::IFNAMSIZ - 1
        )));
    }
    Ok(Sysfs {
        name,
        pci_slot,
        part_id,
        netdev,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_defaults() {
        let v = parse("ibdev=/s/mlx4_0 ; ibdev=/s/mlx4_1,wire=pcap:/t/a.pcap,wc=off,bf_reg_size=0,busy_poll=1,mac=02:00:00:00:00:01,stats=/t/s,name=c0")
            .unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].ibdev, Path::new("/s/mlx4_0"));
        assert_eq!(v[0].wire, "null");
        assert!(v[0].wc && !v[0].busy_poll && v[0].bf_reg_size == 512);
        assert_eq!(v[1].wire, "pcap:/t/a.pcap");
        assert!(!v[1].wc && v[1].busy_poll && v[1].bf_reg_size == 0);
        assert_eq!(v[1].mac, Some([2, 0, 0, 0, 0, 1]));
        assert_eq!(v[1].stats.as_deref(), Some(Path::new("/t/s")));
        assert_eq!(v[1].name, "c0");
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn mistakes_name_the_word() {
        for (text, needle) in [
            ("wire=loop", "no ibdev"),
            ("ibdev=/a,colour=red", "unknown key \"colour\""),
            ("ibdev=/a,wc=maybe", "wc=maybe"),
            ("ibdev=/a,mac=02:00", "mac=02:00"),
            ("ibdev=/a,ibdev=/b", "ibdev given twice"),
            ("ibdev=/a;ibdev=/a", "/a listed twice"),
            ("ibdev=/a,loop", "\"loop\" is not key=value"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
            assert!(e.starts_with(ENV), "{e}");
        }
    }

    #[test]
    fn sysfs_tree_as_the_c_driver_reads_it() {
        let dir = std::env::temp_dir().join(format!("mlx4-verbs-sysfs-{}", std::process::id()));
        let pci = dir.join("0000:00:05.0");
        std::fs::create_dir_all(pci.join("net/eth7")).unwrap();
        std::fs::create_dir_all(pci.join("net/eth8")).unwrap();
        std::fs::create_dir_all(dir.join("ib")).unwrap();
        std::fs::write(
            pci.join("uevent"),
            "DRIVER=mlx4_core\nPCI_SLOT_NAME=0000:00:05.0\n",
        )
        .unwrap();
        std::fs::write(pci.join("device"), "0x1007\n").unwrap();
        std::fs::write(pci.join("net/eth7/dev_port"), "1\n").unwrap();
        std::fs::write(pci.join("net/eth8/dev_port"), "0\n").unwrap();
        let ibdev = dir.join("ib/mlx4_3");
        std::fs::create_dir_all(&ibdev).unwrap();
        std::os::unix::fs::symlink(&pci, ibdev.join("device")).unwrap();
        let s = read_sysfs(&ibdev).unwrap();
        assert_eq!(
            s,
            Sysfs {
                name: "mlx4_3".into(),
                pci_slot: "0000:00:05.0".into(),
                part_id: 0x1007,
                netdev: "eth8".into(),
            }
        );
        std::fs::remove_file(pci.join("net/eth8/dev_port")).unwrap();
        let e = read_sysfs(&ibdev).unwrap_err().to_string();
        assert!(e.contains("no netdev with dev_port 0"), "{e}");
        let e = read_sysfs(&dir.join("ib/none")).unwrap_err().to_string();
        assert!(e.contains("uevent"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
