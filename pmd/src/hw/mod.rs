//! The hardware boundary, control side: what the driver asks of a device besides the stores of
//! the data path. One trait, [`Device`], with one implementation per backend: [`soft`] over the
//! software HCA, and [`verbs`] over rdma-core (verbs + mlx4dv) for a real ConnectX-3.
//!
//! Queue memory fits both kinds of device because the backend owns it: a create call returns a
//! descriptor of the rings, records and registers ([`SqDesc`], [`CqDesc`], [`RqDesc`]), which
//! the software HCA's backend allocates and hands to the model, and which rdma-core hands back
//! from `mlx4dv_init_obj`. The queue code builds its ring views on a descriptor and does not
//! care which. Descriptors are plain data (addresses and numbers), so they may live in memory
//! that several processes share; the register addresses are the creating process's mapping.
//!
//! The burst functions never call through this trait: queues do not hold a device. Control
//! operations that need one (create, reset, recover, destroy) take it as a parameter.

use std::fmt;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;

use crate::mem::{DmaRange, Mr};

mod backend;
pub mod flow;
mod rss;
pub mod soft;
pub mod verbs;

pub use backend::{open, open_pci, Handles, PciPort};
pub use rss::{RssHash, DEFAULT_RSS_KEY, RSS_KEY_LEN};

/// RX and TX queues a port sets up at most (the device allows more; this keeps per-port memory
/// sane).
pub const MAX_QUEUES: u16 = 16;

/// Why a device request failed. Its kind decides the errno DPDK sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HwError {
    /// The request is outside what the device accepts (a bad configuration): `EINVAL`.
    Invalid(String),
    /// Host memory for queue memory ran out: `ENOMEM`.
    NoMemory(String),
    /// The device failed, or is out of its own resources: `EIO`.
    Device(String),
    /// This backend (or this process) cannot do it: `ENOTSUP`.
    Unsupported(&'static str),
}

impl fmt::Display for HwError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HwError::Invalid(s) | HwError::NoMemory(s) | HwError::Device(s) => f.write_str(s),
            HwError::Unsupported(what) => write!(f, "{what} is not supported here"),
        }
    }
}

impl std::error::Error for HwError {}

impl HwError {
    /// The negative errno DPDK expects: `EINVAL` for a bad configuration, `ENOMEM` only for
    /// memory, `EIO` for the device. Every op's failure goes through here.
    pub fn errno(&self) -> std::ffi::c_int {
        -match self {
            HwError::Invalid(_) => libc::EINVAL,
            HwError::NoMemory(_) => libc::ENOMEM,
            HwError::Device(_) => libc::EIO,
            HwError::Unsupported(_) => libc::ENOTSUP,
        }
    }
}

/// What the device reports about itself (QUERY_DEV_CAP, `ibv_query_device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Largest send queue, in 64-byte TXBBs.
    pub max_sq_txbbs: u32,
    /// Largest receive queue, in WQEs.
    pub max_rq_wqes: u32,
    /// Largest completion queue, in CQEs.
    pub max_cqes: u32,
    /// Scatter entries per receive WQE.
    pub max_rq_sges: u32,
    /// Largest send WQE, in bytes.
    pub max_wqe_size: u32,
    /// BlueFlame register size in bytes (two halves); 0 when BlueFlame is unusable.
    pub bf_reg_size: u32,
    /// Firmware version, `major << 32 | minor << 16 | subminor` (mlx4's encoding); 0 unknown.
    pub fw_ver: u64,
    /// Unicast addresses the port filters on ([`Device::set_mac_table`]).
    pub max_mac_addrs: u32,
    /// Receive queues can keep the FCS ([`Device::set_rq_keep_crc`]).
    pub keep_crc: bool,
    /// The port filters VLANs ([`Device::set_vlan_filter`]).
    pub vlan_filter: bool,
    /// VXLAN inner checksums on send and inner verdicts on receive (a ConnectX-3 Pro).
    pub tunnel_offloads: bool,
}

