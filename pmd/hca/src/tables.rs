//! Resource tables the firmware would keep: memory regions, CQ and QP numbers, and the device
//! pages (UAR and BlueFlame) handed to send queues.

use mlx4_prm::INVALID_LKEY;

use crate::dma::{DevPage, HostMem};
use crate::HcaError;

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

    /// The memory of a slot [`MrTable::resolve`] returned (still registered: the table is not
    /// changed while a walk uses it).
    pub(crate) fn mem(&self, slot: usize) -> &HostMem {
        &self.mrs[slot]
            .as_ref()
            .expect("resolved slot is registered")
            .mem
    }
}

/// Numbers for queues or CQs: slots in a table, reused after a while.
#[derive(Debug)]
pub(crate) struct Slots<T> {
    items: Vec<Option<T>>,
    max: usize,
    /// Where the next search starts, so a destroyed queue's number is not reused at once.
    cursor: usize,
}

impl<T> Slots<T> {
    pub(crate) fn new(max: usize) -> Self {
        Slots {
            items: Vec::new(),
            max,
            cursor: 0,
        }
    }

    /// Reserve a free slot and fill it with what `make` builds for that slot.
    pub(crate) fn insert_with(
        &mut self,
        what: &'static str,
        make: impl FnOnce(usize) -> Result<T, HcaError>,
    ) -> Result<usize, HcaError> {
        let n = self.items.len();
        let slot = match (0..n)
            .map(|k| (self.cursor + k) % n)
            .find(|&s| self.items[s].is_none())
        {
            Some(s) => s,
            None if n < self.max => {
                self.items.push(None);
                n
            }
            None => return Err(HcaError::NoResources(what)),
        };
        self.items[slot] = Some(make(slot)?);
        self.cursor = slot + 1;
        Ok(slot)
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

    /// Take an item out to work on it next to the rest of the table; [`Slots::put_back`]
    /// returns it.
    pub(crate) fn take(&mut self, slot: usize) -> Option<T> {
        self.remove(slot)
    }

    pub(crate) fn put_back(&mut self, slot: usize, item: T) {
        self.items[slot] = Some(item);
    }

    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }
}

/// A BlueFlame register the pool handed out: page and register index in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BfSlot {
    pub(crate) page: usize,
    pub(crate) reg: usize,
}

/// UAR pages (one per send queue) and BlueFlame pages (`regs_per_page` registers each).
#[derive(Debug)]
pub(crate) struct Pages {
    uars: Vec<DevPage>,
    free_uars: Vec<usize>,
    bfs: Vec<DevPage>,
    free_bfs: Vec<BfSlot>,
    bf_reg_size: usize,
    bf_regs_per_page: usize,
}

impl Pages {
    pub(crate) fn new(bf_reg_size: u32, bf_regs_per_page: u32) -> Pages {
        Pages {
            uars: Vec::new(),
            free_uars: Vec::new(),
            bfs: Vec::new(),
            free_bfs: Vec::new(),
            bf_reg_size: bf_reg_size as usize,
            bf_regs_per_page: bf_regs_per_page as usize,
        }
    }

    /// A zeroed UAR page: its index and the page.
    pub(crate) fn alloc_uar(&mut self) -> (usize, &DevPage) {
        let i = self.free_uars.pop().unwrap_or_else(|| {
            self.uars.push(DevPage::new());
            self.uars.len() - 1
        });
        let page = &self.uars[i];
        page.clear();
        (i, page)
    }

    pub(crate) fn free_uar(&mut self, i: usize) {
        self.free_uars.push(i);
    }

    /// A zeroed BlueFlame register, with views of its two halves and its address.
    pub(crate) fn alloc_bf(&mut self) -> (BfSlot, [HostMem; 2], *mut u8) {
        let slot = self.free_bfs.pop().unwrap_or_else(|| {
            self.bfs.push(DevPage::new());
            let page = self.bfs.len() - 1;
            self.free_bfs.extend(
                (1..self.bf_regs_per_page)
                    .rev()
                    .map(|reg| BfSlot { page, reg }),
            );
            BfSlot { page, reg: 0 }
        });
        let page = &self.bfs[slot.page];
        let (size, half) = (self.bf_reg_size, self.bf_reg_size / 2);
        let start = slot.reg * size;
        let halves = [page.view(start, half), page.view(start + half, half)];
        halves[0].fill(0, half, 0);
        halves[1].fill(0, half, 0);
        (slot, halves, page.as_ptr().wrapping_add(start))
    }

    pub(crate) fn free_bf(&mut self, slot: BfSlot) {
        self.free_bfs.push(slot);
    }
}
