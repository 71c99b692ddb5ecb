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

use super::eth::EthMut;
use super::Error;
use crate::mbuf::Pool;
use crate::pmd_log;

/// Registers the chunks of `pool` (every pool when `None`) that the port's regions do not
/// cover yet.
pub(super) fn register_pools(e: &mut EthMut<'_>, pool: Option<Pool>) -> Result<(), Error> {
    // SAFETY: the pools are the application's, whose mbufs it hands to this port; DPDK's rule
    // (which every op of ethdev takes on) is that it frees a pool only once no port uses its
    // mbufs, and the port's regions are deregistered at close.
    for range in unsafe { crate::eal::pool_ranges(pool) } {
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
