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
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::LazyLock;

use dpdk_sys as sys;
use parking_lot::Mutex;

use super::eth::{given, ops, Eth, EthMut, Raw};
use super::Error;
use crate::hw::flow::{FlowCounters, FlowRule};
use crate::pmd_log;

mod parse;

use parse::{bad, parse, unsupported, Actions, Conf, Pattern, Refusal, E_ACTION};

static FLOW_OPS: LazyLock<sys::rte_flow_ops> = LazyLock::new(|| sys::rte_flow_ops {
    validate: Some(validate),
    create: Some(create),
    destroy: Some(destroy),
    flush: Some(flush),
    query: Some(query),
    isolate: Some(isolate),
    ..Default::default()
});

ops! {
    fn flow_ops_get(ops: *mut *const sys::rte_flow_ops) -> c_int = shared ops_get, "flow ops";
    fn validate(attr: *const sys::rte_flow_attr, pattern: *const sys::rte_flow_item as Pattern,
        actions: *const sys::rte_flow_action as Actions, error: *mut sys::rte_flow_error)
        -> c_int
        = shared validate_op, "flow validate";
    fn create(attr: *const sys::rte_flow_attr, pattern: *const sys::rte_flow_item as Pattern,
        actions: *const sys::rte_flow_action as Actions, error: *mut sys::rte_flow_error)
        -> *mut sys::rte_flow = shared create_op, "flow create";
    fn destroy(flow: *mut sys::rte_flow as Raw<_>, error: *mut sys::rte_flow_error) -> c_int
        = shared destroy_op, "flow destroy";
    fn flush(error: *mut sys::rte_flow_error) -> c_int = shared flush_op, "flow flush";
    fn query(flow: *mut sys::rte_flow as Raw<_>, action: *const sys::rte_flow_action,
        data: *mut c_void as Raw<_>, error: *mut sys::rte_flow_error) -> c_int
        = shared query_op, "flow query";
    fn isolate(on: c_int, error: *mut sys::rte_flow_error) -> c_int
        = shared isolate_op, "flow isolate";
}

