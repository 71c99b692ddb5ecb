//! A software mlx4 (ConnectX-3) HCA: the hardware the mlx4rs driver runs on when no card is
//! attached.
//!
//! The driver and this model meet only where a driver and a real HCA meet (`doc/design.md`, "The
//! hardware boundary"): device pages (a UAR page per send queue with the send doorbell at 0x14, a
//! BlueFlame register of two halves), host memory the driver hands over at queue creation (SQ
//! ring, CQ ring, RQ ring, CQ consumer index and RQ doorbell records), packet buffers named by
//! virtual address and lkey, and a control channel playing the firmware (this crate's [`Hca`]
//! methods). The data path never calls into the model: the device loop polls the doorbell words
//! and BlueFlame halves and follows the rules of `doc/prm.md` section 10, including producing
//! error CQEs for malformed WQEs rather than trusting them.
//!
//! # Who runs the device
//! - **A thread per adapter** (`HcaConfig::threaded`, the default): between [`Hca::start`] and
//!   [`Hca::stop`] a thread polls the adapter's doorbells, BlueFlame halves and receive buffer,
//!   spinning, then yielding, then sleeping briefly while idle (`busy_poll` keeps it spinning).
//! - **One thread for every adapter of the process** (`threaded` and `shared_thread`): the same
//!   loop over all adapters that asked for it, for machines with few cores.
//! - **The polling lcore** (`threaded: false`): nothing runs by itself. The ethdev burst glue
//!   calls [`SqRunner::run`] (from [`Hca::sq_runner`], one per send queue) after `tx_burst`
//!   posted on that queue, and [`RxRunner::run`] (from [`Hca::rx_runner`]) before `rx_burst`
//!   polls; the queue code itself still only stores to memory and device pages. Both runners
//!   cost a few loads and no lock when there is nothing to do, and may be called from any
//!   thread at any time (they serialise on the adapter's lock only when there is work).
//!   Device work then happens in the lcore that polls, so a 2-core machine measures the
//!   driver rather than the scheduler.
//! - Tests step the device synchronously, one [`Hca::step`] at a time (any mode).
//!
//! # Counting drops
//! A frame that leaves a port counts as sent there; if the other end then cannot take it,
//! that end counts it. [`Counters::rx_missed`] is what the driver reports as `imissed`;
//! [`Counters::rx_dropped`] is every receive-side drop, so on a cable one port's `tx_frames`
//! equals the other's `rx_frames + rx_dropped()` once nothing is in flight.
//!
//! # Device memory and other processes
//! UAR pages, BlueFlame registers, the counters and the port's receive buffer are carved from
//! one region, the adapter's [`Bar`]: the heap by default ([`Hca::open`]), or memory the opener
//! provides ([`Bar::from_raw`] with [`Bar::required_len`] bytes, then [`Hca::open_on`]), e.g.
//! DPDK shared memory. Another process maps the same memory and, with no `Hca`, reads the
//! counters ([`Bar::attach`], [`Bar::counters`]) and rings doorbells at the same offsets
//! ([`Bar::offset_of`], [`Bar::at`]); the device runs in the process that opened the adapter.
//!
//! # Wires
//! [`Wire`]: null (count and drop), loop, a peer port of this process by name, a cable through a
//! file (two processes, or two copies of this library, plug into one path), pcap, TAP, and a
//! closure (tests). [`Hca::set_wire`] plugs one in; `"cable:/path".parse::<Wire>()` and the
//! other devarg forms parse.
//!
//! # Faults
//! [`Faults`] (in [`HcaConfig::faults`] or [`Hca::set_faults`] at run time) injects error CQEs
//! every N send WQEs, RX buffer errors every N frames, lost doorbells, and link flaps; error
//! CQEs it injected carry vendor_err [`INJECTED_VENDOR_ERR`], and the `inj_*` counters say what
//! was injected.
//!
//! # Events
//! The device tells the driver without being polled, through event fds (eventfds a DPDK driver
//! hands to EAL's interrupt thread): port events ([`Hca::event_fd`], [`Hca::next_event`]: link
//! up and down as a PHY sees them, [`Hca::link_up`], and removal, [`Hca::remove`]), and
//! completion events of armed CQs on completion channels ([`Hca::create_comp_channel`]; a CQ is
//! armed by the CQ doorbell at UAR + 0x20, one event per arming).
//!
//! # Queue states
//! Queues start `Ready` (or, with [`HcaConfig::reset_on_create`], `Reset`, running only once
//! [`Hca::set_sq_state`] / [`Hca::set_rq_state`] made them `Ready`, as a QP in RTS and a WQ in
//! RDY). A send queue's ring is slots of 64 bytes or, with [`SqOptions::stride_shift`], more
//! (libmlx4's layout for QPs with inline or LSO caps).
//!
//! # What the device does (the contract the driver codes against)
//! - **Doorbell**: a 32-bit store of BE32(`qpn << 8`) at UAR + 0x14 of any UAR page of the
//!   adapter: the device routes it by the QPN it names (a queue's own page, or one several
//!   queues share, [`SqOptions::uar`]). The device takes the word with an atomic swap, so
//!   doorbells are never lost and two that land together merge (on a shared page the device
//!   then also walks the page's other queues, counted `doorbells_inferred`). It then
//!   walks the SQ from its consumer while the first dword's OWNER bit equals the pass parity and
//!   DS (byte 7) is non-zero. WQEs nobody rang for are not executed; stamped TXBBs never are.
//! - **BlueFlame**: the driver writes the WQE to ring memory first, then copies
//!   ALIGN(ds*16, 64) bytes into the next half with the 16-bit counter in owner_opcode bits 23:8
//!   and the QPN in bytes 4-6 (DS in byte 7). That write is the doorbell: the device runs the SQ
//!   up to and including the WQE at that counter. With `wc` the WQE at the counter comes from
//!   the copy, which the device takes when it lands and checks against ring memory (except
//!   counter, bytes 4-7 and srcrb flags); a copy still incomplete after a short wait is counted
//!   torn, one a newer write replaced before use `bf_superseded`; without `wc` the copy is
//!   never used. The device consumes an arrival by zeroing the half's first qword.
//! - **Completions**: a 32-byte CQE per WQE with srcrb C = 0b11 and per error, owner bit =
//!   pass parity, never more than `cqe_cnt` ahead of `set_ci_db` (a send queue waits instead; a
//!   received frame waits up to 10 ms, then is dropped as `rx_drops_cq_full`).
//! - **Errors**: opcode other than NOP/SEND/LSO (or an LSO header that is not TCP), WQE over `max_wqe_size` or the ring, an unknown
//!   `ins_vlan` value, or an inline segment crossing 64 bytes: `LOCAL_QP_OP`; segments running past DS,
//!   zero-length or oversized frames: `LOCAL_LENGTH`; unknown lkey or a buffer outside its region:
//!   `LOCAL_PROT`. The SQ goes to [`QueueState::Error`] and runs nothing more until reset or
//!   recreated.
//! - **Send**: the frame is the WQE's inline and data segments in order (zero-length entries
//!   skipped); `ins_vlan` inserts a tag after the MACs, except in a WQE a BlueFlame write
//!   announced (copy taken or not): there bytes 4-6 are the QPN, which mlx4_en and rdma-core
//!   also write into the ring copy (`bf_qpn`), so they are neither a VLAN nor an error; srcrb IP_CSUM / TCP_UDP_CSUM fill the IPv4
//!   header and TCP/UDP checksums from scratch. LSO (`mss << 16 | hdr_len`, header template, data
//!   segments) cuts the payload into MSS segments with their own lengths, IDs, sequence numbers
//!   and checksums.
//!   A ConnectX-3 Pro ([`HcaConfig::pro`]) also fills the inner checksums of VXLAN frames
//!   (owner_opcode IIP/ILP).
//! - **Receive**: flow rules ([`Hca::create_flow`]: eth, VLAN, IPv4, TCP/UDP fields under
//!   masks; to an RQ, an RSS context of their own, or dropped as `rx_drops_flow`) are checked
//!   first, by priority. Frames no rule takes meet the filters: not promiscuous (the default
//!   is), only unicast addresses of the MAC table (128), broadcast, multicast groups of the
//!   multicast list (or all, with all-multicast) pass, the rest count as `rx_drops_filter`;
//!   with the VLAN filter on, tagged frames of other VLANs as `rx_drops_vlan`. Frames whose L3
//!   length exceeds the MTU are dropped as `rx_drops_mtu`. The rest go to one RQ,
//!   `steering[hash % len]` with the Toeplitz RSS hash ([`Hca::set_rss`]; hash 0, so the first
//!   entry, for frames no enabled field set covers), which the CQE carries in
//!   `immed_rss_invalid`. An RQ may keep the FCS ([`Hca::set_rq_scatter_fcs`]); on a Pro, a
//!   VXLAN frame's CQE has inner verdicts and tunnel bits. An RQ consumes
//!   WQEs while the device's count differs from the doorbell record's low 16 bits;
//!   no posted WQE drops the frame, a frame larger than the WQE's buffers gets a `LOCAL_LENGTH`
//!   error CQE for that WQE and the queue goes on, a bad scatter entry puts the RQ in error.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod bar;
mod cable;
mod counters;
mod cq;
mod device;
mod dma;
mod error;
mod events;
mod fault;
mod flow;
mod inbox;
mod monitor;
mod net;
mod rq;
mod rss;
mod runner;
mod rx;
mod send;
mod shape;
mod sq;
mod tables;
mod tap;
mod types;
mod wire;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

