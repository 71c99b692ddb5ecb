//! A port's receive buffer: a ring of variable-length frame records in memory of any origin
//! (the heap, the adapter's device memory, a file two processes map), as plain data.
//!
//! Producers (whatever puts frames on this port's wire: its own loop, a cabled port, a TAP
//! reader) take a spin lock once per batch of frames; the one consumer (the port's receive
//! engine) needs no lock. A frame that does not fit, or arrives while the port is down, is
//! refused and counted in the ring's own header, so the receiving side can report it as missed
//! even when nobody is polling it.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crate::dma::Region;

const MAGIC: u32 = 0x4d58_4942; // "MXIB"
const VERSION: u32 = 1;

/// Byte offsets of the header fields; producer and consumer fields on separate cache lines.
mod hdr {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const CAP: usize = 8;
    pub const MAX_FRAMES: usize = 16;
    /// Producer lock: 0 free, 1 held.
    pub const LOCK: usize = 64;
    /// Bytes published by producers (free-running).
    pub const HEAD: usize = 72;
    /// Frames published.
    pub const PUSHED: usize = 80;
    /// Frames refused: no room, or the port down.
    pub const DROPPED: usize = 88;
    /// Bytes the consumer is done with (free-running).
    pub const TAIL: usize = 128;
    /// Frames the consumer is done with.
    pub const POPPED: usize = 136;
    /// Whether the port takes frames (1) or refuses them (0).
    pub const UP: usize = 144;
    pub const LEN: usize = 192;
}

/// Record header: frame length (u32), then padding to 8.
const REC_HDR: usize = 8;
/// A record length that means "continue at the start of the ring".
const WRAP: u32 = u32::MAX;

/// Bytes of the record of a frame of `len` bytes: its header and the frame padded to 8.
#[inline(always)]
pub(crate) const fn record_step(len: usize) -> usize {
    REC_HDR + len.next_multiple_of(8)
}

/// Bytes of a ring region holding `data` bytes of records.
pub(crate) const fn region_len(data: usize) -> usize {
    hdr::LEN + data
}

/// A frame ring in a region of memory.
///
/// Invariant: `[region + off, region + off + region_len(cap))` lies inside `region`, is 8-byte
/// aligned and holds an initialised header; only this protocol touches it.
///
/// The header's counters and the records may be written by another process at any time (a
/// cable's peer): every index read from them is checked before use (8-aligned, at most `cap`
/// bytes apart, records inside what was published), so a bogus one costs frames, never a
/// store or a read outside the ring, or an unbounded loop.
#[derive(Clone)]
pub(crate) struct FrameRing {
    /// Keeps the memory alive.
    region: Arc<Region>,
    base: *mut u8,
    cap: usize,
    /// Records are copied out with atomic loads before the consumer sees them: the producer
    /// is another program, which may rewrite them while they are read.
    guarded: bool,
}

/// How long a producer waits for the lock before it gives up on the batch (refusing its
/// frames): a peer that holds it longer is dead or hostile.
const LOCK_DEADLINE: std::time::Duration = std::time::Duration::from_millis(200);

/// Whether `head` and `tail` (free-running byte counters read from the header) can be a ring
/// of `cap` bytes' positions: 8-aligned, and no more than `cap` apart.
fn positions_ok(head: u64, tail: u64, cap: usize) -> bool {
    head % 8 == 0 && tail % 8 == 0 && head.wrapping_sub(tail) <= cap as u64
}

// SAFETY: the ring is shared memory accessed through atomics (header) and a single-producer
// (under the lock) / single-consumer protocol (records); the region is kept alive by the Arc.
unsafe impl Send for FrameRing {}
// SAFETY: see `Send`.
unsafe impl Sync for FrameRing {}

impl std::fmt::Debug for FrameRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameRing")
            .field("cap", &self.cap)
            .field("pending", &self.pending())
            .finish()
    }
}

impl FrameRing {
    /// A new ring of `data` bytes (a multiple of 8) taking at most `max_frames` frames, on the
    /// heap.
    #[cfg(test)]
    pub(crate) fn on_heap(data: usize, max_frames: u32) -> FrameRing {
        let region = Arc::new(Region::heap(region_len(data)));
        FrameRing::init(region, 0, data, max_frames)
    }

