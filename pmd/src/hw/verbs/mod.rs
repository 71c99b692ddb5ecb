//! The rdma-core backend: [`Device`] over a real ConnectX-3 (or a VF of one) through verbs and
//! the mlx4 direct verbs, as DPDK's own mlx4 reaches the card.
//!
//! One verbs context per physical port (as DPDK's mlx4 opens them), with its protection
//! domain, its BlueFlame page (`pages`) and an allocator that puts queue memory in DPDK
//! memory on the queue's NUMA node (`mlx4dv_set_context_attr`). How each trait operation maps:
//!
//! | `Device` | verbs / mlx4dv |
//! |---|---|
//! | `caps` | `ibv_query_device` (WRs, CQEs, SGEs), the BF page (`pages::BF_REG_SIZE`, 512) |
//! | `reg_mr`, `dereg_mr` | `ibv_reg_mr` (local write), `ibv_dereg_mr` |
//! | `create_cq` | `ibv_create_cq`, `mlx4dv_init_obj(CQ)`: ring, CQE count and size, CI record |
//! | `create_sq` | RAW_PACKET `ibv_create_qp` (send only, 64-byte stride), INIT -> RTR -> RTS, `mlx4dv_init_obj(QP)`: ring, `sdb` in the context's UAR page; a register of the BF page |
//! | `create_rq` | `ibv_create_wq` (the first of a batch reserving an aligned WQN range, `rq_batch`), RDY, `mlx4dv_init_obj(RWQ)`: ring, stride, doorbell record |
//! | `sq_state`, `rq_state` | `ibv_query_qp` / the WQ's state |
//! | `set_rss`, `set_rx_steering`, `set_rx_filter` | while started: indirection table, Toeplitz hash QP (INIT -> RTR), flow rules on it (`steer`) |
//! | `set_mtu`, `start`, `link_up` | the port's netdev (`SIOCSIFMTU`, `IFF_UP`), `ibv_query_port` |
//! | `stop` | flows, hash QP and table destroyed: nothing more is received |
//! | `create_flow`, `destroy_flow` | an rte_flow rule: a hash QP of its own over its queue (or a power-of-two run of consecutive ones, for RSS), or for drop a QP without receive queue, and one `ibv_create_flow` with Ethernet, IPv4 and TCP/UDP specs; no counters |
//! | `set_flow_isolate` | the port's own flows (MAC, broadcast, modes) left out |
//! | `counters`, `missed` | none: mlx4 reports no per-port counters through verbs |
//!
//! Teardown runs in dependency order (flows, hash QP, indirection table, WQs, QPs, CQs, MRs,
//! BF page, PD, context), and every create undoes what it did when a later step fails.

mod hash;
mod netdev;
mod open;
mod pages;
mod queues;
mod rdma;
mod steer;

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::path::PathBuf;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicI32, Ordering};

use dpdk_sys as dpdk;
use parking_lot::Mutex;
use rdma_sys as sys;

use super::flow::{FlowFate, FlowRule};
use super::{
    Caps, CqDesc, Device, HwError, QueueState, RqDesc, RssHash, SqDesc, DEFAULT_RSS_KEY,
    RSS_KEY_LEN,
};
use crate::mem::{DmaRange, Mr};
use crate::pmd_log;
pub use open::open_pci;
use rdma::{errno, strerror, Rdma};
pub use rdma::{ENV_DIR, IBVERBS, MLX4};

/// Spare TXBBs libmlx4 adds to a 64-byte-stride send queue (`(2048 >> 6) + 1`): asking for
/// `n - SQ_SPARE` WRs gives a ring of exactly `n` TXBBs.
const SQ_SPARE: u32 = 33;
/// The largest send WQE of ConnectX-3 (QUERY_DEV_CAP `max_desc_sz_sq`), which verbs does not
/// report.
const MAX_WQE_SIZE: u32 = 1008;

