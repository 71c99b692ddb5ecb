//! Reading an `rte_flow` rule from its C structures into what the port keeps ([`Conf`]), and
//! why one is refused ([`Refusal`]).

use std::ffi::{c_void, CStr};
use std::marker::PhantomData;
use std::mem::size_of;
use std::ptr;

use dpdk_sys as sys;

use super::super::eth::{Eth, FromC};
use super::super::Error;
use crate::hw::flow::{FlowFate, FlowPattern, Ipv4Match, L4Match, L4Proto, Masked};
use crate::hw::RSS_KEY_LEN;
use crate::port;

/// The priorities mlx4 offers (`MLX4_IB_FLOW_MAX_PRIO`).
const MAX_PRIORITY: u32 = 0xfff;
/// Items or actions in one rule, at most: a bound on walking C arrays that end with END.
const MAX_ELEMS: usize = 64;

/// A rule as the port keeps it: receive queues by ethdev index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Conf {
    pub priority: u16,
    pub pattern: FlowPattern,
    pub fate: FlowFate<u16>,
    pub count: bool,
}

/// Why a rule (or a request about one) was refused: what the application gets in its
/// `rte_flow_error`, and the kind that decides the errno.
pub(super) struct Refusal {
    pub err: Error,
    pub etype: sys::rte_flow_error_type,
    pub cause: *const c_void,
    pub msg: &'static CStr,
    /// More for the log than the C message can carry (a device's own words).
    pub detail: Option<String>,
}

pub(super) type Etype = sys::rte_flow_error_type;

/// The device cannot match or do this.
pub(super) fn unsupported(etype: Etype, cause: *const c_void, msg: &'static CStr) -> Refusal {
    Refusal {
        err: Error::Unsupported("flow rule"),
        etype,
        cause,
        msg,
        detail: None,
    }
}

/// The request is wrong (a queue that does not exist, an unknown handle).
pub(super) fn bad(etype: Etype, cause: *const c_void, msg: &'static CStr) -> Refusal {
    Refusal {
        err: Error::Invalid(String::new()),
        etype,
        cause,
        msg,
        detail: None,
    }
}

impl From<Error> for Refusal {
    fn from(e: Error) -> Refusal {
        let msg: &'static CStr = match e {
            Error::Unsupported(_) => c"not supported in this process or on this device",
            Error::Invalid(_) => c"the device refused the rule",
            Error::NoMemory(_) => c"no memory",
            Error::Device(_) => c"the device failed",
        };
        Refusal {
            detail: Some(e.to_string()),
            err: e,
            etype: sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_UNSPECIFIED,
            cause: ptr::null(),
            msg,
        }
    }
}

/// One pattern item, its structures as bytes (`len` each).
struct Item<'a> {
    ty: sys::rte_flow_item_type,
    spec: Option<&'a [u8]>,
    last: Option<&'a [u8]>,
    mask: Option<&'a [u8]>,
    cause: *const c_void,
}

/// An element of an `rte_flow` C array, which ends with one whose type is `END` (0).
trait Typed {
    fn type_of(&self) -> u32;
}

impl Typed for sys::rte_flow_item {
    fn type_of(&self) -> u32 {
        self.type_
    }
}

impl Typed for sys::rte_flow_action {
    fn type_of(&self) -> u32 {
        self.type_
    }
}

/// NULL or a C array of `T` that ends with END (the views' contract, taken on in `from_c`).
struct EndList<'a, T>(*const T, PhantomData<&'a T>);

impl<'a, T: Typed> EndList<'a, T> {
    /// The elements before END; None when there is no END within [`MAX_ELEMS`] of them
    /// (nothing past the bound is read).
    fn elements(&self) -> Option<Vec<&'a T>> {
        let mut v = Vec::new();
        if self.0.is_null() {
            return Some(v);
        }
        for i in 0..=MAX_ELEMS {
            // SAFETY: within the array, up to and including its END (the list's contract).
            let el = unsafe { &*self.0.add(i) };
            if el.type_of() == 0 {
                return Some(v);
            }
            v.push(el);
        }
        None
    }
}

