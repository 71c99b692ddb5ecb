//! The receive engine: a receive queue's WQEs, scattering a frame into the buffers they name and
//! completing it (doc/prm.md 6, section 10 rule 5).

use std::time::{Duration, Instant};

use mlx4_prm::{cqe_opcode, cqe_vlan, syndrome, Cqe, RxDataSeg, CQE_SIZE, INVALID_LKEY};

use crate::counters::{Counters, RxMac};
use crate::cq::Cq;
use crate::dma::HostMem;
use crate::fault::{Every, INJECTED_VENDOR_ERR};
use crate::inbox::Records;
use crate::net::{self, RxMemo};
use crate::tables::MrTable;
use crate::types::QueueState;

/// How long a received frame waits for room in its RQ's CQ before the port drops it (and,
/// while the CQ stays full, the frames after it).
pub(crate) const RX_CQ_PATIENCE: Duration = Duration::from_millis(10);

/// Most scatter entries an RX WQE may have.
pub(crate) const MAX_RQ_SGES: usize = 32;

/// A receive queue as the device keeps it.
#[derive(Debug)]
pub(crate) struct Rq {
    pub(crate) qpn: u32,
    ring: HostMem,
    cnt: u32,
    sges: u32,
    pub(crate) cqn: u32,
    db: HostMem,
    /// Free-running consumer, in WQEs.
    ci: u32,
    /// The producer count (16 bits) the doorbell record last showed: the record is a line the
    /// driver writes, read again only once the WQEs it announced are used up.
    posted: u32,
    pub(crate) state: QueueState,
    /// Since when frames for this RQ wait for room in its CQ.
    full_since: Option<Instant>,
    /// Leave the 4-byte FCS on received frames (verbs' `SCATTER_FCS`, DPDK's `KEEP_CRC`).
    pub(crate) scatter_fcs: bool,
    /// The adapter is a ConnectX-3 Pro: VXLAN frames get inner verdicts and tunnel bits.
    pub(crate) tunnels: bool,
    /// The buffers of the frame being received ([`Rq::scatter_list`]): kept here so that a
    /// frame does not clear 32 of them on the stack (768 bytes) to use one.
    pieces: [Piece; MAX_RQ_SGES],
}

/// What became of a frame offered to an RQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rx {
    /// Delivered, or dropped and counted: the frame is done with.
    Done,
    /// The CQ has no room: offer the frame again later.
    Wait,
}

/// A buffer a frame is scattered into: MR slot, offset in it, bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Piece {
    mr: usize,
    off: usize,
    len: usize,
}

impl Rq {
    pub(crate) fn new(
        qpn: u32,
        ring: HostMem,
        (cnt, sges): (u32, u32),
        cqn: u32,
        db: HostMem,
        state: QueueState,
    ) -> Rq {
        Rq {
            qpn,
            ring,
            cnt,
            sges,
            cqn,
            db,
            ci: 0,
            posted: 0,
            state,
            full_since: None,
            scatter_fcs: false,
            tunnels: false,
            pieces: [Piece::default(); MAX_RQ_SGES],
        }
    }

    /// Move to `state` (the checks are the caller's). Going to `Reset` forgets where the device
    /// was: the next `Ready` takes WQEs from index 0, as a WQ reset does.
    pub(crate) fn set_state(&mut self, state: QueueState) {
        if state == QueueState::Reset {
            self.ci = 0;
            self.posted = 0;
            self.full_since = None;
        }
        self.state = state;
    }

