//! What the RSS hash of the mlx4 family takes: its Toeplitz key and the packet fields it
//! covers.

pub use mlx4_prm::{DEFAULT_RSS_KEY, RSS_KEY_LEN};

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
