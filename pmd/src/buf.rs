//! The containers queues keep buffers in, between handing them to the device and getting them
//! back: generic over the buffer, so that the TX and RX paths need nothing from [`crate::mbuf`].

use std::mem::MaybeUninit;

use crate::mem::{DmaArray, MemSource};

/// Buffers held until the device is done with them, in posting order: a ring of slots of
/// which exactly `[tail, head)` (free-running counters) hold buffers.
///
/// Plain data in `source` memory, so that the queue holding it can live in memory several
/// processes share.
pub struct BufRing<B: Copy> {
    slots: DmaArray<MaybeUninit<B>>,
    head: u32,
    tail: u32,
}

impl<B: Copy> BufRing<B> {
    /// A ring of `n` slots (a power of two) in `source` memory; None when that is exhausted.
    pub fn new(n: u32, source: MemSource) -> Option<BufRing<B>> {
        assert!(n.is_power_of_two());
        Some(BufRing {
            slots: DmaArray::new(n as usize, MaybeUninit::uninit(), source)?,
            head: 0,
            tail: 0,
        })
    }

    pub fn capacity(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Buffers held.
    #[inline(always)]
    pub fn len(&self) -> u32 {
        self.head.wrapping_sub(self.tail)
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    /// Counter the next buffer gets.
    #[inline(always)]
    pub fn head(&self) -> u32 {
        self.head
    }

    /// Holds `b`; false (and `b` not held) when every slot is taken.
    #[inline(always)]
    pub fn push(&mut self, b: B) -> bool {
        if self.len() as usize >= self.slots.len() {
            return false;
        }
        let i = self.head as usize & (self.slots.len() - 1);
        self.slots[i] = MaybeUninit::new(b);
        self.head = self.head.wrapping_add(1);
        true
    }

    /// A cursor that holds buffers from registers in a tight loop (written back when
    /// dropped).
    #[inline(always)]
    pub fn pusher(&mut self) -> Pusher<'_, B> {
        let cap = self.slots.len() as u32;
        Pusher {
            slots: self.slots.as_mut_ptr(),
            mask: cap - 1,
            head: self.head,
            end: self.tail.wrapping_add(cap),
            ring: self,
        }
    }

    /// Gives up the buffers before counter `end` (at most everything held): up to two runs,
    /// in order, to release in bulk.
    pub fn take_until(&mut self, end: u32) -> (&[B], &[B]) {
        let n = end.wrapping_sub(self.tail).min(self.len()) as usize;
        let size = self.slots.len();
        let first = self.tail as usize & (size - 1);
        let run = n.min(size - first);
        self.tail = self.tail.wrapping_add(n as u32);
        let (a, b) = (&self.slots[first..first + run], &self.slots[..n - run]);
        // SAFETY: the slots of [old tail, old tail + n) lie inside [tail, head), which pushes
        // initialised; `MaybeUninit<B>` has `B`'s layout.
        unsafe { (assume_init(a), assume_init(b)) }
    }

    /// Gives up everything held.
    pub fn take_all(&mut self) -> (&[B], &[B]) {
        self.take_until(self.head)
    }
}

/// See [`BufRing::pusher`].
pub struct Pusher<'r, B: Copy> {
    slots: *mut MaybeUninit<B>,
    mask: u32,
    head: u32,
    /// The counter `head` may not reach: every slot taken.
    end: u32,
    ring: &'r mut BufRing<B>,
}

