//! Stamping freed TXBBs over a ring large enough for every unrolled loop of
//! `SqRing::stamp` (groups of 32, then 8, then single TXBBs): each run length from 0 to
//! past two groups of 32, from every start within a group, across the ring's end, stamps
//! exactly its TXBBs for their pass and touches nothing else.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use mlx4_prm::{owner_opcode, STAMP_DWORD, TXBB_SIZE};
use mlx4rs::hw::SqDesc;
use mlx4rs::ring::SqRing;

const CNT: u32 = 256;

#[test]
fn every_run_length_stamps_exactly_its_txbbs() {
    let layout = Layout::from_size_align(CNT as usize * TXBB_SIZE, 4096).unwrap();
    // SAFETY: the layout has a non-zero size.
    let mem = NonNull::new(unsafe { alloc_zeroed(layout) }).expect("allocation");
    let mut doorbell = 0u32;
    // SAFETY: `mem` holds CNT TXBBs, page-aligned, and outlives the ring (freed after it is
    // dropped); the doorbell word outlives it too; no BF register.
    let desc = unsafe { SqDesc::new(mem, CNT, NonNull::from(&mut doorbell), None, 0x48) };
    // SAFETY: as above; the only view of this memory.
    let ring = unsafe { SqRing::new(desc) };
    let first = |c: u32| {
        let off = ((c & (CNT - 1)) as usize) * TXBB_SIZE;
        // SAFETY: a TXBB's first dword inside the allocation.
        u32::from_be(unsafe { mem.as_ptr().add(off).cast::<u32>().read_volatile() })
    };
    let mark = |c: u32| 0x1234_5600 | (c & 0xff);
    for from in (CNT - 40..CNT + 40).step_by(3) {
        for len in 0..=70u32 {
            for c in 0..CNT {
                ring.publish(c, mark(c));
            }
            ring.stamp(from, from + len);
            for c in 0..CNT {
                // The counter of slot `c` within [from, from + len), if it is there.
                let k = (c.wrapping_sub(from) & (CNT - 1)) + from;
                let want = if k < from + len {
                    let pass_bit = if k & CNT != 0 { owner_opcode::OWNER } else { 0 };
                    STAMP_DWORD | pass_bit
                } else {
                    mark(c)
                };
                assert_eq!(first(c), want, "from {from} len {len} slot {c}");
            }
        }
    }
    // The view ends before its memory goes.
    let _ = ring.into_desc();
    // SAFETY: allocated with this layout above; the ring view is gone.
    unsafe { dealloc(mem.as_ptr(), layout) };
}
