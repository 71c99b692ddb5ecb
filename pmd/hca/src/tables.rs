//! Resource tables the firmware would keep: memory regions, CQ and QP numbers, and the device
//! pages (UAR and BlueFlame) handed to send queues.

use mlx4_prm::{INVALID_LKEY, SEND_DOORBELL_OFFSET, UAR_PAGE_SIZE};

use crate::bar::Bar;
use crate::dma::HostMem;
use crate::error::HcaError;

/// First QPN handed out: real adapters reserve the low QPNs, and a zero QPN would make a
/// BlueFlame copy's first qword indistinguishable from an untouched register.
pub(crate) const QPN_BASE: u32 = 0x40;
/// First CQN handed out.
pub(crate) const CQN_BASE: u32 = 0x80;
/// Memory regions one adapter can hold (the lkey keeps the slot in its upper 24 bits).
const MAX_MRS: usize = 0xfffe;

#[derive(Debug)]
struct Mr {
    lkey: u32,
    mem: HostMem,
}

/// Registered memory, looked up by lkey. The low byte of an lkey is a generation, so a stale
/// lkey of a recycled slot is refused.
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    mrs: Vec<Option<Mr>>,
    gen: u8,
    /// Deregistrations so far: what the device learnt about regions is void once it changes.
    epoch: u64,
}

impl MrTable {
    pub(crate) fn register(&mut self, mem: HostMem) -> Result<u32, HcaError> {
        let slot = match self.mrs.iter().position(Option::is_none) {
            Some(s) => s,
            None if self.mrs.len() < MAX_MRS => {
                self.mrs.push(None);
                self.mrs.len() - 1
            }
            None => return Err(HcaError::NoResources("memory regions")),
        };
        // Never generation 0, so slot 0 can never produce INVALID_LKEY (0x100).
        self.gen = self.gen.checked_add(1).unwrap_or(1);
        let lkey = ((slot as u32 + 1) << 8) | u32::from(self.gen);
        debug_assert_ne!(lkey, INVALID_LKEY);
        self.mrs[slot] = Some(Mr { lkey, mem });
        Ok(lkey)
    }

    pub(crate) fn deregister(&mut self, lkey: u32) -> Result<(), HcaError> {
        let slot = self
            .slot(lkey)
            .ok_or(HcaError::NotFound("memory region", lkey))?;
        self.mrs[slot] = None;
        self.epoch += 1;
        Ok(())
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    fn slot(&self, lkey: u32) -> Option<usize> {
        let slot = (lkey >> 8).checked_sub(1)? as usize;
        match self.mrs.get(slot)? {
            Some(mr) if mr.lkey == lkey => Some(slot),
            _ => None,
        }
    }

    /// Where `[addr, addr + len)` lies under `lkey`, as (region slot, offset in the region);
    /// `None` for an unknown lkey or a range outside its region (a protection error).
    pub(crate) fn resolve(&self, lkey: u32, addr: u64, len: usize) -> Option<(usize, usize)> {
        let slot = self.slot(lkey)?;
        let mem = &self.mrs[slot].as_ref()?.mem;
        let off = addr.checked_sub(mem.base() as u64)?;
        if off.checked_add(len as u64)? > mem.len() as u64 {
            return None;
        }
        Some((slot, off as usize))
    }

    /// The region `lkey` names; `None` for an unknown lkey (a protection error). The range
    /// within it is the caller's to check.
    #[inline(always)]
    pub(crate) fn region(&self, lkey: u32) -> Option<&HostMem> {
        let slot = (lkey >> 8).checked_sub(1)? as usize;
        let mr = self.mrs.get(slot)?.as_ref().filter(|mr| mr.lkey == lkey)?;
        Some(&mr.mem)
    }

    /// The memory of a slot [`MrTable::resolve`] returned (still registered: the table is not
    /// changed while a walk uses it).
    pub(crate) fn mem(&self, slot: usize) -> &HostMem {
        &self.mrs[slot]
            .as_ref()
            .expect("resolved slot is registered")
            .mem
    }
}

/// Numbers for queues or CQs: slots in a table, reused after a while. Slots can be held back
/// in aligned ranges (an RSS indirection table's QPNs), to be filled only by number.
#[derive(Debug)]
pub(crate) struct Slots<T> {
    items: Vec<Option<T>>,
    /// Per slot: inside a reserved range, so [`Slots::insert_with`] passes it by.
    held: Vec<bool>,
    max: usize,
    /// Where the next search starts, so a destroyed queue's number is not reused at once.
    cursor: usize,
}

impl<T> Slots<T> {
    pub(crate) fn new(max: usize) -> Self {
        Slots {
            items: Vec::new(),
            held: Vec::new(),
            max,
            cursor: 0,
        }
    }