    /// The status word, checksum field and `vlan_my_qpn` tunnel bits for `frame`. On a Pro, a
    /// VXLAN frame's status describes the inner packet (its types and checksum verdicts, which
    /// DPDK maps to inner packet types), and the tunnel bits the outer headers.
    #[inline(always)]
    fn classify(&self, frame: &[u8], heads: &net::Headers) -> (u32, u16, u32) {
        if self.tunnels {
            if let Some(t) = net::vxlan(frame) {
                let (status, csum) = net::rx_status(&frame[t.inner..]);
                let mut bits = cqe_vlan::L2_TUNNEL;
                if t.outer_v4 {
                    bits |= cqe_vlan::L2_TUNNEL_IPV4;
                }
                if t.outer_ip_ok {
                    bits |= cqe_vlan::L2_TUNNEL_IPOK;
                }
                if t.outer_udp_ok {
                    bits |= cqe_vlan::L2_TUNNEL_L4_CSUM;
                }
                return (status, csum, bits);
            }
        }
        let (status, csum) = net::rx_status_with(frame, heads);
        (status, csum, 0)
    }

    /// Write `frame`, then `fcs`, into the buffers of the WQE at the consumer, checked before
    /// anything is written so a bad entry leaves memory as it was. A first entry that holds
    /// it all (one buffer per WQE, as drivers post them) is the whole scatter list, since the
    /// device reads no entry past the one that fills the frame.
    #[inline(always)]
    fn scatter<'m>(
        &mut self,
        frame: &[u8],
        fcs: &[u8],
        mrs: &'m MrTable,
        last: &mut Option<(u32, &'m HostMem)>,
    ) -> Result<(), u8> {
        let len = frame.len() + fcs.len();
        if self.sges != 0 && len != 0 {
            let mut raw = [0u8; RxDataSeg::<&[u8]>::LEN];
            self.ring.read_array(self.wqe_offset(), &mut raw);
            let d = RxDataSeg::new_unchecked(&raw[..]);
            let (lkey, cap) = (d.lkey(), d.length() as usize);
            if lkey != INVALID_LKEY && cap >= len {
                // The region of the run's last lkey, looked up again only for another key:
                // regions do not change while a delivery holds the table.
                let mem = match *last {
                    Some((k, mem)) if k == lkey => mem,
                    _ => {
                        let mem = mrs.region(lkey).ok_or(syndrome::LOCAL_PROT)?;
                        *last = Some((lkey, mem));
                        mem
                    }
                };
                // `[addr, addr + cap)` inside the region: an address below its base wraps
                // to an offset past its end.
                let (off, room) = (d.addr().wrapping_sub(mem.base() as u64), mem.len() as u64);
                if off > room || cap as u64 > room - off {
                    return Err(syndrome::LOCAL_PROT);
                }
                let off = off as usize;
                mem.write(off, frame);
                if !fcs.is_empty() {
                    mem.write(off + frame.len(), fcs);
                }
                return Ok(());
            }
        }
        self.scatter_pieces(frame, fcs, mrs)
    }

    /// [`Rq::scatter`] across the WQE's entries, whatever their number and sizes.
    #[cold]
    fn scatter_pieces(&mut self, frame: &[u8], fcs: &[u8], mrs: &MrTable) -> Result<(), u8> {
        let n = self.scatter_list(frame.len() + fcs.len(), mrs)?;
        let mut at = 0;
        for p in &self.pieces[..n] {
            let mem = mrs.mem(p.mr);
            let end = at + p.len;
            let body = end.min(frame.len());
            if at < body {
                mem.write(p.off, &frame[at..body]);
            }
            if end > frame.len() {
                let from = at.max(frame.len());
                let skip = from - at;
                mem.write(p.off + skip, &fcs[from - frame.len()..end - frame.len()]);
            }
            at = end;
        }
        Ok(())
    }

    /// WQEs announced and not yet used, the doorbell record read again only once the ones
    /// it showed are used up.
    #[inline(always)]
    fn ready_wqes(&mut self) -> u32 {
        if self.ci & 0xffff == self.posted {
            self.posted = self.db.load_be32(0).unwrap_or(0) & 0xffff;
        }
        self.posted.wrapping_sub(self.ci) & 0xffff
    }