/// A port of a ConnectX-3 as rdma-core presents it.
pub struct Verbs {
    rdma: &'static Rdma,
    name: String,
    ctx: *mut sys::ibv_context,
    pd: *mut sys::ibv_pd,
    port: u8,
    caps: Caps,
    netdev: Option<netdev::Netdev>,
    bf: Option<pages::BfPage>,
    /// Where the allocator puts the next queue's memory (set under `st`'s lock).
    alloc: Box<AllocCtx>,
    st: Mutex<State>,
}

// SAFETY: the verbs objects are used under `st`'s lock or are immutable after open; rdma-core
// serialises its own commands.
unsafe impl Send for Verbs {}
// SAFETY: as above.
unsafe impl Sync for Verbs {}

struct AllocCtx {
    socket: AtomicI32,
}

#[derive(Default)]
struct State {
    cqs: HashMap<u32, *mut sys::ibv_cq>,
    qps: HashMap<u32, (*mut sys::ibv_qp, Option<usize>)>,
    wqs: HashMap<u32, *mut sys::ibv_wq>,
    mrs: HashMap<u32, *mut sys::ibv_mr>,
    /// The WQN range to reserve with the next WQ (`rq_batch`).
    wq_range: Option<u32>,
    steer: Steer,
    /// rte_flow rules, by id: each a flow on a hash QP of its own over its queues.
    user: HashMap<u32, QpFlows>,
    last_user: u32,
}

struct Steer {
    mac: [u8; 6],
    /// Unicast addresses besides `mac`, and the multicast list: a flow rule each.
    unicast: Vec<[u8; 6]>,
    multicast: Vec<[u8; 6]>,
    promisc: bool,
    allmulti: bool,
    key: [u8; RSS_KEY_LEN],
    hash: RssHash,
    reta: Vec<u32>,
    started: bool,
    /// Isolated (rte_flow): the port's own rules (MAC, broadcast, modes) are left out.
    isolated: bool,
    built: Option<Built>,
}

impl Default for Steer {
    fn default() -> Steer {
        Steer {
            mac: [0; 6],
            unicast: Vec::new(),
            multicast: Vec::new(),
            promisc: true,
            allmulti: true,
            key: super::DEFAULT_RSS_KEY,
            hash: RssHash::NONE,
            reta: Vec::new(),
            started: false,
            isolated: false,
            built: None,
        }
    }
}

/// Steering objects in place while the port is started.
struct Built {
    hash: QpFlows,
    wqns: Vec<u32>,
}

/// Flows on one QP: a Toeplitz hash QP over an indirection table of WQs, or (drop) a QP
/// without receive queue and its CQ.
struct QpFlows {
    /// NULL for a drop QP.
    table: *mut sys::ibv_rwq_ind_table,
    qp: *mut sys::ibv_qp,
    /// A drop QP's own CQ; NULL for a hash QP.
    cq: *mut sys::ibv_cq,
    flows: Vec<*mut sys::ibv_flow>,
}

unsafe extern "C" fn alloc_buf(size: usize, data: *mut c_void) -> *mut c_void {
    // SAFETY: `data` is the backend's AllocCtx, which outlives the context.
    let socket = unsafe { &*data.cast::<AllocCtx>() }
        .socket
        .load(Ordering::Relaxed);
    // SAFETY: plain allocation call; rdma-core's buffers are page-aligned.
    unsafe { dpdk::rte_zmalloc_socket(c"mlx4rs_verbs".as_ptr(), size, 4096, socket) }
}

unsafe extern "C" fn free_buf(ptr: *mut c_void, _data: *mut c_void) {
    // SAFETY: rdma-core frees what `alloc_buf` gave it, once.
    unsafe { dpdk::rte_free(ptr) };
}

fn dev_err(what: impl std::fmt::Display, e: c_int) -> HwError {
    match e {
        libc::EINVAL => HwError::Invalid(format!("{what}: {}", strerror(e))),
        libc::ENOMEM => HwError::NoMemory(format!("{what}: {}", strerror(e))),
        _ => HwError::Device(format!("{what}: {}", strerror(e))),
    }
}

/// Largest power of two not above `n` (0 for 0).
fn pow2_floor(n: u32) -> u32 {
    if n == 0 {
        0
    } else {
        1 << (31 - n.leading_zeros())
    }
}