impl Caps {
    /// The firmware version as `major.minor.subminor`, if the device told it.
    pub fn fw_version(&self) -> Option<String> {
        (self.fw_ver != 0).then(|| {
            format!(
                "{}.{}.{}",
                self.fw_ver >> 32,
                (self.fw_ver >> 16) & 0xffff,
                self.fw_ver & 0xffff
            )
        })
    }
}

/// What the device tells the driver without being polled ([`Device::event_fd`]), the pause
/// settings, and queue states: one definition, shared with the software HCA.
pub use mlx4_prm::{FlowControl, PortEvent, QueueState};

/// A BlueFlame register: two halves of `half_size` bytes from `reg`, written alternately.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BfDesc {
    pub reg: NonNull<u8>,
    pub half_size: usize,
}

/// A send queue as the device hands it over. Building one is the backend's promise about the
/// memory it names; the ring views ([`crate::ring`]) take it by value and give it back for
/// destroy, so no view outlives its queue.
#[derive(Debug, PartialEq, Eq)]
pub struct SqDesc {
    buf: NonNull<u8>,
    txbb_cnt: u32,
    doorbell: NonNull<u32>,
    bf: Option<BfDesc>,
    qpn: u32,
    /// The software HCA's count of UAR doorbell writes on the doorbell's page: `None` on a
    /// card, which takes every posted write by itself.
    db_writes: Option<NonNull<AtomicU32>>,
}

impl SqDesc {
    /// # Safety
    /// `buf` is `txbb_cnt` (a power of two) TXBBs of 64 bytes, 64-byte aligned, readable and
    /// writable; `doorbell` is the SQ's 4-byte aligned UAR send doorbell register; `bf`, if
    /// any, is a 64-byte aligned register of two `half_size` halves. All stay valid until the
    /// SQ is destroyed through the device that created it.
    pub unsafe fn new(
        buf: NonNull<u8>,
        txbb_cnt: u32,
        doorbell: NonNull<u32>,
        bf: Option<BfDesc>,
        qpn: u32,
    ) -> SqDesc {
        assert!(txbb_cnt.is_power_of_two());
        SqDesc {
            buf,
            txbb_cnt,
            doorbell,
            bf,
            qpn,
            db_writes: None,
        }
    }

    /// The descriptor of a device that polls its doorbell word rather than receiving each
    /// write: doorbells stored between two of its polls would merge into one it takes, so
    /// the writer bumps `count` before each store, and the device counts (and charges) the
    /// writes. Only the software HCA hands one out; a card's page has no such word.
    ///
    /// # Safety
    /// `count` is a 4-byte aligned word that the device reads and resets only atomically, and
    /// that stays valid as long as the doorbell register does.
    pub unsafe fn with_db_writes(self, count: NonNull<AtomicU32>) -> SqDesc {
        SqDesc {
            db_writes: Some(count),
            ..self
        }
    }

    /// The ring: `txbb_cnt` TXBBs (the stride is 64 bytes).
    pub fn buf(&self) -> NonNull<u8> {
        self.buf
    }

    pub fn txbb_cnt(&self) -> u32 {
        self.txbb_cnt
    }

    /// The UAR send doorbell register.
    pub fn doorbell(&self) -> NonNull<u32> {
        self.doorbell
    }

    /// The count of doorbell writes a polling device asks its writers to keep
    /// ([`SqDesc::with_db_writes`]), if it does.
    pub fn db_writes(&self) -> Option<NonNull<AtomicU32>> {
        self.db_writes
    }

    pub fn bf(&self) -> Option<BfDesc> {
        self.bf
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }
}

/// A completion queue as the device hands it over (see [`SqDesc`]).
#[derive(Debug, PartialEq, Eq)]
pub struct CqDesc {
    buf: NonNull<u8>,
    cqe_cnt: u32,
    cqe_size: u32,
    set_ci_db: NonNull<u32>,
    cqn: u32,
}

