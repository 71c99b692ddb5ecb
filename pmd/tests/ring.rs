//! The ring views (`mlx4rs::ring`) over heap memory, no device: the send ring's counters and
//! ownership parity, the poster's run to the ring's end and its wrap (with and without the
//! pad NOP), which WQEs it publishes when, stamping, the bounds every writer checks, and the
//! completion ring's owner tracking across its wrap and its consumer record.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;

use mlx4_prm::{cqe_owner, opcode, owner_opcode, Cqe, CQE_SIZE, STAMP_DWORD, TXBB_SIZE};
use mlx4rs::hw::{CqDesc, SqDesc};
use mlx4rs::ring::{CqRing, SqRing};

/// Page-aligned zeroed heap memory, freed on drop.
struct Mem {
    p: NonNull<u8>,
    layout: Layout,
}

impl Mem {
    fn new(len: usize) -> Mem {
        let layout = Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: the layout has a non-zero size.
        let p = NonNull::new(unsafe { alloc_zeroed(layout) }).expect("allocation");
        Mem { p, layout }
    }

    fn dword(&self, off: usize) -> u32 {
        assert!(off + 4 <= self.layout.size());
        // SAFETY: inside the allocation (asserted), 4-byte aligned by every caller's offset.
        u32::from_be(unsafe { self.p.as_ptr().add(off).cast::<u32>().read_volatile() })
    }

    fn set_byte(&self, off: usize, v: u8) {
        assert!(off < self.layout.size());
        // SAFETY: inside the allocation (asserted).
        unsafe { self.p.as_ptr().add(off).write_volatile(v) }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { dealloc(self.p.as_ptr(), self.layout) }
    }
}

const CNT: u32 = 16;

/// A send ring of `CNT` TXBBs over `mem`, and a doorbell word nobody reads.
fn sq(mem: &Mem, doorbell: &mut u32) -> SqRing {
    // SAFETY: `mem` holds CNT TXBBs, page-aligned, and outlives the ring in every test; the
    // doorbell is a 4-byte aligned word that outlives it too; no BF register.
    let desc = unsafe { SqDesc::new(mem.p, CNT, NonNull::from(doorbell), None, 0x48) };
    // SAFETY: as above; each test makes one view of its memory.
    unsafe { SqRing::new(desc) }
}

fn first_dword(mem: &Mem, c: u32) -> u32 {
    mem.dword(((c & (CNT - 1)) as usize) * TXBB_SIZE)
}

fn send_word(pass_odd: bool) -> u32 {
    (if pass_odd { owner_opcode::OWNER } else { 0 }) | u32::from(opcode::SEND)
}

#[test]
fn a_new_ring_is_invalid_for_pass_zero_and_parity_follows_the_pass() {
    let mem = Mem::new(CNT as usize * TXBB_SIZE);
    let mut db = 0;
    let ring = sq(&mem, &mut db);
    assert_eq!(ring.txbb_cnt(), CNT);
    for c in 0..CNT {
        assert_eq!(first_dword(&mem, c), u32::MAX, "TXBB {c}");
    }
    for c in [0, 1, CNT - 1, 2 * CNT, 2 * CNT + 5, u32::MAX - 2 * CNT + 1] {
        assert!(!ring.owner(c), "{c}");
        assert_eq!(ring.owner_word(c, opcode::SEND), send_word(false));
    }
    for c in [CNT, CNT + 1, 2 * CNT - 1, 3 * CNT + 7, u32::MAX] {
        assert!(ring.owner(c), "{c}");
        assert_eq!(
            ring.owner_word(c, opcode::NOP),
            owner_opcode::OWNER | u32::from(opcode::NOP)
        );
    }
}

