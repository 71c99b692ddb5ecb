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

mod adapter;
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
mod port;
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

pub use adapter::Hca;
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
    FW_VERSION, PART_CX3, PART_CX3_PRO, UAR_DB_WRITES_OFFSET, UAR_WRITE_NS,
};
pub use wire::{FrameSink, Wire};

/// The frame parser's entry points for the coverage-guided fuzz targets (`fuzz/`, outside the
/// workspace); not an API.
#[doc(hidden)]
pub mod fuzzing {
    /// Runs every parser over `frame` (and over a copy for those that write), checking the
    /// offsets they hand back lie within it; panics where one does not.
    pub fn parse_frame(frame: &[u8]) {
        let _ = crate::net::rx_status(frame);
        let _ = crate::net::frame_fields(frame);
        let _ = crate::net::outer_vlan(frame);
        let _ = crate::net::crc32(frame);
        assert!(crate::net::l3_len(frame) <= frame.len());
        if let Some((l3, _, l4)) = crate::net::tso_template(frame) {
            assert!(
                l3 < l4 && l4 < frame.len(),
                "tso_template: {l3} {l4} in {}",
                frame.len()
            );
        }
        let _ = crate::net::vxlan(frame);
        static KEY: std::sync::OnceLock<crate::rss::Toeplitz> = std::sync::OnceLock::new();
        let key = KEY.get_or_init(|| crate::rss::Toeplitz::new(&crate::DEFAULT_RSS_KEY));
        for bits in [0u32, 0x3f, u32::MAX] {
            let _ = crate::net::rss_hash(frame, key, crate::RssFields::from_bits_truncate(bits));
        }
        let mut copy = frame.to_vec();
        crate::net::fill_tx_checksums(&mut copy, true, true);
        assert_eq!(copy.len(), frame.len());
        let _ = crate::net::fill_inner_checksums(&mut copy, true, true);
    }
}