pub use bar::Bar;
pub use counters::Counters;
pub use error::HcaError;
pub use events::PortEvent;
pub use fault::{Faults, INJECTED_VENDOR_ERR};
pub use flow::{
    EthMatch, FlowAction, FlowCounters, FlowPattern, FlowRule, Ipv4Match, L4Match, L4Proto, Masked,
    RssContext, VlanMatch, MAX_FLOWS, MAX_RSS_CONTEXTS,
};
pub use monitor::{MONITOR_PERIOD, SERVICE_PERIOD};
pub use rss::{RssFields, DEFAULT_RSS_KEY, RSS_KEY_LEN};
pub use runner::{RxRunner, SqRunner};
pub use rx::{FlowControl, RxFilter, MAX_MAC_ADDRS, MAX_MC_ADDRS};
pub use types::{
    BfReg, Caps, CqAttr, HcaConfig, QueueState, RqAttr, RqOptions, SqAttr, SqInfo, SqOptions, Uar,
    FW_VERSION, PART_CX3, PART_CX3_PRO,
};
pub use wire::{FrameSink, Wire};

use device::DevState;
use error::invalid;
use runner::Inner;
use wire::RxPort;

struct Shared {
    inner: Arc<Inner>,
    threaded: bool,
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
    shared: Arc<Shared>,
}

