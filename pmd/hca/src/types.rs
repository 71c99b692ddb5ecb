//! The names the adapter's control channel speaks in (its configuration, capabilities and queue
//! attributes), apart from the adapter itself so that every module can use them without
//! importing the crate root.

use crate::fault::Faults;

/// How the emulated adapter is built and how its device loop runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaConfig {
    /// The platform maps the BlueFlame page write-combining: BF copies arrive as whole 64-byte
    /// bursts and may be executed. Without it they arrive as 8-byte pieces and only act as
    /// doorbells.
    pub wc: bool,
    /// BlueFlame register size in bytes, split into two halves; 0 = BlueFlame unusable.
    /// Otherwise a power of two from 128 to 4096. Default 512.
    pub bf_reg_size: u32,
    /// BlueFlame registers per 4 KiB page (default 8); `bf_reg_size * bf_regs_per_page` must fit
    /// in a page.
    pub bf_regs_per_page: u32,
    /// Run the device loop on a thread between `start` and `stop`. False = the polled mode:
    /// the device runs only when called, by the lcore that polls the port
    /// ([`Hca::sq_runner`](crate::Hca::sq_runner), [`Hca::rx_runner`](crate::Hca::rx_runner)) or
    /// by tests ([`Hca::step`](crate::Hca::step)).
    pub threaded: bool,
    /// With `threaded`: one device thread for every adapter of the process that asks for it
    /// (for machines with few cores) instead of a thread per adapter.
    pub shared_thread: bool,
    /// Spin without backing off when idle (lowest latency, burns a core).
    pub busy_poll: bool,
    /// Name other adapters use to cable to this one (`Wire::Peer`), e.g. `net_mlx4rs0`; must be
    /// unique among open adapters. Empty = not reachable by name.
    pub name: String,
    /// Largest WQE the device accepts, in bytes: a multiple of 16 from 64 to 1008 (the 6-bit DS
    /// limit, the default). Larger WQEs complete in error.
    pub max_wqe_size: u32,
    /// Frames the port buffers on receive before dropping (default 2048).
    pub rx_inbox_frames: u32,
    /// UAR pages of the device memory, one per send queue: the most send queues the adapter
    /// can have at once (default 64).
    pub uars: u32,
    /// Faults to inject from the start (none by default); see
    /// [`Hca::set_faults`](crate::Hca::set_faults).
    pub faults: Faults,
    /// Create queues in [`QueueState::Reset`]: they execute (SQ) or receive (RQ) only once
    /// [`Hca::set_sq_state`](crate::Hca::set_sq_state) /
    /// [`Hca::set_rq_state`](crate::Hca::set_rq_state) moved them to `Ready`, as a QP executes
    /// only in RTS and a WQ receives only in RDY. Off by default: queues are created `Ready`, as
    /// drivers written before queue states expect.
    pub reset_on_create: bool,
    /// Be a ConnectX-3 Pro (PCI device and vendor part 0x1007) rather than a ConnectX-3
    /// (0x1003): VXLAN (UDP 4789) frames get their inner checksums filled on TX (owner_opcode
    /// IIP, ILP) and inner verdicts with tunnel bits in RX CQEs. Off by default.
    pub pro: bool,
    /// Nanoseconds the device spends on each doorbell and each BlueFlame burst it takes, as
    /// a card's UAR write costs time that a software device does not: with it, doorbells the
    /// driver avoids pay in the model as on a card. 0 (the default) charges nothing;
    /// [`UAR_WRITE_NS`] is the cost of txbench's bus cost model.
    pub doorbell_ns: u32,
}

/// A UAR write's cost in txbench's bus cost model (`apps/common/src/model.rs`, `t_db`):
/// 1 / 4.5 Mpps with a doorbell per packet against 1 / 14.9 Mpps with one per 8 packets, on
/// mlx4 at 40GbE, gives 177.3 ns per doorbell.
pub const UAR_WRITE_NS: u32 = 177;

/// Offset in a UAR page of the doorbell write count: a native-endian 32-bit word, reserved on a
/// card, that a writer of the send doorbell may bump atomically before each store to 0x14. A
/// card takes every UAR write, each a posted write, while the model reads the doorbell word
/// only when it polls, so stores between two polls merge; with the count, the device counts
/// and charges ([`HcaConfig::doorbell_ns`]) each write. A page nobody counts on counts one
/// write per doorbell taken.
pub const UAR_DB_WRITES_OFFSET: usize = 0x18;