    /// Lay out a fresh ring at `off` in `region`.
    ///
    /// # Panics
    /// If the ring does not fit the region or `off`/`data` are not multiples of 8.
    pub(crate) fn init(region: Arc<Region>, off: usize, data: usize, max_frames: u32) -> FrameRing {
        assert!(off % 8 == 0 && data % 8 == 0 && data >= 64);
        assert!(off + region_len(data) <= region.len());
        let base = region.as_ptr().wrapping_add(off);
        let ring = FrameRing {
            region,
            base,
            cap: data,
            guarded: false,
        };
        for at in (0..hdr::LEN).step_by(8) {
            ring.word(at).store(0, Ordering::Relaxed);
        }
        ring.half(hdr::MAGIC).store(MAGIC, Ordering::Relaxed);
        ring.half(hdr::VERSION).store(VERSION, Ordering::Relaxed);
        ring.word(hdr::CAP).store(data as u64, Ordering::Relaxed);
        ring.word(hdr::MAX_FRAMES)
            .store(u64::from(max_frames), Ordering::Relaxed);
        ring.word(hdr::UP).store(1, Ordering::Release);
        ring
    }

    /// Use a ring another process (or another copy of this library) laid out at `off` in
    /// `region`; `None` if the header is not a ring of this version that fits.
    pub(crate) fn attach(region: Arc<Region>, off: usize) -> Option<FrameRing> {
        if off % 8 != 0 || off + hdr::LEN > region.len() {
            return None;
        }
        let base = region.as_ptr().wrapping_add(off);
        let mut ring = FrameRing {
            region,
            base,
            cap: 0,
            guarded: false,
        };
        if ring.half(hdr::MAGIC).load(Ordering::Acquire) != MAGIC
            || ring.half(hdr::VERSION).load(Ordering::Acquire) != VERSION
        {
            return None;
        }
        let cap = usize::try_from(ring.word(hdr::CAP).load(Ordering::Acquire)).ok()?;
        if cap % 8 != 0 || cap < 64 || off + region_len(cap) > ring.region.len() {
            return None;
        }
        ring.cap = cap;
        Some(ring)
    }

    /// This ring's records come from another program: copy them out atomically before
    /// handing them on (see [`FrameRing::consume`]).
    pub(crate) fn guard_reads(&mut self) {
        self.guarded = true;
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        debug_assert!(at % 8 == 0 && at < hdr::LEN);
        // SAFETY: `at` is a header offset, 8-aligned, inside the ring (type invariant); the
        // header is only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.base.add(at).cast()) }
    }

    fn half(&self, at: usize) -> &AtomicU32 {
        debug_assert!(at % 4 == 0 && at < hdr::LEN);
        // SAFETY: as in `word`, 4-aligned.
        unsafe { AtomicU32::from_ptr(self.base.add(at).cast()) }
    }

    fn data(&self) -> *mut u8 {
        self.base.wrapping_add(hdr::LEN)
    }

    /// Frames waiting for the consumer.
    pub(crate) fn pending(&self) -> u64 {
        let pushed = self.word(hdr::PUSHED).load(Ordering::Acquire);
        pushed.wrapping_sub(self.word(hdr::POPPED).load(Ordering::Relaxed))
    }

