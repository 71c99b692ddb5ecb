//! Receive-side scaling as a ConnectX port does it: the Microsoft Toeplitz hash over the
//! addresses (and ports) of a received frame, with a 40-byte key and a choice of hashed fields.

use std::fmt;
use std::ops::{BitAnd, BitOr, BitOrAssign};

/// The key length and the default key are the port vocabulary the driver shares.
pub use mlx4_prm::{DEFAULT_RSS_KEY, RSS_KEY_LEN};

/// Which packet types are hashed, and over which fields. A frame whose type is not enabled gets
/// hash 0 (and so the first entry of the steering table). `Default` is [`RssFields::NONE`], as
/// for any flag set; the device itself starts with [`RssFields::ALL`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RssFields(u32);

impl RssFields {
    /// No hashing at all.
    pub const NONE: RssFields = RssFields(0);
    /// IPv4: source and destination address (also for TCP/UDP whose own flag is off).
    pub const IPV4: RssFields = RssFields(1 << 0);
    /// TCP over IPv4: addresses, then source and destination port.
    pub const IPV4_TCP: RssFields = RssFields(1 << 1);
    /// UDP over IPv4: addresses, then source and destination port.
    pub const IPV4_UDP: RssFields = RssFields(1 << 2);
    /// IPv6: source and destination address (also for TCP/UDP whose own flag is off).
    pub const IPV6: RssFields = RssFields(1 << 3);
    /// TCP over IPv6: addresses, then ports.
    pub const IPV6_TCP: RssFields = RssFields(1 << 4);
    /// UDP over IPv6: addresses, then ports.
    pub const IPV6_UDP: RssFields = RssFields(1 << 5);
    /// Every field set above (the default).
    pub const ALL: RssFields = RssFields(0x3f);

    const NAMES: [(RssFields, &'static str); 6] = [
        (RssFields::IPV4, "IPV4"),
        (RssFields::IPV4_TCP, "IPV4_TCP"),
        (RssFields::IPV4_UDP, "IPV4_UDP"),
        (RssFields::IPV6, "IPV6"),
        (RssFields::IPV6_TCP, "IPV6_TCP"),
        (RssFields::IPV6_UDP, "IPV6_UDP"),
    ];

    /// The raw bits (bit 0 IPV4 ... bit 5 IPV6_UDP).
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// From raw bits; bits without a meaning are dropped.
    pub const fn from_bits_truncate(bits: u32) -> RssFields {
        RssFields(bits & RssFields::ALL.0)
    }

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: RssFields) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether no flag is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitOr for RssFields {
    type Output = RssFields;
    fn bitor(self, rhs: RssFields) -> RssFields {
        RssFields(self.0 | rhs.0)
    }
}

impl BitAnd for RssFields {
    type Output = RssFields;
    fn bitand(self, rhs: RssFields) -> RssFields {
        RssFields(self.0 & rhs.0)
    }
}

impl BitOrAssign for RssFields {
    fn bitor_assign(&mut self, rhs: RssFields) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for RssFields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("RssFields(NONE)");
        }
        f.write_str("RssFields(")?;
        let mut first = true;
        for (flag, name) in RssFields::NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        f.write_str(")")
    }
}

/// The Toeplitz hash of `input` under `key`: for every input bit set, XOR in the 32 key bits
/// starting at that bit's position. `input` is at most `RSS_KEY_LEN - 4` bytes. The definition,
/// against which [`Toeplitz`] is tested.
#[cfg(test)]
pub(crate) fn toeplitz(key: &[u8; RSS_KEY_LEN], input: &[u8]) -> u32 {
    debug_assert!(input.len() <= RSS_KEY_LEN - 4);
    let mut hash = 0u32;
    let mut window = u32::from_be_bytes([key[0], key[1], key[2], key[3]]);
    for (i, &byte) in input.iter().enumerate() {
        let next = key.get(i + 4).copied().unwrap_or(0);
        for bit in (0..8).rev() {
            if byte >> bit & 1 != 0 {
                hash ^= window;
            }
            window = window << 1 | u32::from(next >> bit & 1);
        }
    }
    hash
}

/// Input bytes the hash covers at most (two IPv6 addresses and two ports).
const MAX_INPUT: usize = RSS_KEY_LEN - 4;

