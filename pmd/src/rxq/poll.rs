//! The burst: CQEs polled, the filled buffers handed up, fresh ones posted in their slots.

use std::mem::MaybeUninit;

use mlx4_prm::{cqe_opcode, Cqe, DataSeg};

use super::meta::{parse_rx_cqe, rx_meta, with_tunnel, RX_META};
use super::{alloc_into, release, RxBuf, RxConfig, RxQueue, CHUNK, FRESH};
use crate::mem::{Lkeys, Mr};
use crate::stats::RxStats;

impl<B: RxBuf> RxQueue<B> {
    /// Receives up to `out.len()` frames.
    ///
    /// Per burst, not per frame: a call with nothing waiting leaves after one load of the
    /// next CQE's owner byte; the CQEs ready are counted once, and their replacement buffers
    /// allocated with one bulk call; the lkey of the pool's region is looked up once; the
    /// counters are summed in registers; the CQ consumer record and the RQ doorbell record
    /// are written once, at the end. Per frame remain the CQE's fields, the buffer handed up
    /// and the fresh one posted in its slot.
    pub fn burst(&mut self, out: &mut [B]) -> usize {
        let got = match out {
            [one] if self.cfg.sges == 1 => match self.burst_one(one) {
                Some(got) => got,
                None => return 0,
            },
            _ => {
                if out.is_empty() || !self.cq.has_cqe() {
                    return 0;
                }
                if self.cfg.sges == 1 {
                    if self.cfg.rss || self.cfg.tunnel {
                        self.burst_single::<false>(out)
                    } else {
                        self.burst_single::<true>(out)
                    }
                } else {
                    self.burst_scattered(out)
                }
            }
        };
        self.cq.update_ci();
        self.post_all();
        got
    }

    /// A burst of one on a single-buffer queue: the CQE taken as its owner byte is checked,
    /// no count of the ready ones, no run, and a buffer allocated only for a frame. `None`
    /// when no CQE waits.
    fn burst_one(&mut self, out: &mut B) -> Option<usize> {
        let c = self.cq.next_view()?;
        let slot = (self.rq_ci & (self.wqe_cnt - 1)) as usize;
        self.rq_ci = self.rq_ci.wrapping_add(1);
        if c.opcode() == cqe_opcode::ERROR {
            let why = (c.syndrome(), c.vendor_err());
            self.stats.errors += 1;
            self.on_error_cqe(why.0, why.1);
            return Some(0);
        }
        let mut fresh_room = [MaybeUninit::uninit()];
        let Some(fresh) = alloc_into(self.pool, &mut fresh_room).map(|f| f[0]) else {
            // The pool ran dry: the frame is dropped and counted, and its buffer stays posted.
            self.stats.nombuf += 1;
            return Some(0);
        };
        let len = c.byte_cnt();
        let mut errors = 0;
        // SAFETY: the refill writes only the slot of the completion consumed here, with
        // a fresh buffer from the pool inside its region.
        #[allow(unsafe_code)]
        let entries = unsafe { self.rq.scatter_entries() };
        let mut cx = Refill {
            region: self.lkeys.cached(),
            elts: &mut self.elts,
            entries,
            lkeys: &mut self.lkeys,
            cfg: self.cfg,
        };
        *out = cx.frame(&c, len, slot, fresh, &mut errors);
        let st = &mut self.stats;
        st.packets += 1;
        st.bytes += u64::from(len);
        st.errors += errors;
        Some(1)
    }

