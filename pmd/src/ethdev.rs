//! The binding between DPDK's ethdev/vdev C interfaces and the driver.
//!
//! This is the one place that converts raw `rte_eth_dev`, `rte_vdev_device` and queue pointers
//! into Rust references, registers the driver with EAL, and maps `Result`s to negative errno.
//! Everything it calls is ordinary Rust in `port`, `txq` and `rxq`.

use std::ffi::{c_char, c_int, CStr};
use std::mem::size_of;
use std::ptr;
use std::sync::LazyLock;

use dpdk_sys as sys;

use crate::devargs::Devargs;
use crate::mbuf::{Mbuf, Pool};
use crate::mem::{DmaRange, MemSource};
use crate::pmd_log;
use crate::port::{self, Port};
use crate::rxq::{RxConfig, RxQueue};
use crate::txq::TxQueue;

type TxQ = TxQueue<Mbuf>;
type RxQ = RxQueue<Mbuf>;

/// What a `tx_queues` slot holds: the queue, and the port whose device recovers it.
struct TxSlot {
    q: TxQ,
    port_id: u16,
}

/// The negative errno DPDK expects for a device error.
fn errno(e: &crate::hw::HwError) -> c_int {
    use crate::hw::HwError;
    -match e {
        HwError::Invalid(_) => libc::EINVAL,
        HwError::NoMemory(_) => libc::ENOMEM,
        HwError::Device(_) => libc::EIO,
        HwError::Unsupported(_) => libc::ENOTSUP,
    }
}

/// Driver name as EAL matches it against `--vdev net_mlx4rs<N>`.
pub const DRIVER_NAME: &CStr = c"net_mlx4rs";

/// The vdev driver record. EAL links it into its driver list, so it must live for the whole
/// process and have a stable address.
static mut VDEV_DRIVER: sys::rte_vdev_driver = sys::rte_vdev_driver {
    next: sys::rte_vdev_driver__bindgen_ty_1 {
        tqe_next: ptr::null_mut(),
        tqe_prev: ptr::null_mut(),
    },
    driver: sys::rte_driver {
        next: sys::rte_driver__bindgen_ty_1 {
            tqe_next: ptr::null_mut(),
            tqe_prev: ptr::null_mut(),
        },
        name: DRIVER_NAME.as_ptr(),
        alias: ptr::null(),
    },
    probe: Some(vdev_probe),
    remove: Some(vdev_remove),
    dma_map: None,
    dma_unmap: None,
    drv_flags: 0,
};

/// Runs when the library is loaded (by `-d`, from EAL's plugin directory, or linked into an
/// application), which is always before EAL scans the vdev bus.
///
/// A process can load two copies of the library (one from EAL's driver directory, one by `-d`,
/// or one linked in): two entries named `net_mlx4rs` would make EAL probe with whichever it
/// met first while the other copy's state stayed half-alive. The first copy to load keeps the
/// name; later copies withdraw. EAL loads `-d` plugins before its driver directory, so the
/// explicit copy is the one that stays.
#[ctor::ctor]
fn register_driver() {
    crate::log::register();
    let me = ptr::addr_of_mut!(VDEV_DRIVER);
    // SAFETY: runs once per copy, at load time under the loader's lock, before EAL scans; the
    // list entries we read are drivers' static records that live as long as the process.
    unsafe {
        sys::rte_vdev_register(me);
        if let Some(first) = registered_before(me) {
            sys::rte_vdev_unregister(me);
            pmd_log!(
                WARNING,
                "driver already registered by {}; this copy ({}) stays unregistered",
                object_path(first.cast()),
                object_path(me.cast())
            );
        }
    }
}

/// An entry named like ours that precedes `me` on EAL's vdev driver list. EAL exports no
/// lookup by name, but the list is a BSD tail queue whose head and links share one layout,
/// so from our own (just appended) entry the walk back is `TAILQ_PREV`.
///
/// # Safety
/// `me` must be on the vdev driver list.
unsafe fn registered_before(me: *mut sys::rte_vdev_driver) -> Option<*mut sys::rte_vdev_driver> {
    type Link = sys::rte_vdev_driver__bindgen_ty_1;
    let mut cur = me;
    loop {
        // SAFETY: `tqe_prev` points at the previous link's first word (or the head's), and
        // the word after it leads to that link's predecessor; the head ends the walk with NULL.
        cur = unsafe { *(*((*cur).next.tqe_prev as *const Link)).tqe_prev };
        if cur.is_null() {
            return None;
        }
        // SAFETY: every registered driver has a NUL-terminated static name (or none).
        let same = unsafe {
            let name = (*cur).driver.name;
            !name.is_null() && CStr::from_ptr(name) == DRIVER_NAME
        };
        if same {
            return Some(cur);
        }
    }
}

/// The file of the loaded object that holds `addr`, for telling two copies apart in a log.
fn object_path(addr: *const std::ffi::c_void) -> String {
    // SAFETY: `Dl_info` is pointers only, valid all-zero; dladdr only reads the loader's
    // tables and fills `info`.
    let (found, info) = unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        (libc::dladdr(addr, &mut info), info)
    };
    if found == 0 || info.dli_fname.is_null() {
        return "?".into();
    }
    c_str(info.dli_fname).to_owned()
}

