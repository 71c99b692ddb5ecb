//! One `net_mlx4rs` port: its configuration and state, in plain Rust. The `ethdev` module turns
//! DPDK's callbacks into calls on this type.
//!
//! A [`Port`] lives in DPDK shared memory as the ethdev's private data, where every process of
//! the application reads it, so it is plain data (see [`crate::mem`]). The device is a
//! per-process handle ([`Device`]): methods that need it take it as a parameter.

use dpdk_sys::bits::{
    RTE_ETH_RSS_FRAG_IPV4 as RSS_FRAG_IPV4, RTE_ETH_RSS_FRAG_IPV6 as RSS_FRAG_IPV6,
    RTE_ETH_RSS_IPV4 as RSS_IPV4, RTE_ETH_RSS_IPV6 as RSS_IPV6,
    RTE_ETH_RSS_NONFRAG_IPV4_OTHER as RSS_NONFRAG_IPV4_OTHER,
    RTE_ETH_RSS_NONFRAG_IPV4_TCP as RSS_NONFRAG_IPV4_TCP,
    RTE_ETH_RSS_NONFRAG_IPV4_UDP as RSS_NONFRAG_IPV4_UDP,
    RTE_ETH_RSS_NONFRAG_IPV6_OTHER as RSS_NONFRAG_IPV6_OTHER,
    RTE_ETH_RSS_NONFRAG_IPV6_TCP as RSS_NONFRAG_IPV6_TCP,
    RTE_ETH_RSS_NONFRAG_IPV6_UDP as RSS_NONFRAG_IPV6_UDP,
};

use crate::devargs::{Devargs, DeviceLoop};
use crate::hw::{self, Caps, Device, HwError, RssHash, RSS_KEY_LEN};
use crate::mem::{DmaRange, FixedStr, MemSource, Mr};
use crate::mmio::Copy64;
use crate::pmd_log;
use crate::rxq::RxStats;
use crate::txq::{TxConfig, TxPath, TxStats};
use crate::wc::{self, PathChoice};

/// Queue limits we advertise. The HCA allows more; these keep per-port memory sane.
pub const MAX_QUEUES: u16 = crate::hw::MAX_QUEUES;
pub const MIN_DESC: u16 = 64;
pub const MAX_DESC: u16 = 16384;
pub const DEFAULT_RING: u16 = 1024;
pub const DEFAULT_BURST: u16 = 32;
pub const MIN_MTU: u16 = 68;
pub const MAX_MTU: u16 = 9600;
/// Link speed the emulated ConnectX-3 port reports, in Mbps.
pub const LINK_SPEED_MBPS: u32 = 40_000;

/// Memory regions a port can register: one per DPDK memseg list.
pub const MAX_MRS: usize = dpdk_sys::RTE_MAX_MEMSEG_LISTS as usize;

/// A port's state, shared by every process that drives it.
pub struct Port {
    pub name: FixedStr<{ dpdk_sys::RTE_ETH_NAME_MAX_LEN as usize }>,
    /// Inline threshold of the port's TX queues (devarg `txq_inline`).
    pub txq_inline: u16,
    /// Doorbell avoidance on the port's TX queues (devarg `tx_db_avoid`).
    pub tx_db_avoid: bool,
    pub caps: Caps,
    pub mac: [u8; 6],
    pub started: bool,
    /// Which TX path the capability check made live (the reason was logged at probe).
    pub tx_path: TxPath,
    pub copy: Copy64,
    pub source: MemSource,
    /// Memory the device may read packets from and write them to.
    pub mrs: MrTable,
    pub rx: RxState,
    /// Where the software HCA's device loop runs: the burst functions follow it.
    pub device_loop: DeviceLoop,
    /// Receive interrupts, by RX queue.
    pub rx_intr: [RxIntr; MAX_QUEUES as usize],
    /// Unicast, multicast and VLAN filters beyond the main MAC.
    pub filters: Filters,
}

/// Unicast addresses a port accepts at most (mlx4's 128).
pub const MAX_MAC_ADDRS: usize = 128;
/// Multicast addresses a port accepts at most without all-multicast.
pub const MAX_MC_ADDRS: usize = 128;
/// VLAN IDs (12 bits).
const VLAN_IDS: usize = 4096;