impl CqDesc {
    /// # Safety
    /// `buf` is `cqe_cnt` (a power of two) entries of `cqe_size` (32 or 64) bytes, aligned to
    /// an entry, and `set_ci_db` the CQ's 4-byte aligned consumer-index record; both readable
    /// and writable until the CQ is destroyed through the device that created it.
    pub unsafe fn new(
        buf: NonNull<u8>,
        cqe_cnt: u32,
        cqe_size: u32,
        set_ci_db: NonNull<u32>,
        cqn: u32,
    ) -> CqDesc {
        assert!(cqe_cnt.is_power_of_two() && (cqe_size == 32 || cqe_size == 64));
        CqDesc {
            buf,
            cqe_cnt,
            cqe_size,
            set_ci_db,
            cqn,
        }
    }

    pub fn buf(&self) -> NonNull<u8> {
        self.buf
    }

    pub fn cqe_cnt(&self) -> u32 {
        self.cqe_cnt
    }

    /// 32, or 64 (the 32-byte CQE then sits in the entry's second half, as rdma-core lays it out).
    pub fn cqe_size(&self) -> u32 {
        self.cqe_size
    }

    /// The consumer-index record (BE32, 24 bits significant).
    pub fn set_ci_db(&self) -> NonNull<u32> {
        self.set_ci_db
    }

    pub fn cqn(&self) -> u32 {
        self.cqn
    }
}

/// A receive queue as the device hands it over (see [`SqDesc`]).
#[derive(Debug, PartialEq, Eq)]
pub struct RqDesc {
    buf: NonNull<u8>,
    wqe_cnt: u32,
    sges: u32,
    db_rec: NonNull<u32>,
    qpn: u32,
}

impl RqDesc {
    /// # Safety
    /// `buf` is `wqe_cnt` (a power of two) WQEs of `sges` (a power of two) 16-byte scatter
    /// entries, 16-byte aligned, and `db_rec` the RQ's 4-byte aligned doorbell record; both
    /// readable and writable until the RQ is destroyed through the device that created it.
    pub unsafe fn new(
        buf: NonNull<u8>,
        wqe_cnt: u32,
        sges: u32,
        db_rec: NonNull<u32>,
        qpn: u32,
    ) -> RqDesc {
        assert!(wqe_cnt.is_power_of_two() && sges.is_power_of_two());
        RqDesc {
            buf,
            wqe_cnt,
            sges,
            db_rec,
            qpn,
        }
    }

    pub fn buf(&self) -> NonNull<u8> {
        self.buf
    }

    pub fn wqe_cnt(&self) -> u32 {
        self.wqe_cnt
    }

    /// Scatter entries per WQE: the stride is `16 * sges` bytes.
    pub fn sges(&self) -> u32 {
        self.sges
    }

    /// The doorbell record (BE32 producer count, 16 bits significant).
    pub fn db_rec(&self) -> NonNull<u32> {
        self.db_rec
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }
}

// SAFETY: descriptors are addresses of memory the device shares with whichever thread (or
// process) runs the queue; they carry no thread affinity.
unsafe impl Send for SqDesc {}
// SAFETY: as above.
unsafe impl Send for CqDesc {}
// SAFETY: as above.
unsafe impl Send for RqDesc {}

/// The control side of one device port.
///
/// Methods take `&self`: a backend serialises what needs serialising (the software HCA has its
/// own lock, rdma-core its kernel commands). Queue memory a create call returns stays valid
/// until the matching destroy call returns.
pub trait Device: Send + Sync {
    fn caps(&self) -> Caps;

    /// Whether the device reads its BlueFlame page back from the CPU's caches (the software
    /// HCA, whose BF page is ordinary write-back memory) rather than receiving the stores as
    /// bus writes.
    fn bf_page_cached(&self) -> bool {
        false
    }

    /// Registers memory the device may read packets from and write packets to.
    fn reg_mr(&self, range: DmaRange) -> Result<Mr, HwError>;
    fn dereg_mr(&self, mr: &Mr) -> Result<(), HwError>;

