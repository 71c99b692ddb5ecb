//! What the RSS hash of the mlx4 family takes: its Toeplitz key and the packet fields it
//! covers.

/// The Toeplitz key length of the mlx4 family (bytes).
pub const RSS_KEY_LEN: usize = 40;
/// The well-known default Toeplitz key (also mlx4's historic default).
pub const DEFAULT_RSS_KEY: [u8; RSS_KEY_LEN] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// Packet fields the RSS hash covers, as the device can hash them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RssHash(u8);

impl RssHash {
    pub const NONE: RssHash = RssHash(0);
    /// IPv4 source and destination addresses.
    pub const IPV4: RssHash = RssHash(1 << 0);
    /// IPv4 addresses and TCP ports.
    pub const IPV4_TCP: RssHash = RssHash(1 << 1);
    /// IPv4 addresses and UDP ports.
    pub const IPV4_UDP: RssHash = RssHash(1 << 2);
    pub const IPV6: RssHash = RssHash(1 << 3);
    pub const IPV6_TCP: RssHash = RssHash(1 << 4);
    pub const IPV6_UDP: RssHash = RssHash(1 << 5);

    pub fn contains(self, other: RssHash) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for RssHash {
    type Output = RssHash;
    fn bitor(self, o: RssHash) -> RssHash {
        RssHash(self.0 | o.0)
    }
}

impl std::ops::BitOrAssign for RssHash {
    fn bitor_assign(&mut self, o: RssHash) {
        self.0 |= o.0;
    }
}
