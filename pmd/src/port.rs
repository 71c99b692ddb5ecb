//! One `net_mlx4rs` port: its devargs, its (software) HCA, link state and configuration.
//! Ordinary Rust: the `ethdev` module turns DPDK's callbacks into calls on this type.

use std::sync::Arc;

use mlx4_hca::{Caps, Hca, HcaConfig};

use crate::devargs::{Devargs, WcMode};
use crate::mem::{MemSource, Mr};
use crate::mmio::Copy64;
use crate::pmd_log;
use crate::txq::{TxConfig, TxPath, TxStats};
use crate::wc::{self, PathChoice};

/// Queue limits we advertise. The HCA allows more; these keep per-port memory sane.
pub const MAX_QUEUES: u16 = 16;
pub const MIN_DESC: u16 = 64;
pub const MAX_DESC: u16 = 16384;
pub const DEFAULT_RING: u16 = 1024;
pub const DEFAULT_BURST: u16 = 32;
pub const MIN_MTU: u16 = 68;
pub const MAX_MTU: u16 = 9600;
/// Link speed the emulated ConnectX-3 port reports, in Mbps.
pub const LINK_SPEED_MBPS: u32 = 40_000;

#[derive(Debug)]
pub enum PortError {
    Hca(String),
    Invalid(String),
}

impl std::fmt::Display for PortError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortError::Hca(s) => write!(f, "device: {s}"),
            PortError::Invalid(s) => f.write_str(s),
        }
    }
}

impl PortError {
    /// The negative errno DPDK expects from an op.
    pub fn errno(&self) -> i32 {
        match self {
            PortError::Hca(_) => -libc::EIO,
            PortError::Invalid(_) => -libc::EINVAL,
        }
    }
}

pub struct Port {
    pub name: Arc<str>,
    pub args: Devargs,
    pub hca: Hca,
    pub caps: Caps,
    pub mac: [u8; 6],
    pub started: bool,
    /// Which TX path the capability check made live, and why.
    pub tx_path: PathChoice,
    pub copy: Copy64,
    pub source: MemSource,
    /// Memory the device may read packets from.
    pub mrs: Arc<[Mr]>,
}

impl Port {
    /// Opens the device behind a port, reads its capabilities, registers `mem` (the ranges
    /// packet buffers may live in) and runs the TX path capability check.
    pub fn open(
        name: &str,
        args: Devargs,
        source: MemSource,
        mem: &[(usize, usize)],
    ) -> Result<Port, PortError> {
        let cfg = HcaConfig {
            wc: args.wc == WcMode::On,
            threaded: true,
            busy_poll: args.busy_poll,
            name: name.to_owned(),
            ..HcaConfig::default()
        };
        let hca = Hca::open(cfg).map_err(|e| PortError::Hca(e.to_string()))?;
        let caps = hca.caps();
        let mac = args.mac.unwrap_or_else(|| default_mac(name));
        pmd_log!(
            INFO,
            "{name}: software HCA opened: bf_reg_size {} wire {}",
            caps.bf_reg_size,
            args.wire.as_str()
        );
        let mut mrs = Vec::with_capacity(mem.len());
        for &(start, end) in mem {
            // SAFETY-free: the caller guarantees these ranges stay mapped while the port lives.
            mrs.push(crate::hw::reg_mr_range(&hca, start, end).map_err(PortError::Hca)?);
        }
        let copy = Copy64::best();
        hca.start().map_err(|e| PortError::Hca(e.to_string()))?;
        let tx_path = wc::decide(&hca, args.bf, source, copy);
        hca.stop();
        let path = match tx_path.path {
            TxPath::BlueFlame => format!("BlueFlame ({})", copy.name()),
            TxPath::Doorbell => "doorbell".to_owned(),
        };
        if tx_path.warning {
            pmd_log!(WARNING, "{name}: TX path {path}: {}", tx_path.reason);
        } else {
            pmd_log!(NOTICE, "{name}: TX path {path}: {}", tx_path.reason);
        }
        Ok(Port {
            name: name.into(),
            args,
            hca,
            caps,
            mac,
            started: false,
            tx_path,
            copy,
            source,
            mrs: mrs.into(),
        })
    }

    /// The configuration of this port's TX queues.
    pub fn tx_config(&self, fast_free: bool, socket: i32) -> TxConfig {
        TxConfig {
            inline_max: self.args.txq_inline,
            path: self.tx_path.path,
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
    pub fn xstats(&self, txqs: &[TxStats]) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let mut sum = TxStats::default();
        for s in txqs {
            sum.doorbells += s.doorbells;
            sum.bf_writes += s.bf_writes;
            sum.inline_packets += s.inline_packets;
            sum.gather_packets += s.gather_packets;
            sum.completions += s.completions;
            sum.ring_full += s.ring_full;
            sum.error_cqes += s.error_cqes;
        }
        let fields = |s: &TxStats| {
            [
                ("doorbells", s.doorbells),
                ("bf_writes", s.bf_writes),
                ("inline_packets", s.inline_packets),
                ("gather_packets", s.gather_packets),
                ("completions", s.completions),
                ("ring_full", s.ring_full),
                ("error_cqes", s.error_cqes),
            ]
        };
        for (k, v) in fields(&sum) {
            out.push((format!("tx_{k}"), v));
        }
        out.push((
            "tx_path_bf".to_owned(),
            u64::from(self.tx_path.path == TxPath::BlueFlame),
        ));
        for (i, s) in txqs.iter().enumerate() {
            for (k, v) in fields(s) {
                out.push((format!("tx_q{i}_{k}"), v));
            }
        }
        for (k, v) in self.hca.counters().iter() {
            out.push((format!("hca_{k}"), v));
        }
        out
    }

    pub fn start(&mut self) -> Result<(), PortError> {
        if self.started {
            return Ok(());
        }
        self.hca
            .set_wire(self.args.wire.to_wire())
            .map_err(|e| PortError::Hca(format!("wire {}: {e}", self.args.wire.as_str())))?;
        self.hca
            .start()
            .map_err(|e| PortError::Hca(e.to_string()))?;
        self.hca.set_port_up(true);
        self.started = true;
        Ok(())
    }

    pub fn stop(&mut self) {
        if !self.started {
            return;
        }
        self.hca.set_port_up(false);
        self.hca.stop();
        self.started = false;
    }

    pub fn link_up(&self) -> bool {
        self.started && self.hca.port_up()
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        self.stop();
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