    /// Frames refused so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.word(hdr::DROPPED).load(Ordering::Relaxed)
    }

    /// Whether the ring takes frames.
    pub(crate) fn up(&self) -> bool {
        self.word(hdr::UP).load(Ordering::Acquire) != 0
    }

    /// Take (or refuse) frames from now on.
    pub(crate) fn set_up(&self, up: bool) {
        self.word(hdr::UP).store(u64::from(up), Ordering::Release);
    }

    /// Zero the refused-frames count.
    pub(crate) fn reset_dropped(&self) {
        // Under the lock, or a producer's count would overwrite the reset.
        self.producer().dropped = 0;
    }

    /// Take the producer lock (spinning, then yielding, while another producer holds it, for
    /// at most [`LOCK_DEADLINE`]). A producer that did not get the lock, or found the
    /// header's positions bogus, refuses every frame and writes nothing back.
    pub(crate) fn producer(&self) -> Producer {
        let lock = self.half(hdr::LOCK);
        let mut spins = 0u32;
        let mut since: Option<std::time::Instant> = None;
        let mut locked = true;
        while lock
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 128 {
                std::hint::spin_loop();
            } else {
                let t = *since.get_or_insert_with(std::time::Instant::now);
                if t.elapsed() >= LOCK_DEADLINE {
                    locked = false;
                    break;
                }
                std::thread::yield_now();
            }
        }
        let head = self.word(hdr::HEAD).load(Ordering::Relaxed);
        let tail = self.word(hdr::TAIL).load(Ordering::Acquire);
        Producer {
            ring: self.clone(),
            head,
            pushed: self.word(hdr::PUSHED).load(Ordering::Relaxed),
            dropped: self.word(hdr::DROPPED).load(Ordering::Relaxed),
            tail,
            popped: self.word(hdr::POPPED).load(Ordering::Acquire),
            up: self.up(),
            max_frames: self.word(hdr::MAX_FRAMES).load(Ordering::Relaxed),
            locked,
            valid: locked && positions_ok(head, tail, self.cap),
            pos: (head % self.cap as u64) as usize,
            max_frame: self.max_frame(),
        }
    }

    /// Break a lock a dead process left held. Only for whoever alone may produce into this
    /// ring (the side of a cable it just claimed).
    pub(crate) fn break_lock(&self) {
        self.half(hdr::LOCK).store(0, Ordering::Release);
    }

    /// Offer up to `budget` frames, oldest first, to `f`; a frame is consumed when `f` returns
    /// true, and the first it refuses (to be offered again later) ends the call. Returns the
    /// frames consumed. The caller must be the ring's only consumer.
    pub(crate) fn consume(&self, budget: usize, mut f: impl FnMut(&[u8]) -> bool) -> usize {
        let mut recs = self.records(budget);
        while let Some(frame) = recs.peek() {
            if !f(frame) {
                break;
            }
            recs.take();
        }
        recs.finish()
    }

    /// A cursor over up to `budget` pending frames, oldest first, for a consumer that holds
    /// state across frames (the receive delivery's runs); what it took is given back to the
    /// producers by [`Records::finish`]. The caller must be the ring's only consumer.
    #[inline(always)]
    pub(crate) fn records(&self, budget: usize) -> Records<'_> {
        let head = self.word(hdr::HEAD).load(Ordering::Acquire);
        let mut tail = self.word(hdr::TAIL).load(Ordering::Relaxed);
        if !positions_ok(head, tail, self.cap) {
            // A foreign writer broke the header: give up on everything published.
            tail = head;
        }
        Records {
            ring: self,
            head,
            tail,
            // The position in the data area follows the tail record by record: one division
            // per call, not one per record.
            pos: (tail % self.cap as u64) as usize,
            n: 0,
            budget,
            frame: (std::ptr::null(), 0),
            step: 0,
            scratch: Vec::new(),
        }
    }

    /// Discard everything pending (the consumer's side of a port reset); returns how many
    /// frames that was.
    pub(crate) fn clear(&self) -> u64 {
        self.consume(usize::MAX, |_| true) as u64
    }

    /// The record at `pos` in the data area (8-aligned, below `cap`: where a free-running
    /// tail lands, since every record's length is a multiple of 8), with `left` bytes
    /// published from it: where its frame lies in the data area and its length (`None` for a
    /// wrap marker), and its length in the ring; `None` if it is malformed or runs past what
    /// was published. On a guarded ring the frame is copied into `scratch` by atomic loads
    /// (the peer may be rewriting it), and is read there.
    #[inline(always)]
    #[allow(clippy::type_complexity)]
    fn record(
        &self,
        pos: usize,
        left: u64,
        scratch: &mut Vec<u8>,
    ) -> Option<(Option<(usize, usize)>, usize)> {
        debug_assert!(pos % 8 == 0 && pos + REC_HDR <= self.cap);
        // SAFETY: `pos + 8 <= cap`, 8-aligned, inside the data area; read atomically, as the
        // producer may be another program.
        let len =
            unsafe { AtomicU32::from_ptr(self.data().add(pos).cast()) }.load(Ordering::Relaxed);
        if len == WRAP {
            let step = self.cap - pos;
            return (step as u64 <= left).then_some((None, step));
        }
        let len = len as usize;
        // `pos + REC_HDR <= cap`, so this is `pos + REC_HDR + len > cap` without overflow.
        if len > self.cap - pos - REC_HDR {
            return None;
        }
        let step = record_step(len);
        if step as u64 > left {
            return None;
        }
        let from = pos + REC_HDR;
        if self.guarded {
            // Whole 8-byte words: records are 8-aligned and padded to 8, and `cap` is a
            // multiple of 8, so the padded record ends inside the ring.
            let words = len.div_ceil(8);
            scratch.clear();
            scratch.reserve(words * 8);
            for w in 0..words {
                // SAFETY: 8-aligned, inside the data area (`from + 8 * words <= cap`, see
                // above); atomic, so a concurrent write by the peer is no data race.
                let v = unsafe { AtomicU64::from_ptr(self.data().add(from + 8 * w).cast()) }
                    .load(Ordering::Relaxed);
                scratch.extend_from_slice(&v.to_ne_bytes());
            }
            scratch.truncate(len);
        }
        Some((Some((from, len)), step))
    }

    /// Largest frame the ring can ever hold.
    pub(crate) fn max_frame(&self) -> usize {
        self.cap / 2 - REC_HDR
    }
}

