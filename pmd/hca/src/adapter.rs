//! The adapter handle: opening and checking, the queues and resources of the control channel,
//! and who runs the device loop. Its port (steering, filters, flows, link and events) is in
//! `port.rs`.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::bar::Bar;
use crate::counters::Counters;
use crate::device::DevState;
use crate::dma;
use crate::error::{invalid, HcaError};
use crate::events;
use crate::fault::Faults;
use crate::runner::{self, Inner, RxRunner, SqRunner};
use crate::rx::{MAX_MAC_ADDRS, MAX_MC_ADDRS};
use crate::types::{
    Caps, CqAttr, HcaConfig, QueueState, RqAttr, RqOptions, SqAttr, SqInfo, SqOptions, Uar,
    FW_VERSION, PART_CX3, PART_CX3_PRO,
};
use crate::wire::{self, RxPort};

pub(crate) struct Shared {
    pub(crate) inner: Arc<Inner>,
    pub(crate) threaded: bool,
    shared_thread: bool,
    named: bool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Shared {
    fn stop(&self) {
        let mut t = self.thread.lock();
        if let Some(h) = t.take() {
            self.inner.stop.store(true, Ordering::Release);
            let _ = h.join();
            self.inner.stop.store(false, Ordering::Release);
        }
        drop(t);
        runner::leave_shared(&self.inner);
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop();
        if self.named {
            wire::unregister(&self.inner.port);
        }
        // A `peer:` partner mid-poll holds this port's inbox, which lives in device memory the
        // owner frees once this returns.
        self.inner.port.retire();
    }
}

/// The adapter: a cheap, clonable handle. The device loop thread (if started) stops when
/// [`Hca::stop`] is called or the last handle is dropped; device pages (UAR, BlueFlame) stay valid
/// until then.
#[derive(Clone)]
pub struct Hca {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for Hca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hca")
            .field("threaded", &self.shared.threaded)
            .field("shared_thread", &self.shared.shared_thread)
            .finish_non_exhaustive()
    }
}

/// The adapter's lock held by the control path; publishes the counters when dropped.
pub(crate) struct StateGuard<'a>(parking_lot::MutexGuard<'a, DevState>);

impl std::ops::Deref for StateGuard<'_> {
    type Target = DevState;
    fn deref(&self) -> &DevState {
        &self.0
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut DevState {
        &mut self.0
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        self.0.publish();
    }
}

/// A bound on [`Hca::step`] so a driver that keeps posting cannot hang a test.
const MAX_STEP_POLLS: usize = 1 << 20;

impl Hca {
    /// Open an adapter, its device memory on the heap.
    pub fn open(cfg: HcaConfig) -> Result<Hca, HcaError> {
        Hca::check(&cfg)?;
        let bar = Bar::on_heap(&cfg);
        Hca::open_with(cfg, bar)
    }

    /// Open an adapter whose device memory (UAR pages, BlueFlame registers, counters, receive
    /// buffer) is `bar`, which needs [`Bar::required_len`] bytes for `cfg`: memory from
    /// [`Bar::from_raw`], for example DPDK shared memory that secondary processes map too.
    pub fn open_on(cfg: HcaConfig, bar: Bar) -> Result<Hca, HcaError> {
        Hca::check(&cfg)?;
        let bar = bar.prepare(&cfg)?;
        Hca::open_with(cfg, bar)
    }

    /// The adapter's device memory.
    pub fn bar(&self) -> Bar {
        self.state().bar().clone()
    }

    fn check(cfg: &HcaConfig) -> Result<(), HcaError> {
        if cfg.bf_reg_size != 0 {
            if !cfg.bf_reg_size.is_power_of_two() || !(128..=4096).contains(&cfg.bf_reg_size) {
                return Err(invalid(format!(
                    "bf_reg_size {} is not 0 or a power of two from 128 to 4096",
                    cfg.bf_reg_size
                )));
            }
            if cfg.bf_regs_per_page == 0
                || cfg.bf_regs_per_page as usize * cfg.bf_reg_size as usize
                    > mlx4_prm::UAR_PAGE_SIZE
            {
                return Err(invalid(format!(
                    "{} BlueFlame registers of {} bytes do not fit a 4 KiB page",
                    cfg.bf_regs_per_page, cfg.bf_reg_size
                )));
            }
        }
        if cfg.max_wqe_size % 16 != 0 || !(64..=1008).contains(&cfg.max_wqe_size) {
            return Err(invalid(format!(
                "max_wqe_size {} is not a multiple of 16 from 64 to 1008",
                cfg.max_wqe_size
            )));
        }
        if cfg.rx_inbox_frames == 0 {
            return Err(invalid("rx_inbox_frames is 0"));
        }
        if cfg.uars == 0 || cfg.uars > 4096 {
            return Err(invalid(format!("uars {} is not 1 to 4096", cfg.uars)));
        }
        Ok(())
    }

