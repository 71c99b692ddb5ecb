//! The BlueFlame page of a verbs context, mapped the way libmlx4 maps it and handed out one
//! register per send queue.
//!
//! `mlx4dv` exposes no BlueFlame register (a `bf.buf_size` is an mlx5dv field, not mlx4dv's).
//! libmlx4 maps the context's UAR page at offset 0 of the command fd and, when the kernel
//! reported a BlueFlame register size, the BF page at offset `page_size`: the kernel
//! (`mlx4_ib_mmap`) maps that page write-combining where the platform allows, else uncached,
//! which is what the capability check's timing tells apart. We map the same page again
//! ourselves. libmlx4 uses the page's first register only inside `ibv_post_send`, which this
//! driver never calls, so every register is ours; as mlx4_en does, each send queue gets a
//! register of its own (a copy carries its QPN, so any register of the context's page rings
//! any of its QPs), and queues beyond the page's registers ring the doorbell.

use std::ffi::c_int;
use std::ptr::NonNull;

use parking_lot::Mutex;

use crate::hw::BfDesc;

/// The BlueFlame register size of ConnectX-3 (QUERY_DEV_CAP `log_bf_reg_size` 9, the kernel's
/// `bf_reg_size`): two halves of 256 bytes, mlx4_en's `MAX_BF`. libmlx4 learns it from the
/// kernel at context creation but hands it to nobody, so it is stated here; the self-test
/// proves a copy of this size executes before the path goes live.
pub const BF_REG_SIZE: usize = 512;

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// A mapped BF page and which of its registers are taken.
pub struct BfPage {
    base: NonNull<u8>,
    len: usize,
    taken: Mutex<u64>,
}

// SAFETY: the page is device memory shared by the queues it is handed to; the register table
// is behind a lock.
unsafe impl Send for BfPage {}
// SAFETY: as above.
unsafe impl Sync for BfPage {}

impl BfPage {
    /// Maps the BF page of the context whose command fd is `cmd_fd`.
    pub fn map(cmd_fd: c_int) -> Result<BfPage, String> {
        let len = page_size();
        // SAFETY: a shared write-only mapping of the verbs command fd at the offset libmlx4
        // uses for the BF page; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_WRITE,
                libc::MAP_SHARED,
                cmd_fd,
                len as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "mmap of the verbs command fd at offset {len} (libmlx4's BlueFlame page): {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(BfPage {
            base: NonNull::new(p.cast()).expect("mmap succeeded"),
            len,
            taken: Mutex::new(0),
        })
    }

    /// Registers in the page.
    pub fn registers(&self) -> usize {
        (self.len / BF_REG_SIZE).min(64)
    }

    /// A free register, with its index for [`BfPage::give_back`].
    pub fn take(&self) -> Option<(usize, BfDesc)> {
        let mut t = self.taken.lock();
        let i = (0..self.registers()).find(|i| *t & (1 << i) == 0)?;
        *t |= 1 << i;
        // SAFETY: register `i` lies inside the mapped page.
        let reg = unsafe { self.base.add(i * BF_REG_SIZE) };
        Some((
            i,
            BfDesc {
                reg,
                half_size: BF_REG_SIZE / 2,
            },
        ))
    }

    pub fn give_back(&self, i: usize) {
        *self.taken.lock() &= !(1 << i);
    }
}

impl Drop for BfPage {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`; every queue holding a register was destroyed.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_are_handed_out_once_and_come_back() {
        // A memfd stands in for the command fd: two pages, the second mapped.
        // SAFETY: plain memfd_create call; the result is checked.
        let fd = unsafe { libc::memfd_create(c"bf".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: sizing our own memfd.
        let rc = unsafe { libc::ftruncate(fd, 2 * page_size() as libc::off_t) };
        assert_eq!(rc, 0);
        let page = BfPage::map(fd).unwrap();
        let n = page.registers();
        assert_eq!(n, page_size() / 512);
        let regs: Vec<_> = (0..n).map(|_| page.take().unwrap()).collect();
        assert!(page.take().is_none(), "every register is taken");
        let base = regs[0].1.reg.as_ptr() as usize;
        for (k, (i, d)) in regs.iter().enumerate() {
            assert_eq!(*i, k);
            assert_eq!(d.reg.as_ptr() as usize, base + k * 512);
            assert_eq!(d.half_size, 256);
        }
        page.give_back(3);
        assert_eq!(page.take().unwrap().0, 3);
        drop(page);
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
        let e = BfPage::map(-1).err().unwrap();
        assert!(e.contains("offset"), "{e}");
    }
}
