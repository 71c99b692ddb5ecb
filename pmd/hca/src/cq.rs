//! The device side of a completion queue: the producer of CQEs on a ring of driver memory
//! (doc/prm.md 5, section 10 rule 4), and its arming: one completion event per arming, on the
//! completion channel the CQ is bound to (doc/prm.md 5.3).

use std::sync::Arc;

use mlx4_prm::{cqe_owner, Cqe, CQE_SIZE};

use crate::dma::HostMem;
use crate::events::Channel;

/// Bits of the consumer index the `set_ci_db` record carries.
const CI_MASK: u32 = 0x00ff_ffff;

/// The `owner_sr_opcode` byte: the last of the entry, the one published last.
const OWNER_AT: usize = Cqe::<&[u8]>::OWNER_OFFSET;
const _: () = assert!(OWNER_AT == CQE_SIZE - 1);

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
    /// The CQE of an even slot (owner bit set), held back to be written with its odd partner
    /// as one 64-byte line ([`Cq::push`]); [`Cq::flush`] writes it alone.
    held: [u8; CQE_SIZE],
    /// `held` is a CQE not yet written.
    holding: bool,
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
            held: [0; CQE_SIZE],
            holding: false,
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
    #[inline]
    pub(crate) fn has_room(&mut self) -> bool {
        if self.credit == 0 {
            self.credit = self.room();
        }
        self.credit != 0
    }

    /// Write one CQE (its owner bit is set here from the pass parity), publishing the
    /// `owner_sr_opcode` byte last. The two CQEs of a 64-byte line are written together: a
    /// CQE of an even slot is held until its partner comes (or [`Cq::flush`]), since
    /// cross-core a CQE at a time is the slower order (`apps/lines`, `cqe` rows: the polling
    /// lcore pays about 2x the cycles per CQE, pulling the line between the two halves). An
    /// armed CQ raises its event (`solicited`: the WQE asked for a solicited event, or the CQE
    /// is an error), what it holds written first. The caller has checked [`Cq::room`], and
    /// flushes before the driver may look (the end of every walk and delivery). Returns
    /// whether an event was raised.
    #[inline(always)]
    pub(crate) fn push(&mut self, cqe: [u8; CQE_SIZE], solicited: bool) -> bool {
        let cqe = self.put(cqe);
        self.credit = self.credit.saturating_sub(1);
        if let Some(sol_only) = self.armed {
            let error = cqe[OWNER_AT] & cqe_owner::OPCODE_MASK == mlx4_prm::cqe_opcode::ERROR;
            if !sol_only || solicited || error {
                self.flush();
                self.fire();
                return true;
            }
        }
        false
    }

    /// CQEs that may be written now without an event or a look at the consumer record: 0
    /// while the CQ is armed (each CQE must then be checked for the event), else the credit,
    /// the record read again if it is spent ([`Cq::has_room`]).
    #[inline(always)]
    pub(crate) fn quiet_room(&mut self) -> u32 {
        if self.armed.is_some() || !self.has_room() {
            return 0;
        }
        self.credit
    }

    /// [`Cq::push`] of `n` CQEs, no more than [`Cq::quiet_room`] allowed, so that no event
    /// can be due: `tmpl` (whose `wqe_index` is 0) for the WQEs from index `wqe` on, one
    /// after the other, as a receive queue completes them. Those of a line's even and odd
    /// slot are built from the template's qwords and written together, with no CQE held in
    /// between; a CQE left alone at either end goes through [`Cq::put`], which pairs it with
    /// the one held before or holds it for the next.
    #[inline(always)]
    pub(crate) fn push_quiet_run(&mut self, n: u32, tmpl: &[u8; CQE_SIZE], wqe: u16) {
        debug_assert!(self.armed.is_none() && n <= self.credit);
        let at = |i: u32| {
            let mut e = *tmpl;
            Cqe::new_unchecked(&mut e[..]).set_wqe_index(wqe.wrapping_add(i as u16));
            e
        };
        let mut i = 0;
        if self.cnt < 2 {
            while i < n {
                self.put(at(i));
                i += 1;
            }
        }
        if i < n && self.pi & 1 != 0 {
            self.put(at(i));
            i += 1;
        }
        let words = |e: [u8; CQE_SIZE]| {
            let mut w = [0u64; 4];
            for (q, c) in w.iter_mut().zip(e.chunks_exact(8)) {
                *q = u64::from_ne_bytes(c.try_into().expect("8 bytes"));
            }
            w
        };
        // The template's qwords once; per CQE only its index's and owner's bits are added.
        let mut owner_byte = [0u8; 8];
        owner_byte[OWNER_AT % 8] = cqe_owner::OWNER;
        let owner_bit = u64::from_ne_bytes(owner_byte);
        let mut base = words(*tmpl);
        base[OWNER_AT / 8] &= !owner_bit;
        let index = |i: u32| {
            let mut e = [0u8; CQE_SIZE];
            Cqe::new_unchecked(&mut e[..]).set_wqe_index(wqe.wrapping_add(i as u16));
            words(e)
        };
        // The ring as lines of two CQEs, checked once; a ring that is not whole lines
        // (a foreign layout) takes the CQEs one by one.
        let lines = if n - i >= 2 {
            self.ring.slots(self.cnt / 2, 2 * CQE_SIZE)
        } else {
            None
        };
        if let Some(lines) = lines {
            let mut pi = self.pi;
            while i + 2 <= n {
                // An even slot: its partner is of the same pass (`cnt` is even).
                debug_assert!(!self.holding && pi & 1 == 0);
                let owner = if pi & self.cnt != 0 { owner_bit } else { 0 };
                let (mut a, mut b) = (base, base);
                a[OWNER_AT / 8] |= owner;
                b[OWNER_AT / 8] |= owner;
                for (k, (ia, ib)) in index(i).into_iter().zip(index(i + 1)).enumerate() {
                    a[k] |= ia;
                    b[k] |= ib;
                }
                lines.write_pair_publish_last(pi / 2, a, b);
                pi = pi.wrapping_add(2);
                i += 2;
            }
            self.pi = pi;
        }
        // What is left: the last CQE, for an even slot, is held for its partner.
        while i < n {
            self.put(at(i));
            i += 1;
        }
        self.credit -= n;
    }

    /// Write `cqe` with its owner bit (or hold it for its partner) and move the producer on;
    /// returns the CQE as written.
    #[inline(always)]
    fn put(&mut self, mut cqe: [u8; CQE_SIZE]) -> [u8; CQE_SIZE] {
        let owner = if self.pi & self.cnt != 0 {
            cqe_owner::OWNER
        } else {
            0
        };
        cqe[OWNER_AT] = (cqe[OWNER_AT] & !cqe_owner::OWNER) | owner;
        let slot = self.pi & (self.cnt - 1);
        if self.holding {
            // The held CQE is of the even slot just before this one.
            self.holding = false;
            let off = (slot - 1) as usize * CQE_SIZE;
            self.ring.write_pair_publish_last(off, &self.held, &cqe);
        } else if slot & 1 == 0 && self.cnt > 1 {
            self.held = cqe;
            self.holding = true;
        } else {
            self.ring.write_publish_last(slot as usize * CQE_SIZE, &cqe);
        }
        self.pi = self.pi.wrapping_add(1);
        cqe
    }

    /// Write the CQE held for its partner, if any, alone: the driver may look now.
    #[inline]
    pub(crate) fn flush(&mut self) {
        if self.holding {
            self.holding = false;
            let slot = self.pi.wrapping_sub(1) & (self.cnt - 1);
            self.ring
                .write_publish_last(slot as usize * CQE_SIZE, &self.held);
        }
    }

    /// Whether a CQE is held for its partner (none may be once a poll is over).
    #[cfg(test)]
    pub(crate) fn holds(&self) -> bool {
        self.holding
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

    /// Room for up to `n` CQEs to be written together, none of them yet: how many fit,
    /// re-reading the consumer index only when the credit does not cover them all. (Taking
    /// them one by one would re-read it with the granted ones still unwritten, and grant
    /// their room twice.)
    #[inline]
    pub(crate) fn take_up_to(&mut self, cq: &Cq, n: u32) -> u32 {
        if self.0 < n {
            self.0 = cq.room();
        }
        let k = n.min(self.0);
        self.0 -= k;
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dma::DevPage;

    fn cqe(n: u8) -> [u8; CQE_SIZE] {
        let mut c = [n; CQE_SIZE];
        c[OWNER_AT] = mlx4_prm::cqe_opcode::RX_SEND;
        c
    }

    /// The ring's entries as the driver sees them: `Some(fill byte)` where the owner bit says
    /// software owns the entry in pass 0.
    fn visible(page: &DevPage) -> Vec<Option<u8>> {
        (0..4)
            .map(|i| {
                let mut e = [0u8; CQE_SIZE];
                assert!(page.view(0, 4 * CQE_SIZE).read(i * CQE_SIZE, &mut e));
                (e[OWNER_AT] & cqe_owner::OWNER == 0).then_some(e[0])
            })
            .collect()
    }

    #[test]
    fn the_cqes_of_a_line_are_written_together_and_a_flush_writes_the_rest() {
        let page = DevPage::new();
        let mut cq = Cq::new(1, page.view(0, 4 * CQE_SIZE), 4, page.view(512, 4));
        assert_eq!(visible(&page), [None; 4]);
        assert!(!cq.push(cqe(1), false));
        assert!(cq.holds());
        assert_eq!(
            visible(&page),
            [None; 4],
            "the even CQE waits for its partner"
        );
        cq.push(cqe(2), false);
        assert!(!cq.holds());
        assert_eq!(visible(&page), [Some(1), Some(2), None, None]);
        cq.push(cqe(3), false);
        assert_eq!(visible(&page), [Some(1), Some(2), None, None]);
        cq.flush();
        assert!(!cq.holds());
        assert_eq!(visible(&page), [Some(1), Some(2), Some(3), None]);
        // A flush with nothing held writes nothing; the odd slot is written at once.
        cq.flush();
        cq.push(cqe(4), false);
        assert_eq!(visible(&page), [Some(1), Some(2), Some(3), Some(4)]);
        assert_eq!(cq.pi, 4);
    }

    /// `push_quiet_run` against a `push` per CQE, on twin CQs: runs of any length from an odd
    /// or an even slot, with a CQE held or not, across the pass's end (the owner bit), on a
    /// ring of whole lines and on one that is not 8-aligned. The rings' bytes, the producers
    /// and what is held agree after every step.
    #[test]
    fn a_run_of_cqes_is_written_as_one_at_a_time() {
        let mut x = 0x9e37_79b9u32;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for offset in [0usize, 4] {
            let cnt = 8u32;
            let bytes = cnt as usize * CQE_SIZE;
            let (pa, pb) = (DevPage::new(), DevPage::new());
            let ring = |p: &DevPage| p.view(offset, bytes);
            let db = |p: &DevPage| p.view(1024, 4);
            let mut fast = Cq::new(1, ring(&pa), cnt, db(&pa));
            let mut slow = Cq::new(1, ring(&pb), cnt, db(&pb));
            let (mut runs, mut paired) = (0, 0);
            for step in 0..3000 {
                // The consumer has taken everything: the whole ring is room.
                for (p, cq) in [(&pa, &fast), (&pb, &slow)] {
                    db(p).write(0, &cq.pi.to_be_bytes());
                }
                match next() % 4 {
                    0 => {
                        let c = cqe(next() as u8);
                        fast.push(c, false);
                        slow.push(c, false);
                    }
                    1 => {
                        fast.flush();
                        slow.flush();
                    }
                    _ => {
                        let n = next() % (fast.quiet_room() + 1);
                        assert_eq!(slow.quiet_room(), fast.quiet_room());
                        let mut tmpl = [0u8; CQE_SIZE];
                        tmpl.iter_mut().for_each(|b| *b = next() as u8);
                        Cqe::new_unchecked(&mut tmpl[..]).set_wqe_index(0);
                        let wqe = next() as u16;
                        fast.push_quiet_run(n, &tmpl, wqe);
                        for i in 0..n {
                            let mut c = tmpl;
                            Cqe::new_unchecked(&mut c[..])
                                .set_wqe_index(wqe.wrapping_add(i as u16));
                            slow.push(c, false);
                        }
                        runs += 1;
                        paired += usize::from(n >= 3);
                    }
                }
                let (mut a, mut b) = (vec![0u8; bytes], vec![0u8; bytes]);
                assert!(ring(&pa).read(0, &mut a) && ring(&pb).read(0, &mut b));
                assert!(a == b, "offset {offset}, step {step}: the rings differ");
                assert_eq!(
                    (fast.pi, fast.holds()),
                    (slow.pi, slow.holds()),
                    "step {step}"
                );
                assert_eq!(fast.credit, slow.credit, "step {step}");
            }
            assert!(
                runs > 1000 && paired > 300,
                "{runs} runs, {paired} of 3 or more"
            );
        }
    }

    #[test]
    fn an_event_is_raised_only_once_its_cqe_is_visible() {
        let page = DevPage::new();
        let mut cq = Cq::new(1, page.view(0, 4 * CQE_SIZE), 4, page.view(512, 4));
        let ch = Arc::new(Channel::new().unwrap());
        cq.channel = Some(ch.clone());
        assert!(!cq.arm(false, 0));
        assert!(cq.push(cqe(7), false));
        assert!(!cq.holds());
        assert_eq!(ch.pop(), Some(1));
        assert_eq!(visible(&page), [Some(7), None, None, None]);
    }
}
