//! The software HCA backend: [`Device`] over [`mlx4_hca`], the one module of the driver that
//! drives the model. It plays the part rdma-core plays for a card: it allocates queue memory
//! (from the port's [`MemSource`]), hands it to the model, and keeps it until the queue is
//! destroyed.
//!
//! It also decides where the model's device loop runs ([`DeviceLoop`]): in the lcore that polls
//! the port (the ethdev burst glue calls the model's runners through [`Lcore`] after `tx_burst`
//! posts and before `rx_burst` polls), on a thread per port, or on the model's one thread for
//! the process's ports. The model's device pages (UAR pages, BlueFlame registers, counters, the
//! port's receive buffer) live in its BAR, which comes from the port's [`MemSource`]: DPDK
//! shared memory under EAL, so secondary processes ring the same doorbells.

use std::collections::HashMap;
use std::ptr::NonNull;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use mlx4_hca::{Bar, CqAttr, Hca, HcaConfig, HcaError, RqAttr, SqAttr, Wire};
use parking_lot::Mutex;

use super::flow::{FlowCounters, FlowFate, FlowRule};
use super::{
    BfDesc, Caps, CqDesc, Device, FlowControl, HwError, PortEvent, QueueState, RqDesc, RssHash,
    SqDesc, RSS_KEY_LEN,
};
use crate::devargs::{Devargs, DeviceLoop, WcMode};
use crate::mem::{DmaBuf, DmaRange, MemSource, Mr};
use steer::{model_pattern, rss_fields};

mod lcore;
mod steer;

pub use lcore::Lcore;

/// The model this backend drives, for tests and benchmarks that open and step it themselves.
pub use mlx4_hca as hca;

// The port's RSS key is the device's, byte for byte.
const _: () = assert!(RSS_KEY_LEN == mlx4_hca::RSS_KEY_LEN);

/// Records (CQ consumer index, RQ doorbell) sit after their ring, on a cache line of their own.
const RECORD_SPACE: usize = 64;

/// One software HCA port and the queue memory it was given.
pub struct Soft {
    /// First to go: the model, then (last field) the memory its BAR lives in.
    hca: Hca,
    device_loop: DeviceLoop,
    /// Secondary processes attached: their bursts cannot run a device that lives in this
    /// process, so an lcore-run device gets a thread while any is attached.
    secondaries: Mutex<u32>,
    started: std::sync::atomic::AtomicBool,

    /// Where queue memory comes from; a `Dpdk` source takes each queue's socket.
    source: MemSource,
    /// The wire plugged at each start, so that a `peer:` partner may be probed after this
    /// port; `None` for a TAP wire, plugged once at open.
    wire: Option<String>,
    /// Queue memory by kind and number, freed once the model forgot the queue.
    mem: Mutex<QueueMem>,
    /// The model's device memory, when this backend provided it; dropped after the model.
    bar_mem: Option<Arc<DmaBuf>>,
    /// The RSS context each flow rule with an RSS fate owns, by rule id.
    flow_ctxs: Mutex<HashMap<u32, u32>>,
    /// The UAR page CQ arm doorbells go to (its address), allocated at the first arming.
    arm_uar: Mutex<Option<usize>>,
    /// Completion channels made: an lcore-run device then also runs on its thread, so that
    /// frames arrive (and wake the lcore) while the lcore sleeps on the channel's fd.
    channels: std::sync::atomic::AtomicU32,
}

#[derive(Default)]
struct QueueMem {
    cqs: HashMap<u32, DmaBuf>,
    sqs: HashMap<u32, DmaBuf>,
    rqs: HashMap<u32, DmaBuf>,
}

impl Soft {
    /// Whether queue `id`'s ring is `buf`, made by this device: every model numbers its queues
    /// from the same base, so another device's descriptor carries a number that may be live
    /// here, and destroying by number alone would free this device's ring under its queue.
    fn mine(
        &self,
        table: impl FnOnce(&QueueMem) -> &HashMap<u32, DmaBuf>,
        id: u32,
        buf: NonNull<u8>,
        what: &str,
    ) -> Result<(), HwError> {
        let mem = self.mem.lock();
        match table(&mem).get(&id) {
            Some(ring) if ring.non_null() == buf => Ok(()),
            _ => Err(HwError::Invalid(format!(
                "destroy {what} {id:#x}: not a queue of this device"
            ))),
        }
    }
}

