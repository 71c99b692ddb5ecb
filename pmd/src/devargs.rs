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
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Devargs, DevargsError> {
        s.parse()
    }

    #[test]
    fn empty_gives_defaults() {
        let d = parse("").unwrap();
        assert_eq!(d, Devargs::default());
        assert_eq!(d.txq_inline, 104);
        assert_eq!(d.bf, BfMode::Auto);
        assert_eq!(d.wc, WcMode::On);
        assert_eq!(d.wire.as_str(), "null");
        assert_eq!(d.device_loop, DeviceLoop::Lcore);
    }

    #[test]
    fn device_loops() {
        for l in [
            DeviceLoop::Lcore,
            DeviceLoop::PortThread,
            DeviceLoop::ProcessThread,
        ] {
            let d = parse(&format!("device_loop={}", l.as_str())).unwrap();
            assert_eq!(d.device_loop, l);
        }
        for v in ["", "thread", "Lcore", "1"] {
            let e = parse(&format!("device_loop={v}")).unwrap_err();
            assert_eq!((e.key.as_str(), e.value.as_str()), ("device_loop", v));
            assert_eq!(e.allowed, allowed("device_loop"));
        }
    }

    #[test]
    fn all_keys() {
        let d = parse(
            "wire=pcap:/tmp/x.pcap,wc=off,bf=on,txq_inline=0,mac=02:00:00:aa:bb:0c,busy_poll=1,device_loop=process,",
        )
        .unwrap();
        assert_eq!(d.device_loop, DeviceLoop::ProcessThread);
        assert_eq!(d.wire.as_str(), "pcap:/tmp/x.pcap");
        assert_eq!(d.wc, WcMode::Off);
        assert_eq!(d.bf, BfMode::On);
        assert_eq!(d.txq_inline, 0);
        assert_eq!(d.mac, Some([2, 0, 0, 0xaa, 0xbb, 0x0c]));
        assert!(d.busy_poll);
        assert!(!d.tx_db_avoid);
        assert!(parse("tx_db_avoid=1").unwrap().tx_db_avoid);
        assert!(parse("tx_db_avoid=2").is_err());
    }

    #[test]
    fn doorbell_ns() {
        assert_eq!(Devargs::default().doorbell_ns, 0);
        assert_eq!(parse("doorbell_ns=177").unwrap().doorbell_ns, 177);
        assert_eq!(parse("doorbell_ns=100000").unwrap().doorbell_ns, 100_000);
        for v in ["100001", "-1", "+5", "", "1e3", "0x10", "4294967296"] {
            let e = parse(&format!("doorbell_ns={v}")).unwrap_err();
            assert_eq!(
                (e.key.as_str(), e.allowed.as_str()),
                ("doorbell_ns", allowed("doorbell_ns"))
            );
        }
    }

    #[test]
    fn faults() {
        let d = parse("faults=tx_error:100/rx_error:7/db_drop:64/flap:5000+100").unwrap();
        assert_eq!(d.faults.tx_error_every, 100);
        assert_eq!(d.faults.rx_error_every, 7);
        assert_eq!(d.faults.doorbell_drop_every, 64);
        assert_eq!(
            (d.faults.link_flap_every, d.faults.link_flap_frames),
            (5000, 100)
        );
        assert!(parse("").unwrap().faults.none());
        for v in [
            "",
            "tx_error",
            "tx_error:+1",
            "tx_error:1/tx_error:2",
            "flap:5",
            "rx_error:1/",
            "smoke:1",
        ] {
            let e = parse(&format!("faults={v}")).unwrap_err();
            assert_eq!((e.key.as_str(), e.value.as_str()), ("faults", v));
            assert!(e.allowed.contains("tx_error:N"), "{e}");
        }
        let e = parse("faults=tx_error:x").unwrap_err().to_string();
        assert!(e.contains("\"x\" is not a count"), "{e}");
    }

    #[test]
    fn wires() {
        for w in [
            "null",
            "loop",
            "peer:net_mlx4rs1",
            "pcap:/a/b.pcap",
            "tap:mlx4rs0",
        ] {
            assert_eq!(parse(&format!("wire={w}")).unwrap().wire.as_str(), w);
        }
        for w in ["", "nul", "peer:", "pcap:", "tap:", "ether"] {
            let e = parse(&format!("wire={w}")).unwrap_err();
            assert_eq!(e.key, "wire");
            assert_eq!(e.value, w);
        }
    }

    #[test]
    fn unknown_key_names_the_key_and_lists_known_ones() {
        let e = parse("wire=loop,colour=blue").unwrap_err();
        assert_eq!(e.key, "colour");
        assert_eq!(e.value, "blue");
        let msg = e.to_string();
        assert!(msg.contains("colour=\"blue\""), "{msg}");
        assert!(msg.contains("txq_inline"), "{msg}");
    }

    #[test]
    fn key_without_value() {
        let e = parse("bf").unwrap_err();
        assert_eq!(e.key, "bf");
        assert!(e.allowed.contains("key=value"));
    }

    #[test]
    fn duplicate_key() {
        let e = parse("bf=on,bf=off").unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_str()), ("bf", "off"));
        assert!(e.allowed.contains("twice"));
    }

    #[test]
    fn bad_enums() {
        for (k, v) in [
            ("wc", "maybe"),
            ("wc", "ON"),
            ("bf", "yes"),
            ("bf", ""),
            ("busy_poll", "2"),
        ] {
            let e = parse(&format!("{k}={v}")).unwrap_err();
            assert_eq!((e.key.as_str(), e.value.as_str()), (k, v));
            assert_eq!(e.allowed, allowed(k));
        }
    }

    #[test]
    fn inline_bounds() {
        assert_eq!(parse("txq_inline=17").unwrap().txq_inline, 17);
        assert_eq!(parse("txq_inline=928").unwrap().txq_inline, 928);
        for v in [
            "1", "16", "929", "65536", "-1", "abc", "1e2", "+17", "0x20", "",
        ] {
            let e = parse(&format!("txq_inline={v}")).unwrap_err();
            assert_eq!((e.key.as_str(), e.value.as_str()), ("txq_inline", v));
        }
    }

    #[test]
    fn macs() {
        assert_eq!(parse_mac("02:00:00:00:00:01"), Some([2, 0, 0, 0, 0, 1]));
        assert_eq!(
            parse_mac("0A:1b:2C:3d:4E:5f"),
            Some([0x0a, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f])
        );
        for m in [
            "",
            "02:00:00:00:00",
            "02:00:00:00:00:01:02",
            "01:00:5e:00:00:01",
            "ff:ff:ff:ff:ff:ff",
            "00:00:00:00:00:00",
            "2:0:0:0:0:1",
            "02:00:00:00:00:+1",
            "+2:00:00:00:00:01",
            "02:00:00:00:00:-1",
            " 2:00:00:00:00:01",
            "02-00-00-00-00-01",
            "zz:00:00:00:00:01",
        ] {
            assert_eq!(parse_mac(m), None, "{m}");
            assert_eq!(parse(&format!("mac={m}")).unwrap_err().key, "mac");
        }
    }

    #[test]
    fn nothing_is_trimmed() {
        // DPDK's kvargs keeps whitespace; so do we, and refuse it.
        let e = parse("bf =on").unwrap_err();
        assert_eq!(e.key, "bf ");
        assert!(e.allowed.starts_with("unknown key"), "{e}");
        assert_eq!(parse(" bf=on").unwrap_err().key, " bf");
        for (item, key) in [
            ("wire=null\u{a0}", "wire"),
            ("bf=on ", "bf"),
            ("wc=\toff", "wc"),
            ("busy_poll=1\n", "busy_poll"),
            ("mac=02:00:00:00:00:01\u{2003}", "mac"),
        ] {
            let e = parse(item).unwrap_err();
            assert_eq!(e.key, key, "{item:?}");
            assert!(e.allowed.contains("whitespace"), "{e}");
        }
    }

    #[test]
    fn messages_escape_control_characters() {
        let e = parse("wire=tap:a\x1b[2Jb").unwrap_err();
        let msg = e.to_string();
        assert!(!msg.chars().any(char::is_control), "{msg:?}");
        assert!(msg.contains("\\u{1b}"), "{msg}");
        let e = parse("colour\x07=x").unwrap_err();
        assert!(!e.to_string().chars().any(char::is_control));
    }

    fn scratch_dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("mlx4rs-devargs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn targets(wire: &str) -> Result<(), DevargsError> {
        parse(&format!("wire={wire}"))?.check_targets()
    }

    #[test]
    fn pcap_targets_are_checked_and_created_at_probe() {
        let dir = scratch_dir("pcap");
        let file = dir.join("out.pcap");
        targets(&format!("pcap:{}", file.display())).unwrap();
        assert!(file.is_file(), "created at probe");
        std::fs::write(&file, b"old").unwrap();
        targets(&format!("pcap:{}", file.display())).unwrap();
        assert_eq!(
            std::fs::read(&file).unwrap(),
            b"old",
            "not truncated before start"
        );
        let long = format!("pcap:{}/{}", dir.display(), "x".repeat(4096));
        let missing = format!("pcap:{}/no/such/dir/x.pcap", dir.display());
        let a_dir = format!("pcap:{}", dir.display());
        for (bad, why) in [
            (missing.as_str(), "existing directory"),
            (a_dir.as_str(), "directory"),
            ("pcap:/proc", "directory"),
            ("pcap:/dev/full", "special file"),
            (long.as_str(), "cannot"),
        ] {
            let e = targets(bad).unwrap_err();
            assert_eq!((e.key.as_str(), e.value.as_str()), ("wire", bad));
            assert!(e.allowed.contains(why), "{bad}: {e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tap_names_are_checked_at_probe() {
        targets("tap:mlx4rs-t0").unwrap();
        targets("tap:a.b_c-9").unwrap();
        for bad in [
            "tap:a/b",
            "tap:.",
            "tap:..",
            "tap:a:b",
            "tap:%s%s%n",
            "tap:abcdefghijklmnop",
            "tap:lo",
        ] {
            let e = targets(bad).unwrap_err();
            assert_eq!((e.key.as_str(), e.value.as_str()), ("wire", bad));
        }
        assert!(targets("tap:lo").unwrap_err().allowed.contains("not a TAP"));
    }

    /// xorshift64*: a fixed seed gives the same strings on every machine.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[(self.next() % from.len() as u64) as usize]
        }
    }

    #[test]
    fn fuzz_every_rejection_names_its_key() {
        let dir = scratch_dir("fuzz");
        let pcap = format!("pcap:{}/f.pcap", dir.display());
        let keys = [
            "wire",
            "wc",
            "bf",
            "txq_inline",
            "mac",
            "busy_poll",
            "faults",
            "colour",
            "",
            "bf ",
            "WIRE",
        ];
        let values = [
            "null",
            "loop",
            "peer:net_mlx4rs1",
            pcap.as_str(),
            "pcap:/proc",
            "tap:mlx4rs-f",
            "tap:lo",
            "tap:a/b",
            "on",
            "off",
            "auto",
            "0",
            "1",
            "17",
            "104",
            "928",
            "929",
            "+17",
            "-1",
            "02:00:00:00:00:01",
            "02:00:00:00:00:+1",
            "ff:ff:ff:ff:ff:ff",
            "",
            " on",
            "on\u{a0}",
            "\x1b",
            "=",
            "a=b",
            "\u{1F600}",
            "tx_error:5",
            "rx_error:3/db_drop:2",
            "flap:10+2",
            "flap:10",
            "tx_error:-5",
        ];
        let mut rng = Rng(0x6d6c_7834_7273);
        let (mut ok, mut rejected) = (0, 0);
        for _ in 0..2000 {
            let n = rng.next() % 5;
            let mut items = Vec::new();
            for _ in 0..n {
                let item = match rng.next() % 8 {
                    0 => rng.pick(&keys).to_owned(),
                    1 => String::new(),
                    _ => format!("{}={}", rng.pick(&keys), rng.pick(&values)),
                };
                items.push(item);
            }
            let text = items.join(",");
            match parse(&text).and_then(|d| d.check_targets().map(|()| d)) {
                Ok(_) => ok += 1,
                Err(e) => {
                    rejected += 1;
                    // The key it names is one of the items, exactly as written.
                    assert!(
                        items
                            .iter()
                            .any(|i| i == &e.key || i.starts_with(&format!("{}=", e.key))),
                        "{text:?} rejected naming {:?}",
                        e.key
                    );
                    let msg = e.to_string();
                    assert!(!msg.chars().any(char::is_control), "{msg:?}");
                    assert!(!e.allowed.is_empty());
                }
            }
        }
        assert!(
            ok > 100 && rejected > 100,
            "both outcomes exercised: {ok} ok, {rejected} rejected"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