/// A rule's pattern as `rte_flow_validate`/`create` were given it: NULL or items ending with
/// END, whose spec, last and mask are NULL or structures of the type the item names. Read
/// when the rule's checks reach it, and only as far as they go.
pub(super) struct Pattern<'a>(EndList<'a, sys::rte_flow_item>);

impl FromC<*const sys::rte_flow_item> for Pattern<'_> {
    unsafe fn from_c(p: *const sys::rte_flow_item) -> Self {
        Pattern(EndList(p, PhantomData))
    }
}

impl<'a> Pattern<'a> {
    /// The items before END, each structure as bytes; None past [`MAX_ELEMS`].
    fn items(&self) -> Option<Vec<Item<'a>>> {
        let items = self.0.elements()?;
        // SAFETY: each item's structures are NULL or of the type it names (rte_flow's
        // contract, taken on in from_c); `len` is 0 for types refused unread.
        unsafe {
            let bytes = |p: *const c_void, len: usize| {
                (!p.is_null()).then(|| std::slice::from_raw_parts(p.cast::<u8>(), len))
            };
            let items = items.into_iter().map(|i| {
                let len = item_len(i.type_);
                Item {
                    ty: i.type_,
                    spec: bytes(i.spec, len),
                    last: bytes(i.last, len),
                    mask: bytes(i.mask, len),
                    cause: ptr::from_ref(i).cast(),
                }
            });
            Some(items.collect())
        }
    }
}

/// A rule's actions as `rte_flow_validate`/`create` were given them: NULL or actions ending
/// with END, each conf NULL or the structure its type names (for RSS, with `key_len` bytes of
/// key and `queue_num` queues).
pub(super) struct Actions<'a>(EndList<'a, sys::rte_flow_action>);

impl FromC<*const sys::rte_flow_action> for Actions<'_> {
    unsafe fn from_c(p: *const sys::rte_flow_action) -> Self {
        Actions(EndList(p, PhantomData))
    }
}

impl<'a> Actions<'a> {
    /// The actions before END; None past [`MAX_ELEMS`].
    fn list(&self) -> Option<Vec<Action<'a>>> {
        Some(self.0.elements()?.into_iter().map(Action).collect())
    }
}

/// One action of an [`Actions`] list.
struct Action<'a>(&'a sys::rte_flow_action);

/// What an action's conf holds, for the actions that have one.
enum ActionConf<'a> {
    Queue(&'a sys::rte_flow_action_queue),
    Rss(RssConf<'a>),
    /// Another type, or no conf.
    None,
}

/// An RSS action's conf, with its key when `key_len` is the device's and its queues when
/// `queue_num` is within a port's (neither read otherwise).
struct RssConf<'a> {
    rss: &'a sys::rte_flow_action_rss,
    key: Option<&'a [u8; RSS_KEY_LEN]>,
    queues: Option<&'a [u16]>,
}

impl<'a> Action<'a> {
    fn ty(&self) -> sys::rte_flow_action_type {
        self.0.type_
    }

    fn cause(&self) -> *const c_void {
        ptr::from_ref(self.0).cast()
    }

    fn conf(&self) -> ActionConf<'a> {
        let conf = self.0.conf;
        if conf.is_null() {
            return ActionConf::None;
        }
        // SAFETY: a QUEUE action's conf is an rte_flow_action_queue, an RSS action's an
        // rte_flow_action_rss with `key_len` bytes at `key` and `queue_num` entries at
        // `queue` (rte_flow's contract, taken on by the list's from_c).
        unsafe {
            match self.0.type_ {
                sys::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_QUEUE => {
                    ActionConf::Queue(&*conf.cast::<sys::rte_flow_action_queue>())
                }
                sys::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_RSS => {
                    let rss = &*conf.cast::<sys::rte_flow_action_rss>();
                    let key = (rss.key_len as usize == RSS_KEY_LEN && !rss.key.is_null())
                        .then(|| &*rss.key.cast::<[u8; RSS_KEY_LEN]>());
                    let queues = (rss.queue_num != 0
                        && rss.queue_num <= u32::from(port::MAX_QUEUES)
                        && !rss.queue.is_null())
                    .then(|| std::slice::from_raw_parts(rss.queue, rss.queue_num as usize));
                    ActionConf::Rss(RssConf { rss, key, queues })
                }
                _ => ActionConf::None,
            }
        }
    }
}

