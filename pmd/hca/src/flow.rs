//! Flow steering: rules that match fields of a received frame and send it to one RQ, spread it
//! over RQs with an RSS context of their own, or drop it; checked by priority before the port's
//! default path (MAC and VLAN filters, the default RSS), as device-managed flow steering does on
//! a ConnectX-3.
//!
//! The representation is the common ground of the two users: DPDK's `rte_flow` (items eth, vlan,
//! ipv4, tcp, udp; actions queue, rss, drop; a priority) and verbs' `ibv_create_flow` (eth, ipv4,
//! tcp/udp specs, each a value and a mask; a priority; the QP that receives). A field matches
//! when `field & mask == value & mask`, so a zero mask matches anything; a layer that is present
//! (`Some`) also requires the frame to have that header.

use crate::error::HcaError;
use crate::net::FrameFields;
use crate::rss::{RssFields, Toeplitz, RSS_KEY_LEN};

/// Flow rules one adapter holds at most.
pub const MAX_FLOWS: usize = 1024;
/// RSS contexts one adapter holds at most (besides the port's default).
pub const MAX_RSS_CONTEXTS: usize = 256;

/// A value and a mask: matches `x` when `x & mask == value & mask`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Masked<T> {
    /// The bits wanted.
    pub value: T,
    /// Which bits count (all zero: any value).
    pub mask: T,
}

impl<T: Copy> Masked<T> {
    /// Exactly `value`: every bit counts.
    pub fn exact(value: T, all_ones: T) -> Masked<T> {
        Masked {
            value,
            mask: all_ones,
        }
    }
}

fn bytes_match<const N: usize>(m: &Masked<[u8; N]>, x: &[u8; N]) -> bool {
    (0..N).all(|i| x[i] & m.mask[i] == m.value[i] & m.mask[i])
}

fn u16_match(m: &Masked<u16>, x: u16) -> bool {
    x & m.mask == m.value & m.mask
}

/// The Ethernet header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct EthMatch {
    /// Destination MAC.
    pub dst: Masked<[u8; 6]>,
    /// Source MAC.
    pub src: Masked<[u8; 6]>,
    /// The EtherType after any VLAN tags (the L3 protocol).
    pub ether_type: Masked<u16>,
}

/// The outer VLAN tag: present means the frame must be tagged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct VlanMatch {
    /// The VLAN ID (12 bits; higher mask bits are ignored).
    pub vid: Masked<u16>,
}

/// The IPv4 header: present means the frame must be IPv4.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Ipv4Match {
    /// Source address.
    pub src: Masked<[u8; 4]>,
    /// Destination address.
    pub dst: Masked<[u8; 4]>,
}

/// TCP or UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum L4Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// The TCP or UDP header (over IPv4 or IPv6, not in a fragment): present means the frame must
/// carry that protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct L4Match {
    /// Which protocol.
    pub proto: L4Proto,
    /// Source port.
    pub src_port: Masked<u16>,
    /// Destination port.
    pub dst_port: Masked<u16>,
}

/// What a rule matches: each present layer must be in the frame and match.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FlowPattern {
    /// The Ethernet header (`None`: any).
    pub eth: Option<EthMatch>,
    /// The outer VLAN tag (`None`: tagged or not).
    pub vlan: Option<VlanMatch>,
    /// IPv4 (`None`: any L3).
    pub ipv4: Option<Ipv4Match>,
    /// TCP or UDP (`None`: any L4).
    pub l4: Option<L4Match>,
}

impl FlowPattern {
    pub(crate) fn matches(&self, f: &FrameFields) -> bool {
        if let Some(e) = &self.eth {
            if !bytes_match(&e.dst, &f.dst)
                || !bytes_match(&e.src, &f.src)
                || !u16_match(&e.ether_type, f.ether_type)
            {
                return false;
            }
        }
        if let Some(v) = &self.vlan {
            match f.vid {
                Some(vid) => {
                    let m = Masked {
                        value: v.vid.value & 0xfff,
                        mask: v.vid.mask & 0xfff,
                    };
                    if !u16_match(&m, vid) {
                        return false;
                    }
                }
                None => return false,
            }
        }
        if let Some(ip) = &self.ipv4 {
            match &f.ipv4 {
                Some((src, dst)) => {
                    if !bytes_match(&ip.src, src) || !bytes_match(&ip.dst, dst) {
                        return false;
                    }
                }
                None => return false,
            }
        }
        if let Some(l4) = &self.l4 {
            let proto = match l4.proto {
                L4Proto::Tcp => 6,
                L4Proto::Udp => 17,
            };
            match f.l4 {
                Some((p, sport, dport)) if p == proto => {
                    if !u16_match(&l4.src_port, sport) || !u16_match(&l4.dst_port, dport) {
                        return false;
                    }
                }
                _ => return false,
            }
        }
        true
    }
}

/// What a rule does with the frames it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlowAction {
    /// Deliver to this RQ (its QPN).
    Queue(u32),
    /// Spread over the RQs of this RSS context ([`crate::Hca::create_rss_context`]).
    Rss(u32),
    /// Drop, counted as `rx_drops_flow`.
    Drop,
}

/// A steering rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowRule {
    /// Lower is checked first; among equal priorities, the older rule first.
    pub priority: u16,
    /// What it matches.
    pub pattern: FlowPattern,
    /// What it does.
    pub action: FlowAction,
}

