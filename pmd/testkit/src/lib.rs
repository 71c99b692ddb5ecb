//! Test support for the driver, shared by its tests and benchmarks: a scratch device to put
//! queues on (the software HCA in step mode, seen through the driver's backend) and the plain
//! test buffer (one segment, no offloads, nothing to give back).
//!
//! Step mode means no thread: the device runs only in [`Scratch::step`], in the caller's
//! thread, so that a test or an instruction count sees the same work on every run.
#![deny(unsafe_code)]

use std::sync::atomic::{AtomicU32, Ordering};

use mlx4rs::hca::{Hca, HcaConfig, Wire};
use mlx4rs::hw::soft::Soft;
use mlx4rs::hw::Device;
use mlx4rs::mem::{DmaRange, MemSource, Mr};
use mlx4rs::mmio::Copy64;
use mlx4rs::txq::{TxBuf, TxConfig, TxPath, TxQueue};
use mlx4rs::wqe::TxOffloads;

/// A packet of one segment that lives as long as the process, without offloads; its release
/// frees nothing, so counts of a burst are the driver's alone.
#[derive(Clone, Copy, Debug)]
pub struct Plain(pub &'static [u8]);

impl Plain {
    /// `bytes` cut into packets of `size` bytes (the last may be shorter), leaked for the
    /// process's life, with the range they lie in (for [`Scratch::reg_mr`]).
    pub fn leak(bytes: Vec<u8>, size: usize) -> (Vec<Plain>, &'static [u8]) {
        let all: &'static [u8] = bytes.leak();
        (all.chunks(size).map(Plain).collect(), all)
    }
}

impl TxBuf for Plain {
    fn pkt_len(&self) -> u32 {
        self.0.len() as u32
    }
    fn segs(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(self.0)
    }
    fn offloads(&self) -> TxOffloads {
        TxOffloads::default()
    }
    fn plain(&self) -> Option<&[u8]> {
        Some(self.0)
    }
    #[allow(unsafe_code)]
    unsafe fn free_bulk(_bufs: &[Self]) {}
}

/// A TX queue configuration for tests: heap rings, the best copy, no fast free.
pub fn tx_config(path: TxPath, inline_max: u16) -> TxConfig {
    TxConfig {
        inline_max,
        path,
        copy: Copy64::best(),
        fast_free: false,
        source: MemSource::Heap,
    }
}

/// A device for scratch queues: the software HCA in step mode on a wire, started, its link
/// up, and the driver's backend over it, which owns the queues' memory.
pub struct Scratch {
    pub hca: Hca,
    pub dev: Soft,
}

impl Scratch {
    /// Opens one with `cfg` (forced into step mode, under a name of its own in the process,
    /// starting with `tag`) on `wire`.
    pub fn open(tag: &str, cfg: HcaConfig, wire: Wire) -> Result<Scratch, String> {
        static N: AtomicU32 = AtomicU32::new(0);
        let hca = Hca::open(HcaConfig {
            threaded: false,
            name: format!("{tag}{}", N.fetch_add(1, Ordering::Relaxed)),
            ..cfg
        })
        .map_err(|e| format!("opening the software HCA: {e}"))?;
        hca.set_wire(wire).map_err(|e| e.to_string())?;
        hca.start().map_err(|e| e.to_string())?;
        hca.set_port_up(true);
        let dev = Soft::new(hca.clone(), MemSource::Heap);
        Ok(Scratch { hca, dev })
    }

    /// Registers memory that lives as long as the process (what [`Plain::leak`] gives), for
    /// send queues to read.
    pub fn reg_mr(&self, mem: &'static [u8]) -> Result<Mr, String> {
        let start = mem.as_ptr() as usize;
        #[allow(unsafe_code)]
        // SAFETY: leaked memory is mapped for the process's life; send queues only read it.
        let range = unsafe { DmaRange::new(start, start + mem.len()) };
        self.dev.reg_mr(range).map_err(|e| e.to_string())
    }

    /// A TX queue of `nb_desc` descriptors as [`TxQueue::new`] makes it.
    ///
    /// # Safety
    /// As for [`TxQueue::new`]: this scratch device outlives the queue, which ends with
    /// [`TxQueue::destroy`] on `self.dev` (or is leaked).
    #[allow(unsafe_code)]
    pub unsafe fn txq<B: TxBuf>(
        &self,
        name: &str,
        nb_desc: u16,
        cfg: TxConfig,
        mrs: &[Mr],
    ) -> Result<TxQueue<B>, String> {
        // SAFETY: the caller's contract.
        unsafe { TxQueue::new(&self.dev, name, 0, nb_desc, cfg, mrs) }
            .map_err(|e| format!("TX queue: {e}"))
    }

    /// Runs the device once over everything it was told about.
    pub fn step(&self) {
        self.hca.step();
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.hca.stop();
    }
}