    /// Reserve a free slot (not in a held range) and fill it with what `make` builds for it.
    pub(crate) fn insert_with(
        &mut self,
        what: &'static str,
        make: impl FnOnce(usize) -> Result<T, HcaError>,
    ) -> Result<usize, HcaError> {
        let n = self.items.len();
        let slot = match (0..n)
            .map(|k| (self.cursor + k) % n)
            .find(|&s| self.items[s].is_none() && !self.held[s])
        {
            Some(s) => s,
            None if n < self.max => {
                self.grow(n + 1);
                n
            }
            None => return Err(HcaError::NoResources(what)),
        };
        self.items[slot] = Some(make(slot)?);
        self.cursor = slot + 1;
        Ok(slot)
    }

    /// Fill `slot`, which must be free and held (inside a reserved range).
    pub(crate) fn insert_at(
        &mut self,
        slot: usize,
        make: impl FnOnce(usize) -> Result<T, HcaError>,
    ) -> Result<(), HcaError> {
        if !self.held.get(slot).copied().unwrap_or(false) || self.items[slot].is_some() {
            return Err(HcaError::InvalidArgument(format!(
                "slot {slot} is not a free number of a reserved range"
            )));
        }
        self.items[slot] = Some(make(slot)?);
        Ok(())
    }

    fn grow(&mut self, len: usize) {
        while self.items.len() < len {
            self.items.push(None);
            self.held.push(false);
        }
    }

    /// Hold back `count` consecutive free slots whose first satisfies `aligned`; returns it.
    pub(crate) fn reserve_range(
        &mut self,
        count: usize,
        aligned: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let free =
            |s: &Self, at: usize| at >= s.items.len() || (s.items[at].is_none() && !s.held[at]);
        let start = (0..self.max.checked_sub(count)? + 1)
            .filter(|&s| aligned(s))
            .find(|&s| (s..s + count).all(|k| free(self, k)))?;
        self.grow(start + count);
        for h in &mut self.held[start..start + count] {
            *h = true;
        }
        Some(start)
    }

    /// Give a reserved range back; `false` while one of its slots is in use.
    pub(crate) fn release_range(&mut self, start: usize, count: usize) -> bool {
        if self.items[start..start + count].iter().any(Option::is_some) {
            return false;
        }
        for h in &mut self.held[start..start + count] {
            *h = false;
        }
        true
    }

    pub(crate) fn get(&self, slot: usize) -> Option<&T> {
        self.items.get(slot)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, slot: usize) -> Option<&mut T> {
        self.items.get_mut(slot)?.as_mut()
    }

    pub(crate) fn remove(&mut self, slot: usize) -> Option<T> {
        self.items.get_mut(slot)?.take()
    }

    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }
}

/// Who uses a UAR page: the opener who allocated it explicitly ([`crate::Hca::alloc_uar`]),
/// and the send queues created on it.
#[derive(Debug, Default)]
struct UarUse {
    explicit: bool,
    sqs: u32,
    /// BlueFlame registers of the page's BlueFlame page still free.
    free_bfs: Vec<usize>,
}

/// The UAR pages and their BlueFlame pages (UAR page `i` owns BlueFlame page `i`, one page
/// after it in device memory), handed out and taken back.
#[derive(Debug)]
pub(crate) struct Pages {
    pub(crate) bar: Bar,
    free_uars: Vec<usize>,
    uses: Vec<Option<UarUse>>,
}

/// A UAR page in use: its index and send doorbell view.
#[derive(Clone)]
pub(crate) struct UarPage {
    pub(crate) index: usize,
    /// The send doorbell word (0x14).
    pub(crate) db: HostMem,
}