fn hw_err(what: &str) -> impl Fn(HcaError) -> HwError + '_ {
    move |e| match e {
        HcaError::InvalidArgument(_) | HcaError::NameInUse(_) => {
            HwError::Invalid(format!("{what}: {e}"))
        }
        _ => HwError::Device(format!("{what}: {e}")),
    }
}

impl Soft {
    /// Opens the software HCA for the port `name` as its devargs describe it.
    pub fn open(name: &str, args: &Devargs, source: MemSource) -> Result<Soft, HwError> {
        let cfg = HcaConfig {
            wc: args.wc == WcMode::On,
            // A thread is started only where the device loop runs on one (in lcore mode, while
            // a secondary process is attached).
            threaded: true,
            shared_thread: args.device_loop == DeviceLoop::ProcessThread,
            busy_poll: args.busy_poll,
            pro: args.pro,
            name: name.to_owned(),
            faults: args.faults,
            doorbell_ns: args.doorbell_ns,
            ..HcaConfig::default()
        };
        let (hca, bar_mem) = match source {
            MemSource::Dpdk { .. } => {
                let mem = Arc::new(
                    DmaBuf::new(Bar::required_len(&cfg), source)
                        .ok_or_else(|| HwError::NoMemory("no memory for device pages".into()))?,
                );
                // SAFETY: page-aligned DPDK memory of the required length, kept (`bar_mem`, and
                // a clone in every Lcore) until the model and its runners are gone.
                let bar = unsafe { Bar::from_raw(mem.as_ptr(), mem.len()) }
                    .map_err(hw_err("device memory"))?;
                let hca = Hca::open_on(cfg, bar).map_err(hw_err("opening the software HCA"))?;
                (hca, Some(mem))
            }
            MemSource::Heap => (
                Hca::open(cfg).map_err(hw_err("opening the software HCA"))?,
                None,
            ),
        };
        if !args.faults.none() {
            crate::pmd_log!(
                NOTICE,
                "{name}: the software HCA injects faults {}",
                args.faults
            );
        }
        let mut soft = Soft::new(hca, source);
        soft.bar_mem = bar_mem;
        let spec = args.wire.as_str();
        // A TAP interface is the operator's to configure (namespace, addresses, up): it lives
        // from probe to close, as with DPDK's net_tap, and a restart of the port (MTU, queue
        // count) leaves it where it is. The other wires are plugged at each start.
        match spec.parse::<Wire>() {
            Ok(wire @ Wire::Tap(_)) => {
                let what = format!("wire {}", spec.escape_debug());
                soft.hca.set_wire(wire).map_err(|e| {
                    HwError::Device(format!("{what}: {}", e.to_string().escape_debug()))
                })?;
            }
            _ => soft.wire = Some(spec.to_owned()),
        }
        soft.device_loop = args.device_loop;
        Ok(soft)
    }