    fn open_with(cfg: HcaConfig, bar: Bar) -> Result<Hca, HcaError> {
        let w = cfg.max_wqe_size;
        let caps = Caps {
            num_ports: 1,
            max_qps: 1024,
            max_cqs: 1024,
            max_sq_wqes: 16384,
            max_rq_wqes: 16384,
            max_cqes: 1 << 22,
            max_wqe_size: w,
            max_inline: w - 16 - 4 * w.div_ceil(64),
            bf_reg_size: cfg.bf_reg_size,
            bf_regs_per_page: if cfg.bf_reg_size == 0 {
                0
            } else {
                cfg.bf_regs_per_page
            },
            max_rq_sges: 32,
            max_mac_addrs: MAX_MAC_ADDRS as u32,
            max_mc_addrs: MAX_MC_ADDRS as u32,
            scatter_fcs: true,
            vendor_part_id: if cfg.pro { PART_CX3_PRO } else { PART_CX3 },
            tunnel_offloads: cfg.pro,
            fw_ver: u64::from(FW_VERSION.0) << 32
                | u64::from(FW_VERSION.1) << 16
                | u64::from(FW_VERSION.2),
        };
        let port = Arc::new(RxPort::on(bar.new_inbox(cfg.rx_inbox_frames)));
        let faults = cfg.faults;
        let named = !cfg.name.is_empty();
        if named {
            wire::register(&cfg.name, &port)?;
        }
        let events = Arc::new(events::Events::new()?);
        let inner = Arc::new(Inner {
            state: Mutex::new(DevState::new(
                caps,
                (cfg.wc, cfg.reset_on_create),
                port.clone(),
                cfg.doorbell_ns,
                bar,
                events.clone(),
            )),
            events,
            threaded: cfg.threaded,
            port,
            stop: AtomicBool::new(false),
            busy_poll: cfg.busy_poll,
            wire_rx: AtomicBool::new(false),
        });
        inner.state.lock().set_faults(faults);
        Ok(Hca {
            shared: Arc::new(Shared {
                inner,
                threaded: cfg.threaded,
                shared_thread: cfg.shared_thread,
                named,
                thread: Mutex::new(None),
            }),
        })
    }