#[test]
fn the_poster_publishes_each_wqe_when_the_next_is_taken_and_wraps_at_the_end() {
    let mem = Mem::new(CNT as usize * TXBB_SIZE);
    let mut db = 0;
    let mut ring = sq(&mem, &mut db);
    let sink = AtomicU32::new(0);
    // From counter 12 with room for 8: 4 TXBBs to the ring's end, then the next pass.
    let mut p = ring.poster(12, 20, &sink);
    assert!(p.take::<2>().is_some());
    assert_eq!(p.pos(), 14);
    assert!(p.take::<2>().is_some());
    assert!(p.take::<1>().is_none(), "the run ends at the ring's end");
    assert!(p.wrap(2), "room continues in the next pass");
    assert!(p.take::<2>().is_some());
    let posted = p.finish();
    assert_eq!(posted.end, 18);
    let last = posted.last.expect("a last WQE");
    assert_eq!((last.start, last.txbbs), (16, 2));
    assert_eq!(
        u32::from_be(last.send_be),
        send_word(true),
        "pass 1's owner bit"
    );
    // The two WQEs before the ring's end went out with pass 0's SEND word; the last one,
    // in slot 0, waits for the queue's decisions; the sink took the store before each run's
    // first WQE, the last one after the wrap.
    assert_eq!(first_dword(&mem, 12), send_word(false));
    assert_eq!(first_dword(&mem, 14), send_word(false));
    assert_eq!(
        first_dword(&mem, 16),
        u32::MAX,
        "the last WQE is not published"
    );
    assert_eq!(u32::from_be(sink.into_inner()), send_word(true));
    ring.publish(last.start, u32::from_be(last.send_be));
    assert_eq!(first_dword(&mem, 16), send_word(true));
}

#[test]
fn a_wqe_that_would_cross_the_end_pads_it_with_one_nop() {
    let mem = Mem::new(CNT as usize * TXBB_SIZE);
    let mut db = 0;
    let mut ring = sq(&mem, &mut db);
    let sink = AtomicU32::new(0);
    let mut p = ring.poster(13, 13 + 8, &sink);
    assert!(p.take::<2>().is_some());
    assert!(p.take::<2>().is_none(), "one TXBB left before the end");
    assert!(p.wrap(2));
    assert_eq!(p.pos(), 16);
    assert!(p.take::<2>().is_some());
    let posted = p.finish();
    assert_eq!(posted.end, 18);
    assert_eq!(first_dword(&mem, 13), send_word(false));
    let pad = first_dword(&mem, 15);
    assert_eq!(pad & owner_opcode::OWNER, 0, "the pad belongs to pass 0");
    assert_eq!(pad & owner_opcode::OPCODE_MASK, u32::from(opcode::NOP));
    // Its size: one TXBB of 16-byte units in byte 7 of the control segment.
    assert_eq!(ring.ctrl_head(15).ds(), 4);
}

#[test]
fn the_poster_stops_at_its_room_and_not_only_at_the_ring_end() {
    let mem = Mem::new(CNT as usize * TXBB_SIZE);
    let mut db = 0;
    let mut ring = sq(&mem, &mut db);
    let sink = AtomicU32::new(0);
    let mut p = ring.poster(2, 7, &sink);
    assert!(p.take::<2>().is_some());
    assert!(p.take::<2>().is_some());
    assert!(p.take::<2>().is_none(), "5 TXBBs of room");
    assert!(!p.wrap(2), "the room ends here, not the ring");
    assert!(p.take::<1>().is_some());
    assert!(p.take::<1>().is_none());
    assert!(p.take_dyn(1).is_none());
    assert_eq!(p.finish().end, 7);
    // A poster asked for more than a ring keeps less than a whole ring.
    let mut p = ring.poster(0, 100, &sink);
    for _ in 0..CNT - 1 {
        assert!(p.take::<1>().is_some());
    }
    assert!(p.take::<1>().is_none());
    assert_eq!(p.finish().end, CNT - 1);
}

#[test]
fn stamping_marks_each_freed_txbb_for_its_pass_and_nothing_else() {
    let mem = Mem::new(CNT as usize * TXBB_SIZE);
    let mut db = 0;
    let ring = sq(&mem, &mut db);
    for c in 0..CNT {
        ring.publish(c, 0x1234_5600 | c);
    }
    // From counter 10 of pass 0 across the end to counter 20 of pass 1.
    ring.stamp(10, 20);
    for c in 0..CNT {
        let want = match c {
            10..=15 => STAMP_DWORD,
            0..=3 => STAMP_DWORD | owner_opcode::OWNER,
            _ => 0x1234_5600 | c,
        };
        assert_eq!(first_dword(&mem, c), want, "slot {c}");
    }
    // A run of 8 and more takes the unrolled loop, and its rest: slots 4 to 14 of pass 3.
    ring.stamp(52, 52 + 11);
    for c in 4..=14 {
        assert_eq!(
            first_dword(&mem, c),
            STAMP_DWORD | owner_opcode::OWNER,
            "{c}"
        );
    }
    assert_eq!(
        first_dword(&mem, 15),
        STAMP_DWORD,
        "outside the run: pass 0's stamp"
    );
    ring.stamp(5, 5);
    assert_eq!(
        first_dword(&mem, 5),
        STAMP_DWORD | owner_opcode::OWNER,
        "empty"
    );
    // Only the first dword of a TXBB: the rest of the slot is untouched.
    assert_eq!(mem.dword(4 * TXBB_SIZE + 8), 0);
}

