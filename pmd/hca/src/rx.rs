//! What the port does to a received frame before an RQ sees it: the destination-MAC filter
//! (a unicast table, a multicast list, promiscuous and all-multicast switches), the VLAN
//! filter, the MTU check and RSS (a Toeplitz hash over a redirection table of RQs).

use crate::counters::Counters;
use crate::net;
use crate::rss::{RssFields, Toeplitz, DEFAULT_RSS_KEY, RSS_KEY_LEN};

/// The MTU a port starts with (standard Ethernet).
pub(crate) const DEFAULT_MTU: u16 = 1500;

/// Unicast addresses the port filters on, at most (mlx4's `MLX4_MAX_MAC_ADDRESSES`).
pub const MAX_MAC_ADDRS: usize = 128;
/// Multicast addresses the port filters on, at most.
pub const MAX_MC_ADDRS: usize = 128;
/// VLAN IDs: 12 bits.
const VLAN_IDS: usize = 4096;

/// The port's receive filters, as the driver sets them and reads them back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RxFilter {
    /// Deliver every frame, whatever its destination or VLAN (the state of a new adapter).
    pub promisc: bool,
    /// Deliver every multicast frame.
    pub allmulti: bool,
    /// Unicast destinations delivered (at most [`MAX_MAC_ADDRS`]).
    pub unicast: Vec<[u8; 6]>,
    /// Multicast destinations delivered without all-multicast (at most [`MAX_MC_ADDRS`]).
    pub multicast: Vec<[u8; 6]>,
    /// Tagged frames must carry a VLAN ID of `vlans`.
    pub vlan_filter: bool,
    /// VLAN IDs of the filter, ascending.
    pub vlans: Vec<u16>,
}

impl Default for RxFilter {
    fn default() -> Self {
        RxFilter {
            promisc: true,
            allmulti: false,
            unicast: Vec::new(),
            multicast: Vec::new(),
            vlan_filter: false,
            vlans: Vec::new(),
        }
    }
}

/// Flow control as the port is configured: stored and reported. The
/// model's wires have no flow control of their own: a full receiver drops and counts (the
/// `rx_drops_*` counters), no pause frame is ever sent, and one received is just a frame.
pub use mlx4_prm::FlowControl;

/// What the port filters on, in the form a received frame is checked against.
#[derive(Debug, Clone)]
pub(crate) struct Filters {
    pub(crate) promisc: bool,
    pub(crate) allmulti: bool,
    pub(crate) unicast: Vec<[u8; 6]>,
    pub(crate) multicast: Vec<[u8; 6]>,
    pub(crate) vlan_filter: bool,
    /// One bit per VLAN ID.
    pub(crate) vlans: Box<[u64; VLAN_IDS / 64]>,
}

impl Default for Filters {
    fn default() -> Self {
        Filters {
            promisc: true,
            allmulti: false,
            unicast: Vec::new(),
            multicast: Vec::new(),
            vlan_filter: false,
            vlans: Box::new([0; VLAN_IDS / 64]),
        }
    }
}

impl Filters {
    /// Whether the destination-MAC filter passes `dst`. Broadcast always passes.
    fn mac_passes(&self, dst: &[u8]) -> bool {
        if self.promisc || dst == [0xff; 6] {
            return true;
        }
        if dst[0] & 1 != 0 {
            self.allmulti || self.multicast.iter().any(|m| m == dst)
        } else {
            self.unicast.iter().any(|m| m == dst)
        }
    }

    /// Whether the VLAN filter passes `frame`: untagged and priority-tagged (VLAN ID 0) frames
    /// pass, tagged ones only with a VLAN ID of the table. A promiscuous port filters nothing.
    fn vlan_passes(&self, frame: &[u8]) -> bool {
        if !self.vlan_filter || self.promisc {
            return true;
        }
        match net::outer_vlan(frame) {
            None | Some(0) => true,
            Some(vid) => self.has_vlan(vid),
        }
    }