    /// One buffer per frame (RX scatter off): no segment arithmetic, CQEs read in place.
    /// `PLAIN`: neither RSS nor tunnel reports (the queue's settings say so), compiled
    /// without their tests per frame.
    fn burst_single<const PLAIN: bool>(&mut self, out: &mut [B]) -> usize {
        debug_assert_eq!(self.elts.len(), self.wqe_cnt as usize);
        debug_assert!(!PLAIN || !(self.cfg.rss || self.cfg.tunnel));
        let (csum, port) = (self.cfg.csum, self.cfg.port_id);
        let (rss, tunnel) = (!PLAIN && self.cfg.rss, !PLAIN && self.cfg.tunnel);
        let table = &RX_META[usize::from(csum)];
        let region = Region::new(self.lkeys.cached());
        let (mut got, mut bytes, mut errors, mut nombuf) = (0usize, 0u64, 0u64, 0u64);
        let (mut error_cqes, mut why) = (0u64, None);
        let mut rq_ci = self.rq_ci;
        // A burst of more than FRESH frames takes them a chunk at a time; each chunk ends the
        // loop when the CQ had fewer than it asked for.
        while got < out.len() {
            let want = (out.len() - got).min(FRESH);
            let ready = self.cq.ready_run(want);
            let n = ready.len();
            if n == 0 {
                break;
            }
            let mut fresh_room = std::mem::take(&mut self.fresh);
            match alloc_into(self.pool, &mut fresh_room[..n]) {
                None => {
                    // The pool ran dry: the frames are dropped and counted, and their buffers
                    // stay posted.
                    self.cq.take_ready(ready, |c| {
                        if c.opcode() == cqe_opcode::ERROR {
                            errors += 1;
                            error_cqes += 1;
                            why = Some((c.syndrome(), c.vendor_err()));
                        } else {
                            nombuf += 1;
                        }
                    });
                    rq_ci = rq_ci.wrapping_add(n as u32);
                }
                Some(fresh) => {
                    let elts: &mut [B] = &mut self.elts;
                    // SAFETY: only the slots of the CQEs taken are refilled, each with a fresh
                    // buffer from the pool inside its region.
                    #[allow(unsafe_code)]
                    let entries = unsafe { self.rq.scatter_entries() };
                    // One buffer and one entry per WQE: a slot masked by the ring's size is
                    // inside both, which lets the loop index them unchecked.
                    let entries = &mut entries[..elts.len()];
                    let ring_mask = elts.len() - 1;
                    let lkeys = &mut self.lkeys;
                    let (stats, error_seen) = (&mut self.stats, &mut self.error_seen);
                    let dst = &mut out[got..got + n];
                    let mut used = 0;
                    self.cq.take_ready(ready, |c| {
                        let slot = rq_ci as usize & ring_mask;
                        rq_ci = rq_ci.wrapping_add(1);
                        if c.opcode() == cqe_opcode::ERROR {
                            // Too long for its buffer, or a bad one: the slot keeps it. Rare,
                            // so counted in place rather than in registers the loop needs.
                            error_cqe(stats, error_seen, c.syndrome(), c.vendor_err());
                            return;
                        }
                        let len = c.byte_cnt();
                        let mut meta = rx_meta(table, c.status(), c.immed_rss_invalid(), rss);
                        if tunnel {
                            meta = with_tunnel(meta, c.vlan_my_qpn(), csum);
                        }
                        let mut head = elts[slot];
                        head.set_single(len, port, &meta);
                        dst[used] = head;
                        bytes += u64::from(len);
                        let b = fresh[used];
                        used += 1;
                        elts[slot] = b;
                        let (addr, room) = b.data_area();
                        let e = &mut entries[slot];
                        let mut d = DataSeg::new_unchecked(&mut e[..]);
                        let lkey = if region.covers(addr, room) {
                            // The pool's region, looked up once per burst.
                            Some(region.lkey)
                        } else {
                            lkeys.lookup(addr, room as usize)
                        };
                        match lkey {
                            Some(lkey) => {
                                d.set_addr(addr as u64);
                                d.set_lkey(lkey);
                                d.set_byte_count(room);
                            }
                            None => {
                                // See Refill::frame.
                                d.set_addr(0);
                                d.set_lkey(mlx4_prm::INVALID_LKEY);
                                d.set_byte_count(0);
                                stats.errors += 1;
                            }
                        }
                    });
                    got += used;
                    if used < n {
                        release(&fresh[used..]);
                    }
                }
            }
            self.fresh = fresh_room;
            if n < want {
                break;
            }
        }
        self.rq_ci = rq_ci;
        if let Some((syndrome, vendor_err)) = why {
            self.stats.error_cqes += error_cqes - 1;
            self.on_error_cqe(syndrome, vendor_err);
        }
        let st = &mut self.stats;
        st.packets += got as u64;
        st.bytes += bytes;
        st.errors += errors;
        st.nombuf += nombuf;
        got
    }