/// A consumer's pass over a ring's records ([`FrameRing::records`]).
///
/// Each record moves the tail on by 8 bytes at least and never past the head, which is at
/// most `cap` bytes ahead: at most `cap / 8` records a pass, whatever the header says.
pub(crate) struct Records<'r> {
    ring: &'r FrameRing,
    head: u64,
    tail: u64,
    pos: usize,
    /// Frames taken.
    n: usize,
    budget: usize,
    /// The frame [`Records::peek`] found and not yet taken: where it lies (in the data
    /// area, or `scratch` on a guarded ring) and its length; and its record's length, 0
    /// while there is none (a record is 8 bytes at least).
    frame: (*const u8, usize),
    step: usize,
    scratch: Vec<u8>,
}

impl Records<'_> {
    /// The next frame (the one found before, while it is not taken); `None` when the budget
    /// is spent or nothing more is published.
    #[inline(always)]
    pub(crate) fn peek(&mut self) -> Option<&[u8]> {
        if self.step == 0 && !self.advance() {
            return None;
        }
        let (at, len) = self.frame;
        // SAFETY: `record` checked that the frame lies inside the data area, where records
        // between tail and head belong to the consumer (a producer in this program wrote them
        // before publishing head), or `advance` pointed at the copy in `scratch`, which stays
        // as it is while the slice borrows `self`.
        Some(unsafe { std::slice::from_raw_parts(at, len) })
    }

    /// Offer up to `max` frames of a run to `f`, each `len` bytes long, while `f` takes them
    /// (returns true); returns how many it took. The first record that is not such a frame
    /// (another length, a wrap marker, past the end of the data area or of what was
    /// published), or that `f` refuses, ends the call, for [`Records::peek`] to find. The
    /// ring's positions stay in registers for the run. A frame [`Records::peek`] found and
    /// not taken is the first offered. Nothing on a guarded ring, whose frames are copied
    /// out one by one.
    #[inline(always)]
    pub(crate) fn take_run(
        &mut self,
        len: usize,
        max: usize,
        mut f: impl FnMut(&[u8]) -> bool,
    ) -> usize {
        let ring = self.ring;
        if ring.guarded {
            return 0;
        }
        // A frame found and not taken is the record at `pos` (the tail has not moved past
        // it): it is read again as the run's first.
        let (data, cap, step) = (ring.data(), ring.cap, record_step(len));
        let max = max.min(self.budget - self.n);
        let (mut pos, mut left) = (self.pos, self.head.wrapping_sub(self.tail));
        let mut took = 0;
        // The bounds (the data area's end, what is published, `max`) are worked out once per
        // stretch of records up to the end of the data area, not once per record.
        'run: loop {
            let k = ((cap - pos) / step)
                .min((left / step as u64) as usize)
                .min(max - took);
            if k == 0 {
                break;
            }
            for _ in 0..k {
                // SAFETY: `pos` is 8-aligned and `pos + step <= cap` (`k` records of `step`
                // bytes fit before the end), inside the data area; read atomically, as the
                // producer may be another program.
                let rec =
                    unsafe { AtomicU32::from_ptr(data.add(pos).cast()) }.load(Ordering::Relaxed);
                if rec as usize != len {
                    break 'run;
                }
                // SAFETY: the record of `len` bytes lies inside the data area (`pos + step <=
                // cap`), between tail and head (`k * step <= head - tail`), where records
                // belong to the consumer; the slice does not outlive this call.
                let frame = unsafe { std::slice::from_raw_parts(data.add(pos + REC_HDR), len) };
                if !f(frame) {
                    break 'run;
                }
                took += 1;
                pos += step;
            }
            left -= (k * step) as u64;
            if pos == cap {
                pos = 0;
            }
        }
        if took != 0 {
            self.step = 0;
        }
        self.n += took;
        self.tail = self.tail.wrapping_add((took * step) as u64);
        self.pos = pos;
        took
    }

    /// Find the record of the next frame.
    #[inline(always)]
    fn advance(&mut self) -> bool {
        let ring = self.ring;
        while self.n < self.budget && self.tail != self.head {
            match ring.record(
                self.pos,
                self.head.wrapping_sub(self.tail),
                &mut self.scratch,
            ) {
                None => {
                    // A corrupt record (a foreign writer): give up on everything published.
                    self.tail = self.head;
                    return false;
                }
                Some((None, step)) => self.move_on(step),
                Some((Some((from, len)), step)) => {
                    let at = if ring.guarded {
                        self.scratch.as_ptr()
                    } else {
                        ring.data().wrapping_add(from).cast_const()
                    };
                    self.frame = (at, len);
                    self.step = step;
                    return true;
                }
            }
        }
        false
    }

    /// Consume the frame [`Records::peek`] found.
    #[inline(always)]
    pub(crate) fn take(&mut self) {
        if self.step != 0 {
            self.n += 1;
            self.move_on(self.step);
            self.step = 0;
        }
    }

    #[inline(always)]
    fn move_on(&mut self, step: usize) {
        debug_assert!(step != 0);
        self.tail = self.tail.wrapping_add(step as u64);
        self.pos += step;
        if self.pos == self.ring.cap {
            self.pos = 0;
        }
    }

    /// Hand what was taken back to the producers; returns the frames taken. A frame found
    /// and not taken stays for the next pass.
    #[inline(always)]
    pub(crate) fn finish(self) -> usize {
        let r = self.ring;
        // The only consumer: a load and a store, no read-modify-write.
        let popped = r.word(hdr::POPPED).load(Ordering::Relaxed);
        r.word(hdr::POPPED)
            .store(popped.wrapping_add(self.n as u64), Ordering::Release);
        r.word(hdr::TAIL).store(self.tail, Ordering::Release);
        self.n
    }
}