static OPS: LazyLock<sys::eth_dev_ops> = LazyLock::new(|| sys::eth_dev_ops {
    dev_configure: Some(dev_configure),
    dev_start: Some(dev_start),
    dev_stop: Some(dev_stop),
    dev_close: Some(dev_close),
    dev_infos_get: Some(dev_infos_get),
    link_update: Some(link_update),
    stats_get: Some(stats_get),
    stats_reset: Some(stats_reset),
    promiscuous_enable: Some(promiscuous_enable),
    promiscuous_disable: Some(promiscuous_disable),
    allmulticast_enable: Some(allmulticast_enable),
    allmulticast_disable: Some(allmulticast_disable),
    mac_addr_set: Some(mac_addr_set),
    mtu_set: Some(mtu_set),
    reta_update: Some(reta_update),
    reta_query: Some(reta_query),
    rss_hash_update: Some(rss_hash_update),
    rss_hash_conf_get: Some(rss_hash_conf_get),
    rxq_info_get: Some(rxq_info_get),
    txq_info_get: Some(txq_info_get),
    rx_queue_setup: Some(rx_queue_setup),
    rx_queue_release: Some(rx_queue_release),
    tx_queue_setup: Some(tx_queue_setup),
    tx_queue_release: Some(tx_queue_release),
    tx_done_cleanup: Some(tx_done_cleanup),
    xstats_get: Some(xstats_get),
    xstats_get_names: Some(xstats_get_names),
    xstats_reset: Some(xstats_reset),
    ..Default::default()
});

fn c_str<'a>(p: *const c_char) -> &'a str {
    if p.is_null() {
        return "";
    }
    // SAFETY: EAL hands us NUL-terminated strings that live as long as the device.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("")
}

/// # Safety
/// `dev` must be a live ethdev of this driver whose `dev_private` holds an initialised `Port`.
unsafe fn port_of<'a>(dev: *mut sys::rte_eth_dev) -> &'a mut Port {
    // SAFETY: guaranteed by the caller; ethdev serialises control ops on a port.
    unsafe { &mut *((*(*dev).data).dev_private as *mut Port) }
}

/// # Safety
/// `dev` must be a live ethdev.
unsafe fn data<'a>(dev: *mut sys::rte_eth_dev) -> &'a mut sys::rte_eth_dev_data {
    // SAFETY: every ethdev has its data attached from allocation to release.
    unsafe { &mut *(*dev).data }
}

unsafe extern "C" fn vdev_probe(vdev: *mut sys::rte_vdev_device) -> c_int {
    // SAFETY: EAL passes a live vdev device.
    let (name, args, socket) = unsafe {
        (
            c_str(sys::mlx4rs_vdev_name(vdev)).to_owned(),
            c_str(sys::mlx4rs_vdev_args(vdev)).to_owned(),
            sys::mlx4rs_vdev_numa_node(vdev),
        )
    };
    let devargs: Devargs = match args.parse() {
        Ok(d) => d,
        Err(e) => {
            pmd_log!(ERR, "{name}: {e}");
            return -libc::EINVAL;
        }
    };
    pmd_log!(INFO, "{name}: probing with devargs {args:?}");
    let mem = memseg_ranges();
    let port = match Port::open(&name, devargs, MemSource::Dpdk { socket }, &mem) {
        Ok(p) => p,
        Err(e) => {
            pmd_log!(ERR, "{name}: cannot open: {e}");
            return errno(&e);
        }
    };
    // SAFETY: the name outlives the call; on success ethdev returns a zeroed slot we own.
    unsafe { attach_port(vdev, &name, socket, port) }
}

/// Allocates the ethdev and moves `port` into DPDK memory as its private data.
///
/// # Safety
/// `vdev` must be the live device being probed.
unsafe fn attach_port(
    vdev: *mut sys::rte_vdev_device,
    name: &str,
    socket: c_int,
    port: Port,
) -> c_int {
    let cname = std::ffi::CString::new(name).expect("vdev names have no NUL");
    // SAFETY: plain ethdev call with a valid C string.
    let dev = unsafe { sys::rte_eth_dev_allocate(cname.as_ptr()) };
    if dev.is_null() {
        pmd_log!(
            ERR,
            "{name}: cannot allocate an ethdev (name taken or no free port id)"
        );
        return -libc::ENOMEM;
    }
    // SAFETY: `dev` is freshly allocated and ours; the memory we attach comes from rte_zmalloc,
    // because rte_eth_dev_release_port frees `dev_private` and `mac_addrs` with rte_free.
    unsafe {
        let d = data(dev);
        let private =
            sys::rte_zmalloc_socket(c"mlx4rs_port".as_ptr(), size_of::<Port>(), 64, socket)
                as *mut Port;
        let macs = sys::rte_zmalloc_socket(
            c"mlx4rs_mac".as_ptr(),
            size_of::<sys::rte_ether_addr>(),
            0,
            socket,
        ) as *mut sys::rte_ether_addr;
        if private.is_null() || macs.is_null() {
            sys::rte_free(private.cast());
            sys::rte_free(macs.cast());
            sys::rte_eth_dev_release_port(dev);
            pmd_log!(ERR, "{name}: out of DPDK memory");
            return -libc::ENOMEM;
        }
        (*macs).addr_bytes = port.mac;
        ptr::write(private, port);
        d.dev_private = private.cast();
        d.mac_addrs = macs;
        d.numa_node = socket;
        d.dev_flags |= sys::bits::RTE_ETH_DEV_AUTOFILL_QUEUE_XSTATS;
        (*dev).device = ptr::addr_of_mut!((*vdev).device);
        (*dev).dev_ops = &*OPS;
        (*dev).rx_pkt_burst = Some(rx_burst);
        (*dev).tx_pkt_burst = Some(tx_burst);
        sys::rte_eth_dev_probing_finish(dev);
        pmd_log!(
            INFO,
            "{name}: port {} ready, MAC {}",
            d.port_id,
            fmt_mac(&(*macs).addr_bytes)
        );
    }
    0
}

