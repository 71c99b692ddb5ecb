//! A scatter entry as the refill writes it: its head (byte count and lkey) and the region a
//! fresh buffer must lie in, built once per burst so that a frame's entry is its address.

use mlx4_prm::DataSeg;

use crate::mem::Mr;

/// Bytes of a scatter entry before its address: the byte count and the lkey.
pub(super) const ENTRY_HEAD: usize = 8;

/// The byte count and lkey of a scatter entry, as they lie in it.
#[inline(always)]
pub(super) fn entry_head(e: &[u8; mlx4_prm::DS_SIZE]) -> [u8; ENTRY_HEAD] {
    let mut h = [0u8; ENTRY_HEAD];
    h.copy_from_slice(&e[..ENTRY_HEAD]);
    h
}

/// The registered region the pool's buffers came from last, read once per burst: a buffer
/// inside it takes a subtraction and two compares, with no `Option` to test.
#[derive(Clone, Copy)]
pub(super) struct Region {
    start: usize,
    /// Bytes from `start` to the region's end.
    span: usize,
    pub(super) lkey: u32,
}

impl Region {
    /// `mr`, or a region that holds nothing when there is none yet (no span covers a
    /// buffer's room, which setup found to be at least a byte).
    #[inline(always)]
    pub(super) fn new(mr: Option<Mr>) -> Region {
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
    pub(super) fn covers(&self, addr: usize, room: u32) -> bool {
        // `room` first: a pool's buffers all have the same, so its test and `span - room`
        // leave the loop.
        let off = addr.wrapping_sub(self.start);
        room as usize <= self.span && off <= self.span - room as usize
    }
}

/// The scatter entry of a buffer of the queue's room inside the burst's region, but for its
/// address: built once per burst, so that a frame's refill is the address and one copy.
#[derive(Clone, Copy)]
pub(super) struct Posting {
    /// The region's start, and the bound below which a buffer's offset from it leaves the
    /// whole room inside (0 when no buffer fits).
    start: usize,
    bound: usize,
    room: u32,
    /// Byte count and lkey set, the address left to each frame.
    entry: [u8; mlx4_prm::DS_SIZE],
}

impl Posting {
    /// A posting no buffer passes: every frame takes [`Region::covers`].
    pub(super) const NONE: Posting = Posting {
        start: 0,
        bound: 0,
        room: 0,
        entry: [0; mlx4_prm::DS_SIZE],
    };

    #[inline(always)]
    pub(super) fn new(region: &Region, room: u32) -> Posting {
        let mut entry = [0u8; mlx4_prm::DS_SIZE];
        let mut d = DataSeg::new_unchecked(&mut entry[..]);
        d.set_byte_count(room);
        d.set_lkey(region.lkey);
        Posting {
            start: region.start,
            bound: region
                .span
                .checked_sub(room as usize)
                .map_or(0, |last| last.wrapping_add(1)),
            room,
            entry,
        }
    }

    /// The byte count and lkey every entry of the template holds.
    #[inline(always)]
    pub(super) fn head(&self) -> [u8; ENTRY_HEAD] {
        entry_head(&self.entry)
    }

    /// The entry for a buffer at `addr` of `room` bytes, if [`Region::covers`] holds it with
    /// the queue's room (the test [`Posting`] skips is the room's).
    #[inline(always)]
    pub(super) fn entry(&self, addr: usize, room: u32) -> Option<[u8; mlx4_prm::DS_SIZE]> {
        if room != self.room || addr.wrapping_sub(self.start) >= self.bound {
            return None;
        }
        let mut e = self.entry;
        DataSeg::new_unchecked(&mut e[..]).set_addr(addr as u64);
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_address_lies_after_its_head() {
        // The address-only refill rewrites the bytes after ENTRY_HEAD: the address, and only it.
        let mut e = [0u8; mlx4_prm::DS_SIZE];
        DataSeg::new_unchecked(&mut e[..]).set_addr(u64::MAX);
        assert_eq!(e[..ENTRY_HEAD], [0; ENTRY_HEAD]);
        assert_eq!(e[ENTRY_HEAD..], [0xff; mlx4_prm::DS_SIZE - ENTRY_HEAD]);
        let mut d = DataSeg::new_unchecked(&mut e[..]);
        d.set_lkey(0x1234_5678);
        d.set_byte_count(0x780);
        let head = entry_head(&e);
        let d = DataSeg::new_unchecked(&e[..]);
        assert_eq!(
            (d.lkey(), d.byte_count(), d.addr()),
            (0x1234_5678, 0x780, u64::MAX)
        );
        assert_eq!(head, [0, 0, 0x07, 0x80, 0x12, 0x34, 0x56, 0x78]);
    }

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