impl Default for HcaConfig {
    fn default() -> Self {
        HcaConfig {
            wc: true,
            bf_reg_size: 512,
            bf_regs_per_page: 8,
            threaded: true,
            shared_thread: false,
            busy_poll: false,
            name: String::new(),
            max_wqe_size: 1008,
            rx_inbox_frames: 2048,
            uars: 64,
            faults: Faults::default(),
            reset_on_create: false,
            pro: false,
            doorbell_ns: 0,
        }
    }
}

/// What QUERY_DEV_CAP would report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Ports of the adapter (one per `Hca`).
    pub num_ports: u8,
    /// Queue pairs (send and receive queues share the QPN space).
    pub max_qps: u32,
    /// Completion queues.
    pub max_cqs: u32,
    /// Largest SQ, in 64-byte TXBBs.
    pub max_sq_wqes: u32,
    /// Largest RQ, in WQEs.
    pub max_rq_wqes: u32,
    /// Largest CQ, in CQEs.
    pub max_cqes: u32,
    /// Largest send WQE in bytes.
    pub max_wqe_size: u32,
    /// Most inline bytes one WQE of `max_wqe_size` can carry (one 4-byte header per 64 bytes).
    pub max_inline: u32,
    /// BlueFlame register size in bytes; 0 means no BlueFlame.
    pub bf_reg_size: u32,
    /// BlueFlame registers per page.
    pub bf_regs_per_page: u32,
    /// Scatter entries per RX WQE.
    pub max_rq_sges: u32,
    /// Unicast MAC addresses the port filters on
    /// ([`Hca::set_mac_table`](crate::Hca::set_mac_table)).
    pub max_mac_addrs: u32,
    /// Multicast addresses the port filters on ([`Hca::set_mc_list`](crate::Hca::set_mc_list)).
    pub max_mc_addrs: u32,
    /// RQs can keep the FCS ([`Hca::set_rq_scatter_fcs`](crate::Hca::set_rq_scatter_fcs)).
    pub scatter_fcs: bool,
    /// PCI device ID and verbs vendor part: 0x1003 (ConnectX-3) or 0x1007 (ConnectX-3 Pro).
    pub vendor_part_id: u32,
    /// Inner checksums and tunnel bits for VXLAN frames (a Pro).
    pub tunnel_offloads: bool,
    /// Firmware version as mlx4 keeps it: `major << 32 | minor << 16 | subminor`
    /// ([`FW_VERSION`]); [`Caps::fw_version`] formats it.
    pub fw_ver: u64,
}

/// The firmware the model reports: 2.42.5000, the last ConnectX-3 / ConnectX-3 Pro release.
pub const FW_VERSION: (u16, u16, u16) = (2, 42, 5000);

impl Caps {
    /// The firmware version as mlx4_ib reports it (`major.minor.subminor`), e.g. `2.42.5000`.
    pub fn fw_version(&self) -> String {
        format!(
            "{}.{}.{}",
            self.fw_ver >> 32,
            (self.fw_ver >> 16) & 0xffff,
            self.fw_ver & 0xffff
        )
    }
}

/// In the model, a queue in `Reset` drops what reaches it and counts it: an SQ its doorbells
/// and BlueFlame writes (`doorbells_not_ready`, `bf_ignored`), an RQ the frames steered to it
/// (`rx_drops_not_ready`).
pub use mlx4_prm::QueueState;

/// A completion queue on driver memory.
#[derive(Debug, Clone, Copy)]
pub struct CqAttr {
    /// `cqe_cnt` 32-byte CQEs, 32-byte aligned. The device initialises every entry as
    /// hardware-owned for pass 0.
    pub buf: *mut u8,
    /// Number of CQEs, a power of two.
    pub cqe_cnt: u32,
    /// Consumer-index record (BE32, 24 bits significant) the driver updates after polling;
    /// 4-byte aligned. The device never writes more than `cqe_cnt` CQEs ahead of it.
    pub set_ci_db: *mut u32,
}

/// A send queue on driver memory.
#[derive(Debug, Clone, Copy)]
pub struct SqAttr {
    /// `txbb_cnt` 64-byte TXBBs, 64-byte aligned.
    pub buf: *mut u8,
    /// Number of TXBBs, a power of two.
    pub txbb_cnt: u32,
    /// CQ for send completions.
    pub cqn: u32,
}

