//! Resource tables the firmware would keep: memory regions, CQ and QP numbers, and the device
//! pages (UAR and BlueFlame) handed to send queues.

use mlx4_prm::{INVALID_LKEY, SEND_DOORBELL_OFFSET, UAR_PAGE_SIZE};

use crate::bar::Bar;
use crate::dma::HostMem;
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

/// The UAR pages (one per send queue) and BlueFlame registers of the device memory, handed out
/// and taken back.
#[derive(Debug)]
pub(crate) struct Pages {
    pub(crate) bar: Bar,
    free_uars: Vec<usize>,
    free_bfs: Vec<BfSlot>,
}

impl Pages {
    pub(crate) fn new(bar: Bar) -> Pages {
        let free_uars = (0..bar.uar_pages()).rev().collect();
        let free_bfs = (0..bar.bf_pages())
            .flat_map(|page| (0..bar.bf_regs_per_page()).map(move |reg| BfSlot { page, reg }))
            .rev()
            .collect();
        Pages {
            bar,
            free_uars,
            free_bfs,
        }
    }

    /// A zeroed UAR page: its index, a view of its send doorbell word, and its address.
    pub(crate) fn alloc_uar(&mut self) -> Result<(usize, HostMem, *mut u8), HcaError> {
        let i = self
            .free_uars
            .pop()
            .ok_or(HcaError::NoResources("UAR pages"))?;
        self.bar.clear(&self.bar.uar_view(i, 0, UAR_PAGE_SIZE));
        let db = self.bar.uar_view(i, SEND_DOORBELL_OFFSET, 4);
        Ok((i, db, self.bar.uar_ptr(i)))
    }

    pub(crate) fn free_uar(&mut self, i: usize) {
        self.free_uars.push(i);
    }

    /// A zeroed BlueFlame register, with views of its two halves and its address.
    pub(crate) fn alloc_bf(&mut self) -> Result<(BfSlot, [HostMem; 2], *mut u8), HcaError> {
        let slot = self
            .free_bfs
            .pop()
            .ok_or(HcaError::NoResources("BlueFlame registers"))?;
        let (halves, reg) = self.bar.bf_reg(slot.page, slot.reg);
        for h in &halves {
            self.bar.clear(h);
        }
        Ok((slot, halves, reg))
    }

    pub(crate) fn free_bf(&mut self, slot: BfSlot) {
        self.free_bfs.push(slot);
    }
}