/// The Toeplitz hash under one key, as a table: for each input byte position and value, the
/// XOR of the key windows its set bits select. Hashing is then one lookup per byte instead of
/// one step per bit (36 KiB per key, of which an IPv4 tuple touches 12 rows); the table is
/// rebuilt when the key changes.
#[derive(Clone)]
pub(crate) struct Toeplitz {
    table: Box<[[u32; 256]; MAX_INPUT]>,
}

impl Toeplitz {
    pub(crate) fn new(key: &[u8; RSS_KEY_LEN]) -> Toeplitz {
        let mut table = Box::new([[0u32; 256]; MAX_INPUT]);
        // The window of input bit `b` is the 32 key bits starting at bit `b`.
        let window = |b: usize| {
            let k = |i: usize| u64::from(key.get(i).copied().unwrap_or(0));
            let at = b / 8;
            let bits = k(at) << 32 | k(at + 1) << 24 | k(at + 2) << 16 | k(at + 3) << 8 | k(at + 4);
            (bits >> (8 - b % 8)) as u32
        };
        for (pos, row) in table.iter_mut().enumerate() {
            let bit = |i: usize| window(pos * 8 + i);
            for v in 1..256usize {
                // Every value is a smaller one with its lowest set bit added; the most
                // significant bit of the byte is input bit 0 of the position.
                let low = v.trailing_zeros() as usize;
                row[v] = row[v & (v - 1)] ^ bit(7 - low);
            }
        }
        Toeplitz { table }
    }

    /// The hash of `input` (at most `RSS_KEY_LEN - 4` bytes).
    #[cfg(test)]
    pub(crate) fn hash(&self, input: &[u8]) -> u32 {
        input
            .iter()
            .zip(self.table.iter())
            .fold(0, |h, (&b, row)| h ^ row[usize::from(b)])
    }

    /// What `bytes`, standing at byte `start` of the input, add to its hash: the hash of an
    /// input is the XOR of its parts' contributions. `start + N` is at most `RSS_KEY_LEN - 4`.
    #[inline(always)]
    pub(crate) fn hash_at<const N: usize>(&self, start: usize, bytes: &[u8; N]) -> u32 {
        self.table[start..start + N]
            .iter()
            .zip(bytes)
            .fold(0, |h, (row, &b)| h ^ row[usize::from(b)])
    }
}

impl fmt::Debug for Toeplitz {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Toeplitz(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_combine_and_print() {
        let f = RssFields::IPV4 | RssFields::IPV6_UDP;
        assert!(f.contains(RssFields::IPV4) && !f.contains(RssFields::IPV4_TCP));
        assert_eq!(format!("{f:?}"), "RssFields(IPV4 | IPV6_UDP)");
        assert_eq!(format!("{:?}", RssFields::NONE), "RssFields(NONE)");
        assert_eq!(RssFields::from_bits_truncate(!0), RssFields::ALL);
        let mut g = RssFields::NONE;
        g |= RssFields::IPV4_TCP;
        assert_eq!(g.bits(), 2);
        assert_eq!(RssFields::ALL & g, g);
        assert_eq!(RssFields::default(), RssFields::NONE);
    }

    #[test]
    fn empty_input_hashes_to_zero() {
        let table = Toeplitz::new(&DEFAULT_RSS_KEY);
        let mut x = 0x2545_f491u32;
        for len in 0..=MAX_INPUT {
            let input: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            assert_eq!(
                table.hash(&input),
                toeplitz(&DEFAULT_RSS_KEY, &input),
                "{input:x?}"
            );
        }
        // Parts hashed where they stand add up to the whole (the receive path's way).
        let input: [u8; 12] = std::array::from_fn(|i| (i * 37 + 11) as u8);
        let parts = table.hash_at::<8>(0, input[..8].try_into().unwrap())
            ^ table.hash_at::<4>(8, input[8..].try_into().unwrap());
        assert_eq!(parts, toeplitz(&DEFAULT_RSS_KEY, &input));
        assert_eq!(toeplitz(&DEFAULT_RSS_KEY, &[]), 0);
        // A single set MSB picks exactly the key's first 32 bits.
        assert_eq!(toeplitz(&DEFAULT_RSS_KEY, &[0x80]), 0x6d5a_56da);
    }
}