    /// A backend over a model the caller opened and wires itself (tests, benchmarks).
    /// Its device loop runs on the model's own thread (`HcaConfig::threaded`) once started.
    pub fn new(hca: Hca, source: MemSource) -> Soft {
        Soft {
            hca,
            device_loop: DeviceLoop::PortThread,
            secondaries: Mutex::new(0),
            started: std::sync::atomic::AtomicBool::new(false),

            source,
            wire: None,
            mem: Mutex::new(QueueMem::default()),
            bar_mem: None,
            flow_ctxs: Mutex::new(HashMap::new()),
            arm_uar: Mutex::new(None),
            channels: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// The model behind this port.
    pub fn hca(&self) -> &Hca {
        &self.hca
    }

    /// What the burst glue of this process calls, when the device runs in the polling lcore.
    pub fn lcore(&self) -> Option<Lcore> {
        (self.device_loop == DeviceLoop::Lcore).then(|| {
            Lcore::new(
                self.hca.clone(),
                self.hca.rx_runner(),
                usize::from(super::MAX_QUEUES),
                self.bar_mem.clone(),
            )
        })
    }

    /// Starts the device loop where it runs: a thread of its own or the process's thread;
    /// in the polling lcore, a thread only while a secondary process is attached.
    fn run_loop(&self) -> Result<(), HwError> {
        match self.device_loop {
            DeviceLoop::PortThread | DeviceLoop::ProcessThread => {
                self.hca.start().map_err(hw_err("start the device loop"))
            }
            DeviceLoop::Lcore
                if *self.secondaries.lock() > 0 || self.channels.load(Ordering::Acquire) > 0 =>
            {
                self.hca.start().map_err(hw_err("start the device loop"))
            }
            DeviceLoop::Lcore => Ok(()),
        }
    }

    fn stop_loop(&self) {
        self.hca.stop();
    }

    fn alloc(&self, len: usize, socket: i32, what: &str) -> Result<DmaBuf, HwError> {
        let source = match self.source {
            MemSource::Dpdk { .. } => MemSource::Dpdk { socket },
            MemSource::Heap => MemSource::Heap,
        };
        DmaBuf::new(len, source).ok_or_else(|| HwError::NoMemory(format!("no memory for {what}")))
    }
}

fn queue_state(ready: bool) -> mlx4_hca::QueueState {
    if ready {
        QueueState::Ready
    } else {
        QueueState::Reset
    }
}

impl Device for Soft {
    fn bf_page_cached(&self) -> bool {
        true
    }

    fn caps(&self) -> Caps {
        let c = self.hca.caps();
        Caps {
            max_sq_txbbs: c.max_sq_wqes,
            max_rq_wqes: c.max_rq_wqes,
            max_cqes: c.max_cqes,
            max_rq_sges: c.max_rq_sges,
            max_wqe_size: c.max_wqe_size,
            bf_reg_size: c.bf_reg_size,
            fw_ver: c.fw_ver,
            max_mac_addrs: c.max_mac_addrs,
            keep_crc: c.scatter_fcs,
            vlan_filter: true,
            tunnel_offloads: c.tunnel_offloads,
        }
    }

    fn reg_mr(&self, range: DmaRange) -> Result<Mr, HwError> {
        let (start, end) = (range.start(), range.end());
        // SAFETY: a `DmaRange` stays mapped for the device's life (its constructor's contract).
        let lkey = unsafe { self.hca.reg_mr(start as *const u8, end - start) }
            .map_err(hw_err(&format!("register memory {start:#x}..{end:#x}")))?;
        Ok(Mr { start, end, lkey })
    }

    fn dereg_mr(&self, mr: &Mr) -> Result<(), HwError> {
        self.hca
            .dereg_mr(mr.lkey)
            .map_err(hw_err("deregister memory"))
    }

    fn create_cq(&self, cqe_cnt: u32, socket: i32) -> Result<CqDesc, HwError> {
        let ring = cqe_cnt as usize * mlx4_prm::CQE_SIZE;
        let mem = self.alloc(ring + RECORD_SPACE, socket, "a CQ")?;
        // SAFETY: the record space lies after the ring, inside the buffer.
        let set_ci_db = unsafe { mem.as_ptr().add(ring) }.cast::<u32>();
        let attr = CqAttr {
            buf: mem.as_ptr(),
            cqe_cnt,
            set_ci_db,
        };
        // SAFETY: `mem` is kept in `self.mem` until destroy_cq has returned.
        let cqn = unsafe { self.hca.create_cq(&attr) }.map_err(hw_err("create CQ"))?;
        // SAFETY: the ring and the record are in `mem`, which stays in `self.mem` until
        // destroy_cq takes this descriptor back; the model wrote every entry hardware-owned.
        let desc = unsafe {
            CqDesc::new(
                mem.non_null(),
                cqe_cnt,
                mlx4_prm::CQE_SIZE as u32,
                NonNull::new(set_ci_db).expect("inside a live buffer"),
                cqn,
            )
        };
        self.mem.lock().cqs.insert(cqn, mem);
        Ok(desc)
    }

    fn destroy_cq(&self, cq: CqDesc) -> Result<(), HwError> {
        self.mine(|m| &m.cqs, cq.cqn(), cq.buf(), "CQ")?;
        self.hca
            .destroy_cq(cq.cqn())
            .map_err(hw_err("destroy CQ"))?;
        self.mem.lock().cqs.remove(&cq.cqn());
        Ok(())
    }

    fn create_sq(&self, txbb_cnt: u32, cq: &CqDesc, socket: i32) -> Result<SqDesc, HwError> {
        let mem = self.alloc(
            txbb_cnt as usize * mlx4_prm::TXBB_SIZE,
            socket,
            "a send ring",
        )?;
        let attr = SqAttr {
            buf: mem.as_ptr(),
            txbb_cnt,
            cqn: cq.cqn(),
        };
        // SAFETY: `mem` is kept in `self.mem` until destroy_sq has returned.
        let info = unsafe { self.hca.create_sq(&attr) }.map_err(hw_err("create SQ"))?;
        // SAFETY: the send doorbell lies inside the 4 KiB UAR page the model maps for the SQ.
        let doorbell = unsafe { info.uar.add(mlx4_prm::SEND_DOORBELL_OFFSET) }.cast::<u32>();
        let bf = info.bf.map(|b| BfDesc {
            reg: NonNull::new(b.reg).expect("the model maps its BlueFlame registers"),
            half_size: b.half_size,
        });
        // The model reads the doorbell word when it polls, so stores landing between two of
        // its polls merge; it counts each write the driver bumps this word for.
        // SAFETY: the count is a 4-aligned word of the same UAR page.
        let db_writes = unsafe { info.uar.add(mlx4_hca::UAR_DB_WRITES_OFFSET) }.cast::<AtomicU32>();
        // SAFETY: the ring is `mem`, kept in `self.mem` until destroy_sq takes this descriptor
        // back; the model keeps the SQ's UAR page and BlueFlame register until then too, and
        // reaches the count only atomically.
        let desc = unsafe {
            SqDesc::new(
                mem.non_null(),
                txbb_cnt,
                NonNull::new(doorbell).expect("the model maps its UAR pages"),
                bf,
                info.qpn,
            )
            .with_db_writes(NonNull::new(db_writes).expect("the model maps its UAR pages"))
        };
        self.mem.lock().sqs.insert(info.qpn, mem);
        Ok(desc)
    }

    fn destroy_sq(&self, sq: SqDesc) -> Result<(), HwError> {
        self.mine(|m| &m.sqs, sq.qpn(), sq.buf(), "SQ")?;
        self.hca
            .destroy_sq(sq.qpn())
            .map_err(hw_err("destroy SQ"))?;
        self.mem.lock().sqs.remove(&sq.qpn());
        Ok(())
    }

    fn create_rq(
        &self,
        wqe_cnt: u32,
        sges: u32,
        cq: &CqDesc,
        socket: i32,
    ) -> Result<RqDesc, HwError> {
        let ring = wqe_cnt as usize * sges as usize * mlx4_prm::DS_SIZE;
        let mem = self.alloc(ring + RECORD_SPACE, socket, "a receive ring")?;
        // SAFETY: the record space lies after the ring, inside the buffer.
        let db_rec = unsafe { mem.as_ptr().add(ring) }.cast::<u32>();
        let attr = RqAttr {
            buf: mem.as_ptr(),
            wqe_cnt,
            sges,
            cqn: cq.cqn(),
            db_rec,
        };
        // SAFETY: `mem` is kept in `self.mem` until destroy_rq has returned.
        let qpn = unsafe { self.hca.create_rq(&attr) }.map_err(hw_err("create RQ"))?;
        // SAFETY: the ring and the record are in `mem`, kept in `self.mem` until destroy_rq
        // takes this descriptor back.
        let desc = unsafe {
            RqDesc::new(
                mem.non_null(),
                wqe_cnt,
                sges,
                NonNull::new(db_rec).expect("inside a live buffer"),
                qpn,
            )
        };
        self.mem.lock().rqs.insert(qpn, mem);
        Ok(desc)
    }

    fn destroy_rq(&self, rq: RqDesc) -> Result<(), HwError> {
        self.mine(|m| &m.rqs, rq.qpn(), rq.buf(), "RQ")?;
        self.hca
            .destroy_rq(rq.qpn())
            .map_err(hw_err("destroy RQ"))?;
        self.mem.lock().rqs.remove(&rq.qpn());
        Ok(())
    }

    fn sq_state(&self, qpn: u32) -> Result<QueueState, HwError> {
        self.hca.sq_state(qpn).map_err(hw_err("SQ state"))
    }

    fn rq_state(&self, qpn: u32) -> Result<QueueState, HwError> {
        self.hca.rq_state(qpn).map_err(hw_err("RQ state"))
    }

    fn restart_rq(&self, qpn: u32) -> Result<(), HwError> {
        self.hca
            .set_rq_state(qpn, QueueState::Reset)
            .and_then(|()| self.hca.set_rq_state(qpn, QueueState::Ready))
            .map_err(hw_err("restart RQ"))
    }

    fn set_rx_filter(&self, mac: [u8; 6], promisc: bool, allmulti: bool) -> Result<(), HwError> {
        self.hca.set_rx_filter(mac, promisc, allmulti);
        Ok(())
    }

    fn set_mtu(&self, mtu: u16) -> Result<(), HwError> {
        self.hca.set_mtu(mtu).map_err(hw_err("set the MTU"))
    }

    fn set_rss(&self, key: &[u8; RSS_KEY_LEN], hash: RssHash) -> Result<(), HwError> {
        self.hca
            .set_rss(key, rss_fields(hash))
            .map_err(hw_err("set RSS"))
    }

    fn set_rx_steering(&self, rqs: &[u32]) -> Result<(), HwError> {
        self.hca
            .set_rx_steering(rqs)
            .map_err(hw_err("set the RSS indirection table"))
    }

    fn start(&self) -> Result<(), HwError> {
        if let Some(spec) = &self.wire {
            // The spec and the error may hold what the operator typed: escaped in the log.
            let what = format!("wire {}", spec.escape_debug());
            let wire: Wire = spec.parse().map_err(hw_err(&what))?;
            self.hca.set_wire(wire).map_err(|e| {
                HwError::Device(format!("{what}: {}", e.to_string().escape_debug()))
            })?;
        }
        self.run_loop()?;
        self.hca.set_port_up(true);
        self.started
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    fn stop(&self) {
        self.started
            .store(false, std::sync::atomic::Ordering::Release);
        self.hca.set_port_up(false);
        self.stop_loop();
    }

    fn link_up(&self) -> bool {
        self.hca.link_up()
    }

    fn counters(&self) -> Vec<(String, u64)> {
        self.hca
            .counters()
            .iter()
            .map(|(k, v)| (format!("hca_{k}"), v))
            .collect()
    }

    fn reset_counters(&self) {
        self.hca.reset_counters();
    }

    fn missed(&self) -> u64 {
        self.hca.counters().rx_missed()
    }

    fn event_fd(&self) -> Result<std::os::fd::RawFd, HwError> {
        self.hca.event_fd().map_err(hw_err("port event fd"))
    }

    fn next_event(&self) -> Option<PortEvent> {
        self.hca.next_event()
    }

    fn set_link(&self, up: bool) -> Result<(), HwError> {
        if self.hca.removed() {
            return Err(HwError::Device("the device was removed".into()));
        }
        self.hca.set_port_up(up);
        Ok(())
    }

    fn set_sq_ready(&self, qpn: u32, ready: bool) -> Result<(), HwError> {
        self.hca
            .set_sq_state(qpn, queue_state(ready))
            .map_err(hw_err("SQ state"))
    }

    fn set_rq_ready(&self, qpn: u32, ready: bool) -> Result<(), HwError> {
        self.hca
            .set_rq_state(qpn, queue_state(ready))
            .map_err(hw_err("RQ state"))
    }

    fn set_rq_keep_crc(&self, qpn: u32, on: bool) -> Result<(), HwError> {
        self.hca
            .set_rq_scatter_fcs(qpn, on)
            .map_err(hw_err("RQ scatter FCS"))
    }

    fn set_mac_table(&self, macs: &[[u8; 6]]) -> Result<(), HwError> {
        self.hca
            .set_mac_table(macs)
            .map_err(hw_err("unicast MAC table"))
    }

    fn set_mc_list(&self, macs: &[[u8; 6]]) -> Result<(), HwError> {
        self.hca.set_mc_list(macs).map_err(hw_err("multicast list"))
    }

    fn set_vlan_filter(&self, on: bool) -> Result<(), HwError> {
        self.hca.set_vlan_filtering(on);
        Ok(())
    }

    fn set_vlan(&self, vid: u16, member: bool) -> Result<(), HwError> {
        self.hca
            .set_vlan(vid, member)
            .map_err(hw_err("VLAN filter table"))
    }

    fn flow_control(&self) -> Result<FlowControl, HwError> {
        Ok(self.hca.flow_control())
    }

    fn set_flow_control(&self, f: &FlowControl) -> Result<(), HwError> {
        self.hca.set_flow_control(f).map_err(hw_err("flow control"))
    }

    fn create_comp_channel(&self) -> Result<(u32, std::os::fd::RawFd), HwError> {
        let ch = self
            .hca
            .create_comp_channel()
            .map_err(hw_err("completion channel"))?;
        let fd = self
            .hca
            .comp_channel_fd(ch)
            .map_err(hw_err("completion channel"))?;
        self.channels.fetch_add(1, Ordering::AcqRel);
        if self.started.load(Ordering::Acquire) {
            self.run_loop()?;
        }
        Ok((ch, fd))
    }

    fn destroy_comp_channel(&self, channel: u32) {
        if self.hca.destroy_comp_channel(channel).is_ok() {
            self.channels.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn arm_cq(&self, cq: &CqDesc, ci: u32, sn: u32, channel: u32) -> Result<(), HwError> {
        self.hca
            .set_cq_channel(cq.cqn(), Some(channel))
            .map_err(hw_err("bind a CQ to its channel"))?;
        let page = {
            let mut uar = self.arm_uar.lock();
            match *uar {
                Some(p) => p,
                None => {
                    let u = self.hca.alloc_uar().map_err(hw_err("a UAR page"))?;
                    *uar.insert(u.page as usize)
                }
            }
        };
        let ci = ci & 0x00ff_ffff;
        let cmd = (sn & 3) << 28 | mlx4_prm::CQ_DB_REQ_NOT | cq.cqn();
        // SAFETY: the CQ's arm record is the word after its consumer-index record, inside
        // the record space create_cq reserved; the device reads it atomically.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(cq.set_ci_db().as_ptr().add(1)) }.store(
            ((sn & 3) << 28 | mlx4_prm::CQ_DB_REQ_NOT | ci).to_be(),
            Ordering::Release,
        );
        // SAFETY: offset 0x20 of a UAR page of this adapter, 8-byte aligned, mapped while the
        // model lives; the device takes the doorbell as one 64-bit store.
        unsafe {
            std::sync::atomic::AtomicU64::from_ptr(
                (page + mlx4_prm::CQ_DOORBELL_OFFSET) as *mut u64,
            )
            .store(
                ((u64::from(cmd) << 32) | u64::from(ci)).to_be(),
                Ordering::Release,
            )
        };
        Ok(())
    }

    fn next_cq_event(&self, channel: u32) -> Option<u32> {
        self.hca.next_cq_event(channel).ok().flatten()
    }

    fn poll(&self) {
        self.hca.step();
    }

    fn create_flow(&self, rule: &FlowRule) -> Result<u32, HwError> {
        // An RSS fate gets an RSS context of its own, which lives as long as the rule.
        let (action, ctx) = match &rule.fate {
            FlowFate::Queue(qpn) => (mlx4_hca::FlowAction::Queue(*qpn), None),
            FlowFate::Drop => (mlx4_hca::FlowAction::Drop, None),
            FlowFate::Rss { key, hash, queues } => {
                let ctx = mlx4_hca::RssContext {
                    key: *key,
                    fields: rss_fields(*hash),
                    rqs: queues.clone(),
                };
                let id = self
                    .hca
                    .create_rss_context(&ctx)
                    .map_err(hw_err("create an RSS context"))?;
                (mlx4_hca::FlowAction::Rss(id), Some(id))
            }
        };
        let model_rule = mlx4_hca::FlowRule {
            priority: rule.priority,
            pattern: model_pattern(&rule.pattern),
            action,
        };
        match self.hca.create_flow(&model_rule) {
            Ok(id) => {
                if let Some(c) = ctx {
                    self.flow_ctxs.lock().insert(id, c);
                }
                Ok(id)
            }
            Err(e) => {
                if let Some(c) = ctx {
                    let _ = self.hca.destroy_rss_context(c);
                }
                Err(hw_err("create a flow rule")(e))
            }
        }
    }

    fn destroy_flow(&self, id: u32) -> Result<(), HwError> {
        self.hca
            .destroy_flow(id)
            .map_err(hw_err("destroy a flow rule"))?;
        if let Some(c) = self.flow_ctxs.lock().remove(&id) {
            self.hca
                .destroy_rss_context(c)
                .map_err(hw_err("destroy an RSS context"))?;
        }
        Ok(())
    }

    fn flow_counters(&self, id: u32) -> Result<FlowCounters, HwError> {
        let c = self
            .hca
            .flow_counters(id)
            .map_err(hw_err("flow rule counters"))?;
        Ok(FlowCounters {
            frames: c.frames,
            bytes: c.bytes,
        })
    }

    fn set_flow_isolate(&self, on: bool) -> Result<(), HwError> {
        self.hca.set_flows_only(on);
        Ok(())
    }

    fn secondary_attached(&self, attached: bool) {
        let mut n = self.secondaries.lock();
        *n = if attached {
            *n + 1
        } else {
            n.saturating_sub(1)
        };
        if self.device_loop != DeviceLoop::Lcore {
            return;
        }
        // The primary's lcore may go on running the device too: both take the model's lock.
        if *n > 0 && self.started.load(std::sync::atomic::Ordering::Acquire) {
            let _ = self.hca.start();
        } else if *n == 0 {
            self.hca.stop();
        }
    }
}

impl Drop for Soft {
    fn drop(&mut self) {
        // The device loop must stop touching queue memory before it is freed.
        self.stop_loop();
        self.hca.stop();
    }
}
