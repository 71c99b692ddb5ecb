//! `rte_flow`: the generic flow API over the device's flow steering.
//!
//! What a ConnectX-3 can match, and so what is accepted (anything else is refused with an
//! `rte_flow_error` naming the item or action, `ENOTSUP`, or `EINVAL` for a bad queue):
//! - items `eth` (the destination MAC, all of it or none: MAC steering is exact; not the
//!   source MAC, EtherType or `has_vlan`), `vlan` (the VLAN ID, all 12 bits or none; not
//!   PCP/DEI nor the inner EtherType), `ipv4` (source and destination addresses under any
//!   mask; no other header field), `tcp`/`udp` (ports under any mask; no other field), each
//!   at most once and in that order, `void` anywhere; no ranges (`last`);
//! - actions `queue`, `rss` (Toeplitz over IPv4/IPv6 with or without TCP/UDP ports, outer
//!   headers, a 40-byte key or the port's; other requested types are left out, none left is
//!   refused), `drop` (one of the three), `count` (the
//!   device counts every rule; `flow query ... count` reads it), `void`;
//! - attributes: ingress, group 0, priority 0..=4095 (mlx4's range).
//!
//! Isolated mode drops what no rule takes. Rules are control state of the primary process,
//! kept here per port in this process (a handle is the address of its [`Flow`]); they are
//! given to the device while the port runs, and taken back at stop, because the receive
//! queues get new device numbers at every start. So they survive a restart
//! (`RTE_ETH_DEV_CAPA_FLOW_RULE_KEEP`), and their counts carry over.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void, CStr};
use std::mem::size_of;
use std::ptr;
use std::sync::LazyLock;

use dpdk_sys as sys;
use parking_lot::Mutex;

use super::eth::{self, Eth};
use super::{errno, Error};
use crate::hw::flow::{
    FlowCounters, FlowFate, FlowPattern, FlowRule, Ipv4Match, L4Match, L4Proto, Masked,
};
use crate::hw::RSS_KEY_LEN;
use crate::pmd_log;
use crate::port;

/// The priorities mlx4 offers (`MLX4_IB_FLOW_MAX_PRIO`).
const MAX_PRIORITY: u32 = 0xfff;
/// Items or actions in one rule, at most: a bound on walking C arrays that end with END.
const MAX_ELEMS: usize = 64;

static FLOW_OPS: LazyLock<sys::rte_flow_ops> = LazyLock::new(|| sys::rte_flow_ops {
    validate: Some(validate),
    create: Some(create),
    destroy: Some(destroy),
    flush: Some(flush),
    query: Some(query),
    isolate: Some(isolate),
    ..Default::default()
});

pub(super) unsafe extern "C" fn flow_ops_get(
    _dev: *mut sys::rte_eth_dev,
    ops: *mut *const sys::rte_flow_ops,
) -> c_int {
    // SAFETY: ethdev passes where to put the ops table, which is static.
    unsafe { *ops = &*FLOW_OPS };
    0
}

/// A rule as the port keeps it: receive queues by ethdev index.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Conf {
    priority: u16,
    pattern: FlowPattern,
    fate: FlowFate<u16>,
    count: bool,
}

/// A rule of a port; its address is the `struct rte_flow *` the application holds.
struct Flow {
    conf: Conf,
    /// The device's id while the port runs.
    hw: Option<u32>,
    /// What it matched in earlier runs of the port (or since a query reset it).
    base: FlowCounters,
}

#[derive(Default)]
struct PortFlows {
    isolated: bool,
    #[allow(
        clippy::vec_box,
        reason = "a rule's address is its handle: it must not move when the list grows"
    )]
    flows: Vec<Box<Flow>>,
}

/// This process's rules, by port id.
static PORTS: Mutex<BTreeMap<u16, PortFlows>> = Mutex::new(BTreeMap::new());

/// Why a rule (or a request about one) was refused: what the application gets in its
/// `rte_flow_error`, and the kind that decides the errno.
struct Refusal {
    err: Error,
    etype: sys::rte_flow_error_type,
    cause: *const c_void,
    msg: &'static CStr,
    /// More for the log than the C message can carry (a device's own words).
    detail: Option<String>,
}

