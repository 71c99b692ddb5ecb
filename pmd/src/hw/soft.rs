//! The software HCA backend: [`Device`] over [`mlx4_hca`], the one module of the driver that
//! names the model. It plays the part rdma-core plays for a card: it allocates queue memory
//! (from the port's [`MemSource`]), hands it to the model, and keeps it until the queue is
//! destroyed.
//!
//! It also decides where the model's device loop runs ([`DeviceLoop`]): in the lcore that polls
//! the port (the ethdev burst glue calls a [`Lcore`] runner after `tx_burst` posts and before
//! `rx_burst` polls), on a thread per port, or on one thread for the process's ports.

use std::collections::HashMap;
use std::ptr::NonNull;

use mlx4_hca::{CqAttr, Hca, HcaConfig, HcaError, RqAttr, RssFields, SqAttr, Wire};
use parking_lot::Mutex;

use super::{
    BfDesc, Caps, CqDesc, Device, HwError, QueueState, RqDesc, RssHash, SqDesc, RSS_KEY_LEN,
};
use crate::devargs::{Devargs, DeviceLoop, WcMode};
use crate::mem::{DmaBuf, DmaRange, MemSource, Mr};

/// The model this backend drives, for tests and benchmarks that open and step it themselves.
pub use mlx4_hca as hca;

// The port's RSS key is the device's, byte for byte.
const _: () = assert!(RSS_KEY_LEN == mlx4_hca::RSS_KEY_LEN);

/// Records (CQ consumer index, RQ doorbell) sit after their ring, on a cache line of their own.
const RECORD_SPACE: usize = 64;

/// Checks a `wire=` devarg value without opening anything (a `peer:` may not exist yet).
pub fn check_wire(spec: &str) -> Result<(), String> {
    spec.parse::<Wire>().map(|_| ()).map_err(|e| e.to_string())
}

/// One software HCA port and the queue memory it was given.
pub struct Soft {
    hca: Hca,
    device_loop: DeviceLoop,
    /// Secondary processes attached: their bursts cannot run a device that lives in this
    /// process, so an lcore-run device gets a thread while any is attached.
    secondaries: Mutex<u32>,
    started: std::sync::atomic::AtomicBool,
    /// Its id in the process's device thread while it is a member.
    process_member: Mutex<Option<u64>>,
    /// Where queue memory comes from; a `Dpdk` source takes each queue's socket.
    source: MemSource,
    /// Opened at start, so that a `peer:` partner may be probed after this port.
    wire: Option<String>,
    /// Queue memory by kind and number, freed once the model forgot the queue.
    mem: Mutex<QueueMem>,
}

#[derive(Default)]
struct QueueMem {
    cqs: HashMap<u32, DmaBuf>,
    sqs: HashMap<u32, DmaBuf>,
    rqs: HashMap<u32, DmaBuf>,
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
            threaded: true,
            busy_poll: args.busy_poll,
            name: name.to_owned(),
            ..HcaConfig::default()
        };
        let hca = Hca::open(cfg).map_err(hw_err("opening the software HCA"))?;
        let mut soft = Soft::new(hca, source);
        soft.wire = Some(args.wire.as_str().to_owned());
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
            process_member: Mutex::new(None),
            source,
            wire: None,
            mem: Mutex::new(QueueMem::default()),
        }
    }

    /// The model behind this port.
    pub fn hca(&self) -> &Hca {
        &self.hca
    }

    /// What the burst glue of this process calls, when the device runs in the polling lcore.
    pub fn lcore(&self) -> Option<Lcore> {
        (self.device_loop == DeviceLoop::Lcore).then(|| Lcore {
            hca: self.hca.clone(),
        })
    }

    /// Starts the device loop where it runs: a thread of its own or the process's thread;
    /// in the polling lcore, a thread only while a secondary process is attached.
    fn run_loop(&self) -> Result<(), HwError> {
        match self.device_loop {
            DeviceLoop::PortThread => self.hca.start().map_err(hw_err("start the device loop")),
            DeviceLoop::ProcessThread => {
                let mut m = self.process_member.lock();
                if m.is_none() {
                    *m = Some(process_thread::join(&self.hca)?);
                }
                Ok(())
            }
            DeviceLoop::Lcore if *self.secondaries.lock() > 0 => {
                self.hca.start().map_err(hw_err("start the device loop"))
            }
            DeviceLoop::Lcore => Ok(()),
        }
    }

    fn stop_loop(&self) {
        match self.device_loop {
            DeviceLoop::ProcessThread => {
                if let Some(id) = self.process_member.lock().take() {
                    process_thread::leave(id);
                }
            }
            DeviceLoop::PortThread | DeviceLoop::Lcore => self.hca.stop(),
        }
    }

    fn alloc(&self, len: usize, socket: i32, what: &str) -> Result<DmaBuf, HwError> {
        let source = match self.source {
            MemSource::Dpdk { .. } => MemSource::Dpdk { socket },
            MemSource::Heap => MemSource::Heap,
        };
        DmaBuf::new(len, source).ok_or_else(|| HwError::NoMemory(format!("no memory for {what}")))
    }
}