/// The receive filters the application set besides the main MAC, kept so that every apply
/// (start, promiscuous mode, MTU) gives the device all of them again.
#[derive(Debug, Clone, Copy)]
pub struct Filters {
    /// Unicast addresses by ethdev index; index 0 stands for [`Port::mac`]; all-zero: empty.
    pub macs: [[u8; 6]; MAX_MAC_ADDRS],
    pub mc: [[u8; 6]; MAX_MC_ADDRS],
    pub n_mc: usize,
    /// Tagged frames of VLANs not in `vlans` are dropped (RX offload VLAN_FILTER).
    pub vlan_filter: bool,
    /// One bit per VLAN ID.
    pub vlans: [u64; VLAN_IDS / 64],
}

impl Default for Filters {
    fn default() -> Self {
        Filters {
            macs: [[0; 6]; MAX_MAC_ADDRS],
            mc: [[0; 6]; MAX_MC_ADDRS],
            n_mc: 0,
            vlan_filter: false,
            vlans: [0; VLAN_IDS / 64],
        }
    }
}

impl Filters {
    /// The unicast table: `main`, then every other address set.
    pub fn unicast(&self, main: [u8; 6]) -> Vec<[u8; 6]> {
        std::iter::once(main)
            .chain(self.macs[1..].iter().copied().filter(|m| *m != [0; 6]))
            .collect()
    }

    pub fn set_vlan(&mut self, vid: u16, on: bool) {
        let (w, b) = (usize::from(vid) / 64, vid % 64);
        if on {
            self.vlans[w] |= 1 << b;
        } else {
            self.vlans[w] &= !(1 << b);
        }
    }

    pub fn vlan_ids(&self) -> impl Iterator<Item = u16> + '_ {
        (0..VLAN_IDS as u16).filter(|&v| self.vlans[usize::from(v) / 64] & (1 << (v % 64)) != 0)
    }
}

/// A filter request the device cannot take is an error only if the application asked for
/// something: the default (nothing beyond the main MAC) needs no support.
fn unless_default(r: Result<(), HwError>, default: bool) -> Result<(), HwError> {
    match r {
        Err(HwError::Unsupported(_)) if default => Ok(()),
        r => r,
    }
}

/// One RX queue's receive interrupt.
#[derive(Debug, Default)]
pub struct RxIntr {
    /// Its completion channel and the channel's fd (the primary's; only it takes interrupts).
    pub channel: Option<(u32, std::os::fd::RawFd)>,
    /// The CQ arm sequence number (2 bits), moved on per event taken. The queue's lcore
    /// moves it (`rte_eth_dev_rx_intr_disable`) while other ops may read the port.
    sn: std::sync::atomic::AtomicU32,
}