/// The producer lock of a ring, held for a batch of frames; publishes them and unlocks when
/// dropped.
pub(crate) struct Producer {
    ring: FrameRing,
    head: u64,
    pushed: u64,
    dropped: u64,
    /// The consumer's position when the lock was taken (room only grows meanwhile).
    tail: u64,
    popped: u64,
    up: bool,
    max_frames: u64,
    /// The lock was taken (else nothing is written back).
    locked: bool,
    /// The lock was taken and the header's positions are sound: frames may be pushed.
    valid: bool,
    /// Where `head` lies in the data area (`head % cap`), followed record by record.
    pos: usize,
    /// The ring's [`FrameRing::max_frame`].
    max_frame: usize,
}

impl Producer {
    /// Append `frame`; false (and counted as dropped) when the port is down or the ring has no
    /// room for it.
    pub(crate) fn push(&mut self, frame: &[u8]) -> bool {
        let len = frame.len();
        let Some(at) = self.reserve(len) else {
            return false;
        };
        // SAFETY: `[at, at + len)` is the reserved record's frame, inside the data area and
        // the producer's while it holds the lock; `frame` is a distinct buffer.
        unsafe { std::ptr::copy_nonoverlapping(frame.as_ptr(), self.ring.data().add(at), len) };
        self.commit(len);
        true
    }

