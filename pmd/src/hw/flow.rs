//! Flow steering rules as a device takes them: what ConnectX-3 device-managed flow steering
//! can match (the destination MAC, the VLAN ID, IPv4 addresses, TCP/UDP ports) and where a
//! matched frame goes. The ethdev layer turns `rte_flow` rules into these, refusing what the
//! device cannot match; a backend turns them into its own (the software HCA's rules, verbs'
//! `ibv_flow_attr` specs).

use super::{RssHash, RSS_KEY_LEN};

/// A value and a mask: matches `x` when `x & mask == value & mask` (a zero mask: anything).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Masked<T> {
    pub value: T,
    pub mask: T,
}

/// TCP or UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4Proto {
    Tcp,
    Udp,
}

/// The TCP or UDP header: present means the frame must carry that protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L4Match {
    pub proto: L4Proto,
    pub src_port: Masked<u16>,
    pub dst_port: Masked<u16>,
}

/// IPv4 addresses (network byte order): present means the frame must be IPv4.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ipv4Match {
    pub src: Masked<[u8; 4]>,
    pub dst: Masked<[u8; 4]>,
}

/// What a rule matches; each layer that is `Some` must be in the frame and match.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowPattern {
    /// The destination MAC, all of it (the device's MAC steering is exact).
    pub eth_dst: Option<[u8; 6]>,
    /// Tagged, with this VLAN ID if `Some` (12 bits, all of them), with any if `None`.
    pub vlan: Option<Option<u16>>,
    pub ipv4: Option<Ipv4Match>,
    pub l4: Option<L4Match>,
}

/// Where matched frames go. `Q` names a receive queue: an ethdev queue index in the rules a
/// port keeps, the device's queue number (QPN) in the rules it hands a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlowFate<Q> {
    Queue(Q),
    /// Spread over `queues` by the Toeplitz hash of `hash`'s fields under `key`.
    Rss {
        key: [u8; RSS_KEY_LEN],
        hash: RssHash,
        queues: Vec<Q>,
    },
    Drop,
}

impl<Q: Copy> FlowFate<Q> {
    /// The same fate with every queue renamed by `f` (which may refuse one).
    pub fn map<R, E>(&self, mut f: impl FnMut(Q) -> Result<R, E>) -> Result<FlowFate<R>, E> {
        Ok(match self {
            FlowFate::Queue(q) => FlowFate::Queue(f(*q)?),
            FlowFate::Rss { key, hash, queues } => FlowFate::Rss {
                key: *key,
                hash: *hash,
                queues: queues.iter().map(|&q| f(q)).collect::<Result<_, E>>()?,
            },
            FlowFate::Drop => FlowFate::Drop,
        })
    }
}

/// A steering rule for a device: lower priorities are checked first; among equal ones, the
/// older rule first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowRule {
    pub priority: u16,
    pub pattern: FlowPattern,
    /// Receive queues by QPN.
    pub fate: FlowFate<u32>,
}

/// Frames (and their bytes) a rule matched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowCounters {
    pub frames: u64,
    pub bytes: u64,
}