    /// Frames that may take several buffers (scattered RX).
    fn burst_scattered(&mut self, out: &mut [B]) -> usize {
        let mut got = 0;
        while got < out.len() {
            // A chunk's replacements must fit `fresh`, whatever the frames' sizes.
            let want = (out.len() - got)
                .min(CHUNK)
                .min(FRESH / self.cfg.sges as usize)
                .max(1);
            // Take the chunk's CQEs first so one bulk allocation covers all its frames; an
            // error CQE (frame too long for the posted buffers) takes no buffer.
            let mut cqes = [(0u32, 0u32, 0u32, 0usize, 0u32); CHUNK];
            let mut n = 0;
            let mut need = 0usize;
            while n < want {
                let Some(c) = self.cq.poll() else { break };
                let len = c.byte_cnt();
                let k = if c.opcode() == cqe_opcode::ERROR {
                    self.on_error_cqe(c.syndrome(), c.vendor_err());
                    0
                } else {
                    self.segments_for(len)
                };
                need += k;
                cqes[n] = (len, c.status(), c.immed_rss_invalid(), k, c.vlan_my_qpn());
                n += 1;
            }
            if n == 0 {
                break;
            }
            let mut fresh_room = std::mem::take(&mut self.fresh);
            let fresh = alloc_into(self.pool, &mut fresh_room[..need]);
            let alloc_ok = fresh.is_some();
            let fresh = fresh.unwrap_or_default();
            let mut f = 0;
            for &(len, status, hash, k, vlan) in &cqes[..n] {
                let slot = (self.rq_ci & (self.wqe_cnt - 1)) as usize;
                self.rq_ci = self.rq_ci.wrapping_add(1);
                if k == 0 {
                    // The slot keeps its buffers.
                    self.stats.errors += 1;
                    continue;
                }
                if !alloc_ok {
                    self.stats.nombuf += 1;
                    continue;
                }
                let base = slot * self.cfg.sges as usize;
                // Chain from the last segment back, so each knows its successor.
                let mut next: Option<B> = None;
                for i in (0..k).rev() {
                    let seg_len = (len - i as u32 * self.room).min(self.room);
                    let mut b = self.elts[base + i];
                    b.set_segment(seg_len, next);
                    next = Some(b);
                }
                let mut head = next.expect("k >= 1");
                let mut meta = parse_rx_cqe(status, hash, self.cfg.csum, self.cfg.rss);
                if self.cfg.tunnel {
                    meta = with_tunnel(meta, vlan, self.cfg.csum);
                }
                head.set_packet(len, k as u16, self.cfg.port_id, &meta);
                out[got] = head;
                got += 1;
                self.stats.packets += 1;
                self.stats.bytes += u64::from(len);
                for i in 0..k {
                    self.elts[base + i] = fresh[f];
                    f += 1;
                    if !self.post(base + i) {
                        // A buffer outside registered memory (the pool grew into memory we
                        // never saw): the entry must no longer point at the buffer just
                        // handed up, so it becomes an empty one and its frames fail.
                        self.post_empty(base + i);
                        self.stats.errors += 1;
                    }
                }
            }
            self.fresh = fresh_room;
            if n < want {
                break;
            }
        }
        got
    }

    /// Buffers a frame of `len` bytes takes (at least 1).
    fn segments_for(&self, len: u32) -> usize {
        (len.div_ceil(self.room).max(1) as usize).min(self.cfg.sges as usize)
    }
}

/// Counts an error CQE of a burst and notes it for [`RxQueue::recover`].
#[cold]
#[inline(never)]
fn error_cqe(stats: &mut RxStats, error_seen: &mut Option<(u8, u8)>, syndrome: u8, vendor: u8) {
    stats.errors += 1;
    stats.error_cqes += 1;
    *error_seen = Some((syndrome, vendor));
}