fn ops_get(_e: &Eth<'_>, ops: Option<&mut *const sys::rte_flow_ops>) -> Result<(), Error> {
    *given(ops)? = &*FLOW_OPS;
    Ok(())
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

/// Runs a flow op in the primary; a refusal fills `error` (which may be NULL), is logged, and
/// becomes the negative errno of the one mapping.
fn flow_op<T>(
    e: &Eth<'_>,
    error: Option<&mut sys::rte_flow_error>,
    what: &str,
    op: impl FnOnce(&Eth<'_>) -> Result<T, Refusal>,
) -> Result<T, c_int> {
    let r = match e.primary_only().map_err(Refusal::from).and_then(|()| op(e)) {
        Ok(v) => return Ok(v),
        Err(r) => r,
    };
    let msg = r.msg.to_string_lossy();
    match &r.detail {
        Some(d) => pmd_log!(ERR, "{}: {what}: {msg}: {d}", e.port.name),
        None => pmd_log!(ERR, "{}: {what}: {msg}", e.port.name),
    }
    Err(crate::eal::flow_error_set(
        error,
        -r.err.errno(),
        r.etype,
        r.cause,
        r.msg,
    ))
}

/// Gives `f` to the device, with its queues' current device numbers.
fn apply(e: &Eth<'_>, f: &mut Flow) -> Result<(), Refusal> {
    let nb_rxq = e.conf.nb_rx_queues;
    let fate = f.conf.fate.map(|q| {
        (q < nb_rxq)
            .then(|| e.rxq(q).map(|s| s.qpn()))
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
pub(super) fn port_started(e: &EthMut<'_>) -> Result<(), Error> {
    let e = &e.view();
    let mut ports = PORTS.lock();
    let Some(pf) = ports.get_mut(&e.conf.port_id) else {
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
pub(super) fn port_stopping(e: &EthMut<'_>) {
    let e = &e.view();
    if let Some(pf) = PORTS.lock().get_mut(&e.conf.port_id) {
        for f in &mut pf.flows {
            unapply(e, f);
        }
    }
}

/// The port closed: its rules are gone with its device.
pub(super) fn port_closed(port_id: u16) {
    PORTS.lock().remove(&port_id);
}

fn validate_op(
    e: &Eth<'_>,
    attr: Option<&sys::rte_flow_attr>,
    pattern: Pattern<'_>,
    actions: Actions<'_>,
    error: Option<&mut sys::rte_flow_error>,
) -> c_int {
    flow_op(e, error, "flow validate", |e| {
        parse(e, attr, pattern, actions).map(|_| 0)
    })
    .unwrap_or_else(|rc| rc)
}

fn create_op(
    e: &Eth<'_>,
    attr: Option<&sys::rte_flow_attr>,
    pattern: Pattern<'_>,
    actions: Actions<'_>,
    error: Option<&mut sys::rte_flow_error>,
) -> *mut sys::rte_flow {
    flow_op(e, error, "flow create", |e| {
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
        PORTS
            .lock()
            .entry(e.conf.port_id)
            .or_default()
            .flows
            .push(f);
        Ok(handle)
    })
    .unwrap_or(ptr::null_mut())
}

fn no_such_flow(flow: *const sys::rte_flow) -> Refusal {
    bad(
        sys::rte_flow_error_type_RTE_FLOW_ERROR_TYPE_HANDLE,
        flow.cast(),
        c"no such flow rule on this port",
    )
}

/// The handle is only compared, never followed.
fn destroy_op(
    e: &Eth<'_>,
    flow: Raw<sys::rte_flow>,
    error: Option<&mut sys::rte_flow_error>,
) -> c_int {
    let flow = flow.0;
    flow_op(e, error, "flow destroy", |e| {
        let mut ports = PORTS.lock();
        let flows = &mut ports.entry(e.conf.port_id).or_default().flows;
        let i = flows
            .iter()
            .position(|f| ptr::eq(&**f, flow.cast::<Flow>()))
            .ok_or_else(|| no_such_flow(flow))?;
        let mut f = flows.remove(i);
        unapply(e, &mut f);
        Ok(0)
    })
    .unwrap_or_else(|rc| rc)
}

fn flush_op(e: &Eth<'_>, error: Option<&mut sys::rte_flow_error>) -> c_int {
    flow_op(e, error, "flow flush", |e| {
        let flows = PORTS
            .lock()
            .get_mut(&e.conf.port_id)
            .map(|pf| std::mem::take(&mut pf.flows))
            .unwrap_or_default();
        for mut f in flows {
            unapply(e, &mut f);
        }
        Ok(0)
    })
    .unwrap_or_else(|rc| rc)
}

/// A COUNT query's data is an `rte_flow_query_count` (rte_flow_query's contract); the handle
/// is only compared.
fn query_op(
    e: &Eth<'_>,
    flow: Raw<sys::rte_flow>,
    action: Option<&sys::rte_flow_action>,
    data: Raw<c_void>,
    error: Option<&mut sys::rte_flow_error>,
) -> c_int {
    let flow = flow.0;
    let cause = action.map_or(ptr::null(), |a| ptr::from_ref(a).cast::<c_void>());
    flow_op(e, error, "flow query", |e| {
        let counting =
            action.is_some_and(|a| a.type_ == sys::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_COUNT);
        if !counting || data.0.is_null() {
            return Err(unsupported(E_ACTION, cause, c"only count can be queried"));
        }
        let mut ports = PORTS.lock();
        let f = ports
            .get_mut(&e.conf.port_id)
            .and_then(|pf| {
                pf.flows
                    .iter_mut()
                    .find(|f| ptr::eq(&***f, flow.cast::<Flow>()))
            })
            .ok_or_else(|| no_such_flow(flow))?;
        if !f.conf.count {
            return Err(bad(E_ACTION, cause, c"the rule has no count action"));
        }
        let now = match f.hw {
            Some(id) => e.dev.flow_counters(id)?,
            None => FlowCounters::default(),
        };
        // SAFETY: a COUNT query's data, checked above to be there.
        let out = unsafe { &mut *data.0.cast::<sys::rte_flow_query_count>() };
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
    .unwrap_or_else(|rc| rc)
}

fn isolate_op(e: &Eth<'_>, on: c_int, error: Option<&mut sys::rte_flow_error>) -> c_int {
    flow_op(e, error, "flow isolate", |e| {
        e.dev.set_flow_isolate(on != 0)?;
        PORTS.lock().entry(e.conf.port_id).or_default().isolated = on != 0;
        Ok(0)
    })
    .unwrap_or_else(|rc| rc)
}
