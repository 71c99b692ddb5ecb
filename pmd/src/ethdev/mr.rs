//! Memory registration of packet buffers per mempool chunk, when queues are set up.
//!
//! A vdev port registers every memseg list at probe: the software HCA pins nothing, so one
//! region per list covers any mbuf cheaply. A card pins what it registers, and a hugepage
//! memseg list is mostly reserved address space with nothing behind it, so a ConnectX-3 port
//! registers the chunks its mbufs actually live in: the RX queue's pool at RX queue setup, and
//! every pool that exists at TX queue setup (the mbufs an application sends come from its
//! pools, created before its queues). Chunks already covered (always, for a vdev port) cost a
//! lookup. The data path only looks keys up; a buffer in memory registered nowhere is counted
//! as a TX error, which names a pool created after the TX queue was set up.

use std::ffi::c_void;

use dpdk_sys as sys;

use super::eth::EthMut;
use super::Error;
use crate::mem::DmaRange;
use crate::pmd_log;

/// The memory chunks of `pool`, or of every mempool of the process when `None`.
fn chunks(pool: Option<*mut sys::rte_mempool>) -> Vec<DmaRange> {
    unsafe extern "C" fn chunk(
        _mp: *mut sys::rte_mempool,
        arg: *mut c_void,
        hdr: *mut sys::rte_mempool_memhdr,
        _idx: std::ffi::c_uint,
    ) {
        // SAFETY: `arg` is our Vec; `hdr` a live chunk header of the pool being walked. A
        // mempool chunk stays mapped while the pool exists, and an application frees a pool
        // only once no port uses its mbufs.
        unsafe {
            let v = &mut *arg.cast::<Vec<DmaRange>>();
            let start = (*hdr).addr as usize;
            v.push(DmaRange::new(start, start + (*hdr).len));
        }
    }
    unsafe extern "C" fn pool_chunks(mp: *mut sys::rte_mempool, arg: *mut c_void) {
        // SAFETY: a live pool of the walk; `arg` is our Vec, handed on.
        unsafe { sys::rte_mempool_mem_iter(mp, Some(chunk), arg) };
    }
    let mut v: Vec<DmaRange> = Vec::new();
    let arg = (&mut v as *mut Vec<DmaRange>).cast();
    // SAFETY: the callbacks only append to `v`, which outlives the walks.
    unsafe {
        match pool {
            Some(mp) => {
                sys::rte_mempool_mem_iter(mp, Some(chunk), arg);
            }
            None => sys::rte_mempool_walk(Some(pool_chunks), arg),
        }
    }
    v.retain(|r| r.end() > r.start());
    v
}

/// Registers the chunks of `pool` (every pool when `None`) that the port's regions do not
/// cover yet.
pub(super) fn register_pools(
    e: &mut EthMut<'_>,
    pool: Option<*mut sys::rte_mempool>,
) -> Result<(), Error> {
    for range in chunks(pool) {
        let (start, end) = (range.start(), range.end());
        if e.port.mrs.covers(start, end) {
            continue;
        }
        if e.port.mrs.is_full() {
            return Err(Error::NoMemory(format!(
                "memory at {start:#x}..{end:#x} needs a region, and the port has {} already",
                crate::port::MAX_MRS
            )));
        }
        let mr = e.dev.reg_mr(range)?;
        pmd_log!(
            DEBUG,
            "{}: registered {start:#x}..{end:#x} (lkey {:#x})",
            e.port.name,
            mr.lkey
        );
        e.port.mrs.push(mr);
    }
    Ok(())
}