    /// Offset in the ring of the WQE at the consumer.
    #[inline(always)]
    fn wqe_offset(&self) -> usize {
        (self.ci & (self.cnt - 1)) as usize * self.sges as usize * RxDataSeg::<&[u8]>::LEN
    }

    /// The buffers of the WQE at the consumer that `len` bytes fill, into `pieces[..n]` (n is
    /// returned), checked before anything is written so a bad entry leaves memory as it was. Stops at an `INVALID_LKEY` entry; skips
    /// empty ones.
    fn scatter_list(&mut self, len: usize, mrs: &MrTable) -> Result<usize, u8> {
        let entry = RxDataSeg::<&[u8]>::LEN;
        let base = self.wqe_offset();
        let mut raw = [0u8; RxDataSeg::<&[u8]>::LEN];
        let (mut room, mut n) = (0usize, 0usize);
        for i in 0..self.sges as usize {
            if room >= len {
                break;
            }
            self.ring.read_array(base + i * entry, &mut raw);
            let d = RxDataSeg::new_unchecked(&raw[..]);
            if d.lkey() == INVALID_LKEY {
                break;
            }
            let cap = d.length() as usize;
            if cap == 0 {
                continue;
            }
            let (mr, off) = mrs
                .resolve(d.lkey(), d.addr(), cap)
                .ok_or(syndrome::LOCAL_PROT)?;
            let take = cap.min(len - room);
            self.pieces[n] = Piece { mr, off, len: take };
            n += 1;
            room += take;
        }
        if room < len {
            return Err(syndrome::LOCAL_LENGTH);
        }
        Ok(n)
    }
}

/// A run of frames delivered to one RQ: the RQ, its CQ and the region of the lkey last used
/// are found once for the run, not once per frame, and its counters are added once at its
/// end. Each frame still has everything a card does: the RQ's state, its doorbell record
/// (once the WQEs it announced are used up), room in the CQ, the scatter entry read and its
/// lkey and range checked, the copy, the checksum verdict, the CQE.
///
/// The frames of a run are of one flow and one length (the remembered headers compare the
/// length too), so the run counts frames and multiplies at its end.
pub(crate) struct RqRun<'a> {
    rq: &'a mut Rq,
    cq: &'a mut Cq,
    mrs: &'a MrTable,
    inject: &'a mut Every,
    /// The lkey of the last scatter entry and its region.
    last: Option<(u32, &'a HostMem)>,
    /// The length of each of the run's frames.
    len: usize,
    /// Frames delivered.
    frames: u64,
}

