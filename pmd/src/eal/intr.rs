//! An EAL interrupt handle of this process on one event fd, with a handler registered on it
//! ([`IntrHandle::watch`]), and the per-queue event fds of receive interrupts
//! ([`IntrHandle::set_rx_vectors`]). Dropping it unregisters the handler, waiting for a run
//! in progress, then frees the handle.

use std::ffi::{c_int, c_void};
use std::os::fd::RawFd;
use std::ptr::NonNull;

use dpdk_sys as sys;

/// What EAL calls, in its interrupt thread, when the fd is readable.
pub(crate) type Handler = unsafe extern "C" fn(arg: *mut c_void);

/// A process-private interrupt handle (type `EXT`: EAL watches the fd and calls the handler
/// in its interrupt thread without reading the fd), with `handler` registered on it.
pub(crate) struct IntrHandle {
    h: NonNull<sys::rte_intr_handle>,
    handler: Handler,
    arg: usize,
}

impl IntrHandle {
    /// Watches `fd`, calling `handler(arg)` whenever it is readable; an error says which step
    /// failed and EAL's answer.
    ///
    /// # Safety
    /// `handler(arg)` is sound to run in EAL's interrupt thread, beside any other thread, for
    /// as long as the handle lives (dropping it waits for a run in progress).
    pub unsafe fn watch(fd: RawFd, handler: Handler, arg: usize) -> Result<IntrHandle, String> {
        // SAFETY: allocation with no shared-memory flag (RTE_INTR_INSTANCE_F_PRIVATE is 0);
        // an fd is only a number to EAL until the handler is registered.
        let h = unsafe {
            let h = NonNull::new(sys::rte_intr_instance_alloc(0))
                .ok_or("no memory for an interrupt handle")?;
            sys::rte_intr_type_set(h.as_ptr(), sys::rte_intr_handle_type_RTE_INTR_HANDLE_EXT);
            sys::rte_intr_fd_set(h.as_ptr(), fd);
            h
        };
        // SAFETY: the handle made above; the handler may run with `arg` until drop
        // unregisters it (the caller's contract).
        let rc = unsafe {
            sys::rte_intr_callback_register(h.as_ptr(), Some(handler), arg as *mut c_void)
        };
        let me = IntrHandle { h, handler, arg };
        if rc != 0 {
            // Drop's unregister finds nothing registered, and frees the handle.
            return Err(format!("registering the handler: {rc}"));
        }
        Ok(me)
    }

    /// The handle, for ethdev's `intr_handle` (which must not outlive `self`).
    pub fn as_ptr(&self) -> *mut sys::rte_intr_handle {
        self.h.as_ptr()
    }

    /// Receive interrupts: queue `i`'s event fd is `fds[i]`, on vector
    /// `RTE_INTR_VEC_RXTX_OFFSET + i`.
    pub fn set_rx_vectors(&self, fds: &[RawFd]) -> Result<(), VectorError> {
        let n = c_int::try_from(fds.len()).map_err(|_| VectorError::Queue(fds.len()))?;
        let h = self.h.as_ptr();
        // SAFETY: this handle; EAL checks each index against the list it allocated (and the
        // event fds' array, RTE_MAX_RXTX_INTR_VEC_ID entries) and refuses what lies outside.
        unsafe {
            if sys::rte_intr_vec_list_alloc(h, std::ptr::null(), n) != 0 {
                return Err(VectorError::NoMemory);
            }
            for (i, &fd) in (0..n).zip(fds) {
                if sys::rte_intr_vec_list_index_set(
                    h,
                    i,
                    sys::RTE_INTR_VEC_RXTX_OFFSET as c_int + i,
                ) != 0
                    || sys::rte_intr_efds_index_set(h, i, fd) != 0
                {
                    return Err(VectorError::Queue(i as usize));
                }
            }
            sys::rte_intr_nb_efd_set(h, n);
        }
        Ok(())
    }
}

/// Why receive vectors could not be set.
#[derive(Debug)]
pub(crate) enum VectorError {
    /// No memory for the vector list.
    NoMemory,
    /// EAL has no vector or event fd entry for this queue.
    Queue(usize),
}

impl Drop for IntrHandle {
    fn drop(&mut self) {
        let h = self.h.as_ptr();
        // SAFETY: this handle, freed once, here; unregistering waits for a run of the handler
        // in progress, so none runs once the handle is gone. (Dropping it from inside its own
        // handler would wait forever: the handlers here never do.)
        unsafe {
            unregister_waiting(h, self.handler, self.arg);
            sys::rte_intr_vec_list_free(h);
            sys::rte_intr_instance_free(h);
        }
    }
}

/// How long an unregister that found the handler running sleeps before it asks again.
const UNREGISTER_RETRY: std::time::Duration = std::time::Duration::from_micros(100);

/// Unregister `handler(arg)` from `h`, waiting for a run in progress to end.
///
/// Not `rte_intr_callback_unregister_sync`, which asks again after a pause: each ask holds
/// EAL's interrupt lock for most of its length, and the interrupt thread needs that lock to
/// end the run. Where the two threads share a CPU (one core, or valgrind, which runs one
/// thread at a time) it rarely gets it, and close hung under callgrind with the interrupt
/// thread spinning on the lock. Sleeping between asks leaves the lock free.
///
/// # Safety
/// `h` is a live interrupt handle.
unsafe fn unregister_waiting(h: *mut sys::rte_intr_handle, handler: Handler, arg: usize) {
    loop {
        // SAFETY: `h` is live (the caller's contract); EAL answers -EAGAIN while the handler
        // runs, and removes nothing then.
        let rc = unsafe { sys::rte_intr_callback_unregister(h, Some(handler), arg as *mut c_void) };
        if rc != -libc::EAGAIN {
            return;
        }
        std::thread::sleep(UNREGISTER_RETRY);
    }
}