/// The registered region the pool's buffers came from last, read once per burst: a buffer
/// inside it takes a subtraction and two compares, with no `Option` to test.
#[derive(Clone, Copy)]
struct Region {
    start: usize,
    /// Bytes from `start` to the region's end.
    span: usize,
    lkey: u32,
}

impl Region {
    /// `mr`, or a region that holds nothing when there is none yet (no span covers a
    /// buffer's room, which setup found to be at least a byte).
    #[inline(always)]
    fn new(mr: Option<Mr>) -> Region {
        match mr {
            Some(m) => Region {
                start: m.start,
                span: m.end.saturating_sub(m.start),
                lkey: m.lkey,
            },
            None => Region {
                start: usize::MAX,
                span: 0,
                lkey: mlx4_prm::INVALID_LKEY,
            },
        }
    }

    /// Whether `[addr, addr + room)` lies inside (what [`Mr::contains`] says): an `addr` below
    /// `start` wraps to an offset past any span.
    #[inline(always)]
    fn covers(&self, addr: usize, room: u32) -> bool {
        let off = addr.wrapping_sub(self.start);
        off <= self.span && room as usize <= self.span - off
    }
}

/// What handing up one frame of a single-buffer queue touches, borrowed once per burst.
struct Refill<'a, B: RxBuf> {
    elts: &'a mut [B],
    entries: &'a mut [[u8; mlx4_prm::DS_SIZE]],
    lkeys: &'a mut Lkeys,
    /// The pool's region, looked up once per burst.
    region: Option<Mr>,
    cfg: RxConfig,
}

impl<B: RxBuf> Refill<'_, B> {
    /// Hands up the frame of CQE `c` (not an error one, `len` bytes) in `slot`'s buffer and posts `fresh`
    /// in its place; an entry that cannot point at `fresh` is counted in `errors`.
    #[inline(always)]
    fn frame(&mut self, c: &Cqe<&[u8]>, len: u32, slot: usize, fresh: B, errors: &mut u64) -> B {
        let cfg = self.cfg;
        let table = &RX_META[usize::from(cfg.csum)];
        let mut meta = rx_meta(table, c.status(), c.immed_rss_invalid(), cfg.rss);
        if cfg.tunnel {
            meta = with_tunnel(meta, c.vlan_my_qpn(), cfg.csum);
        }
        let mut head = self.elts[slot];
        head.set_single(len, cfg.port_id, &meta);
        self.elts[slot] = fresh;
        let (addr, room) = fresh.data_area();
        let lkey = match self.region {
            Some(mr) if mr.contains(addr, room as usize) => Some(mr.lkey),
            _ => self.lkeys.lookup(addr, room as usize),
        };
        let mut d = DataSeg::new_unchecked(&mut self.entries[slot][..]);
        match lkey {
            Some(lkey) => {
                d.set_addr(addr as u64);
                d.set_lkey(lkey);
                d.set_byte_count(room);
            }
            None => {
                // A buffer outside registered memory (the pool grew into memory we never
                // saw): the entry must no longer point at the buffer just handed up, so it
                // becomes an empty one and its frames fail.
                d.set_addr(0);
                d.set_lkey(mlx4_prm::INVALID_LKEY);
                d.set_byte_count(0);
                *errors += 1;
            }
        }
        head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_covers_what_the_region_contains() {
        let mr = Mr {
            start: 0x1_0000,
            end: 0x2_0000,
            lkey: 7,
        };
        let r = Region::new(Some(mr));
        for addr in [
            0,
            0xffff,
            0x1_0000,
            0x1_8000,
            0x1_f800,
            0x1_ffff,
            0x2_0000,
            usize::MAX - 8,
        ] {
            for room in [1u32, 0x7ff, 0x800, 0x801, 0x1_0000, 0x1_0001, u32::MAX] {
                assert_eq!(
                    r.covers(addr, room),
                    mr.contains(addr, room as usize),
                    "addr {addr:#x} room {room:#x}"
                );
            }
        }
        let none = Region::new(None);
        for addr in [0, 0x1_0000, usize::MAX - 1, usize::MAX] {
            assert!(!none.covers(addr, 1), "no region holds {addr:#x}");
        }
    }
}