impl<'a> RqRun<'a> {
    /// A run of frames of `len` bytes each.
    #[inline(always)]
    pub(crate) fn new(
        rq: &'a mut Rq,
        cq: &'a mut Cq,
        mrs: &'a MrTable,
        inject: &'a mut Every,
        len: usize,
    ) -> RqRun<'a> {
        RqRun {
            rq,
            cq,
            mrs,
            inject,
            last: None,
            len,
            frames: 0,
        }
    }

    /// Add the run's counts to `counters`; `mac` is what the port counters count of each of
    /// its frames (one flow's).
    #[inline(always)]
    pub(crate) fn end(self, mac: RxMac, counters: &mut Counters) {
        let (n, len) = (self.frames, self.len as u64);
        let fcs = if self.rq.scatter_fcs { 4 } else { 0 };
        counters.rx_frames += n;
        counters.rx_bytes += n * len;
        counters.dma_write_bytes += n * (len + fcs);
        counters.cqes += n;
        counters.count_rx(mac, n);
    }

    /// Receive the next frames, which the remembered headers `memo` recall (the first of
    /// them already routed), with the RSS hash `hash`; returns how many. Only while the
    /// common case alone can happen: the RQ ready, WQEs announced, room in a CQ that is not
    /// armed, each WQE's first scatter entry in the region of the run's lkey and holding the
    /// frame, no FCS kept, no VXLAN inner verdict, no error to inject. Those are decided once
    /// for the stretch rather than per frame. The stretch takes the frames of the next one's
    /// L4 verdict, so that their CQEs differ only in the WQE index and the owner bit; they
    /// are written after the frames, two to a line ([`Cq::push_quiet_run`]). The first frame
    /// that leaves the common case is left to [`RqRun::receive`]. Only for a delivery without
    /// flow rules, whose hits count per frame.
    #[inline(always)]
    pub(crate) fn stretch(&mut self, recs: &mut Records<'_>, memo: &RxMemo, hash: u32) -> usize {
        let (rq, cq) = (&mut *self.rq, &mut *self.cq);
        if rq.state != QueueState::Ready || rq.scatter_fcs || self.inject.armed() {
            return 0;
        }
        if rq.tunnels {
            // Whether a frame is VXLAN depends on its length and its bytes up to the ports,
            // which every frame the memo recalls shares.
            match recs.peek() {
                Some(frame) if net::vxlan(frame).is_none() => {}
                _ => return 0,
            }
        }
        let len = self.len;
        let Some(key) = memo.key_for(len) else {
            return 0;
        };
        let n = rq.ready_wqes().min(cq.quiet_room());
        if n == 0 {
            return 0;
        }
        let Some(wqes) = rq
            .ring
            .slots(rq.cnt, rq.sges as usize * RxDataSeg::<&[u8]>::LEN)
        else {
            return 0;
        };
        // The region of the run's last lkey, or else of the first WQE's (the frames of a
        // WQE with another key are left to `receive`).
        let (lkey, mem) = match self.last {
            Some(last) => last,
            None => {
                let [lo, _] = wqes.qwords2(rq.ci);
                let lkey = RxDataSeg::new_unchecked(&lo.to_ne_bytes()[..]).lkey();
                let Some(mem) = self.mrs.region(lkey) else {
                    return 0;
                };
                *self.last.insert((lkey, mem))
            }
        };
        rq.full_since = None;
        let verdict = memo.heads().verdict_for(len);
        // The stretch takes the frames of the next one's L4 verdict: their CQEs are alike but
        // for the WQE index and the owner bit.
        let Some(good) = recs.peek().map(|frame| verdict.passes(frame)) else {
            return 0;
        };
        let mut tmpl = [0u8; CQE_SIZE];
        {
            let (status, csum) = verdict.fields(good);
            let mut w = Cqe::new_unchecked(&mut tmpl[..]);
            w.set_vlan_my_qpn(rq.qpn);
            w.set_immed_rss_invalid(hash);
            w.set_status(status);
            w.set_byte_cnt(len as u32);
            w.set_checksum(csum);
            w.set_owner_sr_opcode(cqe_opcode::RX_SEND);
        }
        let (base, first) = (mem.base() as u64, rq.ci);
        let mut ci = first;
        let done = recs.take_run(
            len,
            n as usize,
            #[inline(always)]
            |frame| {
                if !frame.starts_with(key) {
                    return false;
                }
                if verdict.passes(frame) != good {
                    return false;
                }
                // The entry as two qwords: four loads and swaps where a byte array's accessors
                // would load byte by byte.
                let [lo, hi] = wqes.qwords2(ci);
                let mut raw = [0u8; RxDataSeg::<&[u8]>::LEN];
                raw[..8].copy_from_slice(&lo.to_ne_bytes());
                raw[8..].copy_from_slice(&hi.to_ne_bytes());
                let d = RxDataSeg::new_unchecked(&raw[..]);
                // As in `Rq::scatter`: an address below the region wraps to an offset past it.
                let off = d.addr().wrapping_sub(base);
                if d.lkey() != lkey || !mem.write_within(off, d.length().into(), frame) {
                    return false;
                }
                ci = ci.wrapping_add(1);
                true
            },
        );
        rq.ci = ci;
        cq.push_quiet_run(done as u32, &tmpl, first as u16);
        self.frames += done as u64;
        done
    }

    /// Receive `frame` (its headers `heads`, RSS hash `hash`) into the RQ's next posted WQE.
    #[inline(always)]
    pub(crate) fn receive(
        &mut self,
        frame: &[u8],
        heads: &net::Headers,
        hash: u32,
        counters: &mut Counters,
    ) -> Rx {
        debug_assert_eq!(frame.len(), self.len, "a run's frames are of one length");
        let rq = &mut *self.rq;
        let cq = &mut *self.cq;
        match rq.state {
            QueueState::Ready => {}
            QueueState::Error => {
                counters.rx_drops_error += 1;
                return Rx::Done;
            }
            QueueState::Reset => {
                counters.rx_drops_not_ready += 1;
                return Rx::Done;
            }
        }
        if rq.ready_wqes() == 0 {
            counters.rx_drops_no_wqe += 1;
            return Rx::Done;
        }
        if !cq.has_room() {
            // Wait (a driver may repost buffers before it moves the consumer index), but not
            // forever: a CQ that stays full makes the port drop, and count, like a NIC.
            let since = *rq.full_since.get_or_insert_with(|| {
                counters.cq_full_stalls += 1;
                Instant::now()
            });
            if since.elapsed() < RX_CQ_PATIENCE {
                return Rx::Wait;
            }
            counters.rx_drops_cq_full += 1;
            return Rx::Done;
        }
        rq.full_since = None;
        let mut cqe = [0u8; CQE_SIZE];
        Cqe::new_unchecked(&mut cqe[..]).set_wqe_index(rq.ci as u16);
        // The FCS goes on the wire least significant byte first.
        let fcs_bytes;
        let fcs: &[u8] = if rq.scatter_fcs {
            fcs_bytes = net::crc32(frame).to_le_bytes();
            &fcs_bytes
        } else {
            &[]
        };
        let injected = self.inject.tick();
        let scattered = if injected {
            counters.inj_rx_errors += 1;
            let mut w = Cqe::new_unchecked(&mut cqe[..]);
            w.set_vendor_err(INJECTED_VENDOR_ERR);
            Err(syndrome::LOCAL_PROT)
        } else {
            rq.scatter(frame, fcs, self.mrs, &mut self.last)
        };
        match scattered {
            Ok(()) => {
                let len = frame.len() + fcs.len();
                let (status, csum, tunnel) = rq.classify(frame, heads);
                let mut w = Cqe::new_unchecked(&mut cqe[..]);
                w.set_vlan_my_qpn(rq.qpn | tunnel);
                w.set_immed_rss_invalid(hash);
                w.set_status(status);
                w.set_byte_cnt(len as u32);
                w.set_checksum(csum);
                w.set_owner_sr_opcode(cqe_opcode::RX_SEND);
                self.frames += 1;
            }
            Err(syn) => {
                let mut w = Cqe::new_unchecked(&mut cqe[..]);
                w.set_qpn(rq.qpn);
                w.set_syndrome(syn);
                w.set_owner_sr_opcode(cqe_opcode::ERROR);
                counters.error_cqes += 1;
                counters.cqes += 1;
                if syn == syndrome::LOCAL_LENGTH {
                    counters.rx_drops_too_long += 1;
                } else {
                    counters.rx_drops_error += 1;
                    rq.state = QueueState::Error;
                }
            }
        }
        // Received frames are not solicited events (only errors count as such).
        if cq.push(cqe, false) {
            counters.cq_events += 1;
        }
        rq.ci = rq.ci.wrapping_add(1);
        Rx::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dma::DevPage;

    const PAGE: usize = mlx4_prm::UAR_PAGE_SIZE;

    fn entry(lkey: u32, addr: u64, len: u32) -> [u8; 16] {
        let mut e = [0u8; 16];
        let mut d = RxDataSeg::new_unchecked(&mut e[..]);
        d.set_byte_count(len);
        d.set_lkey(lkey);
        d.set_addr(addr);
        e
    }

    /// The one-entry scatter against the general one, over WQEs of one to four entries with
    /// buffers that fit or not, empty and terminating entries, unknown keys and ranges
    /// outside their region, with and without an FCS: the same verdict and the same bytes in
    /// memory every time, and the shortcut taken for most frames that it can take.
    #[test]
    fn the_one_entry_scatter_is_the_general_one() {
        let (ring_page, db_page, a, b) = (
            DevPage::new(),
            DevPage::new(),
            DevPage::new(),
            DevPage::new(),
        );
        let mut mrs = MrTable::default();
        let ka = mrs.register(a.view(0, PAGE)).unwrap();
        // A region that is part of a page, so that ranges can run past its end inside memory.
        let kb = mrs.register(b.view(256, 1024)).unwrap();
        let (base_a, base_b) = (
            a.view(0, PAGE).base() as u64,
            b.view(256, 1024).base() as u64,
        );
        let mut x = 0x2545_f491u32;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as usize
        };
        let snapshot = || {
            let mut m = vec![0u8; 2 * PAGE];
            a.view(0, PAGE).read(0, &mut m[..PAGE]);
            b.view(0, PAGE).read(0, &mut m[PAGE..]);
            m
        };
        let restore = |m: &[u8]| {
            a.view(0, PAGE).write(0, &m[..PAGE]);
            b.view(0, PAGE).write(0, &m[PAGE..]);
        };
        let (mut fast, mut ok, mut bad) = (0, 0, 0);
        for round in 0..4000 {
            let sges = [1u32, 1, 2, 4][next() % 4];
            let ring = ring_page.view(0, 4 * sges as usize * 16);
            let mut rq = Rq::new(
                0x40,
                ring.clone(),
                (4, sges),
                0x80,
                db_page.view(0, 4),
                QueueState::Ready,
            );
            rq.ci = (next() % 4) as u32;
            let frame: Vec<u8> = (0..next() % 300).map(|i| (i + round) as u8).collect();
            let fcs: &[u8] = if next() % 4 == 0 { &[1, 2, 3, 4] } else { &[] };
            for i in 0..sges as usize {
                let len = [0, 1, 17, 60, 64, 68, 200, 300, 2048][next() % 9];
                let (lkey, base, room) = match next() % 8 {
                    0 => (INVALID_LKEY, base_a, PAGE),
                    1 => (ka ^ 0x10, base_a, PAGE),
                    2 | 3 => (kb, base_b, 1024),
                    _ => (ka, base_a, PAGE),
                };
                // Mostly inside the region; now and then across its end or before it.
                let addr = match next() % 8 {
                    0 => base.wrapping_sub(8),
                    1 => base + (room - 32) as u64,
                    _ => base + (next() % (room / 2)) as u64,
                };
                let e = entry(lkey, addr, len);
                ring.write(rq.wqe_offset() + i * 16, &e);
            }
            let first = {
                let mut raw = [0u8; 16];
                ring.read(rq.wqe_offset(), &mut raw);
                let d = RxDataSeg::new_unchecked(&raw[..]);
                d.lkey() != INVALID_LKEY && d.length() as usize >= frame.len() + fcs.len()
            };
            let before = snapshot();
            let full = rq.scatter_pieces(&frame, fcs, &mrs);
            let full_mem = snapshot();
            restore(&before);
            let short = rq.scatter(&frame, fcs, &mrs, &mut None);
            assert_eq!(short, full, "round {round}: verdict");
            assert!(snapshot() == full_mem, "round {round}: memory differs");
            fast += usize::from(first && !frame.is_empty());
            if short.is_ok() {
                ok += 1;
            } else {
                bad += 1;
            }
        }
        assert!(fast > 1000 && ok > 1000 && bad > 500, "{fast} {ok} {bad}");
    }
}
