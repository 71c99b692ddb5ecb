//! Device arguments of a `net_mlx4rs` port, parsed strictly.
//!
//! `--vdev net_mlx4rs0,wire=loop,bf=off` hands us `wire=loop,bf=off`. Every key is known, every
//! value checked; the first problem fails the probe of that port with one message naming the key,
//! the value (control characters escaped) and what is allowed.
//!
//! Strict as DPDK's own kvargs: keys and values are taken exactly as given. Nothing is trimmed,
//! so `bf =on` names an unknown key `"bf "`, and whitespace or control characters inside a value
//! are refused rather than silently dropped. Numbers are plain decimal digits (no sign), MAC
//! bytes two hex digits each. Wire targets are checked at probe too ([`Devargs::check_targets`]):
//! a pcap file is created there (the wire truncates it when the port starts) and a TAP name must
//! be one the kernel takes and not an existing interface of another kind, so a bad target fails
//! the probe of its port, not a later `port start` of every port.

use std::fmt;
use std::str::FromStr;

// The software HCA's settings (`wire`, `faults`) are checked by the model's own parsers, named
// here from the model's crate rather than through the backend (`hw::soft`), which is built on
// these devargs.
use mlx4_hca::{Faults, Wire};

/// Largest inline threshold: the inline data that fits a WQE of 63 DS (1008 bytes) once the
/// control segment and one 4-byte header per 64-byte chunk are taken out: 44 + 14 * 60 + 44.
pub const MAX_TXQ_INLINE: u16 = 928;
/// mlx4_en's default threshold (`MAX_INLINE` = 128 - 16 - 4 - 4).
pub const DEFAULT_TXQ_INLINE: u16 = 104;
/// Below this mlx4_en refuses to inline (it pads short frames to 17 bytes).
pub const MIN_TXQ_INLINE: u16 = 17;

/// Whether the platform maps the BlueFlame page write-combining (a property of the emulated
/// platform: a VM without WC is `off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcMode {
    On,
    Off,
}

/// Which transmit path the operator wants; `Auto` lets the capability check decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BfMode {
    Auto,
    On,
    Off,
}

/// Where the software HCA's device loop runs (`device_loop=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceLoop {
    /// In the lcore that polls the port: the burst functions run the device after `tx_burst`
    /// posts and before `rx_burst` polls. No thread of its own, so on few cores the figures
    /// measure the driver rather than the scheduler (the default).
    Lcore,
    /// A thread per port.
    PortThread,
    /// One thread for every port of the process that asks for it.
    ProcessThread,
}

impl DeviceLoop {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceLoop::Lcore => "lcore",
            DeviceLoop::PortThread => "port",
            DeviceLoop::ProcessThread => "process",
        }
    }
}

/// A validated `wire=` value. Kept as text because a wire is opened when the port starts, and a
/// `peer:` partner may not exist yet at probe time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireSpec(String);

impl WireSpec {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Devargs {
    pub wire: WireSpec,
    pub wc: WcMode,
    pub bf: BfMode,
    pub txq_inline: u16,
    pub mac: Option<[u8; 6]>,
    /// Device loop spins without backing off (latency runs).
    pub busy_poll: bool,
    pub device_loop: DeviceLoop,
    /// Faults the software HCA injects from the port's probe on (none by default).
    pub faults: Faults,
    /// The software HCA is a ConnectX-3 Pro: VXLAN inner checksums on send, inner verdicts on
    /// receive.
    pub pro: bool,
    /// TX doorbell avoidance (`txq::DbAvoid`), off by default.
    pub tx_db_avoid: bool,
    /// Nanoseconds the software HCA spends on each doorbell and BlueFlame burst (0 by
    /// default): what a UAR write costs a card, so that skipping one pays in the model too.
    pub doorbell_ns: u32,
}

impl Default for Devargs {
    fn default() -> Self {
        Devargs {
            wire: WireSpec("null".into()),
            wc: WcMode::On,
            bf: BfMode::Auto,
            txq_inline: DEFAULT_TXQ_INLINE,
            mac: None,
            busy_poll: false,
            device_loop: DeviceLoop::Lcore,
            faults: Faults::default(),
            pro: false,
            tx_db_avoid: false,
            doorbell_ns: 0,
        }
    }
}

/// A devargs problem: which key, which value, what is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevargsError {
    pub key: String,
    pub value: String,
    pub allowed: String,
}