type Etype = sys::rte_flow_error_type;

/// The device cannot match or do this.
fn unsupported(etype: Etype, cause: *const c_void, msg: &'static CStr) -> Refusal {
    Refusal {
        err: Error::Unsupported("flow rule"),
        etype,
        cause,
        msg,
        detail: None,
    }
}

/// The request is wrong (a queue that does not exist, an unknown handle).
fn bad(etype: Etype, cause: *const c_void, msg: &'static CStr) -> Refusal {
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

impl From<crate::hw::HwError> for Refusal {
    fn from(e: crate::hw::HwError) -> Refusal {
        Error::from(e).into()
    }
}

/// Runs a flow op on the port behind `dev`; a refusal fills `error` (which may be NULL), is
/// logged, and becomes the negative errno of the one mapping.
///
/// # Safety
/// As for [`eth::run`]; `error` is NULL or writable.
unsafe fn flow_op<T>(
    dev: *mut sys::rte_eth_dev,
    error: *mut sys::rte_flow_error,
    what: &str,
    op: impl FnOnce(&mut Eth<'_>) -> Result<T, Refusal>,
) -> Result<T, c_int> {
    // SAFETY: guaranteed by the caller.
    let answer = unsafe {
        eth::query(dev, |e| {
            let name = e.port.name.to_string();
            e.primary_only()
                .map_err(Refusal::from)
                .and_then(|()| op(e))
                .map_err(|r| (name, r))
        })
    };
    let (name, r) = match answer {
        Some(Ok(v)) => return Ok(v),
        Some(Err(nr)) => nr,
        None => {
            // SAFETY: `error` is NULL or writable (the caller's contract); the message static.
            return Err(unsafe {
                sys::rte_flow_error_set(
                    error,
                    libc::ENODEV,
                    sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_UNSPECIFIED,
                    ptr::null(),
                    c"port not attached".as_ptr(),
                )
            });
        }
    };
    let msg = r.msg.to_string_lossy();
    match &r.detail {
        Some(d) => pmd_log!(ERR, "{name}: {what}: {msg}: {d}"),
        None => pmd_log!(ERR, "{name}: {what}: {msg}"),
    }
    // SAFETY: as above; rte_flow_error_set keeps the pointers, which are static or the
    // application's own (cause).
    Err(unsafe { sys::rte_flow_error_set(error, -errno(&r.err), r.etype, r.cause, r.msg.as_ptr()) })
}

/// One pattern item, its structures as bytes (`len` each).
struct Item<'a> {
    ty: sys::rte_flow_item_type,
    spec: Option<&'a [u8]>,
    last: Option<&'a [u8]>,
    mask: Option<&'a [u8]>,
    cause: *const c_void,
}

/// Reads a C array ending with an element whose type is `END` (0).
///
/// # Safety
/// `p` is NULL or points to such an array of at most [`MAX_ELEMS`] elements before the END.
unsafe fn until_end<'a, T>(p: *const T, ty: impl Fn(&T) -> u32) -> Option<Vec<&'a T>> {
    let mut v = Vec::new();
    if p.is_null() {
        return Some(v);
    }
    for i in 0..=MAX_ELEMS {
        // SAFETY: within the array, up to and including its END (the caller's contract).
        let el = unsafe { &*p.add(i) };
        if ty(el) == 0 {
            return Some(v);
        }
        v.push(el);
    }
    None
}

/// The bytes of an item structure of `len` bytes at `p` (if not NULL).
///
/// # Safety
/// `p` is NULL or points to `len` readable bytes that outlive the op.
unsafe fn bytes<'a>(p: *const c_void, len: usize) -> Option<&'a [u8]> {
    // SAFETY: the caller's contract.
    (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
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
const E_ACTION: Etype = sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_ACTION;
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
    actions: &[&sys::rte_flow_action],
    port_key: &[u8; RSS_KEY_LEN],
    queue_ok: impl Fn(u16) -> bool,
) -> Result<(FlowFate<u16>, bool), Refusal> {
    let mut fate = None;
    let mut count = false;
    for a in actions {
        let cause = ptr::from_ref(*a).cast::<c_void>();
        let conf = a.conf;
        let this = match a.type_ {
            sys::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_VOID => continue,
            sys::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_COUNT => {
                count = true;
                continue;
            }
            sys::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_DROP => FlowFate::Drop,
            sys::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_QUEUE => {
                if conf.is_null() {
                    return Err(bad(E_CONF, cause, c"queue: no configuration"));
                }
                // SAFETY: a QUEUE action's conf is an rte_flow_action_queue.
                let q = unsafe { (*conf.cast::<sys::rte_flow_action_queue>()).index };
                if !queue_ok(q) {
                    return Err(bad(E_CONF, cause, c"queue: no such RX queue set up"));
                }
                FlowFate::Queue(q)
            }
            sys::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_RSS => {
                if conf.is_null() {
                    return Err(bad(E_CONF, cause, c"rss: no configuration"));
                }
                // SAFETY: an RSS action's conf is an rte_flow_action_rss.
                let rss = unsafe { &*conf.cast::<sys::rte_flow_action_rss>() };
                rss_fate(rss, cause, port_key, &queue_ok)?
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
    rss: &sys::rte_flow_action_rss,
    cause: *const c_void,
    port_key: &[u8; RSS_KEY_LEN],
    queue_ok: impl Fn(u16) -> bool,
) -> Result<FlowFate<u16>, Refusal> {
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
    let key = match rss.key_len {
        0 => *port_key,
        40 if !rss.key.is_null() => {
            // SAFETY: key_len bytes at key (rte_flow_action_rss's contract).
            let k = unsafe { std::slice::from_raw_parts(rss.key, RSS_KEY_LEN) };
            k.try_into().expect("40 bytes")
        }
        _ => return Err(bad(E_CONF, cause, c"rss: the key is 40 bytes")),
    };
    if rss.queue_num == 0 || rss.queue.is_null() {
        return Err(bad(E_CONF, cause, c"rss: no queues"));
    }
    if rss.queue_num > u32::from(port::MAX_QUEUES) {
        return Err(bad(E_CONF, cause, c"rss: more queues than a port has"));
    }
    // SAFETY: queue_num entries at queue (rte_flow_action_rss's contract).
    let queues = unsafe { std::slice::from_raw_parts(rss.queue, rss.queue_num as usize) };
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
///
/// # Safety
/// The pointers are what `rte_flow_validate`/`create` were given: NULL or valid, items and
/// actions ending with END, specs and confs of the structures their types name.
unsafe fn parse(
    e: &mut Eth<'_>,
    attr: *const sys::rte_flow_attr,
    pattern: *const sys::rte_flow_item,
    actions: *const sys::rte_flow_action,
) -> Result<Conf, Refusal> {
    let nul = ptr::null();
    // SAFETY: NULL or valid (the caller's contract).
    let Some(attr) = (unsafe { attr.as_ref() }) else {
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
    // SAFETY: an END-terminated array (the caller's contract).
    let items =
        unsafe { until_end(pattern, |i: &sys::rte_flow_item| i.type_) }.ok_or_else(|| {
            unsupported(
                sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_ITEM_NUM,
                nul,
                c"too many items",
            )
        })?;
    let items: Vec<Item<'_>> = items
        .into_iter()
        .map(|i| {
            let len = item_len(i.type_);
            // SAFETY: spec, last and mask are NULL or structures of the item's type, of `len`
            // bytes (0 for types refused unread).
            unsafe {
                Item {
                    ty: i.type_,
                    spec: bytes(i.spec, len),
                    last: bytes(i.last, len),
                    mask: bytes(i.mask, len),
                    cause: ptr::from_ref(i).cast(),
                }
            }
        })
        .collect();
    let pattern = parse_pattern(&items)?;
    // SAFETY: as above.
    let actions =
        unsafe { until_end(actions, |a: &sys::rte_flow_action| a.type_) }.ok_or_else(|| {
            unsupported(
                sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_ACTION_NUM,
                nul,
                c"too many actions",
            )
        })?;
    let set_up: Vec<bool> = (0..e.nb_rx_queues()).map(|q| e.rxq(q).is_some()).collect();
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

/// Gives `f` to the device, with its queues' current device numbers.
fn apply(e: &mut Eth<'_>, f: &mut Flow) -> Result<(), Refusal> {
    let nb_rxq = e.nb_rx_queues();
    let fate = f.conf.fate.map(|q| {
        (q < nb_rxq)
            .then(|| e.rxq(q).map(|s| s.q.qpn()))
            .flatten()
            .ok_or_else(|| {
                bad(
                    sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_HANDLE,
                    ptr::null(),
                    c"a rule names an RX queue the port no longer has",
                )
            })
    })?;
    let rule = FlowRule {
        priority: f.conf.priority,
        pattern: f.conf.pattern,
        fate,
    };
    f.hw = Some(e.dev.create_flow(&rule)?);
    Ok(())
}

/// Takes `f` back from the device, keeping what it counted.
fn unapply(e: &Eth<'_>, f: &mut Flow) {
    if let Some(id) = f.hw.take() {
        if let Ok(c) = e.dev.flow_counters(id) {
            f.base.frames += c.frames;
            f.base.bytes += c.bytes;
        }
        if let Err(err) = e.dev.destroy_flow(id) {
            pmd_log!(ERR, "{}: destroying flow rule {id}: {err}", e.port.name);
        }
    }
}

/// At port start, after the receive queues: every rule to the device.
pub(super) fn port_started(e: &mut Eth<'_>) -> Result<(), Error> {
    let mut ports = PORTS.lock();
    let Some(pf) = ports.get_mut(&e.port_id()) else {
        return Ok(());
    };
    if pf.isolated {
        e.dev.set_flow_isolate(true)?;
    }
    for f in &mut pf.flows {
        apply(e, f).map_err(|r| {
            Error::Invalid(format!(
                "flow rule {:p}: {}{}",
                &**f,
                r.msg.to_string_lossy(),
                r.detail.map(|d| format!(": {d}")).unwrap_or_default()
            ))
        })?;
    }
    Ok(())
}

/// At port stop, before the receive queues are renewed: every rule back from the device.
pub(super) fn port_stopping(e: &mut Eth<'_>) {
    if let Some(pf) = PORTS.lock().get_mut(&e.port_id()) {
        for f in &mut pf.flows {
            unapply(e, f);
        }
    }
}

/// The port closed: its rules are gone with its device.
pub(super) fn port_closed(port_id: u16) {
    PORTS.lock().remove(&port_id);
}

unsafe extern "C" fn validate(
    dev: *mut sys::rte_eth_dev,
    attr: *const sys::rte_flow_attr,
    pattern: *const sys::rte_flow_item,
    actions: *const sys::rte_flow_action,
    error: *mut sys::rte_flow_error,
) -> c_int {
    // SAFETY: ethdev's contract for flow ops; the pointers are the application's (see parse).
    unsafe {
        flow_op(dev, error, "flow validate", |e| {
            parse(e, attr, pattern, actions).map(|_| 0)
        })
    }
    .unwrap_or_else(|rc| rc)
}

unsafe extern "C" fn create(
    dev: *mut sys::rte_eth_dev,
    attr: *const sys::rte_flow_attr,
    pattern: *const sys::rte_flow_item,
    actions: *const sys::rte_flow_action,
    error: *mut sys::rte_flow_error,
) -> *mut sys::rte_flow {
    // SAFETY: as for validate.
    unsafe {
        flow_op(dev, error, "flow create", |e| {
            let conf = parse(e, attr, pattern, actions)?;
            let mut f = Box::new(Flow {
                conf,
                hw: None,
                base: FlowCounters::default(),
            });
            if e.port.started {
                apply(e, &mut f)?;
            }
            // At debug level: a test (or a user) can know when a rule is in force.
            let when = if e.port.started {
                "in force"
            } else {
                "in force from port start"
            };
            pmd_log!(
                DEBUG,
                "{}: flow rule created, {when}: {:?}",
                e.port.name,
                f.conf
            );
            let handle = ptr::from_mut(&mut *f).cast::<sys::rte_flow>();
            PORTS.lock().entry(e.port_id()).or_default().flows.push(f);
            Ok(handle)
        })
    }
    .unwrap_or(ptr::null_mut())
}

fn no_such_flow(flow: *const sys::rte_flow) -> Refusal {
    bad(
        sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_HANDLE,
        flow.cast(),
        c"no such flow rule on this port",
    )
}

unsafe extern "C" fn destroy(
    dev: *mut sys::rte_eth_dev,
    flow: *mut sys::rte_flow,
    error: *mut sys::rte_flow_error,
) -> c_int {
    // SAFETY: ethdev's contract for flow ops; the handle is only compared, never followed.
    unsafe {
        flow_op(dev, error, "flow destroy", |e| {
            let mut ports = PORTS.lock();
            let flows = &mut ports.entry(e.port_id()).or_default().flows;
            let i = flows
                .iter()
                .position(|f| ptr::eq(&**f, flow.cast::<Flow>()))
                .ok_or_else(|| no_such_flow(flow))?;
            let mut f = flows.remove(i);
            unapply(e, &mut f);
            Ok(0)
        })
    }
    .unwrap_or_else(|rc| rc)
}

unsafe extern "C" fn flush(dev: *mut sys::rte_eth_dev, error: *mut sys::rte_flow_error) -> c_int {
    // SAFETY: ethdev's contract for flow ops.
    unsafe {
        flow_op(dev, error, "flow flush", |e| {
            let flows = PORTS
                .lock()
                .get_mut(&e.port_id())
                .map(|pf| std::mem::take(&mut pf.flows))
                .unwrap_or_default();
            for mut f in flows {
                unapply(e, &mut f);
            }
            Ok(0)
        })
    }
    .unwrap_or_else(|rc| rc)
}

unsafe extern "C" fn query(
    dev: *mut sys::rte_eth_dev,
    flow: *mut sys::rte_flow,
    action: *const sys::rte_flow_action,
    data: *mut c_void,
    error: *mut sys::rte_flow_error,
) -> c_int {
    // SAFETY: ethdev's contract for flow ops; a COUNT query's data is an rte_flow_query_count
    // (rte_flow_query's contract); the handle is only compared.
    unsafe {
        flow_op(dev, error, "flow query", |e| {
            let counting = action
                .as_ref()
                .is_some_and(|a| a.type_ == sys::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_COUNT);
            if !counting || data.is_null() {
                return Err(unsupported(
                    E_ACTION,
                    action.cast(),
                    c"only count can be queried",
                ));
            }
            let mut ports = PORTS.lock();
            let f = ports
                .get_mut(&e.port_id())
                .and_then(|pf| {
                    pf.flows
                        .iter_mut()
                        .find(|f| ptr::eq(&***f, flow.cast::<Flow>()))
                })
                .ok_or_else(|| no_such_flow(flow))?;
            if !f.conf.count {
                return Err(bad(
                    E_ACTION,
                    action.cast(),
                    c"the rule has no count action",
                ));
            }
            let now = match f.hw {
                Some(id) => e.dev.flow_counters(id)?,
                None => FlowCounters::default(),
            };
            let out = &mut *data.cast::<sys::rte_flow_query_count>();
            out.hits = f.base.frames + now.frames;
            out.bytes = f.base.bytes + now.bytes;
            out.set_hits_set(1);
            out.set_bytes_set(1);
            if out.reset() != 0 {
                f.base = FlowCounters {
                    frames: f.base.frames.wrapping_sub(out.hits),
                    bytes: f.base.bytes.wrapping_sub(out.bytes),
                };
            }
            Ok(0)
        })
    }
    .unwrap_or_else(|rc| rc)
}

unsafe extern "C" fn isolate(
    dev: *mut sys::rte_eth_dev,
    on: c_int,
    error: *mut sys::rte_flow_error,
) -> c_int {
    // SAFETY: ethdev's contract for flow ops.
    unsafe {
        flow_op(dev, error, "flow isolate", |e| {
            e.dev.set_flow_isolate(on != 0)?;
            PORTS.lock().entry(e.port_id()).or_default().isolated = on != 0;
            Ok(0)
        })
    }
    .unwrap_or_else(|rc| rc)
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
        assert_eq!(errno(&r.err), -libc::ENOTSUP);
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