    /// A CQ of at least `cqe_cnt` entries, its memory on NUMA node `socket` (-1: any).
    fn create_cq(&self, cqe_cnt: u32, socket: i32) -> Result<CqDesc, HwError>;
    /// Destroys the CQ (after the queues reporting to it) and frees its memory.
    fn destroy_cq(&self, cq: CqDesc) -> Result<(), HwError>;
    /// A send queue of `txbb_cnt` TXBBs completing into `cq`, ready to post on.
    fn create_sq(&self, txbb_cnt: u32, cq: &CqDesc, socket: i32) -> Result<SqDesc, HwError>;
    fn destroy_sq(&self, sq: SqDesc) -> Result<(), HwError>;
    /// A receive queue of `wqe_cnt` WQEs of `sges` scatter entries completing into `cq`. The
    /// device uses a WQE once the doorbell record covers it.
    fn create_rq(
        &self,
        wqe_cnt: u32,
        sges: u32,
        cq: &CqDesc,
        socket: i32,
    ) -> Result<RqDesc, HwError>;
    fn destroy_rq(&self, rq: RqDesc) -> Result<(), HwError>;
    /// The next `count` receive queues are created one after the other, in queue order (at
    /// setup, and when the port stops and renews them). A device whose RSS needs consecutive
    /// queue numbers reserves them now (mlx4 through verbs: a WQN range); others need nothing.
    fn rq_batch(&self, _count: u16) {}
    fn sq_state(&self, qpn: u32) -> Result<QueueState, HwError>;
    fn rq_state(&self, qpn: u32) -> Result<QueueState, HwError>;
    /// Puts a receive queue an error completion stopped back to work in place, through reset
    /// to ready: its number, ring and place in the steering tables stay. It then takes WQEs
    /// from index 0, as far as the doorbell record says.
    fn restart_rq(&self, qpn: u32) -> Result<(), HwError>;

    /// Which frames the port accepts: promiscuous, or those to `mac`, broadcast, and with
    /// `allmulti` every multicast address.
    fn set_rx_filter(&self, mac: [u8; 6], promisc: bool, allmulti: bool) -> Result<(), HwError>;
    fn set_mtu(&self, mtu: u16) -> Result<(), HwError>;
    fn set_rss(&self, key: &[u8; RSS_KEY_LEN], hash: RssHash) -> Result<(), HwError>;
    /// The RSS indirection table: received frames go to `rqs[hash % rqs.len()]`.
    fn set_rx_steering(&self, rqs: &[u32]) -> Result<(), HwError>;

    /// Brings the port up: frames flow.
    fn start(&self) -> Result<(), HwError>;
    /// Takes the port down; the device executes nothing more until the next start.
    fn stop(&self);
    fn link_up(&self) -> bool;

    /// The device's own counters as `(xstat name, value)`.
    fn counters(&self) -> Vec<(String, u64)>;
    fn reset_counters(&self);
    /// Frames the port received and lost for want of a posted buffer or of room on the way
    /// (DPDK's `imissed`).
    fn missed(&self) -> u64;

    // Port events, link control, queue states, receive filters and completion events. A
    // backend without one answers `Unsupported`, which ethdev reports as ENOTSUP.