impl fmt::Display for DevargsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One log line: a value of kilobytes is cut, control characters are escaped.
        const SHOWN: usize = 96;
        write!(f, "invalid devarg {}=", self.key.escape_debug())?;
        if self.value.chars().count() > SHOWN {
            let head: String = self.value.chars().take(SHOWN).collect();
            write!(f, "{head:?}... ({} bytes)", self.value.len())?;
        } else {
            write!(f, "{:?}", self.value)?;
        }
        write!(f, ": {}", self.allowed)
    }
}

impl std::error::Error for DevargsError {}

/// Keys this driver understands, with what each allows.
pub const KEYS: &[(&str, &str)] = &[
    (
        "wire",
        "null, loop, peer:<vdev name>, pcap:<path> or tap:<ifname>",
    ),
    ("wc", "on or off"),
    ("bf", "auto, on or off"),
    ("txq_inline", "0 (no inlining) or 17..=928 bytes"),
    ("mac", "a unicast MAC address like 02:00:00:00:00:01"),
    ("busy_poll", "0 or 1"),
    ("pro", "0 (ConnectX-3) or 1 (ConnectX-3 Pro)"),
    (
        "device_loop",
        "lcore (the polling lcore runs the device), port (a thread per port) or process (one thread for the process's ports)",
    ),
    (
        "faults",
        "faults for the software HCA to inject, items separated by '/': tx_error:N (every Nth send WQE completes in error), rx_error:N (every Nth received frame gets a buffer error), db_drop:N (every Nth send doorbell is lost), flap:N+M (the link goes down after N frames sent, up after M more), cqe_drop:N (every Nth good send completion is lost), cqe_dup:N (every Nth good send completion is written twice); N and M decimal",
    ),
    (
        "tx_db_avoid",
        "0 or 1 (1: a burst skips its doorbell while the last one is outstanding)",
    ),
    (
        "doorbell_ns",
        "0..=100000 nanoseconds the software HCA spends on each doorbell (177: a UAR write)",
    ),
];

fn allowed(key: &str) -> &'static str {
    KEYS.iter()
        .find(|(k, _)| *k == key)
        .map(|(_, a)| *a)
        .unwrap_or("")
}

fn err(key: &str, value: &str, allowed_text: impl Into<String>) -> DevargsError {
    DevargsError {
        key: key.into(),
        value: value.into(),
        allowed: allowed_text.into(),
    }
}

impl FromStr for Devargs {
    type Err = DevargsError;

    fn from_str(s: &str) -> Result<Self, DevargsError> {
        let mut d = Devargs::default();
        let mut seen: Vec<&str> = Vec::new();
        // Empty items (`a=1,,b=2`, a trailing comma) are skipped, as kvargs skips them.
        for item in s.split(',').filter(|i| !i.is_empty()) {
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k, v),
                None => return Err(err(item, "", "every devarg is key=value")),
            };
            if !KEYS.iter().any(|(k, _)| *k == key) {
                let keys: Vec<&str> = KEYS.iter().map(|(k, _)| *k).collect();
                return Err(err(
                    key,
                    value,
                    format!("unknown key; known keys are {}", keys.join(", ")),
                ));
            }
            if seen.contains(&key) {
                return Err(err(key, value, "the key is given twice"));
            }
            seen.push(key);
            let bad = || err(key, value, allowed(key));
            if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(err(
                    key,
                    value,
                    format!(
                        "{}; whitespace and control characters are not allowed",
                        allowed(key)
                    ),
                ));
            }
            match key {
                "wire" => {
                    // Checked without opening anything: a `peer:` may not exist yet.
                    value
                        .parse::<Wire>()
                        .map_err(|e| err(key, value, e.to_string()))?;
                    d.wire = WireSpec(value.to_owned());
                }
                "wc" => {
                    d.wc = match value {
                        "on" => WcMode::On,
                        "off" => WcMode::Off,
                        _ => return Err(bad()),
                    }
                }
                "bf" => {
                    d.bf = match value {
                        "auto" => BfMode::Auto,
                        "on" => BfMode::On,
                        "off" => BfMode::Off,
                        _ => return Err(bad()),
                    }
                }
                "txq_inline" => {
                    let n: u16 = parse_decimal(value).ok_or_else(bad)?;
                    if n != 0 && !(MIN_TXQ_INLINE..=MAX_TXQ_INLINE).contains(&n) {
                        return Err(bad());
                    }
                    d.txq_inline = n;
                }
                "mac" => d.mac = Some(parse_mac(value).ok_or_else(bad)?),
                "busy_poll" => {
                    d.busy_poll = match value {
                        "0" => false,
                        "1" => true,
                        _ => return Err(bad()),
                    }
                }
                "doorbell_ns" => {
                    let n: u32 = value
                        .parse()
                        .ok()
                        .filter(|n| {
                            *n <= MAX_DOORBELL_NS && value.bytes().all(|b| b.is_ascii_digit())
                        })
                        .ok_or_else(bad)?;
                    d.doorbell_ns = n;
                }
                "tx_db_avoid" => {
                    d.tx_db_avoid = match value {
                        "0" => false,
                        "1" => true,
                        _ => return Err(bad()),
                    }
                }
                "pro" => {
                    d.pro = match value {
                        "0" => false,
                        "1" => true,
                        _ => return Err(bad()),
                    }
                }
                "device_loop" => {
                    d.device_loop = match value {
                        "lcore" => DeviceLoop::Lcore,
                        "port" => DeviceLoop::PortThread,
                        "process" => DeviceLoop::ProcessThread,
                        _ => return Err(bad()),
                    }
                }
                "faults" => {
                    // The empty list would be a silent no-op: say so instead.
                    if value.is_empty() {
                        return Err(bad());
                    }
                    d.faults = Faults::parse(value)
                        .map_err(|why| err(key, value, format!("{why}; {}", allowed(key))))?;
                }
                _ => unreachable!("key checked against KEYS"),
            }
        }
        Ok(d)
    }
}