impl fmt::Debug for Hca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hca")
            .field("threaded", &self.shared.threaded)
            .field("shared_thread", &self.shared.shared_thread)
            .finish_non_exhaustive()
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

    fn state(&self) -> parking_lot::MutexGuard<'_, DevState> {
        self.shared.inner.state.lock()
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

    /// Choose the receive queues frames are spread over by their RSS hash (the CQE carries the
    /// hash): the RSS indirection table, `rqs[hash % rqs.len()]`. Empty (the default) means
    /// every RQ in QPN order. A listed RQ destroyed later makes its share of frames drop.
    pub fn set_rx_steering(&self, rqs: &[u32]) -> Result<(), HcaError> {
        self.state().set_steering(rqs)
    }

    /// Set the Toeplitz RSS key (exactly [`RSS_KEY_LEN`] bytes) and the packet types hashed.
    /// The input is source then destination address, then source then destination port for
    /// TCP/UDP whose field set is on (addresses only when just the IP set is on); frames no
    /// enabled set covers hash to 0. Default: [`DEFAULT_RSS_KEY`] and [`RssFields::ALL`].
    pub fn set_rss(&self, key: &[u8], fields: RssFields) -> Result<(), HcaError> {
        let key: [u8; RSS_KEY_LEN] = key
            .try_into()
            .map_err(|_| invalid(format!("RSS key of {} bytes, not {RSS_KEY_LEN}", key.len())))?;
        self.state().set_rss(key, fields);
        Ok(())
    }

    /// The RSS key and hashed packet types in use.
    pub fn rss(&self) -> ([u8; RSS_KEY_LEN], RssFields) {
        self.state().rss()
    }

    /// Filter received frames by destination MAC: `mac` becomes the whole unicast table, and
    /// the promiscuous and all-multicast switches are set. `promisc` (the state of a new
    /// adapter) delivers everything; otherwise only frames to an address of the unicast table,
    /// broadcast, a multicast address of the multicast list or, with `allmulti`, any multicast
    /// address pass; the rest count as `rx_drops_filter`.
    pub fn set_rx_filter(&self, mac: [u8; 6], promisc: bool, allmulti: bool) {
        self.state().set_rx_filter(mac, promisc, allmulti);
    }

    /// Replace the unicast MAC table: up to [`MAX_MAC_ADDRS`] (128, mlx4's limit) unicast
    /// addresses, repeats ignored; `NoResources` above that, `InvalidArgument` for a multicast
    /// address. An empty table passes no unicast frame (unless promiscuous).
    pub fn set_mac_table(&self, macs: &[[u8; 6]]) -> Result<(), HcaError> {
        self.state().set_mac_table(macs)
    }

    /// Replace the multicast list: up to [`MAX_MC_ADDRS`] multicast addresses passed without
    /// all-multicast; `InvalidArgument` for a unicast address.
    pub fn set_mc_list(&self, macs: &[[u8; 6]]) -> Result<(), HcaError> {
        self.state().set_mc_list(macs)
    }

    /// Promiscuous mode: every frame passes the MAC and VLAN filters.
    pub fn set_promisc(&self, on: bool) {
        self.state().set_promisc(on);
    }

    /// All-multicast mode: every multicast frame passes the MAC filter.
    pub fn set_allmulti(&self, on: bool) {
        self.state().set_allmulti(on);
    }

    /// Turn the VLAN filter on or off (off for a new adapter). While on and not promiscuous,
    /// a frame whose outer tag (802.1Q, 802.1ad, 0x9100) carries a VLAN ID not in the table
    /// is dropped as `rx_drops_vlan`; untagged and priority-tagged (ID 0) frames pass, as
    /// everything does while it is off.
    pub fn set_vlan_filtering(&self, on: bool) {
        self.state().set_vlan_filtering(on);
    }

    /// Add (`member`) or remove VLAN ID `vid` (below 4096) of the VLAN filter table.
    pub fn set_vlan(&self, vid: u16, member: bool) -> Result<(), HcaError> {
        self.state().set_vlan(vid, member)
    }

    /// The receive filters in force.
    pub fn rx_filter(&self) -> RxFilter {
        self.state().rx_filter()
    }

    /// Set the port's flow control (pause) settings; `InvalidArgument` if `low_water` is above
    /// `high_water`. Stored and reported only: the model sends no pause frame and honours
    /// none (see [`FlowControl`]).
    pub fn set_flow_control(&self, fc: &FlowControl) -> Result<(), HcaError> {
        self.state().set_flow_control(*fc)
    }

    /// The flow control settings ([`FlowControl::default`], mlx4_en's, until set).
    pub fn flow_control(&self) -> FlowControl {
        self.state().flow_control()
    }

    /// Create an RSS context (its own key, hashed fields and RQ table) for flow rules with
    /// [`FlowAction::Rss`]; its id. The RQs must exist (one destroyed later makes its share of
    /// frames drop, as `rx_drops_no_wqe`). Up to [`MAX_RSS_CONTEXTS`].
    pub fn create_rss_context(&self, ctx: &RssContext) -> Result<u32, HcaError> {
        self.state().create_rss_context(ctx.clone())
    }

    /// Destroy an RSS context (`Busy` while rules use it).
    pub fn destroy_rss_context(&self, id: u32) -> Result<(), HcaError> {
        self.state().destroy_rss_context(id)
    }

    /// An RSS context's settings.
    pub fn rss_context(&self, id: u32) -> Result<RssContext, HcaError> {
        self.state()
            .rss_context(id)
            .ok_or(HcaError::NotFound("RSS context", id))
    }

    /// Add a flow rule; its id. Every received frame is checked against the rules, lowest
    /// priority first (the older first among equals), before the port's default path: the
    /// first rule that matches decides (its RQ, its RSS context's RQs, or a drop counted as
    /// `rx_drops_flow`), and the MAC and VLAN filters and the default RSS do not apply to it;
    /// the MTU does. Frames no rule matches take the default path. The queue or context must
    /// exist. Up to [`MAX_FLOWS`].
    pub fn create_flow(&self, rule: &FlowRule) -> Result<u32, HcaError> {
        self.state().create_flow(rule)
    }

    /// Deliver only what flow rules take (`on`): frames no rule matches are dropped as
    /// `rx_drops_filter`, as device-managed flow steering with no default rule does (what a
    /// verbs device is; the verbs stand-in turns it on). Off by default: such frames take the
    /// default path.
    pub fn set_flows_only(&self, on: bool) {
        self.state().set_flows_only(on);
    }

    /// Remove a flow rule.
    pub fn destroy_flow(&self, id: u32) -> Result<(), HcaError> {
        self.state().destroy_flow(id)
    }

    /// Frames and bytes a rule matched so far.
    pub fn flow_counters(&self, id: u32) -> Result<FlowCounters, HcaError> {
        self.state().flow_counters(id)
    }

    /// Every rule with its id, in the order they are checked.
    pub fn flows(&self) -> Vec<(u32, FlowRule)> {
        self.state().flows()
    }

    /// Set the MTU (default 1500): received frames whose L3 length (frame length minus the
    /// 14-byte MAC header and 4 bytes per VLAN tag) exceeds it are dropped as `rx_drops_mtu`.
    /// Transmitted frames are not checked: what the driver may post is the driver's concern
    /// (it knows its MTU, and LSO frames are far above it by design), and a device that
    /// silently dropped them would only hide a driver bug behind a successful completion.
    ///
    /// A TAP wire's interface takes the same MTU, wherever it is now; the error is the
    /// kernel's refusal (the port's own MTU is set all the same).
    pub fn set_mtu(&self, mtu: u16) -> Result<(), HcaError> {
        self.state()
            .set_mtu(mtu)
            .map_err(|e| HcaError::Io(format!("MTU {mtu} on the TAP interface: {e}")))
    }

    /// The MTU in use.
    pub fn mtu(&self) -> u16 {
        self.state().mtu()
    }

    /// Plug the port into a wire (replacing the previous one).
    pub fn set_wire(&self, wire: Wire) -> Result<(), HcaError> {
        // Frames from outside: the device must look at the wire itself to receive.
        let rx = matches!(wire, Wire::Tap(_) | Wire::Cable(_));
        let port = wire::WirePort::open(wire)?;
        self.state().set_wire(port);
        self.shared.inner.wire_rx.store(rx, Ordering::Relaxed);
        Ok(())
    }

    /// Describe the current wire (`null`, `loop`, `peer:<name>`, `pcap`, `tap:<if>`,
    /// `cable:<path>`, `sink`).
    pub fn wire(&self) -> String {
        self.state().wire_name()
    }

    /// Set the link state. While down, transmitted frames are dropped (their WQEs still
    /// complete) and nothing is received.
    pub fn set_port_up(&self, up: bool) {
        self.state().set_port_up(up);
    }

    /// Whether the port is up as set ([`Hca::set_port_up`], not down by an injected flap,
    /// not removed): whether it sends and receives. The wire's carrier is not part of it; see
    /// [`Hca::link_up`].
    pub fn port_up(&self) -> bool {
        self.shared.inner.port.up()
    }

    /// The link as a PHY reports it: the port up ([`Hca::port_up`]) and its wire with a
    /// carrier (a cable's far end plugged in and up, its process alive; a TAP interface up; a
    /// peer adapter open and up; always for null, loop, pcap and sink). Looked at now; a
    /// change from what was last reported queues an event.
    pub fn link_up(&self) -> bool {
        self.state().check_link()
    }

    /// The port's event fd: an `eventfd`, non-blocking, readable while events wait in
    /// [`Hca::next_event`] (link up and down, removal). A DPDK driver registers it with EAL's
    /// interrupt thread and calls `next_event` until `None` in the callback. Asking for it also
    /// has the link monitor look for changes at the far end of the wire every
    /// [`MONITOR_PERIOD`]; changes the driver makes itself are queued at once. The fd belongs
    /// to the adapter and stays valid until its last handle is dropped.
    pub fn event_fd(&self) -> Result<std::os::fd::RawFd, HcaError> {
        monitor::watch(&self.shared.inner)?;
        Ok(self.shared.inner.events.fd())
    }

    /// The oldest port event not yet taken; `None` when there is none (the event fd is then
    /// not readable).
    pub fn next_event(&self) -> Option<PortEvent> {
        self.shared.inner.events.pop()
    }

    /// Create a completion channel (what `ibv_create_comp_channel` gives): CQs bound to it
    /// ([`Hca::set_cq_channel`]) report their completion events there, behind an event fd
    /// ([`Hca::comp_channel_fd`]). A CQ is armed by the CQ doorbell, a 64-bit big-endian store
    /// of `(sn << 28 | cmd << 24 | cqn) << 32 | ci` at offset 0x20 of any UAR page of the
    /// adapter (an SQ's, or one from [`Hca::alloc_uar`]), `cmd` 2 for the next completion, 1
    /// for the next solicited one (a send WQE with srcrb SOLICIT, or an error); received
    /// frames are not solicited. One event per arming: the first such completion after the
    /// arm raises it (at once if CQEs past `ci` were already written), then the CQ is
    /// disarmed until the next arm doorbell. In the polled mode the link monitor runs the
    /// device every [`SERVICE_PERIOD`] while a channel exists, so events come while the lcore
    /// sleeps.
    pub fn create_comp_channel(&self) -> Result<u32, HcaError> {
        let id = self.state().create_channel()?;
        if !self.shared.threaded {
            monitor::watch(&self.shared.inner)?;
        }
        Ok(id)
    }

    /// The channel's event fd: an `eventfd`, readable while events wait in
    /// [`Hca::next_cq_event`]; blocking until its user sets `O_NONBLOCK` (as a verbs channel
    /// fd), which `next_cq_event` never needs. Valid until the channel is destroyed.
    pub fn comp_channel_fd(&self, channel: u32) -> Result<std::os::fd::RawFd, HcaError> {
        Ok(self.state().channel(channel)?.fd())
    }

    /// The CQN of the oldest completion event on `channel`, `None` when there is none (the fd
    /// is then not readable).
    pub fn next_cq_event(&self, channel: u32) -> Result<Option<u32>, HcaError> {
        let ch = self.state().channel(channel)?;
        Ok(ch.pop())
    }

    /// Destroy a completion channel (`Busy` while CQs are bound to it).
    pub fn destroy_comp_channel(&self, channel: u32) -> Result<(), HcaError> {
        self.state().destroy_channel(channel)
    }

    /// Bind CQ `cqn` to `channel` (`None`: no channel; its events are then lost).
    pub fn set_cq_channel(&self, cqn: u32, channel: Option<u32>) -> Result<(), HcaError> {
        self.state().set_cq_channel(cqn, channel)
    }

    /// Surprise removal, as when a card is hot-unplugged: the link goes down, nothing is
    /// executed, sent or received any more, and [`PortEvent::Removed`] is queued. For good:
    /// the adapter can only be dropped.
    pub fn remove(&self) {
        self.state().remove();
    }

    /// Whether the adapter was removed ([`Hca::remove`], or its cable file was deleted).
    pub fn removed(&self) -> bool {
        self.state().removed()
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
            let n = self.state().poll();
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