impl Pages {
    pub(crate) fn new(bar: Bar) -> Pages {
        let n = bar.uar_pages();
        Pages {
            free_uars: (0..n).rev().collect(),
            uses: (0..n).map(|_| None).collect(),
            bar,
        }
    }

    fn page(&self, i: usize) -> UarPage {
        UarPage {
            index: i,
            db: self.bar.uar_view(i, SEND_DOORBELL_OFFSET, 4),
        }
    }

    /// A zeroed UAR page (with its zeroed BlueFlame page), for the opener (`explicit`) or for
    /// one send queue of its own.
    pub(crate) fn alloc_uar(&mut self, explicit: bool) -> Result<UarPage, HcaError> {
        let i = self
            .free_uars
            .pop()
            .ok_or(HcaError::NoResources("UAR pages"))?;
        self.bar.clear(&self.bar.uar_view(i, 0, UAR_PAGE_SIZE));
        if self.bar.bf_pages() > 0 {
            for r in 0..self.bar.bf_regs_per_page() {
                for h in &self.bar.bf_reg(i, r).0 {
                    self.bar.clear(h);
                }
            }
        }
        self.uses[i] = Some(UarUse {
            explicit,
            sqs: u32::from(!explicit),
            free_bfs: (0..self.bar.bf_regs_per_page()).rev().collect(),
        });
        Ok(self.page(i))
    }

    /// UAR page `i` for one more send queue; it must be allocated.
    pub(crate) fn share_uar(&mut self, i: usize) -> Result<UarPage, HcaError> {
        match self.uses.get_mut(i) {
            Some(Some(u)) => {
                u.sqs += 1;
                Ok(self.page(i))
            }
            _ => Err(HcaError::NotFound("UAR page", i as u32)),
        }
    }

    /// A send queue on UAR page `i` is gone; the page is free once nobody uses it.
    pub(crate) fn drop_sq(&mut self, i: usize) {
        if let Some(Some(u)) = self.uses.get_mut(i) {
            u.sqs = u.sqs.saturating_sub(1);
            if u.sqs == 0 && !u.explicit {
                self.uses[i] = None;
                self.free_uars.push(i);
            }
        }
    }

    /// The opener gives UAR page `i` back (`Busy` while send queues are still on it).
    pub(crate) fn free_uar(&mut self, i: usize) -> Result<(), HcaError> {
        match self.uses.get_mut(i) {
            Some(Some(u)) if u.explicit => {
                if u.sqs > 0 {
                    return Err(HcaError::Busy(i as u32));
                }
                self.uses[i] = None;
                self.free_uars.push(i);
                Ok(())
            }
            _ => Err(HcaError::NotFound("UAR page", i as u32)),
        }
    }

    /// Whether UAR page `i` is allocated.
    pub(crate) fn in_use(&self, i: usize) -> bool {
        matches!(self.uses.get(i), Some(Some(_)))
    }

    /// The address of UAR page `i`'s BlueFlame page, if the device has BlueFlame.
    pub(crate) fn bf_page_ptr(&self, i: usize) -> Option<*mut u8> {
        (self.bar.bf_pages() > 0).then(|| self.bar.bf_reg(i, 0).1)
    }

    /// A free BlueFlame register of UAR page `i`'s BlueFlame page (zeroed when the page was
    /// allocated and when the register was last given back): its halves and address.
    pub(crate) fn alloc_bf(&mut self, i: usize) -> Option<(BfSlot, [HostMem; 2], *mut u8)> {
        if self.bar.bf_pages() == 0 {
            return None;
        }
        let reg = self.uses.get_mut(i)?.as_mut()?.free_bfs.pop()?;
        let (halves, ptr) = self.bar.bf_reg(i, reg);
        Some((BfSlot { page: i, reg }, halves, ptr))
    }

    pub(crate) fn free_bf(&mut self, slot: BfSlot) {
        let (halves, _) = self.bar.bf_reg(slot.page, slot.reg);
        for h in &halves {
            self.bar.clear(h);
        }
        if let Some(Some(u)) = self.uses.get_mut(slot.page) {
            u.free_bfs.push(slot.reg);
        }
    }
}

/// A BlueFlame register the pool handed out: page and register index in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BfSlot {
    pub(crate) page: usize,
    pub(crate) reg: usize,
}