impl<B: Copy> Pusher<'_, B> {
    /// As [`BufRing::push`].
    #[inline(always)]
    pub fn push(&mut self, b: B) -> bool {
        if self.head == self.end {
            return false;
        }
        // SAFETY: `head & mask` < capacity: a slot of the ring the pusher borrows, free
        // (between head and tail + capacity); writing a MaybeUninit needs nothing more.
        unsafe {
            self.slots
                .add((self.head & self.mask) as usize)
                .write(MaybeUninit::new(b))
        };
        self.head = self.head.wrapping_add(1);
        true
    }

    /// As [`Pusher::push`] without the test for a free slot, for a loop that counted them
    /// once for all its pushes.
    ///
    /// # Safety
    /// A slot is free: fewer buffers were pushed since the pusher was made than the ring had
    /// free slots then.
    #[inline(always)]
    pub unsafe fn push_unchecked(&mut self, b: B) {
        debug_assert!(!self.is_full());
        // SAFETY: as in `push`; the slot is free by the caller's contract.
        unsafe {
            self.slots
                .add((self.head & self.mask) as usize)
                .write(MaybeUninit::new(b))
        };
        self.head = self.head.wrapping_add(1);
    }

    /// Whether every slot is taken.
    #[inline(always)]
    pub fn is_full(&self) -> bool {
        self.head == self.end
    }
}

impl<B: Copy> Drop for Pusher<'_, B> {
    #[inline(always)]
    fn drop(&mut self) {
        self.ring.head = self.head;
    }
}

/// # Safety
/// Every entry of `s` must be initialised.
unsafe fn assume_init<B>(s: &[MaybeUninit<B>]) -> &[B] {
    // SAFETY: the caller's contract; same layout.
    unsafe { &*(s as *const [MaybeUninit<B>] as *const [B]) }
}

/// Up to `N` buffers gathered for one bulk release.
pub struct BufBatch<B: Copy, const N: usize> {
    slots: [MaybeUninit<B>; N],
    len: usize,
}

impl<B: Copy, const N: usize> Default for BufBatch<B, N> {
    fn default() -> Self {
        BufBatch {
            slots: [MaybeUninit::uninit(); N],
            len: 0,
        }
    }
}

impl<B: Copy, const N: usize> BufBatch<B, N> {
    /// Adds `b`; false (and `b` not added) when full.
    #[inline(always)]
    pub fn push(&mut self, b: B) -> bool {
        if self.len == N {
            return false;
        }
        self.slots[self.len] = MaybeUninit::new(b);
        self.len += 1;
        true
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffers gathered, and the batch emptied.
    pub fn take(&mut self) -> &[B] {
        let n = std::mem::take(&mut self.len);
        // SAFETY: the first `n` slots were initialised by push.
        unsafe { assume_init(&self.slots[..n]) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buf_ring_hands_back_what_it_holds_in_order() {
        let mut r: BufRing<u32> = BufRing::new(4, MemSource::Heap).unwrap();
        assert!(r.is_empty());
        for i in 0..4 {
            assert!(r.push(i));
        }
        assert!(!r.push(9), "full");
        assert_eq!(r.take_until(2), (&[0, 1][..], &[][..]));
        assert!(r.push(4) && r.push(5));
        assert_eq!(r.len(), 4);
        // Wraps: two runs.
        assert_eq!(r.take_until(r.head()), (&[2, 3][..], &[4, 5][..]));
        assert_eq!(r.take_all(), (&[][..], &[][..]));
        // Never past what it holds.
        assert!(r.push(6));
        assert_eq!(r.take_until(r.head().wrapping_add(10)), (&[6][..], &[][..]));
        // The pusher fills the same slots and stops at the same place.
        {
            let mut p = r.pusher();
            for i in 0..4 {
                assert!(p.push(10 + i));
            }
            assert!(p.is_full() && !p.push(99));
        }
        assert_eq!(r.len(), 4);
        let (a, b) = r.take_all();
        assert_eq!([a, b].concat(), [10, 11, 12, 13]);
    }

    #[test]
    fn buf_batch_fills_and_empties() {
        let mut b: BufBatch<u8, 3> = BufBatch::default();
        assert!(b.push(1) && b.push(2) && b.push(3));
        assert!(!b.push(4));
        assert_eq!(b.take(), &[1, 2, 3]);
        assert!(b.is_empty());
        assert!(b.push(7));
        assert_eq!(b.take(), &[7]);
    }
}