/// The structure size of the items this driver knows (others are refused unread).
fn item_len(ty: sys::rte_flow_item_type) -> usize {
    match ty {
        sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_ETH => size_of::<sys::rte_flow_item_eth>(),
        sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_VLAN => size_of::<sys::rte_flow_item_vlan>(),
        sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_IPV4 => size_of::<sys::rte_flow_item_ipv4>(),
        sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_UDP => size_of::<sys::rte_flow_item_udp>(),
        sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_TCP => size_of::<sys::rte_flow_item_tcp>(),
        _ => 0,
    }
}

/// The default mask of an item (`rte_flow_item_*_mask`), as bytes: what a NULL mask means.
fn default_mask(ty: sys::rte_flow_item_type) -> Vec<u8> {
    let mut m = vec![0u8; item_len(ty)];
    match ty {
        // Destination and source MACs.
        sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_ETH => m[..12].fill(0xff),
        // The VLAN ID.
        sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_VLAN => m[..2].copy_from_slice(&[0x0f, 0xff]),
        // Source and destination addresses.
        sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_IPV4 => m[12..20].fill(0xff),
        // Source and destination ports.
        sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_UDP
        | sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_TCP => m[..4].fill(0xff),
        _ => {}
    }
    m
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn quad(b: &[u8], at: usize) -> [u8; 4] {
    [b[at], b[at + 1], b[at + 2], b[at + 3]]
}

/// Where each item type sits in a pattern: outer to inner.
fn layer(ty: sys::rte_flow_item_type) -> Option<u8> {
    match ty {
        sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_ETH => Some(0),
        sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_VLAN => Some(1),
        sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_IPV4 => Some(2),
        sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_UDP
        | sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_TCP => Some(3),
        _ => None,
    }
}

const E_ITEM: Etype = sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_ITEM;
const E_MASK: Etype = sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_ITEM_MASK;
const E_LAST: Etype = sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_ITEM_LAST;
pub(super) const E_ACTION: Etype = sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_ACTION;
const E_CONF: Etype = sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_ACTION_CONF;

/// The pattern the device can match for `items`, or why not.
fn parse_pattern(items: &[Item<'_>]) -> Result<FlowPattern, Refusal> {
    let mut p = FlowPattern::default();
    let mut next_layer = 0u8;
    for it in items {
        if it.ty == sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_VOID {
            continue;
        }
        let Some(l) = layer(it.ty) else {
            return Err(unsupported(
                E_ITEM,
                it.cause,
                c"item not supported: mlx4 matches eth, vlan, ipv4, tcp and udp",
            ));
        };
        if l < next_layer {
            return Err(unsupported(
                E_ITEM,
                it.cause,
                c"items must come once each, outer to inner: eth, vlan, ipv4, tcp or udp",
            ));
        }
        next_layer = l + 1;
        let Some(spec) = it.spec else {
            // No spec: the layer must be there, with any contents.
            if it.last.is_some() {
                return Err(unsupported(E_LAST, it.cause, c"last without spec"));
            }
            match l {
                1 => p.vlan = Some(None),
                2 => p.ipv4 = Some(Ipv4Match::default()),
                3 => p.l4 = Some(l4(it.ty, Masked::default(), Masked::default())),
                _ => {}
            }
            continue;
        };
        let dflt;
        let mask = match it.mask {
            Some(m) => m,
            None => {
                dflt = default_mask(it.ty);
                &dflt[..]
            }
        };
        if let Some(last) = it.last {
            let differs = (0..mask.len()).any(|i| (last[i] ^ spec[i]) & mask[i] != 0);
            if differs {
                return Err(unsupported(
                    E_LAST,
                    it.cause,
                    c"ranges (last) are not supported",
                ));
            }
        }
        // Mask bytes outside `allowed` must be zero: those fields cannot be matched.
        let only = |allowed: std::ops::Range<usize>, msg: &'static CStr| {
            let outside = mask
                .iter()
                .enumerate()
                .any(|(i, &b)| b != 0 && !allowed.contains(&i));
            if outside {
                Err(unsupported(E_MASK, it.cause, msg))
            } else {
                Ok(())
            }
        };
        match l {
            0 => {
                only(
                    0..6,
                    c"eth: only the destination MAC can be matched (not source, type, has_vlan)",
                )?;
                match &mask[..6] {
                    [0, 0, 0, 0, 0, 0] => {}
                    [0xff, 0xff, 0xff, 0xff, 0xff, 0xff] => {
                        let mut dst = [0u8; 6];
                        dst.copy_from_slice(&spec[..6]);
                        p.eth_dst = Some(dst);
                    }
                    _ => {
                        return Err(unsupported(
                            E_MASK,
                            it.cause,
                            c"eth: the destination MAC is matched whole or not at all",
                        ))
                    }
                }
            }
            1 => {
                only(
                    0..2,
                    c"vlan: only the TCI can be matched (not the inner type)",
                )?;
                let (tci, m) = (be16(spec, 0), be16(mask, 0));
                if m & 0xf000 != 0 {
                    return Err(unsupported(
                        E_MASK,
                        it.cause,
                        c"vlan: PCP and DEI cannot be matched, only the VLAN ID",
                    ));
                }
                p.vlan = Some(match m {
                    0 => None,
                    0x0fff => Some(tci & 0x0fff),
                    _ => {
                        return Err(unsupported(
                            E_MASK,
                            it.cause,
                            c"vlan: the VLAN ID is matched whole or not at all",
                        ))
                    }
                });
            }
            2 => {
                only(
                    12..20,
                    c"ipv4: only the source and destination addresses can be matched",
                )?;
                p.ipv4 = Some(Ipv4Match {
                    src: Masked {
                        value: quad(spec, 12),
                        mask: quad(mask, 12),
                    },
                    dst: Masked {
                        value: quad(spec, 16),
                        mask: quad(mask, 16),
                    },
                });
            }
            _ => {
                only(
                    0..4,
                    c"tcp/udp: only the source and destination ports can be matched",
                )?;
                let port = |at| Masked {
                    value: be16(spec, at),
                    mask: be16(mask, at),
                };
                p.l4 = Some(l4(it.ty, port(0), port(2)));
            }
        }
    }
    Ok(p)
}

fn l4(ty: sys::rte_flow_item_type, src_port: Masked<u16>, dst_port: Masked<u16>) -> L4Match {
    L4Match {
        proto: if ty == sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_TCP {
            L4Proto::Tcp
        } else {
            L4Proto::Udp
        },
        src_port,
        dst_port,
    }
}

/// What the actions ask for: the fate (queues by ethdev index) and whether to count.
fn parse_actions(
    actions: &[Action<'_>],
    port_key: &[u8; RSS_KEY_LEN],
    queue_ok: impl Fn(u16) -> bool,
) -> Result<(FlowFate<u16>, bool), Refusal> {
    let mut fate = None;
    let mut count = false;
    for a in actions {
        let cause = a.cause();
        let this = match a.ty() {
            sys::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_VOID => continue,
            sys::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_COUNT => {
                count = true;
                continue;
            }
            sys::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_DROP => FlowFate::Drop,
            sys::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_QUEUE => {
                let ActionConf::Queue(q) = a.conf() else {
                    return Err(bad(E_CONF, cause, c"queue: no configuration"));
                };
                let q = q.index;
                if !queue_ok(q) {
                    return Err(bad(E_CONF, cause, c"queue: no such RX queue set up"));
                }
                FlowFate::Queue(q)
            }
            sys::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_RSS => {
                let ActionConf::Rss(rss) = a.conf() else {
                    return Err(bad(E_CONF, cause, c"rss: no configuration"));
                };
                rss_fate(&rss, cause, port_key, &queue_ok)?
            }
            _ => {
                return Err(unsupported(
                    E_ACTION,
                    cause,
                    c"action not supported: mlx4 does queue, rss, drop and count",
                ))
            }
        };
        if fate.is_some() {
            return Err(unsupported(
                E_ACTION,
                cause,
                c"one fate per rule: queue, rss or drop",
            ));
        }
        fate = Some(this);
    }
    let fate = fate.ok_or_else(|| {
        unsupported(
            sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_ACTION_NUM,
            ptr::null(),
            c"a rule needs a fate: queue, rss or drop",
        )
    })?;
    Ok((fate, count))
}

fn rss_fate(
    conf: &RssConf<'_>,
    cause: *const c_void,
    port_key: &[u8; RSS_KEY_LEN],
    queue_ok: impl Fn(u16) -> bool,
) -> Result<FlowFate<u16>, Refusal> {
    let rss = conf.rss;
    if rss.func != sys::rte_eth_hash_function_RTE_ETH_HASH_FUNCTION_DEFAULT
        && rss.func != sys::rte_eth_hash_function_RTE_ETH_HASH_FUNCTION_TOEPLITZ
    {
        return Err(unsupported(
            E_CONF,
            cause,
            c"rss: the device hashes with Toeplitz only",
        ));
    }
    if rss.level > 1 {
        return Err(unsupported(
            E_CONF,
            cause,
            c"rss: only outer headers are hashed",
        ));
    }
    // Types the device cannot hash (IPv6 extensions, SCTP, L2...) are left out, as long as
    // some remain: applications pass their port-wide set (testpmd's default has IPV6_EX).
    let types = match rss.types {
        0 => port::RSS_HF_ALL,
        t if t & port::RSS_HF_ALL == 0 => {
            return Err(unsupported(
                E_CONF,
                cause,
                c"rss: the device hashes IPv4/IPv6 addresses and TCP/UDP ports only",
            ))
        }
        t => t & port::RSS_HF_ALL,
    };
    let key = match (rss.key_len, conf.key) {
        (0, _) => *port_key,
        (_, Some(k)) => *k,
        _ => return Err(bad(E_CONF, cause, c"rss: the key is 40 bytes")),
    };
    if rss.queue_num == 0 || rss.queue.is_null() {
        return Err(bad(E_CONF, cause, c"rss: no queues"));
    }
    if rss.queue_num > u32::from(port::MAX_QUEUES) {
        return Err(bad(E_CONF, cause, c"rss: more queues than a port has"));
    }
    let queues = conf
        .queues
        .expect("read for queue_num within a port's, checked above");
    if !queues.iter().all(|&q| queue_ok(q)) {
        return Err(bad(E_CONF, cause, c"rss: no such RX queue set up"));
    }
    Ok(FlowFate::Rss {
        key,
        hash: port::rss_hash(types),
        queues: queues.to_vec(),
    })
}

/// The rule `attr`, `pattern` and `actions` describe, as the port keeps it.
/// `pattern` and `actions` are what `rte_flow_validate`/`create` were given: NULL or items and
/// actions ending with END, specs and confs of the structures their types name.
pub(super) fn parse(
    e: &Eth<'_>,
    attr: Option<&sys::rte_flow_attr>,
    pattern: Pattern<'_>,
    actions: Actions<'_>,
) -> Result<Conf, Refusal> {
    let nul = ptr::null();
    let Some(attr) = attr else {
        return Err(bad(
            sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_ATTR,
            nul,
            c"no attributes",
        ));
    };
    let cause = ptr::from_ref(attr).cast::<c_void>();
    if attr.egress() != 0 || attr.transfer() != 0 || attr.ingress() == 0 {
        return Err(unsupported(
            sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_ATTR_INGRESS,
            cause,
            c"only ingress rules (no egress, no transfer)",
        ));
    }
    if attr.group != 0 {
        return Err(unsupported(
            sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_ATTR_GROUP,
            cause,
            c"only group 0",
        ));
    }
    if attr.priority > MAX_PRIORITY {
        return Err(unsupported(
            sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_ATTR_PRIORITY,
            cause,
            c"priorities are 0..=4095",
        ));
    }
    let items = pattern.items().ok_or_else(|| {
        unsupported(
            sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_ITEM_NUM,
            nul,
            c"too many items",
        )
    })?;
    let pattern = parse_pattern(&items)?;
    let actions = actions.list().ok_or_else(|| {
        unsupported(
            sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_ACTION_NUM,
            nul,
            c"too many actions",
        )
    })?;
    let set_up: Vec<bool> = (0..e.conf.nb_rx_queues)
        .map(|q| e.rxq(q).is_some())
        .collect();
    let key = e.port.rx.rss_key;
    let (fate, count) = parse_actions(&actions, &key, |q| {
        set_up.get(usize::from(q)).copied().unwrap_or(false)
    })?;
    Ok(Conf {
        priority: attr.priority as u16,
        pattern,
        fate,
        count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item<'a>(ty: u32, spec: Option<&'a [u8]>, mask: Option<&'a [u8]>) -> Item<'a> {
        Item {
            ty,
            spec,
            last: None,
            mask,
            cause: ptr::null(),
        }
    }

    const ETH: u32 = sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_ETH;
    const VLAN: u32 = sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_VLAN;
    const IPV4: u32 = sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_IPV4;
    const UDP: u32 = sys::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_UDP;

    #[test]
    fn udp_port_under_ipv4_is_a_device_pattern() {
        let mut spec = [0u8; 8];
        spec[2..4].copy_from_slice(&53u16.to_be_bytes());
        let mut mask = [0u8; 8];
        mask[2..4].fill(0xff);
        let p = parse_pattern(&[
            item(ETH, None, None),
            item(IPV4, None, None),
            item(UDP, Some(&spec), Some(&mask)),
        ])
        .map_err(|r| r.msg)
        .unwrap();
        assert_eq!(p.eth_dst, None);
        assert_eq!(p.ipv4, Some(Ipv4Match::default()));
        let l4 = p.l4.unwrap();
        assert_eq!(
            (l4.proto, l4.dst_port.value, l4.dst_port.mask),
            (L4Proto::Udp, 53, 0xffff)
        );
        assert_eq!(l4.src_port.mask, 0);
    }

    #[test]
    fn what_the_device_cannot_match_is_refused_with_its_reason() {
        let spec = [1u8; 20];
        // NULL mask on eth: the default covers the source MAC.
        let r = parse_pattern(&[item(ETH, Some(&spec), None)])
            .err()
            .unwrap();
        assert!(r.msg.to_str().unwrap().contains("destination MAC"));
        assert_eq!(r.err.errno(), -libc::ENOTSUP);
        // Half a MAC.
        let mut mask = [0u8; 20];
        mask[..3].fill(0xff);
        assert!(parse_pattern(&[item(ETH, Some(&spec), Some(&mask))]).is_err());
        // PCP.
        let m = [0xe0, 0, 0, 0, 0, 0, 0, 0];
        let r = parse_pattern(&[item(VLAN, Some(&spec[..8]), Some(&m))])
            .err()
            .unwrap();
        assert!(r.msg.to_str().unwrap().contains("PCP"));
        // The IPv4 protocol field.
        let mut m = [0u8; 20];
        m[9] = 0xff;
        assert!(parse_pattern(&[item(IPV4, Some(&spec), Some(&m))]).is_err());
        // Out of order.
        assert!(parse_pattern(&[item(IPV4, None, None), item(ETH, None, None)]).is_err());
    }

    #[test]
    fn vlan_id_and_address_prefix_match() {
        let spec = [0x20, 0x05, 0, 0, 0, 0, 0, 0];
        let p = parse_pattern(&[item(VLAN, Some(&spec), None)])
            .map_err(|r| r.msg)
            .unwrap();
        assert_eq!(
            p.vlan,
            Some(Some(5)),
            "PCP bits of the spec ignored under the default mask"
        );
        let mut ip = [0u8; 20];
        ip[16..20].copy_from_slice(&[10, 253, 0, 0]);
        let mut m = [0u8; 20];
        m[16..20].copy_from_slice(&[255, 255, 255, 0]);
        let p = parse_pattern(&[item(IPV4, Some(&ip), Some(&m))])
            .map_err(|r| r.msg)
            .unwrap();
        assert_eq!(p.ipv4.unwrap().dst.mask, [255, 255, 255, 0]);
    }
}