/// Every memseg list's virtual range: where mbufs can live. Registered once per port so the
/// data path never registers memory.
fn memseg_ranges() -> Vec<DmaRange> {
    unsafe extern "C" fn cb(msl: *const sys::rte_memseg_list, arg: *mut std::ffi::c_void) -> c_int {
        // SAFETY: EAL passes a live list and our Vec as `arg`.
        unsafe {
            let v = &mut *(arg as *mut Vec<DmaRange>);
            let base = (*msl).__bindgen_anon_1.base_va as usize;
            if base != 0 && (*msl).len > 0 {
                // A memseg list's address range is reserved until EAL cleans up, after
                // every port is closed.
                v.push(DmaRange::new(base, base + (*msl).len));
            }
        }
        0
    }
    let mut v: Vec<DmaRange> = Vec::new();
    // SAFETY: the callback only appends to `v`, which outlives the walk.
    unsafe { sys::rte_memseg_list_walk(Some(cb), (&mut v as *mut Vec<DmaRange>).cast()) };
    v
}

/// `tx_pkt_burst`.
unsafe extern "C" fn tx_burst(
    q: *mut std::ffi::c_void,
    pkts: *mut *mut sys::rte_mbuf,
    n: u16,
) -> u16 {
    if n == 0 {
        return 0;
    }
    // SAFETY: `q` is the queue tx_queue_setup stored, used by one lcore at a time (ethdev's
    // contract); `pkts` holds `n` valid mbuf pointers, and `Mbuf` is a transparent pointer.
    let (s, pkts) = unsafe {
        (
            &mut *(q as *mut TxSlot),
            std::slice::from_raw_parts(pkts as *const Mbuf, usize::from(n)),
        )
    };
    let sent = s.q.burst(pkts) as u16;
    if s.q.failed() {
        recover_txq(s);
    }
    sent
}

/// Recreates a TX queue an error completion stopped, with its port's device.
#[cold]
fn recover_txq(s: &mut TxSlot) {
    // SAFETY: a queue's port outlives it; its private data is the Port written at probe, and
    // the device is only read here.
    let p = unsafe {
        let d = (*ptr::addr_of_mut!(sys::rte_eth_devices[usize::from(s.port_id)])).data;
        &*((*d).dev_private as *const Port)
    };
    s.q.recover(p.dev.as_ref());
}

unsafe extern "C" fn tx_done_cleanup(q: *mut std::ffi::c_void, free_cnt: u32) -> c_int {
    // SAFETY: as for tx_burst.
    let s = unsafe { &mut *(q as *mut TxSlot) };
    let n = s.q.done_cleanup(free_cnt) as c_int;
    if s.q.failed() {
        recover_txq(s);
    }
    n
}

