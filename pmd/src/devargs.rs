//! Device arguments of a `net_mlx4rs` port, parsed strictly.
//!
//! `--vdev net_mlx4rs0,wire=loop,bf=off` hands us `wire=loop,bf=off`. Every key is known, every
//! value checked; the first problem fails the probe of that port with one message naming the key,
//! the value and what is allowed.

use std::fmt;
use std::str::FromStr;

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
        write!(
            f,
            "invalid devarg {}={:?}: {}",
            self.key, self.value, self.allowed
        )
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
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k.trim(), v.trim()),
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
            match key {
                "wire" => {
                    crate::hw::soft::check_wire(value).map_err(|e| err(key, value, e))?;
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
                    let n: u16 = value.parse().map_err(|_| bad())?;
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
                _ => unreachable!("key checked against KEYS"),
            }
        }
        Ok(d)
    }
}

/// Parses `aa:bb:cc:dd:ee:ff`; refuses multicast (which includes broadcast) and all-zero.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in mac.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
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
    }

    #[test]
    fn all_keys() {
        let d = parse(
            "wire=pcap:/tmp/x.pcap, wc=off,bf=on,txq_inline=0,mac=02:00:00:aa:bb:0c,busy_poll=1",
        )
        .unwrap();
        assert_eq!(d.wire.as_str(), "pcap:/tmp/x.pcap");
        assert_eq!(d.wc, WcMode::Off);
        assert_eq!(d.bf, BfMode::On);
        assert_eq!(d.txq_inline, 0);
        assert_eq!(d.mac, Some([2, 0, 0, 0xaa, 0xbb, 0x0c]));
        assert!(d.busy_poll);
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
        for v in ["1", "16", "929", "65536", "-1", "abc", "1e2"] {
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
            "02-00-00-00-00-01",
            "zz:00:00:00:00:01",
        ] {
            assert_eq!(parse_mac(m), None, "{m}");
            assert_eq!(parse(&format!("mac={m}")).unwrap_err().key, "mac");
        }
    }
}