impl Verbs {
    /// The port's MAC: its netdev's.
    pub fn mac(&self) -> Option<[u8; 6]> {
        self.netdev.as_ref().and_then(|n| n.mac().ok())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn modify_qp(&self, qp: *mut sys::ibv_qp, state: sys::ibv_qp_state) -> Result<(), c_int> {
        let mut a = sys::ibv_qp_attr {
            qp_state: state,
            port_num: self.port,
            ..Default::default()
        };
        let mut mask = sys::IBV_QP_STATE;
        if state == sys::IBV_QPS_INIT {
            mask |= sys::IBV_QP_PORT;
        }
        // SAFETY: a live QP of ours and a filled attribute.
        match unsafe { self.rdma.ibv.ibv_modify_qp(qp, &mut a, mask as c_int) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    fn destroy_qp(&self, qp: *mut sys::ibv_qp) {
        // SAFETY: a QP of ours with no flows left, destroyed once.
        let rc = unsafe { self.rdma.ibv.ibv_destroy_qp(qp) };
        if rc != 0 {
            pmd_log!(ERR, "{}: destroying a QP: {}", self.name, strerror(rc));
        }
    }

    /// The WQN range size libmlx4 passes with the next WQ (a power of two).
    fn set_wq_range(&self, n: u32) {
        let mut log = n.next_power_of_two().trailing_zeros() as u8;
        // SAFETY: a live context; the attribute is one byte, copied.
        let rc = unsafe {
            self.rdma.dv.mlx4dv_set_context_attr(
                self.ctx,
                sys::MLX4DV_SET_CTX_ATTR_LOG_WQS_RANGE_SZ,
                (&mut log as *mut u8).cast(),
            )
        };
        if rc != 0 {
            pmd_log!(
                WARNING,
                "{}: no WQN range reserved: {}",
                self.name,
                strerror(rc)
            );
        }
    }

    fn set_socket(&self, socket: i32) {
        self.alloc.socket.store(socket, Ordering::Relaxed);
    }
}

impl Device for Verbs {
    fn caps(&self) -> Caps {
        self.caps
    }

    fn reg_mr(&self, range: DmaRange) -> Result<Mr, HwError> {
        let (start, end) = (range.start(), range.end());
        // SAFETY: a live PD; the range stays mapped while registered (DmaRange's contract).
        let mr = unsafe {
            self.rdma.ibv.ibv_reg_mr(
                self.pd,
                start as *mut c_void,
                end - start,
                sys::IBV_ACCESS_LOCAL_WRITE as c_int,
            )
        };
        if mr.is_null() {
            let e = errno();
            let hint = if matches!(e, libc::ENOMEM | libc::EPERM | libc::EAGAIN) {
                " (pinned memory is limited by RLIMIT_MEMLOCK: raise `ulimit -l`)"
            } else {
                ""
            };
            return Err(HwError::Device(format!(
                "{}: registering memory {start:#x}..{end:#x}: {}{hint}",
                self.name,
                strerror(e)
            )));
        }
        // SAFETY: a fresh MR.
        let lkey = unsafe { (*mr).lkey };
        self.st.lock().mrs.insert(lkey, mr);
        Ok(Mr { start, end, lkey })
    }

    fn dereg_mr(&self, mr: &Mr) -> Result<(), HwError> {
        let Some(p) = self.st.lock().mrs.remove(&mr.lkey) else {
            return Err(HwError::Invalid(format!("no MR with lkey {:#x}", mr.lkey)));
        };
        // SAFETY: our MR, deregistered once.
        match unsafe { self.rdma.ibv.ibv_dereg_mr(p) } {
            0 => Ok(()),
            e => Err(dev_err(format!("{}: deregistering memory", self.name), e)),
        }
    }

    fn create_cq(&self, cqe_cnt: u32, socket: i32) -> Result<CqDesc, HwError> {
        self.new_cq(cqe_cnt, socket)
    }

    fn destroy_cq(&self, cq: CqDesc) -> Result<(), HwError> {
        self.drop_cq(cq)
    }

    fn create_sq(&self, txbb_cnt: u32, cq: &CqDesc, socket: i32) -> Result<SqDesc, HwError> {
        self.new_sq(txbb_cnt, cq, socket)
    }

    fn destroy_sq(&self, sq: SqDesc) -> Result<(), HwError> {
        self.drop_sq(sq)
    }

    fn create_rq(
        &self,
        wqe_cnt: u32,
        sges: u32,
        cq: &CqDesc,
        socket: i32,
    ) -> Result<RqDesc, HwError> {
        self.new_rq(wqe_cnt, sges, cq, socket)
    }

    fn destroy_rq(&self, rq: RqDesc) -> Result<(), HwError> {
        self.drop_rq(rq)
    }

    fn rq_batch(&self, count: u16) {
        self.st.lock().wq_range = Some(u32::from(count));
    }

    fn sq_state(&self, qpn: u32) -> Result<QueueState, HwError> {
        self.query_sq(qpn)
    }

    fn rq_state(&self, qpn: u32) -> Result<QueueState, HwError> {
        self.query_rq(qpn)
    }

    fn restart_rq(&self, qpn: u32) -> Result<(), HwError> {
        self.reset_rq(qpn)
    }

    fn set_rx_filter(&self, mac: [u8; 6], promisc: bool, allmulti: bool) -> Result<(), HwError> {
        let mut st = self.st.lock();
        let s = &mut st.steer;
        if (s.mac, s.promisc, s.allmulti) == (mac, promisc, allmulti) && s.built.is_some() {
            return Ok(());
        }
        (s.mac, s.promisc, s.allmulti) = (mac, promisc, allmulti);
        self.rebuild(&mut st)
    }

    fn set_mac_table(&self, macs: &[[u8; 6]]) -> Result<(), HwError> {
        let mut st = self.st.lock();
        if st.steer.unicast == macs && st.steer.built.is_some() {
            return Ok(());
        }
        st.steer.unicast = macs.to_vec();
        self.rebuild(&mut st)
    }

    fn set_mc_list(&self, macs: &[[u8; 6]]) -> Result<(), HwError> {
        let mut st = self.st.lock();
        if st.steer.multicast == macs && st.steer.built.is_some() {
            return Ok(());
        }
        st.steer.multicast = macs.to_vec();
        self.rebuild(&mut st)
    }

    fn set_mtu(&self, mtu: u16) -> Result<(), HwError> {
        let Some(n) = &self.netdev else {
            return Err(HwError::Unsupported("setting the MTU without a netdev"));
        };
        n.set_mtu(u32::from(mtu)).map_err(|e| {
            HwError::Device(format!(
                "{}: MTU {mtu} on {}: {e} (the MTU is the netdev's; setting it needs \
                 CAP_NET_ADMIN)",
                self.name,
                n.name()
            ))
        })
    }

    fn set_rss(&self, key: &[u8; RSS_KEY_LEN], hash: RssHash) -> Result<(), HwError> {
        let mut st = self.st.lock();
        let s = &mut st.steer;
        if (&s.key, s.hash) == (key, hash) && s.built.is_some() {
            return Ok(());
        }
        (s.key, s.hash) = (*key, hash);
        self.rebuild(&mut st)
    }

    fn set_rx_steering(&self, rqs: &[u32]) -> Result<(), HwError> {
        let mut st = self.st.lock();
        if st.steer.reta == rqs && st.steer.built.is_some() {
            return Ok(());
        }
        st.steer.reta = rqs.to_vec();
        self.rebuild(&mut st)
    }

    fn start(&self) -> Result<(), HwError> {
        if let Some(n) = &self.netdev {
            // As DPDK's mlx4: the port passes no traffic while its netdev is down.
            if let Err(e) = n.set_up() {
                pmd_log!(WARNING, "{}: bringing {} up: {e}", self.name, n.name());
            }
        }
        let mut st = self.st.lock();
        st.steer.started = true;
        self.rebuild(&mut st)
    }

    fn stop(&self) {
        let mut st = self.st.lock();
        st.steer.started = false;
        self.teardown(&mut st.steer);
        // The queues are recreated while the port is stopped (new WQNs): the next start
        // brings its own redirection table.
        st.steer.reta.clear();
    }

    fn link_up(&self) -> bool {
        // SAFETY: a live context.
        unsafe { rdma::query_port(self.rdma, self.ctx, self.port) }
            .is_ok_and(|pa| pa.state == sys::IBV_PORT_ACTIVE)
    }

    fn counters(&self) -> Vec<(String, u64)> {
        Vec::new()
    }

    fn reset_counters(&self) {}

    fn missed(&self) -> u64 {
        0
    }

    fn create_flow(&self, rule: &FlowRule) -> Result<u32, HwError> {
        let mut words = steer::user_rule(self.port, rule.priority, &rule.pattern)
            .map_err(HwError::Unsupported)?;
        let mut st = self.st.lock();
        let mut h = match &rule.fate {
            FlowFate::Queue(q) => self.hash_qp(&st, &[*q], DEFAULT_RSS_KEY, RssHash::NONE)?,
            FlowFate::Rss { key, hash, queues } => {
                let wqns = steer::ind_table(queues).map_err(HwError::Invalid)?;
                self.hash_qp(&st, &wqns, *key, *hash)?
            }
            FlowFate::Drop => self.drop_qp()?,
        };
        // SAFETY: a live QP; the words hold the attribute followed by its specs.
        match unsafe { rdma::create_flow(h.qp, words.as_mut_ptr().cast()) } {
            Ok(f) => h.flows.push(f),
            Err(e) => {
                self.destroy_hash(h);
                return Err(dev_err(format!("{}: flow rule", self.name), e));
            }
        }
        st.last_user = st.last_user.wrapping_add(1).max(1);
        let id = st.last_user;
        st.user.insert(id, h);
        Ok(id)
    }

    fn destroy_flow(&self, id: u32) -> Result<(), HwError> {
        let h = self
            .st
            .lock()
            .user
            .remove(&id)
            .ok_or_else(|| HwError::Invalid(format!("no flow rule {id}")))?;
        self.destroy_hash(h);
        Ok(())
    }

    fn set_flow_isolate(&self, on: bool) -> Result<(), HwError> {
        let mut st = self.st.lock();
        if st.steer.isolated == on {
            return Ok(());
        }
        st.steer.isolated = on;
        self.rebuild(&mut st)
    }
}

impl Drop for Verbs {
    fn drop(&mut self) {
        let st = self.st.get_mut();
        let user: Vec<QpFlows> = st.user.drain().map(|(_, h)| h).collect();
        let mut steer = std::mem::take(&mut st.steer);
        for h in user {
            self.destroy_hash(h);
        }
        self.teardown(&mut steer);
        let st = self.st.get_mut();
        let leaked = st.wqs.len() + st.qps.len() + st.cqs.len();
        if leaked > 0 {
            pmd_log!(
                WARNING,
                "{}: {leaked} queues still open at close; destroying them",
                self.name
            );
        }
        let st = std::mem::take(self.st.get_mut());
        // SAFETY (each call below): objects of this context, destroyed once, in dependency
        // order: WQs and QPs before their CQs, MRs and queues before the PD, all before the
        // context.
        for (_, wq) in st.wqs {
            // SAFETY: see above.
            let _ = unsafe { rdma::destroy_wq(wq) };
        }
        for (_, (qp, _)) in st.qps {
            self.destroy_qp(qp);
        }
        for (_, cq) in st.cqs {
            // SAFETY: see above.
            unsafe { self.rdma.ibv.ibv_destroy_cq(cq) };
        }
        for (_, mr) in st.mrs {
            // SAFETY: see above.
            unsafe { self.rdma.ibv.ibv_dereg_mr(mr) };
        }
        self.bf = None;
        // SAFETY: see above.
        unsafe {
            self.rdma.ibv.ibv_dealloc_pd(self.pd);
            self.rdma.ibv.ibv_close_device(self.ctx);
        }
    }
}