pub fn fmt_mac(m: &[u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

unsafe extern "C" fn vdev_remove(vdev: *mut sys::rte_vdev_device) -> c_int {
    // SAFETY: EAL passes a live vdev device.
    let name = unsafe { sys::mlx4rs_vdev_name(vdev) };
    // SAFETY: lookup by name; NULL when the port was already closed and released.
    let dev = unsafe { sys::rte_eth_dev_allocated(name) };
    if dev.is_null() {
        return 0;
    }
    // SAFETY: `dev` is live; closing runs our dev_close and releases the port.
    unsafe { sys::rte_eth_dev_close(data(dev).port_id) }
}

unsafe extern "C" fn dev_configure(dev: *mut sys::rte_eth_dev) -> c_int {
    // SAFETY: ethdev calls ops only on live ports of this driver.
    let (p, d) = unsafe { (port_of(dev), data(dev)) };
    if d.nb_rx_queues > port::MAX_QUEUES || d.nb_tx_queues > port::MAX_QUEUES {
        pmd_log!(
            ERR,
            "{}: {} RX / {} TX queues requested, at most {} each",
            p.name,
            d.nb_rx_queues,
            d.nb_tx_queues,
            port::MAX_QUEUES
        );
        return -libc::EINVAL;
    }
    p.reset_reta(d.nb_rx_queues);
    if d.mtu != 0 {
        p.rx.mtu = d.mtu;
    }
    0
}

unsafe extern "C" fn dev_start(dev: *mut sys::rte_eth_dev) -> c_int {
    // SAFETY: ethdev calls ops only on live ports of this driver.
    let (p, d) = unsafe { (port_of(dev), data(dev)) };
    if let Err(e) = p.start() {
        pmd_log!(ERR, "{}: start failed: {e}", p.name);
        return errno(&e);
    }
    // SAFETY: live port.
    let rc = unsafe { apply_rx(dev) };
    if rc != 0 {
        return rc;
    }
    set_queue_states(d, sys::RTE_ETH_QUEUE_STATE_STARTED);
    // SAFETY: live port.
    unsafe { set_link(dev, p.link_up()) };
    0
}

unsafe extern "C" fn dev_stop(dev: *mut sys::rte_eth_dev) -> c_int {
    // Let the device send what tx_burst already took, then stop it.
    // SAFETY: live port.
    unsafe {
        let d = port_of(dev).dev.as_ref();
        for_each_txq(dev, |i, q| {
            if !q.drain(d, std::time::Duration::from_secs(1)) {
                pmd_log!(
                    WARNING,
                    "{}: TX queue {i}: the device did not drain within 1 s",
                    port_of(dev).name
                );
            }
        })
    };
    // SAFETY: ethdev calls ops only on live ports of this driver.
    let (p, d) = unsafe { (port_of(dev), data(dev)) };
    p.stop();
    // With the device stopped, every buffer still in flight is reclaimed and each queue
    // starts afresh at the next start.
    // SAFETY: live port.
    unsafe {
        for_each_txq(dev, |i, q| {
            if let Err(e) = q.reset(p.dev.as_ref()) {
                pmd_log!(ERR, "{}: TX queue {i}: reset failed: {e}", p.name);
            }
        });
        for_each_rxq(dev, |i, q| {
            if let Err(e) = q.reset(p.dev.as_ref()) {
                pmd_log!(ERR, "{}: RX queue {i}: reset failed: {e}", p.name);
            }
        });
    };
    set_queue_states(d, sys::RTE_ETH_QUEUE_STATE_STOPPED);
    // SAFETY: live port.
    unsafe { set_link(dev, false) };
    0
}

unsafe extern "C" fn dev_close(dev: *mut sys::rte_eth_dev) -> c_int {
    // SAFETY: ethdev calls ops only on live ports of this driver.
    let d = unsafe { data(dev) };
    if d.dev_private.is_null() {
        return 0;
    }
    for q in 0..d.nb_rx_queues {
        // SAFETY: live port, queue index in range.
        unsafe { rx_queue_release(dev, q) };
    }
    for q in 0..d.nb_tx_queues {
        // SAFETY: live port, queue index in range.
        unsafe { tx_queue_release(dev, q) };
    }
    // SAFETY: dev_private holds the Port written at probe from rte_zmalloc memory; it is
    // dropped and freed exactly once here, and the NULL left behind tells a second close (and
    // ethdev's release, which rte_free()s it) that nothing is left.
    let name = unsafe {
        let private = d.dev_private as *mut Port;
        let name = std::mem::take(&mut (*private).name);
        ptr::drop_in_place(private);
        sys::rte_free(private.cast());
        d.dev_private = ptr::null_mut();
        name
    };
    pmd_log!(INFO, "{name}: closed");
    0
}

unsafe extern "C" fn dev_infos_get(
    _dev: *mut sys::rte_eth_dev,
    info: *mut sys::rte_eth_dev_info,
) -> c_int {
    // SAFETY: ethdev passes a live port and a zeroed info struct.
    let info = unsafe { &mut *info };
    info.max_rx_queues = port::MAX_QUEUES;
    info.max_tx_queues = port::MAX_QUEUES;
    info.max_mac_addrs = 1;
    info.min_rx_bufsize = 32;
    info.max_rx_pktlen = u32::from(port::MAX_MTU) + 18;
    info.min_mtu = port::MIN_MTU;
    info.max_mtu = port::MAX_MTU;
    info.speed_capa = sys::bits::RTE_ETH_LINK_SPEED_40G;
    let lim = sys::rte_eth_desc_lim {
        nb_max: port::MAX_DESC,
        nb_min: port::MIN_DESC,
        nb_align: 1,
        ..Default::default()
    };
    info.rx_desc_lim = lim;
    info.tx_desc_lim = lim;
    let conf = sys::rte_eth_dev_portconf {
        burst_size: port::DEFAULT_BURST,
        ring_size: port::DEFAULT_RING,
        nb_queues: 1,
    };
    info.default_rxportconf = conf;
    info.default_txportconf = conf;
    info.tx_offload_capa = TX_OFFLOAD_CAPA;
    info.tx_desc_lim.nb_seg_max = crate::wqe::MAX_GATHER_SEGS as u16;
    info.tx_desc_lim.nb_mtu_seg_max = crate::wqe::MAX_GATHER_SEGS as u16;
    info.tx_queue_offload_capa = 0;
    info.reta_size = port::RETA_SIZE as u16;
    info.hash_key_size = crate::hw::RSS_KEY_LEN as u8;
    info.flow_type_rss_offloads = port::RSS_HF_ALL;
    info.rx_offload_capa = RX_OFFLOAD_CAPA;
    info.rx_queue_offload_capa = 0;
    0
}

/// # Safety
/// `dev` must be a live port.
unsafe fn set_link(dev: *mut sys::rte_eth_dev, up: bool) -> c_int {
    let mut link = sys::rte_eth_link::default();
    if up {
        link.link_speed = port::LINK_SPEED_MBPS;
        link.set_link_duplex(sys::RTE_ETH_LINK_FULL_DUPLEX as u16);
        link.set_link_autoneg(sys::RTE_ETH_LINK_AUTONEG as u16);
        link.set_link_status(sys::RTE_ETH_LINK_UP as u16);
    } else {
        link.set_link_status(sys::RTE_ETH_LINK_DOWN as u16);
    }
    // SAFETY: live port; the glue only reads `link`.
    unsafe { sys::mlx4rs_linkstatus_set(dev, &link) }
}

unsafe extern "C" fn link_update(dev: *mut sys::rte_eth_dev, _wait: c_int) -> c_int {
    // SAFETY: ethdev calls ops only on live ports of this driver.
    let up = unsafe { port_of(dev) }.link_up();
    // SAFETY: live port.
    unsafe { set_link(dev, up) }
}

fn set_queue_states(d: &mut sys::rte_eth_dev_data, state: u32) {
    let (rx, tx) = (usize::from(d.nb_rx_queues), usize::from(d.nb_tx_queues));
    // ethdev sizes the fixed state arrays for the most queues a port can have.
    d.rx_queue_state[..rx].fill(state as u8);
    d.tx_queue_state[..tx].fill(state as u8);
}

/// The queue in slot `i` of an ethdev queue array, if one was set up.
///
/// # Safety
/// `slots` must be a live port's `rx_queues` or `tx_queues` array with more than `i` entries,
/// each NULL or a `Box<Q>` leaked by the matching setup op; control ops do not race the data
/// path on a queue.
unsafe fn queue<'a, Q>(slots: *mut *mut std::ffi::c_void, i: usize) -> Option<&'a mut Q> {
    // SAFETY: guaranteed by the caller.
    unsafe { (*slots.add(i) as *mut Q).as_mut() }
}

/// Hands the queue in slot `i` (if any) to `destroy` and empties the slot.
///
/// # Safety
/// As for [`queue`].
unsafe fn release_queue<Q>(slots: *mut *mut std::ffi::c_void, i: usize, destroy: impl FnOnce(Q)) {
    // SAFETY: guaranteed by the caller: the slot holds NULL or a leaked Box<Q>.
    unsafe {
        let slot = slots.add(i);
        let q = *slot as *mut Q;
        if !q.is_null() {
            *slot = ptr::null_mut();
            destroy(*Box::from_raw(q));
        }
    }
}

/// # Safety
/// `dev` must be a live port; the closure sees each configured TX queue.
unsafe fn for_each_txq(dev: *mut sys::rte_eth_dev, mut f: impl FnMut(usize, &mut TxQ)) {
    // SAFETY: live port.
    let d = unsafe { data(dev) };
    for i in 0..usize::from(d.nb_tx_queues) {
        // SAFETY: the array has nb_tx_queues entries of this driver's TX queues.
        if let Some(s) = unsafe { queue::<TxSlot>(d.tx_queues, i) } {
            f(i, &mut s.q);
        }
    }
}

/// # Safety
/// `dev` must be a live port; the closure sees each configured RX queue.
unsafe fn for_each_rxq(dev: *mut sys::rte_eth_dev, mut f: impl FnMut(usize, &mut RxQ)) {
    // SAFETY: live port.
    let d = unsafe { data(dev) };
    for i in 0..usize::from(d.nb_rx_queues) {
        // SAFETY: the array has nb_rx_queues entries of this driver's RX queues.
        if let Some(q) = unsafe { queue::<RxQ>(d.rx_queues, i) } {
            f(i, q);
        }
    }
}

unsafe extern "C" fn stats_get(dev: *mut sys::rte_eth_dev, st: *mut sys::rte_eth_stats) -> c_int {
    // SAFETY: ethdev passes a zeroed stats struct.
    let st = unsafe { &mut *st };
    let n = sys::RTE_ETHDEV_QUEUE_STAT_CNTRS as usize;
    // SAFETY: live port.
    unsafe {
        for_each_txq(dev, |i, q| {
            let s = q.stats();
            st.opackets += s.packets;
            st.obytes += s.bytes;
            st.oerrors += s.errors;
            if i < n {
                st.q_opackets[i] = s.packets;
                st.q_obytes[i] = s.bytes;
            }
        });
        for_each_rxq(dev, |i, q| {
            let s = q.stats();
            st.ipackets += s.packets;
            st.ibytes += s.bytes;
            st.ierrors += s.errors;
            st.rx_nombuf += s.nombuf;
            if i < n {
                st.q_ipackets[i] = s.packets;
                st.q_ibytes[i] = s.bytes;
                st.q_errors[i] = s.errors;
            }
        });
    }
    0
}

unsafe extern "C" fn stats_reset(dev: *mut sys::rte_eth_dev) -> c_int {
    // SAFETY: live port.
    unsafe {
        for_each_txq(dev, |_, q| q.reset_stats());
        for_each_rxq(dev, |_, q| q.reset_stats());
    }
    0
}

/// Pushes the port's receive settings to the device (filter, MTU, RSS and the redirection
/// table over the current RX queues).
///
/// # Safety
/// `dev` must be a live port.
unsafe fn apply_rx(dev: *mut sys::rte_eth_dev) -> c_int {
    let mut qpns = Vec::new();
    // SAFETY: live port.
    unsafe { for_each_rxq(dev, |_, q| qpns.push(q.qpn())) };
    // SAFETY: live port.
    let p = unsafe { port_of(dev) };
    match p.apply_rx(&qpns) {
        Ok(()) => 0,
        Err(e) => {
            pmd_log!(ERR, "{}: {e}", p.name);
            errno(&e)
        }
    }
}

/// Changes one receive setting and applies it.
///
/// # Safety
/// `dev` must be a live port.
unsafe fn update_rx(dev: *mut sys::rte_eth_dev, f: impl FnOnce(&mut port::RxState)) -> c_int {
    // SAFETY: live port.
    f(&mut unsafe { port_of(dev) }.rx);
    // SAFETY: live port.
    unsafe { apply_rx(dev) }
}

unsafe extern "C" fn promiscuous_enable(dev: *mut sys::rte_eth_dev) -> c_int {
    // SAFETY: live port (ethdev contract for all ops below).
    unsafe { update_rx(dev, |r| r.promisc = true) }
}

unsafe extern "C" fn promiscuous_disable(dev: *mut sys::rte_eth_dev) -> c_int {
    // SAFETY: live port.
    unsafe { update_rx(dev, |r| r.promisc = false) }
}

unsafe extern "C" fn allmulticast_enable(dev: *mut sys::rte_eth_dev) -> c_int {
    // SAFETY: live port.
    unsafe { update_rx(dev, |r| r.allmulti = true) }
}

unsafe extern "C" fn allmulticast_disable(dev: *mut sys::rte_eth_dev) -> c_int {
    // SAFETY: live port.
    unsafe { update_rx(dev, |r| r.allmulti = false) }
}

unsafe extern "C" fn mac_addr_set(
    dev: *mut sys::rte_eth_dev,
    mac: *mut sys::rte_ether_addr,
) -> c_int {
    // SAFETY: live port; ethdev passes a valid address (and stores it in mac_addrs itself).
    let (p, mac) = unsafe { (port_of(dev), (*mac).addr_bytes) };
    if mac[0] & 1 != 0 || mac == [0; 6] {
        pmd_log!(
            ERR,
            "{}: {} is not a unicast address",
            p.name,
            fmt_mac(&mac)
        );
        return -libc::EINVAL;
    }
    p.mac = mac;
    // SAFETY: live port.
    unsafe { apply_rx(dev) }
}

unsafe extern "C" fn mtu_set(dev: *mut sys::rte_eth_dev, mtu: u16) -> c_int {
    // SAFETY: live port.
    let p = unsafe { port_of(dev) };
    if !(port::MIN_MTU..=port::MAX_MTU).contains(&mtu) {
        pmd_log!(
            ERR,
            "{}: MTU {mtu} outside {}..={}",
            p.name,
            port::MIN_MTU,
            port::MAX_MTU
        );
        return -libc::EINVAL;
    }
    // SAFETY: live port.
    unsafe { update_rx(dev, |r| r.mtu = mtu) }
}

unsafe extern "C" fn reta_update(
    dev: *mut sys::rte_eth_dev,
    conf: *mut sys::rte_eth_rss_reta_entry64,
    size: u16,
) -> c_int {
    // SAFETY: live port.
    let (p, d) = unsafe { (port_of(dev), data(dev)) };
    if usize::from(size) != port::RETA_SIZE {
        pmd_log!(
            ERR,
            "{}: RETA size {size}, the device has {}",
            p.name,
            port::RETA_SIZE
        );
        return -libc::EINVAL;
    }
    let groups = port::RETA_SIZE / sys::RTE_ETH_RETA_GROUP_SIZE as usize;
    // SAFETY: ethdev passes size / 64 groups.
    let conf = unsafe { std::slice::from_raw_parts(conf, groups) };
    let mut reta = p.rx.reta;
    for (g, c) in conf.iter().enumerate() {
        for (i, &q) in c.reta.iter().enumerate() {
            if c.mask & (1 << i) != 0 {
                if q >= d.nb_rx_queues {
                    pmd_log!(
                        ERR,
                        "{}: RETA entry names RX queue {q} of {}",
                        p.name,
                        d.nb_rx_queues
                    );
                    return -libc::EINVAL;
                }
                reta[g * 64 + i] = q;
            }
        }
    }
    // SAFETY: live port.
    unsafe { update_rx(dev, |r| r.reta = reta) }
}

unsafe extern "C" fn reta_query(
    dev: *mut sys::rte_eth_dev,
    conf: *mut sys::rte_eth_rss_reta_entry64,
    size: u16,
) -> c_int {
    // SAFETY: live port.
    let p = unsafe { port_of(dev) };
    if usize::from(size) != port::RETA_SIZE {
        return -libc::EINVAL;
    }
    let groups = port::RETA_SIZE / sys::RTE_ETH_RETA_GROUP_SIZE as usize;
    // SAFETY: ethdev passes size / 64 groups.
    let conf = unsafe { std::slice::from_raw_parts_mut(conf, groups) };
    for (g, c) in conf.iter_mut().enumerate() {
        for i in 0..64 {
            if c.mask & (1 << i) != 0 {
                c.reta[i] = p.rx.reta[g * 64 + i];
            }
        }
    }
    0
}

unsafe extern "C" fn rss_hash_update(
    dev: *mut sys::rte_eth_dev,
    conf: *mut sys::rte_eth_rss_conf,
) -> c_int {
    // SAFETY: live port, valid conf.
    let (p, conf) = unsafe { (port_of(dev), &*conf) };
    if conf.rss_hf & !port::RSS_HF_ALL != 0 {
        pmd_log!(
            ERR,
            "{}: unsupported RSS hash types {:#x}",
            p.name,
            conf.rss_hf & !port::RSS_HF_ALL
        );
        return -libc::EINVAL;
    }
    let mut key = p.rx.rss_key;
    if !conf.rss_key.is_null() {
        if usize::from(conf.rss_key_len) != crate::hw::RSS_KEY_LEN {
            pmd_log!(
                ERR,
                "{}: RSS key of {} bytes, the device takes {}",
                p.name,
                conf.rss_key_len,
                crate::hw::RSS_KEY_LEN
            );
            return -libc::EINVAL;
        }
        // SAFETY: rss_key_len bytes readable.
        key.copy_from_slice(unsafe {
            std::slice::from_raw_parts(conf.rss_key, crate::hw::RSS_KEY_LEN)
        });
    }
    let hf = conf.rss_hf;
    // SAFETY: live port.
    unsafe {
        update_rx(dev, |r| {
            r.rss_key = key;
            r.rss_hf = hf;
        })
    }
}

unsafe extern "C" fn rss_hash_conf_get(
    dev: *mut sys::rte_eth_dev,
    conf: *mut sys::rte_eth_rss_conf,
) -> c_int {
    // SAFETY: live port, valid conf.
    let (p, conf) = unsafe { (port_of(dev), &mut *conf) };
    if !conf.rss_key.is_null() {
        // SAFETY: ethdev checked rss_key_len against hash_key_size.
        unsafe {
            std::ptr::copy_nonoverlapping(
                p.rx.rss_key.as_ptr(),
                conf.rss_key,
                crate::hw::RSS_KEY_LEN,
            )
        };
        conf.rss_key_len = crate::hw::RSS_KEY_LEN as u8;
    }
    conf.rss_hf = p.rx.rss_hf;
    0
}

unsafe extern "C" fn rxq_info_get(
    dev: *mut sys::rte_eth_dev,
    qid: u16,
    info: *mut sys::rte_eth_rxq_info,
) {
    // SAFETY: live port; ethdev checked qid and zeroed info.
    let (d, info) = unsafe { (data(dev), &mut *info) };
    // SAFETY: qid < nb_rx_queues, checked by ethdev.
    let Some(q) = (unsafe { queue::<RxQ>(d.rx_queues, usize::from(qid)) }) else {
        return;
    };
    info.mp = q.pool().0;
    info.nb_desc = q.nb_desc() as u16;
    info.scattered_rx = u8::from(q.sges() > 1);
    info.conf.offloads = d.dev_conf.rxmode.offloads;
}

unsafe extern "C" fn txq_info_get(
    dev: *mut sys::rte_eth_dev,
    qid: u16,
    info: *mut sys::rte_eth_txq_info,
) {
    // SAFETY: live port; ethdev checked qid and zeroed info.
    let (d, info) = unsafe { (data(dev), &mut *info) };
    // SAFETY: qid < nb_tx_queues, checked by ethdev.
    let Some(TxSlot { q, .. }) = (unsafe { queue::<TxSlot>(d.tx_queues, usize::from(qid)) }) else {
        return;
    };
    info.nb_desc = q.nb_desc() as u16;
    info.conf.offloads = d.dev_conf.txmode.offloads;
}

/// TX offloads the WQE carries (checksums, VLAN insertion) or the queue implements.
const TX_OFFLOAD_CAPA: u64 = sys::bits::RTE_ETH_TX_OFFLOAD_VLAN_INSERT
    | sys::bits::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM
    | sys::bits::RTE_ETH_TX_OFFLOAD_UDP_CKSUM
    | sys::bits::RTE_ETH_TX_OFFLOAD_TCP_CKSUM
    | sys::bits::RTE_ETH_TX_OFFLOAD_MULTI_SEGS
    | sys::bits::RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE;

unsafe extern "C" fn tx_queue_setup(
    dev: *mut sys::rte_eth_dev,
    qid: u16,
    nb_desc: u16,
    socket: u32,
    conf: *const sys::rte_eth_txconf,
) -> c_int {
    // SAFETY: live port; ethdev released any previous queue at this index and passes a
    // valid conf.
    let (p, d, conf) = unsafe { (port_of(dev), data(dev), &*conf) };
    let offloads = conf.offloads | d.dev_conf.txmode.offloads;
    let fast_free = offloads & sys::bits::RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE != 0;
    let cfg = p.tx_config(fast_free, socket as i32);
    match TxQ::new(
        p.dev.as_ref(),
        p.name.clone(),
        qid,
        nb_desc,
        cfg,
        p.mrs.clone(),
    ) {
        Ok(q) => {
            let slot = TxSlot {
                q,
                port_id: d.port_id,
            };
            // SAFETY: qid < nb_tx_queues, checked by ethdev.
            unsafe { *d.tx_queues.add(qid as usize) = Box::into_raw(Box::new(slot)).cast() };
            0
        }
        Err(e) => {
            pmd_log!(ERR, "{}: TX queue {qid}: {e}", p.name);
            errno(&e)
        }
    }
}

unsafe extern "C" fn tx_queue_release(dev: *mut sys::rte_eth_dev, qid: u16) {
    // SAFETY: live port, qid < nb_tx_queues; the slot holds NULL or a TX queue of ours.
    unsafe {
        let p = port_of(dev);
        release_queue(data(dev).tx_queues, usize::from(qid), |s: TxSlot| {
            s.q.destroy(p.dev.as_ref())
        })
    }
}

/// RX offloads: checksum verdicts, RSS hash, scattered frames.
const RX_OFFLOAD_CAPA: u64 = sys::bits::RTE_ETH_RX_OFFLOAD_IPV4_CKSUM
    | sys::bits::RTE_ETH_RX_OFFLOAD_UDP_CKSUM
    | sys::bits::RTE_ETH_RX_OFFLOAD_TCP_CKSUM
    | sys::bits::RTE_ETH_RX_OFFLOAD_RSS_HASH
    | sys::bits::RTE_ETH_RX_OFFLOAD_SCATTER;

unsafe extern "C" fn rx_queue_setup(
    dev: *mut sys::rte_eth_dev,
    qid: u16,
    nb_desc: u16,
    socket: u32,
    conf: *const sys::rte_eth_rxconf,
    mp: *mut sys::rte_mempool,
) -> c_int {
    use sys::bits::*;
    // SAFETY: live port; ethdev released any previous queue at this index and passes a valid
    // conf and mempool.
    let (p, d, conf) = unsafe { (port_of(dev), data(dev), &*conf) };
    let offloads = conf.offloads | d.dev_conf.rxmode.offloads;
    // SAFETY: a valid pktmbuf pool (ethdev checked it).
    let room = unsafe { sys::mlx4rs_pktmbuf_data_room_size(mp) }
        .saturating_sub(sys::RTE_PKTMBUF_HEADROOM as u16)
        .max(1);
    let max_frame = d.mtu as u32 + 18;
    let sges = if offloads & RTE_ETH_RX_OFFLOAD_SCATTER != 0 {
        max_frame
            .div_ceil(u32::from(room))
            .next_power_of_two()
            .min(32)
    } else {
        if max_frame > u32::from(room) {
            pmd_log!(
                ERR,
                "{}: RX queue {qid}: mbufs hold {room} bytes, frames up to {max_frame}: enable scatter or use bigger mbufs",
                p.name
            );
            return -libc::EINVAL;
        }
        1
    };
    let cfg = RxConfig {
        sges,
        csum: offloads
            & (RTE_ETH_RX_OFFLOAD_IPV4_CKSUM
                | RTE_ETH_RX_OFFLOAD_UDP_CKSUM
                | RTE_ETH_RX_OFFLOAD_TCP_CKSUM)
            != 0,
        rss: offloads & RTE_ETH_RX_OFFLOAD_RSS_HASH != 0,
        port_id: d.port_id,
        source: MemSource::Dpdk {
            socket: socket as i32,
        },
    };
    match RxQ::new(p.dev.as_ref(), qid, nb_desc, cfg, Pool(mp), p.mrs.clone()) {
        Ok(q) => {
            // SAFETY: qid < nb_rx_queues, checked by ethdev.
            unsafe { *d.rx_queues.add(qid as usize) = Box::into_raw(Box::new(q)).cast() };
            0
        }
        Err(e) => {
            pmd_log!(ERR, "{}: RX queue {qid}: {e}", p.name);
            errno(&e)
        }
    }
}

/// `rx_pkt_burst`.
unsafe extern "C" fn rx_burst(
    q: *mut std::ffi::c_void,
    pkts: *mut *mut sys::rte_mbuf,
    n: u16,
) -> u16 {
    // SAFETY: `q` is the queue rx_queue_setup stored, used by one lcore at a time; `pkts` has
    // room for `n` mbuf pointers, and `Mbuf` is a transparent pointer.
    unsafe {
        let q = &mut *(q as *mut RxQ);
        let out = std::slice::from_raw_parts_mut(pkts as *mut Mbuf, usize::from(n));
        q.burst(out) as u16
    }
}

unsafe extern "C" fn rx_queue_release(dev: *mut sys::rte_eth_dev, qid: u16) {
    // SAFETY: live port, qid < nb_rx_queues; the slot holds NULL or an RX queue of ours.
    unsafe {
        let p = port_of(dev);
        release_queue(data(dev).rx_queues, usize::from(qid), |q: RxQ| {
            q.destroy(p.dev.as_ref())
        })
    }
}

/// # Safety
/// `dev` must be a live port.
unsafe fn xstats_of(dev: *mut sys::rte_eth_dev) -> Vec<(String, u64)> {
    let mut txqs = Vec::new();
    // SAFETY: live port.
    unsafe { for_each_txq(dev, |_, q| txqs.push(q.stats())) };
    // SAFETY: live port.
    unsafe { port_of(dev) }.xstats(&txqs)
}

unsafe extern "C" fn xstats_get_names(
    dev: *mut sys::rte_eth_dev,
    names: *mut sys::rte_eth_xstat_name,
    size: u32,
) -> c_int {
    // SAFETY: live port.
    let x = unsafe { xstats_of(dev) };
    if names.is_null() || (size as usize) < x.len() {
        return x.len() as c_int;
    }
    for (i, (name, _)) in x.iter().enumerate() {
        // SAFETY: `names` has room for `size` >= x.len() entries.
        let slot = unsafe { &mut (*names.add(i)).name };
        let n = name.len().min(slot.len() - 1);
        for (d, s) in slot.iter_mut().zip(name.as_bytes()[..n].iter()) {
            *d = *s as c_char;
        }
        slot[n] = 0;
    }
    x.len() as c_int
}

unsafe extern "C" fn xstats_get(
    dev: *mut sys::rte_eth_dev,
    stats: *mut sys::rte_eth_xstat,
    n: u32,
) -> c_int {
    // SAFETY: live port.
    let x = unsafe { xstats_of(dev) };
    if stats.is_null() || (n as usize) < x.len() {
        return x.len() as c_int;
    }
    for (i, (_, v)) in x.iter().enumerate() {
        // SAFETY: `stats` has room for `n` >= x.len() entries.
        unsafe {
            (*stats.add(i)).id = i as u64;
            (*stats.add(i)).value = *v;
        }
    }
    x.len() as c_int
}

unsafe extern "C" fn xstats_reset(dev: *mut sys::rte_eth_dev) -> c_int {
    // SAFETY: live port.
    unsafe {
        // ethdev does not reset the basic stats when a driver resets its xstats.
        for_each_txq(dev, |_, q| q.reset_stats());
        for_each_rxq(dev, |_, q| q.reset_stats());
        port_of(dev).dev.reset_counters();
    }
    0
}