/// An RSS context: its own key, hashed fields and indirection table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RssContext {
    /// The Toeplitz key ([`RSS_KEY_LEN`] bytes).
    pub key: [u8; RSS_KEY_LEN],
    /// The packet types hashed.
    pub fields: RssFields,
    /// The RQs (QPNs), `rqs[hash % len]`; not empty.
    pub rqs: Vec<u32>,
}

/// Frames and bytes a rule matched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowCounters {
    /// Frames it matched (delivered, dropped by it, or lost further on).
    pub frames: u64,
    /// Their bytes.
    pub bytes: u64,
}

#[derive(Debug)]
struct Rule {
    id: u32,
    rule: FlowRule,
    hits: FlowCounters,
}

#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) ctx: RssContext,
    pub(crate) toeplitz: Toeplitz,
    users: u32,
}

/// Where a matched frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Queue(u32),
    /// Hash with this RSS context (its slot).
    Rss(usize),
    Drop,
}

/// The adapter's rules, kept in the order they are checked, and its RSS contexts.
#[derive(Debug, Default)]
pub(crate) struct FlowTable {
    rules: Vec<Rule>,
    ctxs: Vec<Option<Ctx>>,
    next_id: u32,
}

/// RSS context numbers are their slot plus this, so a zero is never valid.
const CTX_BASE: u32 = 1;

impl FlowTable {
    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub(crate) fn create_ctx(&mut self, ctx: RssContext) -> Result<u32, HcaError> {
        let slot = match self.ctxs.iter().position(Option::is_none) {
            Some(s) => s,
            None if self.ctxs.len() < MAX_RSS_CONTEXTS => {
                self.ctxs.push(None);
                self.ctxs.len() - 1
            }
            None => return Err(HcaError::NoResources("RSS contexts")),
        };
        let toeplitz = Toeplitz::new(&ctx.key);
        self.ctxs[slot] = Some(Ctx {
            ctx,
            toeplitz,
            users: 0,
        });
        Ok(slot as u32 + CTX_BASE)
    }

    fn ctx_slot(&self, id: u32) -> Option<usize> {
        let s = id.checked_sub(CTX_BASE)? as usize;
        self.ctxs.get(s)?.as_ref().map(|_| s)
    }

    pub(crate) fn destroy_ctx(&mut self, id: u32) -> Result<(), HcaError> {
        let s = self
            .ctx_slot(id)
            .ok_or(HcaError::NotFound("RSS context", id))?;
        if self.ctxs[s].as_ref().is_some_and(|c| c.users > 0) {
            return Err(HcaError::Busy(id));
        }
        self.ctxs[s] = None;
        Ok(())
    }

    pub(crate) fn ctx(&self, slot: usize) -> Option<&Ctx> {
        self.ctxs.get(slot)?.as_ref()
    }

    pub(crate) fn rss_context(&self, id: u32) -> Option<RssContext> {
        Some(self.ctxs[self.ctx_slot(id)?].as_ref()?.ctx.clone())
    }

    /// Add a rule whose queues the caller checked; its id.
    pub(crate) fn create(&mut self, rule: FlowRule) -> Result<u32, HcaError> {
        if self.rules.len() >= MAX_FLOWS {
            return Err(HcaError::NoResources("flow rules"));
        }
        if let FlowAction::Rss(id) = rule.action {
            let s = self
                .ctx_slot(id)
                .ok_or(HcaError::NotFound("RSS context", id))?;
            if let Some(c) = self.ctxs[s].as_mut() {
                c.users += 1;
            }
        }
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let id = self.next_id;
        // After every rule of a lower or equal priority: equal ones keep their age order.
        let at = self
            .rules
            .partition_point(|r| r.rule.priority <= rule.priority);
        self.rules.insert(
            at,
            Rule {
                id,
                rule,
                hits: FlowCounters::default(),
            },
        );
        Ok(id)
    }

    pub(crate) fn destroy(&mut self, id: u32) -> Result<(), HcaError> {
        let i = self
            .rules
            .iter()
            .position(|r| r.id == id)
            .ok_or(HcaError::NotFound("flow rule", id))?;
        let r = self.rules.remove(i);
        if let FlowAction::Rss(c) = r.rule.action {
            if let Some(s) = self.ctx_slot(c) {
                if let Some(ctx) = self.ctxs[s].as_mut() {
                    ctx.users -= 1;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn counters(&self, id: u32) -> Option<FlowCounters> {
        self.rules.iter().find(|r| r.id == id).map(|r| r.hits)
    }

    pub(crate) fn list(&self) -> Vec<(u32, FlowRule)> {
        self.rules.iter().map(|r| (r.id, r.rule)).collect()
    }

    /// The first rule `fields` match, counted: where the frame (`len` bytes) goes.
    pub(crate) fn lookup(&mut self, fields: &FrameFields, len: usize) -> Option<Verdict> {
        let r = self
            .rules
            .iter_mut()
            .find(|r| r.rule.pattern.matches(fields))?;
        r.hits.frames += 1;
        r.hits.bytes += len as u64;
        Some(match r.rule.action {
            FlowAction::Queue(q) => Verdict::Queue(q),
            FlowAction::Drop => Verdict::Drop,
            FlowAction::Rss(id) => match id.checked_sub(CTX_BASE) {
                Some(s) => Verdict::Rss(s as usize),
                None => Verdict::Drop,
            },
        })
    }
}
