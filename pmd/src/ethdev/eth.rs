//! A small safe wrapper over `rte_eth_dev`: an op gets one [`Eth`], which holds the port's one
//! `&mut Port`, this process's device handle, and reaches the rest of the device (its queue
//! slots, link, queue states) through methods that never hand out a second reference to the
//! same data.
//!
//! What lives where: the [`Port`] (`dev_private`) and the queues (the `rx_queues`/`tx_queues`
//! slots) are plain data in DPDK shared memory, the same for every process; [`Proc`]
//! (`process_private`) is this process's own: its handle to the device. The port, each queue
//! and `rte_eth_dev_data` are separate allocations, so a `&mut Port` and a `&mut` queue never
//! overlap.

use std::ffi::{c_int, c_void};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};

use dpdk_sys as sys;

use super::queue::{RxSlot, TxSlot};
use super::{errno, Error};
use crate::hw::Device;
use crate::mbuf::Mbuf;
use crate::mem::{DmaBox, MemSource};
use crate::pmd_log;
use crate::port::Port;
use crate::rxq::RxQueue;
use crate::txq::TxQueue;
use parking_lot::RwLock;

pub(super) type TxQ = TxQueue<Mbuf>;
pub(super) type RxQ = RxQueue<Mbuf>;

/// What one process keeps for a port (`process_private`): its handles to the device.
pub(super) type Proc = crate::hw::Handles;

/// One op's view of a port.
pub(super) struct Eth<'a> {
    raw: NonNull<sys::rte_eth_dev>,
    pub port: &'a mut Port,
    /// This process's handle to the port's device.
    pub dev: &'a dyn Device,
    /// When the device runs in the polling lcore: what the burst glue runs it with.
    pub lcore: Option<&'a crate::hw::soft::Lcore>,
}

/// This process's handle to port `port_id`, for the data path's rare control needs.
///
/// # Safety
/// `port_id` must be a port of this driver that outlives the returned reference.
pub(super) unsafe fn proc_of<'a>(port_id: u16) -> Option<&'a Proc> {
    // SAFETY: rte_eth_devices is ethdev's per-process array of RTE_MAX_ETHPORTS devices; a port
    // of ours has process_private NULL or this process's Proc, which is only read.
    unsafe {
        // bindgen declares the array with no length: index by pointer.
        let dev = ptr::addr_of!(sys::rte_eth_devices)
            .cast::<sys::rte_eth_dev>()
            .add(usize::from(port_id));
        ((*dev).process_private as *const Proc).as_ref()
    }
}

/// Port `port_id`'s ethdev in this process.
///
/// # Safety
/// `port_id` is below `RTE_MAX_ETHPORTS`.
pub(super) unsafe fn dev_of(port_id: u16) -> *mut sys::rte_eth_dev {
    // SAFETY: in bounds of ethdev's per-process array (the caller's promise).
    unsafe {
        ptr::addr_of_mut!(sys::rte_eth_devices)
            .cast::<sys::rte_eth_dev>()
            .add(usize::from(port_id))
    }
}

/// Publishes the link state of `dev`. ethdev keeps `dev_link` as one 64-bit word that any
/// thread may read, and stores it with an atomic exchange; so do we.
///
/// # Safety
/// `dev` is a live port of this driver.
pub(super) unsafe fn publish_link(dev: *mut sys::rte_eth_dev, up: bool) {
    let word = link_word(up);
    // SAFETY: a live port has its data attached; `dev_link` is an 8-byte, 8-aligned word in
    // every supported release (a union with `val64` from 24.11), only ever accessed whole and
    // atomically by ethdev.
    unsafe {
        let link = ptr::addr_of_mut!((*(*dev).data).dev_link).cast::<u64>();
        AtomicU64::from_ptr(link).swap(word, Ordering::AcqRel);
    }
}

/// `rte_eth_link` as its 64-bit word: the speed in Mb/s in the low 32 bits, then the duplex,
/// autonegotiation and status bits (the same positions in every supported release).
fn link_word(up: bool) -> u64 {
    const _: () = assert!(std::mem::size_of::<sys::rte_eth_link>() == 8);
    if !up {
        return u64::from(sys::RTE_ETH_LINK_DOWN) << 34;
    }
    u64::from(crate::port::LINK_SPEED_MBPS)
        | u64::from(sys::RTE_ETH_LINK_FULL_DUPLEX) << 32
        | u64::from(sys::RTE_ETH_LINK_AUTONEG) << 33
        | u64::from(sys::RTE_ETH_LINK_UP) << 34
}

/// Held (shared) while the IPC thread answers a secondary about a port, and (exclusive) while
/// a port closes, so that a port's handles never go away under an answer.
static CLOSING: RwLock<()> = RwLock::new(());