impl Devargs {
    /// Checks the wire's target on this system, at probe: a pcap file must be creatable as a
    /// regular file in an existing directory (it is created now, empty if new, and truncated
    /// when the port starts); a TAP name must be one the kernel accepts and not name an existing
    /// interface that is not a TAP.
    pub fn check_targets(&self) -> Result<(), DevargsError> {
        let spec = self.wire.as_str();
        let checked = if let Some(path) = spec.strip_prefix("pcap:") {
            check_pcap(path)
        } else if let Some(name) = spec.strip_prefix("tap:") {
            check_tap(name)
        } else {
            Ok(())
        };
        checked.map_err(|why| err("wire", spec, why))
    }
}

fn check_pcap(path: &str) -> Result<(), String> {
    let p = std::path::Path::new(path);
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() => {}
        Ok(m) => {
            let kind = if m.is_dir() {
                "directory"
            } else {
                "special file"
            };
            return Err(format!(
                "pcap:<path> must be a regular file; this is a {kind}"
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = p
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            if !dir.is_dir() {
                return Err(format!(
                    "pcap:<path> must be in an existing directory; {:?} is not one",
                    dir.display().to_string()
                ));
            }
        }
        Err(e) => return Err(format!("pcap:<path> cannot be used: {e}")),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
        .map(drop)
        .map_err(|e| format!("pcap:<path> cannot be created: {e}"))
}

/// Longest interface name the kernel takes (IFNAMSIZ less the NUL).
const MAX_IFNAME: usize = 15;

fn check_tap(name: &str) -> Result<(), String> {
    // The kernel refuses empty names, ".", "..", '/', ':' and whitespace; '%' would make it
    // pick a number. Narrower and simpler to state: letters, digits, '-', '_' and '.'.
    let charset = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if name.is_empty() || name.len() > MAX_IFNAME || !charset || name == "." || name == ".." {
        return Err(format!(
            "tap:<ifname> takes 1..={MAX_IFNAME} letters, digits, '-', '_' or '.' (not \".\" or \"..\")"
        ));
    }
    let sys = std::path::Path::new("/sys/class/net").join(name);
    // TUN/TAP interfaces expose tun_flags; anything else of that name is not ours to take.
    if sys.exists() && !sys.join("tun_flags").exists() {
        return Err(format!(
            "tap:<ifname>: interface {name} exists and is not a TAP interface"
        ));
    }
    Ok(())
}

/// Digits only: `str::parse` would also take a leading `+`.
/// Longest time the model may spend on one doorbell: a tenth of a millisecond.
const MAX_DOORBELL_NS: u32 = 100_000;

fn parse_decimal(s: &str) -> Option<u16> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Parses `aa:bb:cc:dd:ee:ff`; refuses multicast (which includes broadcast) and all-zero.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in mac.iter_mut() {
        let p = parts.next()?;
        // Exactly two hex digits: from_str_radix alone would take `+1`.
        if p.len() != 2 || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    if parts.next().is_some() || mac[0] & 1 != 0 || mac == [0; 6] {
        return None;
    }
    Some(mac)
}

#[cfg(test)]
mod tests;