impl RxIntr {
    pub fn sn(&self) -> u32 {
        self.sn.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn next_sn(&self) {
        let sn = self.sn() + 1;
        self.sn.store(sn & 3, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The regions a port registered, inline.
#[derive(Clone, Copy)]
pub struct MrTable {
    n: usize,
    regions: [Mr; MAX_MRS],
}

impl MrTable {
    pub fn as_slice(&self) -> &[Mr] {
        &self.regions[..self.n]
    }

    /// Whether one region holds all of `[start, end)`.
    pub fn covers(&self, start: usize, end: usize) -> bool {
        self.as_slice()
            .iter()
            .any(|m| m.contains(start, end.saturating_sub(start)))
    }

    pub fn is_full(&self) -> bool {
        self.n == MAX_MRS
    }

    /// Adds a region registered after probe (a mempool chunk at queue setup).
    pub fn push(&mut self, mr: Mr) {
        assert!(!self.is_full(), "checked by the caller");
        self.regions[self.n] = mr;
        self.n += 1;
    }
}

/// RSS redirection table size (entries of queue indices).
pub const RETA_SIZE: usize = 128;

/// Receive-side settings the device applies: filter, MTU, RSS.
#[derive(Debug, Clone, Copy)]
pub struct RxState {
    pub promisc: bool,
    pub allmulti: bool,
    pub mtu: u16,
    pub rss_key: [u8; RSS_KEY_LEN],
    /// `RTE_ETH_RSS_*` hash types.
    pub rss_hf: u64,
    /// Queue index per redirection-table entry.
    pub reta: [u16; RETA_SIZE],
}

impl Default for RxState {
    fn default() -> Self {
        RxState {
            promisc: true,
            allmulti: true,
            mtu: 1500,
            rss_key: hw::DEFAULT_RSS_KEY,
            rss_hf: RSS_HF_ALL,
            reta: [0; RETA_SIZE],
        }
    }
}

/// The IPv6 types with extension headers (`RTE_ETH_RSS_IPV6_EX`, `_IPV6_TCP_EX`,
/// `_IPV6_UDP_EX`; `RTE_BIT64` values from 22.11's `rte_ethdev.h`, which bindgen cannot expand).
pub const RSS_IPV6_EX: u64 = 1 << 15;
pub const RSS_IPV6_TCP_EX: u64 = 1 << 16;
pub const RSS_IPV6_UDP_EX: u64 = 1 << 17;

/// Every hash type the device computes: what DPDK's C mlx4 offers on ConnectX-3
/// (`mlx4_conv_rss_types`), so an application asking for `RTE_ETH_RSS_IP` (0xa38c) without
/// masking it by `dev_info` is accepted on both. The `_EX` types hash as their plain IPv6
/// counterparts (the device finds the ports past hop-by-hop, routing, destination-options and
/// fragment headers either way).
pub const RSS_HF_ALL: u64 = RSS_IPV4
    | RSS_FRAG_IPV4
    | RSS_NONFRAG_IPV4_TCP
    | RSS_NONFRAG_IPV4_UDP
    | RSS_NONFRAG_IPV4_OTHER
    | RSS_IPV6
    | RSS_FRAG_IPV6
    | RSS_NONFRAG_IPV6_TCP
    | RSS_NONFRAG_IPV6_UDP
    | RSS_NONFRAG_IPV6_OTHER
    | RSS_IPV6_EX
    | RSS_IPV6_TCP_EX
    | RSS_IPV6_UDP_EX;

/// The device's field sets for DPDK hash types.
pub fn rss_hash(hf: u64) -> RssHash {
    let mut h = RssHash::NONE;
    for (types, fields) in [
        (
            RSS_IPV4 | RSS_FRAG_IPV4 | RSS_NONFRAG_IPV4_OTHER,
            RssHash::IPV4,
        ),
        (RSS_NONFRAG_IPV4_TCP, RssHash::IPV4_TCP),
        (RSS_NONFRAG_IPV4_UDP, RssHash::IPV4_UDP),
        (
            RSS_IPV6 | RSS_FRAG_IPV6 | RSS_NONFRAG_IPV6_OTHER | RSS_IPV6_EX,
            RssHash::IPV6,
        ),
        (RSS_NONFRAG_IPV6_TCP | RSS_IPV6_TCP_EX, RssHash::IPV6_TCP),
        (RSS_NONFRAG_IPV6_UDP | RSS_IPV6_UDP_EX, RssHash::IPV6_UDP),
    ] {
        if hf & types != 0 {
            h |= fields;
        }
    }
    h
}

impl Port {
    /// A port on `dev`: reads the device's capabilities, registers `mem` (the ranges packet
    /// buffers may live in) and runs the TX path capability check.
    pub fn open(
        name: &str,
        args: &Devargs,
        source: MemSource,
        mem: &[DmaRange],
        dev: &dyn Device,
    ) -> Result<Port, HwError> {
        if mem.len() > MAX_MRS {
            return Err(HwError::Invalid(format!(
                "{} memory regions, at most {MAX_MRS}",
                mem.len()
            )));
        }
        let caps = dev.caps();
        let mac = args.mac.unwrap_or_else(|| default_mac(name));
        pmd_log!(
            NOTICE,
            "{name}: device ready: bf_reg_size {}, wire {}, device loop {}",
            caps.bf_reg_size,
            args.wire.as_str(),
            args.device_loop.as_str()
        );
        let mut mrs = MrTable {
            n: 0,
            regions: [Mr::default(); MAX_MRS],
        };
        for &range in mem {
            mrs.regions[mrs.n] = dev.reg_mr(range)?;
            mrs.n += 1;
        }
        let copy = bf_copy(dev);
        let choice = wc::decide(dev, args.bf, source.socket(), copy);
        log_path(name, &choice, copy);
        let port = Port {
            name: FixedStr::new(name),
            txq_inline: args.txq_inline,
            tx_db_avoid: args.tx_db_avoid,
            caps,
            mac,
            started: false,
            tx_path: choice.path,
            copy,
            source,
            mrs,
            rx: RxState::default(),
            device_loop: args.device_loop,
            rx_intr: std::array::from_fn(|_| RxIntr::default()),
            filters: Filters::default(),
        };
        Ok(port)
    }

    /// Pushes filter, MTU and RSS settings to the device. `rq_qpns` are the RX queues' QPNs by
    /// queue index; the redirection table maps hash buckets to them.
    pub fn apply_rx(&self, dev: &dyn Device, rq_qpns: &[u32]) -> Result<(), HwError> {
        dev.set_rx_filter(self.mac, self.rx.promisc, self.rx.allmulti)?;
        let f = &self.filters;
        let unicast = f.unicast(self.mac);
        unless_default(dev.set_mac_table(&unicast), unicast.len() == 1)?;
        unless_default(dev.set_mc_list(&f.mc[..f.n_mc]), f.n_mc == 0)?;
        unless_default(dev.set_vlan_filter(f.vlan_filter), !f.vlan_filter)?;
        for vid in f.vlan_ids() {
            dev.set_vlan(vid, true)?;
        }
        dev.set_mtu(self.rx.mtu)?;
        dev.set_rss(&self.rx.rss_key, rss_hash(self.rx.rss_hf))?;
        if !rq_qpns.is_empty() {
            let table: Vec<u32> = self
                .rx
                .reta
                .iter()
                .map(|&q| rq_qpns[usize::from(q) % rq_qpns.len()])
                .collect();
            dev.set_rx_steering(&table)?;
        }
        Ok(())
    }

    /// The default redirection table: buckets round-robin over `nb_rxq` queues.
    pub fn reset_reta(&mut self, nb_rxq: u16) {
        for (i, e) in self.rx.reta.iter_mut().enumerate() {
            *e = (i % usize::from(nb_rxq.max(1))) as u16;
        }
    }

    /// The configuration of this port's TX queues.
    pub fn tx_config(&self, fast_free: bool, socket: i32) -> TxConfig {
        TxConfig {
            inline_max: self.txq_inline,
            path: self.tx_path,
            copy: self.copy,
            fast_free,
            source: match self.source {
                MemSource::Dpdk { .. } => MemSource::Dpdk { socket },
                MemSource::Heap => MemSource::Heap,
            },
        }
    }

    /// Extended statistics: driver counters summed over queues, then per queue, then the
    /// device's own (bus analyser) counters.
    pub fn xstats(
        &self,
        dev: &dyn Device,
        txqs: &[TxStats],
        rxqs: &[RxStats],
    ) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let mut sum = TxStats::default();
        for s in txqs {
            sum.add(s);
        }
        out.extend(sum.extended().map(|(k, v)| (format!("tx_{k}"), v)));
        out.push((
            "tx_path_bf".to_owned(),
            u64::from(self.tx_path == TxPath::BlueFlame),
        ));
        for (i, s) in txqs.iter().enumerate() {
            out.extend(s.extended().map(|(k, v)| (format!("tx_q{i}_{k}"), v)));
        }
        let mut sum = RxStats::default();
        for s in rxqs {
            sum.add(s);
        }
        out.extend(sum.extended().map(|(k, v)| (format!("rx_{k}"), v)));
        for (i, s) in rxqs.iter().enumerate() {
            out.extend(s.extended().map(|(k, v)| (format!("rx_q{i}_{k}"), v)));
        }
        out.extend(dev.counters());
        out
    }

    pub fn start(&mut self, dev: &dyn Device) -> Result<(), HwError> {
        if self.started {
            return Ok(());
        }
        dev.start()?;
        self.started = true;
        Ok(())
    }

    pub fn stop(&mut self, dev: &dyn Device) {
        if !self.started {
            return;
        }
        dev.stop();
        self.started = false;
    }

    pub fn link_up(&self, dev: &dyn Device) -> bool {
        self.started && dev.link_up()
    }
}

/// How TX queues copy WQEs to `dev`'s BlueFlame page: the CPU's best store, except where the
/// device reads the page back from the caches (the software HCA). There `movdir64b`, which
/// writes around the caches and evicts the line, makes the device's first read of each copy
/// wait for memory: about 400 ns per 64-byte line on the 2-core test machine, 25 ns per packet
/// at burst 32, a cost of the model that would hide the driver's. On a card both forms are one
/// posted write; on the model a cached 64-byte store is one store, read back from L1. A routine
/// a benchmark asked for ([`Copy64::prefer`]) is used as asked.
fn bf_copy(dev: &dyn Device) -> Copy64 {
    match Copy64::best() {
        Copy64::Movdir64b if dev.bf_page_cached() && Copy64::preferred().is_none() => {
            [Copy64::Avx512, Copy64::Qwords]
                .into_iter()
                .find(|c| c.available())
                .unwrap_or(Copy64::Qwords)
        }
        c => c,
    }
}

/// The capability check's decision, once, at NOTICE (WARNING when the operator forced a path
/// the checks advise against).
fn log_path(name: &str, choice: &PathChoice, copy: Copy64) {
    let path = match choice.path {
        TxPath::BlueFlame => format!("BlueFlame ({})", copy.name()),
        TxPath::Doorbell => "doorbell".to_owned(),
    };
    if choice.warning {
        pmd_log!(WARNING, "{name}: TX path {path}: {}", choice.reason);
    } else {
        pmd_log!(NOTICE, "{name}: TX path {path}: {}", choice.reason);
    }
}

/// A stable, locally administered MAC derived from the device name, so that the same
/// command line gives the same addresses run after run.
pub fn default_mac(name: &str) -> [u8; 6] {
    // FNV-1a: tiny, stable across releases (unlike std's hasher).
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let [a, b, c, d] = h.to_be_bytes();
    [0x02, 0x4d, a ^ b, b, c, d]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_types_as_the_c_mlx4_offers_them() {
        // RTE_ETH_RSS_IP, what dpdk-test-flow-perf asks for unmasked.
        const RSS_IP: u64 = 0xa38c;
        assert_eq!(RSS_HF_ALL, 0x3afbc);
        assert_eq!(RSS_IP & !RSS_HF_ALL, 0);
        assert_eq!(rss_hash(RSS_IP), RssHash::IPV4 | RssHash::IPV6);
        assert_eq!(rss_hash(RSS_IPV6_EX), RssHash::IPV6);
        assert_eq!(rss_hash(RSS_IPV6_TCP_EX), RssHash::IPV6_TCP);
        assert_eq!(rss_hash(RSS_IPV6_UDP_EX), RssHash::IPV6_UDP);
    }

    #[test]
    fn a_port_is_plain_data() {
        // What another process reads owns nothing on this process's heap: a String, Box, Vec,
        // Arc or trait object in Port would need dropping.
        assert!(!std::mem::needs_drop::<Port>());
    }

    #[test]
    fn the_software_hca_gets_a_cached_blueflame_store() {
        use crate::hw::soft::{hca, Soft};
        let model = hca::Hca::open(hca::HcaConfig::default()).unwrap();
        let dev = Soft::new(model, crate::mem::MemSource::Heap);
        let copy = bf_copy(&dev);
        assert!(copy.available());
        assert_ne!(
            copy,
            Copy64::Movdir64b,
            "its device would read each copy from memory"
        );
    }

    #[test]
    fn default_macs_are_unicast_local_and_distinct() {
        let a = default_mac("net_mlx4rs0");
        let b = default_mac("net_mlx4rs1");
        assert_ne!(a, b);
        assert_eq!(a, default_mac("net_mlx4rs0"));
        for m in [a, b] {
            assert_eq!(m[0] & 1, 0, "unicast");
            assert_eq!(m[0] & 2, 2, "locally administered");
        }
    }
}