fn rss_fields(h: RssHash) -> RssFields {
    let mut f = RssFields::NONE;
    for (ours, theirs) in [
        (RssHash::IPV4, RssFields::IPV4),
        (RssHash::IPV4_TCP, RssFields::IPV4_TCP),
        (RssHash::IPV4_UDP, RssFields::IPV4_UDP),
        (RssHash::IPV6, RssFields::IPV6),
        (RssHash::IPV6_TCP, RssFields::IPV6_TCP),
        (RssHash::IPV6_UDP, RssFields::IPV6_UDP),
    ] {
        if h.contains(ours) {
            f |= theirs;
        }
    }
    f
}

fn state(s: mlx4_hca::QueueState) -> QueueState {
    match s {
        mlx4_hca::QueueState::Ready => QueueState::Ready,
        mlx4_hca::QueueState::Error => QueueState::Error,
    }
}

impl Device for Soft {
    fn caps(&self) -> Caps {
        let c = self.hca.caps();
        Caps {
            max_sq_txbbs: c.max_sq_wqes,
            max_rq_wqes: c.max_rq_wqes,
            max_cqes: c.max_cqes,
            max_rq_sges: c.max_rq_sges,
            max_wqe_size: c.max_wqe_size,
            bf_reg_size: c.bf_reg_size,
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
        // SAFETY: the ring is `mem`, kept in `self.mem` until destroy_sq takes this descriptor
        // back; the model keeps the SQ's UAR page and BlueFlame register until then too.
        let desc = unsafe {
            SqDesc::new(
                mem.non_null(),
                txbb_cnt,
                NonNull::new(doorbell).expect("the model maps its UAR pages"),
                bf,
                info.qpn,
            )
        };
        self.mem.lock().sqs.insert(info.qpn, mem);
        Ok(desc)
    }

    fn destroy_sq(&self, sq: SqDesc) -> Result<(), HwError> {
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
        self.hca
            .destroy_rq(rq.qpn())
            .map_err(hw_err("destroy RQ"))?;
        self.mem.lock().rqs.remove(&rq.qpn());
        Ok(())
    }

    fn sq_state(&self, qpn: u32) -> Result<QueueState, HwError> {
        self.hca
            .sq_state(qpn)
            .map(state)
            .map_err(hw_err("SQ state"))
    }

    fn rq_state(&self, qpn: u32) -> Result<QueueState, HwError> {
        self.hca
            .rq_state(qpn)
            .map(state)
            .map_err(hw_err("RQ state"))
    }

    fn set_rx_filter(&self, mac: [u8; 6], promisc: bool, allmulti: bool) -> Result<(), HwError> {
        self.hca.set_rx_filter(mac, promisc, allmulti);
        Ok(())
    }

    fn set_mtu(&self, mtu: u16) -> Result<(), HwError> {
        self.hca.set_mtu(mtu);
        Ok(())
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
        self.hca.port_up()
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
        let c = self.hca.counters();
        c.rx_drops_no_wqe + c.rx_drops_wire
    }

    fn poll(&self) {
        self.hca.step();
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

/// The device loop's share of the polling lcore: the burst glue calls [`Lcore::after_tx`]
/// after `tx_burst` posted and [`Lcore::before_rx`] before `rx_burst` polls. The queue code
/// never does: it only stores to memory and device pages, as on a card.
pub struct Lcore {
    hca: Hca,
}

impl Lcore {
    /// Executes what the send queues were told to do (doorbells, BlueFlame copies).
    #[inline]
    pub fn after_tx(&self) {
        self.hca.step();
    }

    /// Delivers frames waiting at the port to its receive queues.
    #[inline]
    pub fn before_rx(&self) {
        self.hca.step();
    }
}

/// One device thread for every port of the process that runs its device there
/// (`device_loop=process`): it steps each member's model in turn, backing off when all are
/// idle as a device thread of its own does.
mod process_thread {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use mlx4_hca::Hca;
    use parking_lot::Mutex;

    use crate::hw::HwError;

    struct Shared {
        /// Members by the id `join` gave them.
        members: Mutex<Vec<(u64, Hca)>>,
        /// Rounds over the members completed: `leave` waits for one that began without the
        /// member it removed.
        rounds: AtomicU64,
        stop: AtomicBool,
    }

    struct Running {
        sh: Arc<Shared>,
        thread: std::thread::JoinHandle<()>,
        next_id: u64,
    }

    static THREAD: Mutex<Option<Running>> = Mutex::new(None);

    const SPIN_POLLS: u32 = 2000;
    const YIELD_POLLS: u32 = 200;
    const MIN_IDLE_SLEEP: Duration = Duration::from_micros(50);
    const MAX_IDLE_SLEEP: Duration = Duration::from_micros(200);

    fn run(sh: Arc<Shared>) {
        let mut idle: u32 = 0;
        while !sh.stop.load(Ordering::Acquire) {
            let members: Vec<Hca> = sh.members.lock().iter().map(|(_, h)| h.clone()).collect();
            let work: usize = members.iter().map(Hca::step).sum();
            drop(members);
            sh.rounds.fetch_add(1, Ordering::Release);
            if work > 0 {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle < SPIN_POLLS {
                std::hint::spin_loop();
            } else if idle < SPIN_POLLS + YIELD_POLLS {
                std::thread::yield_now();
            } else {
                let doublings = ((idle - SPIN_POLLS - YIELD_POLLS) / 64).min(2);
                std::thread::sleep((MIN_IDLE_SLEEP * (1 << doublings)).min(MAX_IDLE_SLEEP));
            }
        }
    }

    /// Adds `hca` to the process's device thread, starting the thread with its first member.
    /// Returns the member's id for [`leave`].
    pub fn join(hca: &Hca) -> Result<u64, HwError> {
        let mut t = THREAD.lock();
        if t.is_none() {
            let sh = Arc::new(Shared {
                members: Mutex::new(Vec::new()),
                rounds: AtomicU64::new(0),
                stop: AtomicBool::new(false),
            });
            let run_sh = sh.clone();
            let thread = std::thread::Builder::new()
                .name("mlx4rs-devices".into())
                .spawn(move || run(run_sh))
                .map_err(|e| HwError::Device(format!("spawning the device thread: {e}")))?;
            *t = Some(Running {
                sh,
                thread,
                next_id: 0,
            });
        }
        let r = t.as_mut().expect("started above");
        let id = r.next_id;
        r.next_id += 1;
        r.sh.members.lock().push((id, hca.clone()));
        Ok(id)
    }

    /// Removes member `id`; once this returns the thread no longer runs it. The thread ends
    /// with its last member.
    pub fn leave(id: u64) {
        let mut t = THREAD.lock();
        let Some(r) = t.as_ref() else { return };
        let empty = {
            let mut m = r.sh.members.lock();
            m.retain(|(i, _)| *i != id);
            m.is_empty()
        };
        if empty {
            let r = t.take().expect("checked above");
            r.sh.stop.store(true, Ordering::Release);
            let _ = r.thread.join();
            return;
        }
        // The round in progress may still hold the member; the one after it does not.
        let sh = r.sh.clone();
        drop(t);
        let seen = sh.rounds.load(Ordering::Acquire);
        let deadline = Instant::now() + Duration::from_secs(1);
        while sh.rounds.load(Ordering::Acquire) < seen + 2 && Instant::now() < deadline {
            std::thread::sleep(MIN_IDLE_SLEEP);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_hash_maps_each_field_set() {
        assert_eq!(rss_fields(RssHash::NONE), RssFields::NONE);
        let all = RssHash::IPV4
            | RssHash::IPV4_TCP
            | RssHash::IPV4_UDP
            | RssHash::IPV6
            | RssHash::IPV6_TCP
            | RssHash::IPV6_UDP;
        assert_eq!(rss_fields(all), RssFields::ALL);
        assert_eq!(
            rss_fields(RssHash::IPV4 | RssHash::IPV6_UDP),
            RssFields::IPV4 | RssFields::IPV6_UDP
        );
    }

    #[test]
    fn default_key_is_the_devices() {
        assert_eq!(super::super::DEFAULT_RSS_KEY, mlx4_hca::DEFAULT_RSS_KEY);
    }
}