    /// [`Producer::push`] of the `len`-byte frame that is `spans` of `src` (byte offset,
    /// length) in order, each copied straight into the frame's record. A span outside `src`,
    /// or past `len` bytes, is not copied (the caller's spans lie inside and add up to `len`).
    #[inline]
    pub(crate) fn push_spans(&mut self, src: &[u8], spans: &[(u16, u16)], len: usize) -> bool {
        let Some(at) = self.reserve(len) else {
            return false;
        };
        let data = self.ring.data();
        let mut off = 0;
        for &(from, n) in spans {
            let (from, n) = (usize::from(from), usize::from(n));
            let Some(p) = src.get(from..from + n).filter(|_| n <= len - off) else {
                continue;
            };
            // SAFETY: `[at, at + len)` is the reserved record's frame, inside the data area
            // and the producer's while it holds the lock; `off + n <= len`; `src` is a
            // distinct buffer.
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), data.add(at + off), n) };
            off += n;
        }
        self.commit(len);
        true
    }

    /// Room for the record of a frame of `len` bytes at the head, its header written; where
    /// its frame goes in the data area. `None` (and counted as dropped) when the port is
    /// down or the ring has no room for it.
    #[inline(always)]
    fn reserve(&mut self, len: usize) -> Option<usize> {
        if !self.valid || !self.up || len > self.max_frame {
            self.dropped = self.dropped.wrapping_add(1);
            return None;
        }
        let cap = self.ring.cap;
        let need = record_step(len);
        let to_end = cap - self.pos;
        let waste = if to_end < need { to_end } else { 0 };
        let take = (waste + need) as u64;
        if self.full(take) {
            // Look again: the consumer may have made room since the lock was taken.
            self.tail = self.ring.word(hdr::TAIL).load(Ordering::Acquire);
            self.popped = self.ring.word(hdr::POPPED).load(Ordering::Acquire);
            // The consumer's tail, just read again, may be bogus.
            self.valid = positions_ok(self.head, self.tail, cap);
            if !self.valid || self.full(take) {
                self.dropped = self.dropped.wrapping_add(1);
                return None;
            }
        }
        let data = self.ring.data();
        if waste > 0 {
            // SAFETY: `pos + 4 <= cap` (records are 8-aligned, so to_end >= 8); the bytes from
            // head up to tail + cap are the producer's.
            unsafe { data.add(self.pos).cast::<u32>().write(WRAP) };
            self.head = self.head.wrapping_add(waste as u64);
            self.pos = 0;
        }
        // SAFETY: `pos + need <= cap` (no wrap needed, or wrapped to 0 with room checked); the
        // region between head and tail + cap is the producer's while it holds the lock.
        unsafe { data.add(self.pos).cast::<u32>().write(len as u32) };
        Some(self.pos + REC_HDR)
    }

    /// Publish, when the lock is let go, the record [`Producer::reserve`] made for `len` bytes.
    #[inline(always)]
    fn commit(&mut self, len: usize) {
        let need = record_step(len);
        self.head = self.head.wrapping_add(need as u64);
        self.pos += need;
        if self.pos == self.ring.cap {
            self.pos = 0;
        }
        self.pushed = self.pushed.wrapping_add(1);
    }

    /// How many more records of `need` bytes fit after the one just reserved, as the
    /// consumer's position last read shows, none of them past the ring's end.
    #[inline(always)]
    fn fit(&self, need: usize) -> u64 {
        let used = self.head.wrapping_add(need as u64).wrapping_sub(self.tail);
        let bytes = (self.ring.cap as u64).saturating_sub(used) / need as u64;
        let frames = self
            .max_frames
            .saturating_sub(self.pushed.wrapping_sub(self.popped).wrapping_add(1));
        bytes.min(frames)
    }

    /// Whether `take` more bytes, or one more frame, would overfill the ring as the consumer's
    /// position last read shows it.
    #[inline(always)]
    fn full(&self, take: u64) -> bool {
        self.head.wrapping_sub(self.tail).saturating_add(take) > self.ring.cap as u64
            || self.pushed.wrapping_sub(self.popped) >= self.max_frames
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        if !self.locked {
            // Not ours to write: the frames it refused go uncounted in the header.
            return;
        }
        let r = &self.ring;
        r.word(hdr::DROPPED).store(self.dropped, Ordering::Relaxed);
        if self.valid {
            r.word(hdr::HEAD).store(self.head, Ordering::Release);
            r.word(hdr::PUSHED).store(self.pushed, Ordering::Release);
        }
        r.half(hdr::LOCK).store(0, Ordering::Release);
    }
}

mod run;

#[cfg(test)]
mod tests;
