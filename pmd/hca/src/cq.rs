//! The device side of a completion queue: the producer of CQEs on a ring of driver memory
//! (doc/prm.md 5, section 10 rule 4), and its arming: one completion event per arming, on the
//! completion channel the CQ is bound to (doc/prm.md 5.3).

use std::sync::Arc;

use mlx4_prm::{cqe_owner, Cqe, CQE_SIZE};

use crate::dma::HostMem;
use crate::events::Channel;

/// Bits of the consumer index the `set_ci_db` record carries.
const CI_MASK: u32 = 0x00ff_ffff;

/// A CQ as the device keeps it.
#[derive(Debug)]
pub(crate) struct Cq {
    ring: HostMem,
    cnt: u32,
    ci_db: HostMem,
    /// Free-running producer count.
    pi: u32,
    /// Room left of what the consumer record last showed ([`Cq::has_room`]), less the CQEs
    /// written since: the record is a line the driver writes, read once per batch.
    credit: u32,
    /// Queues reporting to this CQ; it cannot be destroyed while any do.
    pub(crate) users: u32,
    pub(crate) cqn: u32,
    /// Armed: the next completion (solicited only, with `Some(true)`) raises an event.
    armed: Option<bool>,
    /// Where its events go.
    pub(crate) channel: Option<Arc<Channel>>,
}

impl Cq {
    /// Take over `ring` (`cnt` CQEs) and mark every entry hardware-owned for pass 0, so the
    /// driver never mistakes memory it did not initialise for a completion.
    pub(crate) fn new(cqn: u32, ring: HostMem, cnt: u32, ci_db: HostMem) -> Cq {
        let mut init = [0u8; CQE_SIZE];
        Cqe::new_unchecked(&mut init[..]).set_owner_sr_opcode(cqe_owner::OWNER);
        for i in 0..cnt as usize {
            ring.write_publish_last(i * CQE_SIZE, &init);
        }
        Cq {
            ring,
            cnt,
            ci_db,
            pi: 0,
            credit: 0,
            users: 0,
            cqn,
            armed: None,
            channel: None,
        }
    }

    /// An arm doorbell: request an event for the next completion (`solicited`: the next
    /// solicited or error one) after consumer index `ci`; if completions past `ci` are there
    /// already, the event is raised now, as the hardware compares its producer with the index
    /// the arm carries. Returns whether an event was raised.
    pub(crate) fn arm(&mut self, solicited: bool, ci: u32) -> bool {
        self.armed = Some(solicited);
        if self.pi & CI_MASK != ci & CI_MASK {
            self.fire();
            return true;
        }
        false
    }

    #[cold]
    fn fire(&mut self) {
        self.armed = None;
        if let Some(ch) = &self.channel {
            ch.push(self.cqn);
        }
    }

    /// CQEs the device may write before it would overrun the driver's consumer index.
    pub(crate) fn room(&self) -> u32 {
        let ci = self.ci_db.load_be32(0).unwrap_or(0) & CI_MASK;
        let used = self.pi.wrapping_sub(ci) & CI_MASK;
        self.cnt.saturating_sub(used)
    }

    /// Whether one more CQE fits: [`Cq::room`] read again only once the room it last showed
    /// is used up (a consumer only ever frees room, so the old figure is never too high).
    pub(crate) fn has_room(&mut self) -> bool {
        if self.credit == 0 {
            self.credit = self.room();
        }
        self.credit != 0
    }

    /// Write one CQE (its owner bit is set here from the pass parity), publishing the
    /// `owner_sr_opcode` byte last. Cross-core, a CQE at a time is the slower order:
    /// `apps/lines` (`cqe` rows) measures the polling lcore at about 2x the cycles per CQE
    /// against writing the two CQEs of a 64-byte line together, because the lcore pulls the
    /// line between the two halves. Pairing them needs a CQE held until its partner is due
    /// and flushed at the end of every poll (and before an event fires); not done yet, so
    /// this stays the one-at-a-time write; an armed CQ raises its event (`solicited`: the WQE asked for
    /// a solicited event, or the CQE is an error). The caller has checked [`Cq::room`].
    /// Returns whether an event was raised.
    #[inline]
    pub(crate) fn push(&mut self, mut cqe: [u8; CQE_SIZE], solicited: bool) -> bool {
        let owner = if self.pi & self.cnt != 0 {
            cqe_owner::OWNER
        } else {
            0
        };
        let mut v = Cqe::new_unchecked(&mut cqe[..]);
        let byte = (v.owner_sr_opcode() & !cqe_owner::OWNER) | owner;
        v.set_owner_sr_opcode(byte);
        let off = (self.pi & (self.cnt - 1)) as usize * CQE_SIZE;
        self.ring.write_publish_last(off, &cqe);
        self.pi = self.pi.wrapping_add(1);
        self.credit = self.credit.saturating_sub(1);
        if let Some(sol_only) = self.armed {
            let error = cqe[31] & cqe_owner::OPCODE_MASK == mlx4_prm::cqe_opcode::ERROR;
            if !sol_only || solicited || error {
                self.fire();
                return true;
            }
        }
        false
    }
}

/// CQEs a walk may still write before it must look at the consumer index again: the index is
/// read once per batch, not once per CQE.
#[derive(Debug, Default)]
pub(crate) struct CqCredit(u32);

impl CqCredit {
    /// Whether one more CQE fits, re-reading the consumer index only when the credit is spent.
    pub(crate) fn take(&mut self, cq: &Cq) -> bool {
        if self.0 == 0 {
            self.0 = cq.room();
            if self.0 == 0 {
                return false;
            }
        }
        self.0 -= 1;
        true
    }
}