/// Runs `f` with this process's handles to port `port_id`, if it is a port of this driver,
/// from a thread that is not running an op on it (the IPC thread).
///
/// # Safety
/// `port_id`'s ethdev, if it is ours, must be set up as probe leaves it.
pub(super) unsafe fn with_proc<T>(port_id: u16, f: impl FnOnce(&Proc) -> T) -> Option<T> {
    let _open = CLOSING.read();
    if u32::from(port_id) >= sys::RTE_MAX_ETHPORTS {
        return None;
    }
    // SAFETY: in bounds of ethdev's per-process array; only a port whose ops are ours has our
    // Proc in process_private, which closing (excluded above) alone frees.
    unsafe {
        let dev = ptr::addr_of!(sys::rte_eth_devices)
            .cast::<sys::rte_eth_dev>()
            .add(usize::from(port_id));
        if !ptr::eq((*dev).dev_ops, &*super::ops::OPS) {
            return None;
        }
        ((*dev).process_private as *const Proc).as_ref().map(f)
    }
}

/// Shared memory for what C keeps pointers to: any socket's, freed with `rte_free`.
const SHARED: MemSource = MemSource::Dpdk { socket: -1 };

/// Runs `op` on the port behind `dev` and turns its result into what DPDK expects: 0, or a
/// negative errno after one log line naming the port, `what` failed and why. A port already
/// closed (or not attached in this process) answers `-ENODEV`.
///
/// # Safety
/// `dev` must be a live ethdev of this driver (ethdev calls ops only on those), whose
/// `dev_private` is NULL or the `Port` written at probe, and `process_private` NULL or this
/// process's `Proc`; ethdev serialises control ops on a port, so nothing else holds a
/// reference to the port during the call.
pub(super) unsafe fn run(
    dev: *mut sys::rte_eth_dev,
    what: &str,
    op: impl FnOnce(&mut Eth<'_>) -> Result<(), Error>,
) -> c_int {
    // SAFETY: guaranteed by the caller.
    let Some(mut eth) = (unsafe { Eth::new(dev) }) else {
        return -libc::ENODEV;
    };
    match op(&mut eth) {
        Ok(()) => 0,
        Err(e) => {
            pmd_log!(ERR, "{}: {what}: {e}", eth.port.name);
            errno(&e)
        }
    }
}

/// As [`run`], for ops whose answer is a value (or a count) rather than a status.
///
/// # Safety
/// As for [`run`].
pub(super) unsafe fn query<T>(
    dev: *mut sys::rte_eth_dev,
    op: impl FnOnce(&mut Eth<'_>) -> T,
) -> Option<T> {
    // SAFETY: guaranteed by the caller.
    let mut eth = unsafe { Eth::new(dev) }?;
    Some(op(&mut eth))
}

/// Closes the port behind `dev` (see [`Eth::close`]); None if it was closed already.
///
/// # Safety
/// As for [`run`].
pub(super) unsafe fn close(dev: *mut sys::rte_eth_dev) -> Option<String> {
    // SAFETY: guaranteed by the caller.
    Some(unsafe { Eth::new(dev) }?.close())
}

impl<'a> Eth<'a> {
    /// # Safety
    /// As for [`run`].
    unsafe fn new(dev: *mut sys::rte_eth_dev) -> Option<Eth<'a>> {
        let raw = NonNull::new(dev)?;
        // SAFETY: a live ethdev has its data attached; dev_private is NULL or our Port, which
        // nothing else references during a control op (the caller's contract);
        // process_private is NULL or this process's Proc, which control ops only read.
        let (port, proc_) = unsafe {
            (
                ((*(*dev).data).dev_private as *mut Port).as_mut()?,
                ((*dev).process_private as *const Proc).as_ref()?,
            )
        };
        Some(Eth {
            raw,
            port,
            dev: proc_.dev.as_ref(),
            lcore: proc_.lcore.as_ref(),
        })
    }

    fn data(&self) -> *mut sys::rte_eth_dev_data {
        // SAFETY: a live ethdev has its data attached from allocation to release.
        unsafe { (*self.raw.as_ptr()).data }
    }

    pub fn port_id(&self) -> u16 {
        // SAFETY: a plain field read of the live port's data.
        unsafe { (*self.data()).port_id }
    }

    pub fn nb_rx_queues(&self) -> u16 {
        // SAFETY: as above.
        unsafe { (*self.data()).nb_rx_queues }
    }

    pub fn nb_tx_queues(&self) -> u16 {
        // SAFETY: as above.
        unsafe { (*self.data()).nb_tx_queues }
    }

    /// The MTU ethdev recorded from the application's configuration (0 before the first).
    pub fn mtu(&self) -> u16 {
        // SAFETY: as above.
        unsafe { (*self.data()).mtu }
    }

    /// Port-wide RX offloads the application configured.
    pub fn rx_offloads(&self) -> u64 {
        // SAFETY: as above.
        unsafe { (*self.data()).dev_conf.rxmode.offloads }
    }

    /// Port-wide TX offloads the application configured.
    pub fn tx_offloads(&self) -> u64 {
        // SAFETY: as above.
        unsafe { (*self.data()).dev_conf.txmode.offloads }
    }

    /// Fails an op that would change the port from a secondary process: the port, its queues
    /// and its device are the primary's.
    pub fn primary_only(&self) -> Result<(), Error> {
        if super::mp::secondary() {
            return Err(Error::Unsupported(
                "changing a port from a secondary process",
            ));
        }
        Ok(())
    }

    /// Publishes the link state (ethdev stores it atomically).
    pub fn set_link(&mut self, up: bool) {
        // SAFETY: live port.
        unsafe { publish_link(self.raw.as_ptr(), up) };
    }

    /// Whether the application asked for receive interrupts (`intr_conf.rxq`).
    pub fn intr_conf_rxq(&self) -> bool {
        // SAFETY: a plain field read of the live port's data.
        unsafe { (*self.data()).dev_conf.intr_conf.rxq() != 0 }
    }

    /// The port's interrupt handle in this process (NULL: the device has no events).
    pub fn intr_handle(&self) -> *mut sys::rte_intr_handle {
        // SAFETY: a plain field read.
        unsafe { (*self.raw.as_ptr()).intr_handle }
    }

    /// Marks every configured queue started or stopped.
    pub fn set_queue_states(&mut self, started: bool) {
        let state = if started {
            sys::RTE_ETH_QUEUE_STATE_STARTED
        } else {
            sys::RTE_ETH_QUEUE_STATE_STOPPED
        } as u8;
        let (rx, tx) = (
            usize::from(self.nb_rx_queues()),
            usize::from(self.nb_tx_queues()),
        );
        // SAFETY: live port; ethdev sizes the state arrays for the most queues a port can have,
        // and no reference into them is held elsewhere.
        unsafe {
            let d = &mut *self.data();
            d.rx_queue_state[..rx].fill(state);
            d.tx_queue_state[..tx].fill(state);
        }
    }

    /// Marks one queue (`tx`: a TX queue, else RX) started or stopped.
    pub fn set_queue_state(&mut self, tx: bool, qid: u16, started: bool) {
        let state = if started {
            sys::RTE_ETH_QUEUE_STATE_STARTED
        } else {
            sys::RTE_ETH_QUEUE_STATE_STOPPED
        } as u8;
        // SAFETY: live port; qid is a configured queue, inside ethdev's state arrays.
        unsafe {
            let d = &mut *self.data();
            if tx {
                d.tx_queue_state[usize::from(qid)] = state;
            } else {
                d.rx_queue_state[usize::from(qid)] = state;
            }
        }
    }

    fn tx_slots(&self) -> *mut *mut c_void {
        // SAFETY: a plain field read.
        unsafe { (*self.data()).tx_queues }
    }

    fn rx_slots(&self) -> *mut *mut c_void {
        // SAFETY: a plain field read.
        unsafe { (*self.data()).rx_queues }
    }

    /// TX queue `i` (below `nb_tx_queues`), if it was set up.
    pub fn txq(&mut self, i: u16) -> Option<&mut TxSlot> {
        assert!(i < self.nb_tx_queues());
        // SAFETY: the array has nb_tx_queues entries, each NULL or a slot tx_queue_setup
        // leaked; a slot is a separate allocation from the port, and `&mut self` keeps this
        // the only reference handed out.
        unsafe { (*self.tx_slots().add(usize::from(i)) as *mut TxSlot).as_mut() }
    }

    /// RX queue `i` (below `nb_rx_queues`), if it was set up.
    pub fn rxq(&mut self, i: u16) -> Option<&mut RxSlot> {
        assert!(i < self.nb_rx_queues());
        // SAFETY: as for txq.
        unsafe { (*self.rx_slots().add(usize::from(i)) as *mut RxSlot).as_mut() }
    }

    /// Calls `f` with each TX queue that is set up, in order.
    pub fn for_each_txq(&mut self, mut f: impl FnMut(u16, &mut TxQ)) {
        for i in 0..self.nb_tx_queues() {
            if let Some(s) = self.txq(i) {
                f(i, &mut s.q);
            }
        }
    }

    /// Calls `f` with each RX queue that is set up, in order.
    pub fn for_each_rxq(&mut self, mut f: impl FnMut(u16, &mut RxQ)) {
        for i in 0..self.nb_rx_queues() {
            if let Some(s) = self.rxq(i) {
                f(i, &mut s.q);
            }
        }
    }

    /// Puts a new TX queue, in shared memory, in slot `i`, which ethdev emptied (by
    /// releasing) before setup.
    pub fn install_txq(&mut self, i: u16, slot: TxSlot) -> Result<(), Error> {
        assert!(i < self.nb_tx_queues());
        let p = DmaBox::new(slot, SHARED)
            .ok_or_else(|| Error::NoMemory(format!("TX queue {i}: no shared memory")))?
            .into_raw();
        // SAFETY: in bounds; the slot holds NULL (ethdev released the old queue first).
        unsafe { *self.tx_slots().add(usize::from(i)) = p.as_ptr().cast() };
        Ok(())
    }

    /// Puts a new RX queue in slot `i` (as [`Eth::install_txq`]).
    pub fn install_rxq(&mut self, i: u16, slot: RxSlot) -> Result<(), Error> {
        assert!(i < self.nb_rx_queues());
        let p = DmaBox::new(slot, SHARED)
            .ok_or_else(|| Error::NoMemory(format!("RX queue {i}: no shared memory")))?
            .into_raw();
        // SAFETY: as above.
        unsafe { *self.rx_slots().add(usize::from(i)) = p.as_ptr().cast() };
        Ok(())
    }

    /// Empties TX slot `i`, handing over its queue.
    pub fn take_txq(&mut self, i: u16) -> Option<TxSlot> {
        // SAFETY: the port's TX array of nb_tx_queues slots, filled by install_txq.
        unsafe { take(self.tx_slots(), i, self.nb_tx_queues()) }
    }

    /// Empties RX slot `i`, handing over its queue.
    pub fn take_rxq(&mut self, i: u16) -> Option<RxSlot> {
        // SAFETY: the port's RX array of nb_rx_queues slots, filled by install_rxq.
        unsafe { take(self.rx_slots(), i, self.nb_rx_queues()) }
    }

    /// Ends the port: every queue destroyed, the device stopped, then the port and this
    /// process's handle dropped and their memory freed. The NULLs left behind tell a second
    /// close (and ethdev's release, which frees `dev_private` itself) that nothing is left.
    /// Returns the port's name.
    pub fn close(mut self) -> String {
        let _closing = CLOSING.write();
        if super::mp::secondary() {
            // The port and its queues are the primary's; this process only lets go of its
            // handles (telling the primary it left).
            self.dev.secondary_attached(false);
            let name = self.port.name.to_string();
            // SAFETY: process_private is this process's Box<Proc>, referenced only by `self`,
            // which is gone after this; the slot is cleared.
            unsafe {
                let raw = self.raw.as_ptr();
                drop(Box::from_raw((*raw).process_private as *mut Proc));
                (*raw).process_private = ptr::null_mut();
            }
            return name;
        }
        let dev = self.dev;
        super::flow::port_closed(self.port_id());
        for i in 0..self.nb_rx_queues() {
            if let Some(s) = self.take_rxq(i) {
                s.q.destroy(dev);
            }
        }
        for i in 0..self.nb_tx_queues() {
            if let Some(s) = self.take_txq(i) {
                s.q.destroy(dev);
            }
        }
        self.port.stop(dev);
        let name = self.port.name.to_string();
        let (raw, data) = (self.raw.as_ptr(), self.data());
        let private = NonNull::from(&mut *self.port);
        // SAFETY: dev_private holds the Port that probe put in a DmaBox of shared memory, and
        // process_private the Box<Proc> of this process; `self` held their only references and
        // is gone after this, so each is dropped and freed exactly once, and the slots cleared.
        unsafe {
            drop(DmaBox::from_raw(private, SHARED));
            (*data).dev_private = ptr::null_mut();
            drop(Box::from_raw((*raw).process_private as *mut Proc));
            (*raw).process_private = ptr::null_mut();
        }
        name
    }
}

/// Empties slot `i` of a queue array of `n` entries.
///
/// # Safety
/// `slots` is a live port's queue array of `n` entries, each NULL or a shared-memory `DmaBox<S>`
/// given up by the matching install.
unsafe fn take<S>(slots: *mut *mut c_void, i: u16, n: u16) -> Option<S> {
    assert!(i < n);
    // SAFETY: in bounds (the caller's array); the slot is emptied here, so the queue is taken
    // once.
    unsafe {
        let slot = slots.add(usize::from(i));
        let q = NonNull::new(*slot as *mut S)?;
        *slot = ptr::null_mut();
        Some(DmaBox::from_raw(q, SHARED).into_inner())
    }
}