    /// An fd readable while port events wait in [`Device::next_event`]: what EAL's interrupt
    /// thread watches. The caller never reads it; taking the events empties it.
    fn event_fd(&self) -> Result<RawFd, HwError> {
        Err(HwError::Unsupported("port events"))
    }
    /// The oldest port event not yet taken.
    fn next_event(&self) -> Option<PortEvent> {
        None
    }
    /// Sets the link up or down while the port stays started (`dev_set_link_up/down`).
    fn set_link(&self, _up: bool) -> Result<(), HwError> {
        Err(HwError::Unsupported("setting the link up or down"))
    }
    /// Moves a send queue to ready (it executes from slot 0 on) or to reset (it executes
    /// nothing).
    fn set_sq_ready(&self, _qpn: u32, _ready: bool) -> Result<(), HwError> {
        Err(HwError::Unsupported("send queue states"))
    }
    /// Moves a receive queue to ready (it takes frames) or to reset (its share is dropped).
    fn set_rq_ready(&self, _qpn: u32, _ready: bool) -> Result<(), HwError> {
        Err(HwError::Unsupported("receive queue states"))
    }
    /// Leaves (`on`) or strips the FCS of frames receive queue `qpn` takes.
    fn set_rq_keep_crc(&self, _qpn: u32, _on: bool) -> Result<(), HwError> {
        Err(HwError::Unsupported("keeping the CRC"))
    }
    /// The unicast addresses the port accepts besides the main one (up to
    /// `Caps::max_mac_addrs` in all).
    fn set_mac_table(&self, _macs: &[[u8; 6]]) -> Result<(), HwError> {
        Err(HwError::Unsupported("more than one unicast MAC address"))
    }
    /// The multicast addresses the port accepts without all-multicast.
    fn set_mc_list(&self, _macs: &[[u8; 6]]) -> Result<(), HwError> {
        Err(HwError::Unsupported("a multicast address list"))
    }
    /// Turns the VLAN filter on or off: while on, tagged frames of VLANs not in the table
    /// are dropped (and counted by the device).
    fn set_vlan_filter(&self, _on: bool) -> Result<(), HwError> {
        Err(HwError::Unsupported("VLAN filtering"))
    }
    fn set_vlan(&self, _vid: u16, _member: bool) -> Result<(), HwError> {
        Err(HwError::Unsupported("VLAN filtering"))
    }
    fn flow_control(&self) -> Result<FlowControl, HwError> {
        Err(HwError::Unsupported("flow control"))
    }
    fn set_flow_control(&self, _fc: &FlowControl) -> Result<(), HwError> {
        Err(HwError::Unsupported("flow control"))
    }
    /// A completion channel: its id and the fd readable while its events wait.
    fn create_comp_channel(&self) -> Result<(u32, RawFd), HwError> {
        Err(HwError::Unsupported("completion events"))
    }
    fn destroy_comp_channel(&self, _channel: u32) {}
    /// Binds `cq` to `channel` and arms it: the next completion after consumer index `ci`
    /// raises one event there. `sn` is the arm sequence number (2 bits), moved on by the
    /// caller once per event taken.
    fn arm_cq(&self, _cq: &CqDesc, _ci: u32, _sn: u32, _channel: u32) -> Result<(), HwError> {
        Err(HwError::Unsupported("completion events"))
    }
    /// The CQN of the oldest event on `channel`, if any.
    fn next_cq_event(&self, _channel: u32) -> Option<u32> {
        None
    }

    /// For a device that runs in the caller's context (the software HCA stepped by the
    /// polling thread): does its pending work now. The control path calls it while it waits
    /// for the device; a card needs nothing.
    fn poll(&self) {}

    /// A secondary process attached to this port (`true`) or left it. A device that runs in
    /// the primary's polling lcore must then run by itself, since a secondary's bursts cannot
    /// run a device that lives in the primary; a card needs nothing.
    fn secondary_attached(&self, _attached: bool) {}

    // Flow steering (rte_flow). Rules are the primary process's control state; a rule's id
    // is this backend's, valid until destroyed or the device closes.

    /// Adds a steering rule, checked before the port's default path; its id.
    fn create_flow(&self, _rule: &flow::FlowRule) -> Result<u32, HwError> {
        Err(HwError::Unsupported("flow steering"))
    }
    fn destroy_flow(&self, _id: u32) -> Result<(), HwError> {
        Err(HwError::Unsupported("flow steering"))
    }
    /// What rule `id` matched since it was created.
    fn flow_counters(&self, _id: u32) -> Result<flow::FlowCounters, HwError> {
        Err(HwError::Unsupported("flow counters"))
    }
    /// Isolated mode (`on`): only frames a rule takes are delivered, the rest dropped.
    fn set_flow_isolate(&self, _on: bool) -> Result<(), HwError> {
        Err(HwError::Unsupported("flow isolation"))
    }
}
