//! What the port does to a received frame before an RQ sees it: the destination-MAC filter,
//! the MTU check and RSS (a Toeplitz hash over a redirection table of RQs).

use crate::net;
use crate::rss::{RssFields, Toeplitz, DEFAULT_RSS_KEY, RSS_KEY_LEN};
use crate::Counters;

/// The MTU a port starts with (standard Ethernet).
pub(crate) const DEFAULT_MTU: u16 = 1500;

/// What a non-promiscuous port accepts besides broadcast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MacFilter {
    pub(crate) mac: [u8; 6],
    pub(crate) allmulti: bool,
}

impl MacFilter {
    fn accepts(&self, dst: &[u8]) -> bool {
        // Broadcast is a multicast address too, but is accepted without allmulti.
        dst == self.mac || dst == [0xff; 6] || (self.allmulti && dst[0] & 1 != 0)
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
    /// Destination-MAC filter; `None` = promiscuous.
    pub(crate) filter: Option<MacFilter>,
    /// Largest L3 length received.
    pub(crate) mtu: u16,
}

impl Default for RxConfig {
    fn default() -> Self {
        RxConfig {
            steering: Vec::new(),
            rss_key: DEFAULT_RSS_KEY,
            toeplitz: Toeplitz::new(&DEFAULT_RSS_KEY),
            rss_fields: RssFields::ALL,
            filter: None,
            mtu: DEFAULT_MTU,
        }
    }
}

impl RxConfig {
    /// Whether the port takes `frame` at all (dropping and counting it if not), and if so its
    /// RSS hash.
    pub(crate) fn admit(&self, frame: &[u8], counters: &mut Counters) -> Option<u32> {
        if let Some(f) = &self.filter {
            if frame.len() < 6 || !f.accepts(&frame[..6]) {
                counters.rx_drops_filter += 1;
                return None;
            }
        }
        if net::l3_len(frame) > usize::from(self.mtu) {
            counters.rx_drops_mtu += 1;
            return None;
        }
        Some(net::rss_hash(frame, &self.toeplitz, self.rss_fields))
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