    /// The device's state, for a control-path call: what the call changed in the counters
    /// reaches device memory when it lets go (the device loop publishes only after polls
    /// that did something).
    pub(crate) fn state(&self) -> StateGuard<'_> {
        StateGuard(self.shared.inner.state.lock())
    }

    /// Device capabilities.
    pub fn caps(&self) -> Caps {
        self.state().caps
    }

    /// Register `[addr, addr + len)` for DMA and return its lkey (never [`mlx4_prm::INVALID_LKEY`]).
    ///
    /// # Safety
    /// The range must stay valid for reads and writes until [`Hca::dereg_mr`] returns (or the
    /// adapter is dropped): the device reads gather buffers and writes received frames there,
    /// from its own thread.
    #[allow(unsafe_code)]
    pub unsafe fn reg_mr(&self, addr: *const u8, len: usize) -> Result<u32, HcaError> {
        if addr.is_null() || len == 0 || (addr as usize).checked_add(len).is_none() {
            return Err(invalid(format!(
                "memory region {addr:p}+{len:#x} is empty, null or wraps"
            )));
        }
        // SAFETY: the caller keeps the range valid until deregistration, which removes this view.
        let mem = unsafe { dma::HostMem::new(addr as *mut u8, len) };
        self.state().reg_mr(mem)
    }

    /// Deregister a memory region; the device no longer touches it once this returns.
    pub fn dereg_mr(&self, lkey: u32) -> Result<(), HcaError> {
        self.state().dereg_mr(lkey)
    }

    /// Create a completion queue and return its CQN.
    ///
    /// # Safety
    /// `attr.buf` (`cqe_cnt * 32` bytes) and `attr.set_ci_db` (4 bytes) must stay valid for reads
    /// and writes until [`Hca::destroy_cq`] returns or the adapter is dropped.
    #[allow(unsafe_code)]
    pub unsafe fn create_cq(&self, attr: &CqAttr) -> Result<u32, HcaError> {
        let n = attr.cqe_cnt;
        if !n.is_power_of_two() || n < 2 {
            return Err(invalid(format!(
                "cqe_cnt {n} is not a power of two of at least 2"
            )));
        }
        if n > self.caps().max_cqes {
            return Err(invalid(format!("cqe_cnt {n} exceeds max_cqes")));
        }
        check_ptr(attr.buf, mlx4_prm::CQE_SIZE, "CQ buffer")?;
        check_ptr(attr.set_ci_db as *mut u8, 4, "CQ set_ci_db record")?;
        let len = n as usize * mlx4_prm::CQE_SIZE;
        // SAFETY: the caller keeps both ranges valid until destroy_cq; `check_ptr` made sure
        // they are non-null and aligned for the device's atomic accesses.
        let (ring, db) = unsafe {
            (
                dma::HostMem::new(attr.buf, len),
                dma::HostMem::new(attr.set_ci_db as *mut u8, 4),
            )
        };
        self.state().create_cq(ring, n, db)
    }

    /// Create a send queue with the default [`SqOptions`] (64-byte slots, a UAR page of its
    /// own).
    ///
    /// # Safety
    /// `attr.buf` (`txbb_cnt * 64` bytes) must stay valid for reads until [`Hca::destroy_sq`]
    /// returns or the adapter is dropped.
    #[allow(unsafe_code)]
    pub unsafe fn create_sq(&self, attr: &SqAttr) -> Result<SqInfo, HcaError> {
        // SAFETY: the caller's contract is create_sq_with's.
        unsafe { self.create_sq_with(attr, &SqOptions::default()) }
    }

    /// Create a send queue laid out and ringing as `opts` says. It starts in `Ready`, or in
    /// `Reset` with [`HcaConfig::reset_on_create`].
    ///
    /// # Safety
    /// As [`Hca::create_sq`].
    #[allow(unsafe_code)]
    pub unsafe fn create_sq_with(
        &self,
        attr: &SqAttr,
        opts: &SqOptions,
    ) -> Result<SqInfo, HcaError> {
        let n = attr.txbb_cnt;
        if !n.is_power_of_two() {
            return Err(invalid(format!("txbb_cnt {n} is not a power of two")));
        }
        if n > self.caps().max_sq_wqes {
            return Err(invalid(format!("txbb_cnt {n} exceeds max_sq_wqes")));
        }
        let shift = opts.stride_shift;
        if !(mlx4_prm::TXBB_SHIFT..=11).contains(&shift) {
            return Err(invalid(format!("stride_shift {shift} is not 6 to 11")));
        }
        if (n as usize * mlx4_prm::TXBB_SIZE) >> shift == 0 {
            return Err(invalid(format!(
                "{n} TXBBs hold no slot of {} bytes",
                1u32 << shift
            )));
        }
        check_ptr(attr.buf, mlx4_prm::TXBB_SIZE, "SQ buffer")?;
        // SAFETY: the caller keeps the ring valid until destroy_sq; it is non-null and aligned.
        let ring = unsafe { dma::HostMem::new(attr.buf, n as usize * mlx4_prm::TXBB_SIZE) };
        self.state().create_sq(ring, n, attr.cqn, opts)
    }

    /// Create a receive queue and return its QPN.
    ///
    /// # Safety
    /// `attr.buf` (`wqe_cnt * 16 * sges` bytes) and `attr.db_rec` (4 bytes) must stay valid for
    /// reads until [`Hca::destroy_rq`] returns or the adapter is dropped.
    #[allow(unsafe_code)]
    pub unsafe fn create_rq(&self, attr: &RqAttr) -> Result<u32, HcaError> {
        // SAFETY: the caller's contract is create_rq_with's.
        unsafe { self.create_rq_with(attr, &RqOptions::default()) }
    }

    /// Create a receive queue as `opts` says and return its QPN. It starts in `Ready`, or in
    /// `Reset` with [`HcaConfig::reset_on_create`].
    ///
    /// # Safety
    /// As [`Hca::create_rq`].
    #[allow(unsafe_code)]
    pub unsafe fn create_rq_with(&self, attr: &RqAttr, opts: &RqOptions) -> Result<u32, HcaError> {
        let caps = self.caps();
        if !attr.wqe_cnt.is_power_of_two() || attr.wqe_cnt > caps.max_rq_wqes {
            return Err(invalid(format!(
                "wqe_cnt {} is not a power of two up to {}",
                attr.wqe_cnt, caps.max_rq_wqes
            )));
        }
        if !attr.sges.is_power_of_two() || attr.sges > caps.max_rq_sges {
            return Err(invalid(format!(
                "sges {} is not a power of two up to {}",
                attr.sges, caps.max_rq_sges
            )));
        }
        check_ptr(attr.buf, 16, "RQ buffer")?;
        check_ptr(attr.db_rec as *mut u8, 4, "RQ doorbell record")?;
        let len = attr.wqe_cnt as usize * attr.sges as usize * 16;
        // SAFETY: the caller keeps both ranges valid until destroy_rq; they are non-null and
        // aligned.
        let (ring, db) = unsafe {
            (
                dma::HostMem::new(attr.buf, len),
                dma::HostMem::new(attr.db_rec as *mut u8, 4),
            )
        };
        self.state()
            .create_rq(ring, (attr.wqe_cnt, attr.sges), attr.cqn, db, opts)
    }

    /// Move a send queue to `state`: `Ready` from `Reset` (the walk starts at slot 0), `Reset`
    /// or `Error` from anywhere. A queue in error must go through `Reset`.
    pub fn set_sq_state(&self, qpn: u32, state: QueueState) -> Result<(), HcaError> {
        self.state().set_sq_state(qpn, state)
    }

    /// Leave (`on`) or strip the 4-byte FCS of frames this RQ receives (verbs'
    /// `IBV_WQ_FLAGS_SCATTER_FCS`, DPDK's `KEEP_CRC`): the device scatters the frame and then
    /// its CRC-32 (least significant byte first, as on the wire), and `byte_cnt` counts it, so
    /// the buffers must hold 4 more bytes. Filters, MTU, hash and checksums see the frame
    /// without it. Off by default.
    pub fn set_rq_scatter_fcs(&self, qpn: u32, on: bool) -> Result<(), HcaError> {
        self.state().set_rq_scatter_fcs(qpn, on)
    }

    /// Move a receive queue to `state`, with the rules of [`Hca::set_sq_state`].
    pub fn set_rq_state(&self, qpn: u32, state: QueueState) -> Result<(), HcaError> {
        self.state().set_rq_state(qpn, state)
    }

    /// Hold back `count` (a power of two) consecutive QPNs whose first is a multiple of
    /// `count`, and return the first: queues created with [`SqOptions::qpn`] /
    /// [`RqOptions::qpn`] take numbers from it (libmlx4's `LOG_WQS_RANGE_SZ`, which mlx4_ib
    /// needs for an RSS indirection table). Other queues never get these numbers.
    pub fn reserve_qpns(&self, count: u32) -> Result<u32, HcaError> {
        self.state().reserve_qpns(count)
    }

    /// Give back a range from [`Hca::reserve_qpns`] (`Busy` while a queue holds one of its
    /// numbers).
    pub fn release_qpns(&self, base: u32) -> Result<(), HcaError> {
        self.state().release_qpns(base)
    }

    /// Allocate a UAR page (zeroed, with its BlueFlame page): for send queues to share
    /// ([`SqOptions::uar`]; each gets a register of its BlueFlame page while they last) and
    /// for CQ arm doorbells. A doorbell on any UAR page of the adapter is routed by the QPN it
    /// names.
    pub fn alloc_uar(&self) -> Result<Uar, HcaError> {
        self.state().alloc_uar()
    }

    /// Free a page from [`Hca::alloc_uar`] (`Busy` while send queues are on it).
    pub fn free_uar(&self, index: u32) -> Result<(), HcaError> {
        self.state().free_uar(index)
    }

    /// Destroy a send queue; the device stops reading its ring before this returns.
    pub fn destroy_sq(&self, qpn: u32) -> Result<(), HcaError> {
        self.state().destroy_sq(qpn)
    }

    /// Destroy a receive queue; the device stops using its ring before this returns.
    pub fn destroy_rq(&self, qpn: u32) -> Result<(), HcaError> {
        self.state().destroy_rq(qpn)
    }

    /// Destroy a completion queue (fails while queues still report to it).
    pub fn destroy_cq(&self, cqn: u32) -> Result<(), HcaError> {
        self.state().destroy_cq(cqn)
    }

    /// State of a send queue.
    pub fn sq_state(&self, qpn: u32) -> Result<QueueState, HcaError> {
        self.state().sq_state(qpn)
    }

    /// State of a receive queue.
    pub fn rq_state(&self, qpn: u32) -> Result<QueueState, HcaError> {
        self.state().rq_state(qpn)
    }

    /// Start the device loop: its own thread, or a place in the process-wide device thread
    /// (`shared_thread`). A no-op in the polled mode or when running.
    pub fn start(&self) -> Result<(), HcaError> {
        let sh = &self.shared;
        if !sh.threaded {
            return Ok(());
        }
        if sh.shared_thread {
            return runner::join_shared(&sh.inner);
        }
        let mut t = sh.thread.lock();
        if t.is_none() {
            *t = Some(runner::own_thread(sh.inner.clone())?);
        }
        Ok(())
    }

    /// Stop the device loop and wait until it no longer runs this adapter; idempotent. The
    /// runners of the polled mode are not affected (they run when called).
    pub fn stop(&self) {
        self.shared.stop();
    }

    /// The runner of send queue `qpn`, for the polled mode: the ethdev burst glue calls
    /// [`SqRunner::run`] after `tx_burst` posted on the queue. Keep it with the queue; it does
    /// nothing once the queue is destroyed.
    pub fn sq_runner(&self, qpn: u32) -> Result<SqRunner, HcaError> {
        let w = self.state().sq_watch(qpn)?;
        Ok(SqRunner {
            inner: self.shared.inner.clone(),
            qpn,
            db: w.db,
            bf: w.bf,
            busy: w.busy,
        })
    }

    /// The runner of the port's receive side, for the polled mode: the ethdev burst glue calls
    /// [`RxRunner::run`] before `rx_burst` polls.
    pub fn rx_runner(&self) -> RxRunner {
        RxRunner {
            inner: self.shared.inner.clone(),
        }
    }

    /// Run the device loop until it finds nothing to do; returns the work items done
    /// (doorbells, BlueFlame writes, WQEs, received frames). Meant for step mode, safe in both.
    pub fn step(&self) -> usize {
        let mut total = 0;
        for _ in 0..MAX_STEP_POLLS {
            let n = self.shared.inner.charged(DevState::poll);
            if n == 0 {
                break;
            }
            total += n;
        }
        total
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        let mut st = self.state();
        st.fold_wire_drops();
        st.publish();
        let mut c = st.counters.clone();
        c.rx_drops_wire += self.shared.inner.port.inbox.dropped();
        c
    }

    /// Inject `faults` from now on (each schedule starts over; `Faults::default()` stops
    /// injecting); a link an injected flap took down comes back up. What was injected is
    /// counted in the `inj_*` counters.
    pub fn set_faults(&self, faults: Faults) {
        self.state().set_faults(faults);
    }

    /// Whether a send queue may execute a WQE that has the shape of the last one it decoded
    /// (the same control segment and the same segment headers) from those words, without
    /// decoding it again: on by default. Off, every WQE is decoded in full, the reference
    /// the cache is tested against.
    pub fn set_shape_cache(&self, on: bool) {
        self.state().set_shape_cache(on);
    }

    /// Whether the receive delivery may take the frames of a run (one flow to one RQ) in
    /// stretches, with what cannot change within one decided once: on by default. Off, every
    /// frame goes through the general receive, the reference the stretches are tested
    /// against.
    pub fn set_rx_stretches(&self, on: bool) {
        self.state().set_rx_stretches(on);
    }

    /// The faults being injected.
    pub fn faults(&self) -> Faults {
        self.state().faults()
    }

    /// Zero all counters.
    pub fn reset_counters(&self) {
        let mut st = self.state();
        st.counters = Counters::default();
        st.publish();
        self.shared.inner.port.inbox.reset_dropped();
    }
}

fn check_ptr(p: *mut u8, align: usize, what: &str) -> Result<(), HcaError> {
    if p.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    if p as usize % align != 0 {
        return Err(invalid(format!("{what} {p:p} is not {align}-byte aligned")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_is_send_sync_and_attrs_describe_themselves() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Hca>();
        let e = HcaError::NotFound("SQ", 0x41);
        assert_eq!(e.to_string(), "no SQ 0x41");
        assert_eq!(e.errno(), libc::ENOENT);
    }
}