/// How a send queue is laid out and where it rings, beyond [`SqAttr`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqOptions {
    /// log2 of the slot (stride) size, 6 (64 bytes, the default) to 11. A WQE starts at a slot
    /// and takes `ceil(size / stride)` slots; the ownership parity, the BlueFlame counter and
    /// CQE `wqe_index` count slots. DPDK and mlx4_en use 64-byte slots (so WQEs pack TXBB after
    /// TXBB); libmlx4 gives QPs with inline or LSO-header caps 128 bytes or more and puts one
    /// WQE per slot.
    pub stride_shift: u32,
    /// Ring on this UAR page (from [`Hca::alloc_uar`](crate::Hca::alloc_uar)) with the other
    /// queues on it, as the QPs of one verbs context share its page; `None` (the default): a page
    /// of its own.
    pub uar: Option<u32>,
    /// Take this QPN, a free number of a range from
    /// [`Hca::reserve_qpns`](crate::Hca::reserve_qpns); `None` (the default): any free QPN.
    pub qpn: Option<u32>,
}

impl Default for SqOptions {
    fn default() -> Self {
        SqOptions {
            stride_shift: mlx4_prm::TXBB_SHIFT,
            uar: None,
            qpn: None,
        }
    }
}

/// How a receive queue is created, beyond [`RqAttr`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RqOptions {
    /// Take this QPN, a free number of a range from
    /// [`Hca::reserve_qpns`](crate::Hca::reserve_qpns) (an RSS indirection table wants consecutive
    /// QPNs from an aligned base); `None` (the default): any free QPN.
    pub qpn: Option<u32>,
    /// Leave the 4-byte FCS on received frames
    /// ([`Hca::set_rq_scatter_fcs`](crate::Hca::set_rq_scatter_fcs)).
    pub scatter_fcs: bool,
}

/// A UAR page the opener allocated ([`Hca::alloc_uar`](crate::Hca::alloc_uar)), for send queues to
/// share and for CQ arm doorbells.
#[derive(Debug, Clone, Copy)]
pub struct Uar {
    /// The page's index (for [`SqOptions::uar`]).
    pub index: u32,
    /// The 4 KiB page: send doorbell at 0x14, CQ doorbell at 0x20.
    pub page: *mut u8,
    /// Its BlueFlame page, the next page of device memory; `None` without BlueFlame.
    pub bf_page: Option<*mut u8>,
}

/// A BlueFlame register: two halves of `half_size` bytes at `reg` and `reg + half_size`, used
/// alternately starting with the first.
#[derive(Debug, Clone, Copy)]
pub struct BfReg {
    /// Start of the register (device memory).
    pub reg: *mut u8,
    /// Size of one half in bytes.
    pub half_size: usize,
}

/// What the driver needs to post on a new send queue.
#[derive(Debug, Clone, Copy)]
pub struct SqInfo {
    /// The queue's number, for doorbells, BF copies and CQEs.
    pub qpn: u32,
    /// The queue's 4 KiB UAR page; the send doorbell is at offset 0x14.
    pub uar: *mut u8,
    /// The index of that page (shared with other queues if [`SqOptions::uar`] named it).
    pub uar_index: u32,
    /// The queue's BlueFlame register in its UAR page's BlueFlame page: `None` when
    /// `Caps::bf_reg_size` is 0, or when every register of a shared page is taken.
    pub bf: Option<BfReg>,
}

/// A receive queue on driver memory.
#[derive(Debug, Clone, Copy)]
pub struct RqAttr {
    /// `wqe_cnt` WQEs of `16 * sges` bytes, 16-byte aligned.
    pub buf: *mut u8,
    /// Number of WQEs, a power of two.
    pub wqe_cnt: u32,
    /// Scatter entries per WQE, a power of two.
    pub sges: u32,
    /// CQ for receive completions.
    pub cqn: u32,
    /// Doorbell record: BE32 producer count, low 16 bits significant; 4-byte aligned.
    pub db_rec: *mut u32,
}

/// PCI device ID of a ConnectX-3.
pub const PART_CX3: u32 = 0x1003;
/// PCI device ID of a ConnectX-3 Pro.
pub const PART_CX3_PRO: u32 = 0x1007;

/// Largest frame the device assembles or accepts.
pub(crate) const MAX_FRAME: usize = 65536;

/// What a valid WQE puts on the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Frames (0 for a NOP, several for a large send).
    pub(crate) frames: u32,
    /// Bytes of those frames.
    pub(crate) len: u32,
    /// Bytes gathered from host memory.
    pub(crate) dma: u32,
}