    pub(crate) fn has_vlan(&self, vid: u16) -> bool {
        let v = usize::from(vid & 0xfff);
        self.vlans[v / 64] >> (v % 64) & 1 != 0
    }

    pub(crate) fn set_vlan(&mut self, vid: u16, on: bool) {
        let v = usize::from(vid & 0xfff);
        if on {
            self.vlans[v / 64] |= 1 << (v % 64);
        } else {
            self.vlans[v / 64] &= !(1 << (v % 64));
        }
    }

    pub(crate) fn snapshot(&self) -> RxFilter {
        RxFilter {
            promisc: self.promisc,
            allmulti: self.allmulti,
            unicast: self.unicast.clone(),
            multicast: self.multicast.clone(),
            vlan_filter: self.vlan_filter,
            vlans: (0..VLAN_IDS as u16).filter(|&v| self.has_vlan(v)).collect(),
        }
    }
}

/// The port's receive settings.
#[derive(Debug, Clone)]
pub(crate) struct RxConfig {
    /// RX indirection table (RQ QPNs); empty = all RQs in QPN order.
    pub(crate) steering: Vec<u32>,
    pub(crate) rss_key: [u8; RSS_KEY_LEN],
    /// `rss_key` as a hashing table.
    pub(crate) toeplitz: Toeplitz,
    pub(crate) rss_fields: RssFields,
    /// The last frame's headers and hash under `toeplitz` and `rss_fields`: forgotten when
    /// they change.
    pub(crate) memo: net::RxMemo,
    /// Destination-MAC and VLAN filters.
    pub(crate) filter: Filters,
    /// Largest L3 length received.
    pub(crate) mtu: u16,
    /// Only flow rules deliver: frames none matches are dropped.
    pub(crate) flows_only: bool,
}

impl Default for RxConfig {
    fn default() -> Self {
        RxConfig {
            steering: Vec::new(),
            rss_key: DEFAULT_RSS_KEY,
            toeplitz: Toeplitz::new(&DEFAULT_RSS_KEY),
            rss_fields: RssFields::ALL,
            memo: net::RxMemo::default(),
            filter: Filters::default(),
            mtu: DEFAULT_MTU,
            flows_only: false,
        }
    }
}

impl RxConfig {
    /// Whether the MAC and VLAN filters pass `frame` (dropping and counting it if not).
    #[inline]
    pub(crate) fn filters_pass(&self, frame: &[u8], counters: &mut Counters) -> bool {
        // A promiscuous port passes every frame with a destination (the VLAN filter too).
        if self.filter.promisc && !self.flows_only && frame.len() >= 6 {
            return true;
        }
        self.filters_pass_slow(frame, counters)
    }

    #[inline(never)]
    fn filters_pass_slow(&self, frame: &[u8], counters: &mut Counters) -> bool {
        if self.flows_only || frame.len() < 6 || !self.filter.mac_passes(&frame[..6]) {
            counters.rx_drops_filter += 1;
            return false;
        }
        if !self.filter.vlan_passes(frame) {
            counters.rx_drops_vlan += 1;
            return false;
        }
        true
    }

    /// Whether a frame of L3 length `l3_len` ([`net::l3_len`], found with its headers) fits
    /// the MTU (dropping and counting it if not).
    #[inline]
    pub(crate) fn mtu_passes(&self, l3_len: usize, counters: &mut Counters) -> bool {
        if l3_len > usize::from(self.mtu) {
            counters.rx_drops_mtu += 1;
            return false;
        }
        true
    }

    /// The QPN of the RQ a frame with `hash` goes to. `rqs` lists every RQ in QPN order, for an
    /// empty steering table; `None` when there is none.
    pub(crate) fn steer(&self, hash: u32, rqs: &[u32]) -> Option<u32> {
        let table = if self.steering.is_empty() {
            rqs
        } else {
            &self.steering
        };
        table.get(hash as usize % table.len().max(1)).copied()
    }
}