#[test]
#[should_panic(expected = "WQE wraps the ring")]
fn a_writer_never_crosses_the_ring_end() {
    let mem = Mem::new(CNT as usize * TXBB_SIZE);
    let mut db = 0;
    let mut ring = sq(&mem, &mut db);
    let _ = ring.wqe_mut(CNT - 1, 2);
}

#[test]
#[should_panic(expected = "WQE wraps the ring")]
fn a_fixed_writer_never_crosses_the_ring_end() {
    let mem = Mem::new(CNT as usize * TXBB_SIZE);
    let mut db = 0;
    let mut ring = sq(&mem, &mut db);
    let _ = ring.wqe_fixed::<2>(2 * CNT - 1);
}

#[test]
#[should_panic(expected = "a write outside its WQE")]
fn a_writer_stays_inside_its_wqe() {
    let mem = Mem::new(CNT as usize * TXBB_SIZE);
    let mut db = 0;
    let mut ring = sq(&mem, &mut db);
    let mut w = ring.wqe_mut(3, 1);
    w.put_bytes(60, &[1, 2, 3, 4]);
    assert_eq!(mem.dword(3 * TXBB_SIZE + 60), 0x0102_0304);
    w.put_bytes(61, &[1, 2, 3, 4]);
}

#[test]
#[should_panic(expected = "a write outside its WQE")]
fn a_writer_leaves_the_owner_and_size_words_alone() {
    let mem = Mem::new(CNT as usize * TXBB_SIZE);
    let mut db = 0;
    let mut ring = sq(&mem, &mut db);
    ring.wqe_mut(0, 1).put_be32(4, 1);
}

const CQES: u32 = 8;

fn cq(mem: &Mem, rec: &Mem, size: u32) -> CqRing {
    // SAFETY: `mem` holds CQES entries of `size` bytes, page-aligned; `rec` starts with a
    // 4-byte aligned word; both outlive the ring in the test.
    let desc = unsafe { CqDesc::new(mem.p, CQES, size, rec.p.cast(), 7) };
    // SAFETY: as above; each test makes one view of its memory.
    unsafe { CqRing::new(desc) }
}

/// Completes entry `n` (free-running) the way a device does: the bytes, then the owner byte
/// with the pass parity.
fn device_writes(mem: &Mem, size: u32, n: u32, tag: u8) {
    let base = ((n % CQES) * size) as usize + size as usize - CQE_SIZE;
    mem.set_byte(base, tag);
    let owner = if n & CQES != 0 { cqe_owner::OWNER } else { 0 };
    mem.set_byte(base + Cqe::<&[u8]>::OWNER_OFFSET, owner | tag & 0x1f);
}

#[test]
fn the_completion_ring_tracks_ownership_across_its_wrap() {
    for size in [32, 64] {
        let mem = Mem::new((CQES * size) as usize);
        // Hardware-owned for pass 0, as a device initialises a new CQ.
        for i in 0..CQES {
            mem.set_byte(
                (i * size) as usize + size as usize - CQE_SIZE + Cqe::<&[u8]>::OWNER_OFFSET,
                cqe_owner::OWNER,
            );
        }
        let rec = Mem::new(64);
        for i in 0..4 {
            rec.set_byte(i, 0xff);
        }
        let mut ring = cq(&mem, &rec, size);
        assert_eq!(rec.dword(0), 0, "a new view starts the record over");
        assert!(!ring.has_cqe());
        assert!(ring.poll().is_none());
        let mut next = 0u32;
        for round in 0..5u32 {
            let k = 1 + round % 3 + round;
            for i in 0..k {
                device_writes(&mem, size, next + i, (next + i) as u8);
            }
            assert_eq!(ring.ready(64), k as usize, "size {size} round {round}");
            assert_eq!(ring.ready(1), 1);
            for _ in 0..k {
                let c = ring.poll().expect("a CQE");
                assert_eq!(c.into_inner()[0], next as u8, "in order");
                next += 1;
            }
            assert!(
                ring.poll().is_none(),
                "the next pass's entry is not ours yet"
            );
            assert_eq!(ring.ci(), next);
            ring.update_ci();
            assert_eq!(rec.dword(0), next & 0x00ff_ffff);
        }
        assert!(next > 2 * CQES, "wrapped twice");
    }
}
