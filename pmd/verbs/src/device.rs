//! The devices the stand-in presents and, while any context is open, the adapter behind each:
//! the model (`mlx4_hca::Hca`, one port), its wire, its netdev and its receive steering.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::ffi::{c_char, c_int};
use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use mlx4_hca::{Bar, FlowAction, FlowRule, Hca, HcaConfig, PortEvent, RssContext, Wire};
use parking_lot::Mutex;

use crate::config::{self, DeviceConf, Sysfs};
use crate::steer::Steering;
use crate::{log, netdev, sys};

/// A verbs device: rdma-core's `struct ibv_device` first, so the pointer the application holds
/// is ours.
#[repr(C)]
pub(crate) struct Device {
    pub ibv: sys::ibv_device,
    pub conf: DeviceConf,
    pub sysfs: Sysfs,
    open: Mutex<Opened>,
}

#[derive(Default)]
struct Opened {
    contexts: usize,
    adapter: Option<Arc<Adapter>>,
}

fn fill(dst: &mut [c_char], s: &str) {
    let n = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
}

impl Device {
    fn new(index: usize, conf: DeviceConf, sysfs: Sysfs) -> Device {
        let mut ibv = sys::ibv_device {
            node_type: sys::IBV_NODE_CA,
            transport_type: sys::IBV_TRANSPORT_IB,
            ..Default::default()
        };
        fill(&mut ibv.name, &sysfs.name);
        fill(&mut ibv.dev_name, &format!("uverbs{index}"));
        fill(&mut ibv.dev_path, &conf.ibdev.to_string_lossy());
        fill(&mut ibv.ibdev_path, &conf.ibdev.to_string_lossy());
        Device {
            ibv,
            conf,
            sysfs,
            open: Mutex::new(Opened::default()),
        }
    }

    /// The device behind a pointer the application got from [`devices`].
    pub(crate) fn from_ibv(p: *const sys::ibv_device) -> Option<&'static Device> {
        devices().iter().copied().find(|d| std::ptr::eq(&d.ibv, p))
    }

    /// A context opens: the adapter comes up with the first one.
    pub(crate) fn acquire(&'static self) -> Result<Arc<Adapter>, String> {
        let mut o = self.open.lock();
        let a = match &o.adapter {
            Some(a) => a.clone(),
            None => {
                let a = Adapter::open(self)?;
                o.adapter = Some(a.clone());
                a
            }
        };
        o.contexts += 1;
        Ok(a)
    }

    /// A context closed: the adapter goes down (counters written, netdev released) with the
    /// last one.
    pub(crate) fn release(&self) {
        let mut o = self.open.lock();
        o.contexts = o.contexts.saturating_sub(1);
        if o.contexts == 0 {
            if let Some(a) = o.adapter.take() {
                a.shutdown();
            }
        }
    }
}

/// Every configured device whose sysfs tree could be read; configuration mistakes are logged
/// once and leave the list empty or shorter.
pub(crate) fn devices() -> &'static [&'static Device] {
    static DEVICES: OnceLock<Vec<&'static Device>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let Some(text) = std::env::var_os(config::ENV) else {
            log(format_args!(
                "no devices: {} is not set (it names the sysfs path of each device, see the \
                 mlx4rs README)",
                config::ENV
            ));
            return Vec::new();
        };
        let confs = match config::parse(&text.to_string_lossy()) {
            Ok(c) => c,
            Err(e) => {
                log(format_args!("no devices: {e}"));
                return Vec::new();
            }
        };
        let mut v = Vec::new();
        for conf in confs {
            match config::read_sysfs(&conf.ibdev) {
                Ok(s) => {
                    let d: &'static Device = Box::leak(Box::new(Device::new(v.len(), conf, s)));
                    v.push(d);
                }
                Err(e) => log(format_args!("device skipped: {e}")),
            }
        }
        v
    })
}

/// An async event waiting for `ibv_get_async_event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AsyncEvent {
    pub event_type: sys::ibv_event_type,
    pub port: u32,
}

/// A context's async events; its eventfd is the context's `async_fd`, readable exactly while
/// events are queued.
pub(crate) struct EventQueue {
    q: Mutex<VecDeque<AsyncEvent>>,
    pub fd: OwnedFd,
}

impl EventQueue {
    pub(crate) fn new() -> std::io::Result<EventQueue> {
        // SAFETY: plain eventfd(2) call; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(EventQueue {
            q: Mutex::new(VecDeque::new()),
            // SAFETY: a fresh descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub(crate) fn push(&self, ev: AsyncEvent) {
        let mut q = self.q.lock();
        q.push_back(ev);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to an eventfd adds to its counter; it cannot block below
        // u64::MAX - 1.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// The next event; with none queued, wait on the fd the way the application configured it
    /// (blocking, or `EAGAIN` when it made the fd non-blocking).
    pub(crate) fn pop(&self) -> Result<AsyncEvent, c_int> {
        loop {
            {
                let mut q = self.q.lock();
                if let Some(ev) = q.pop_front() {
                    if q.is_empty() {
                        // Every push added one and nothing else reads: the counter is non-zero,
                        // so this read does not block, and it leaves the fd unreadable.
                        let mut n: u64 = 0;
                        // SAFETY: reading 8 bytes from an eventfd into a u64.
                        let _ = unsafe {
                            libc::read(self.fd.as_raw_fd(), (&mut n as *mut u64).cast(), 8)
                        };
                    }
                    return Ok(ev);
                }
            }
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: F_GETFL on our own descriptor.
            let fl = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_GETFL) };
            if fl >= 0 && fl & libc::O_NONBLOCK != 0 {
                return Err(libc::EAGAIN);
            }
            // SAFETY: polling one pollfd.
            unsafe { libc::poll(&mut pfd, 1, -1) };
        }
    }
}

/// The running adapter of a device.
pub(crate) struct Adapter {
    pub hca: Hca,
    /// The memory file holding the adapter's device memory: what a context's command fd maps
    /// (a UAR page at `mlx4dv_qp.uar_mmap_offset`, its BlueFlame page one page later).
    pub bar_fd: OwnedFd,
    pub name: String,
    pub part_id: u32,
    steering: Mutex<SteerState>,
    events: Arc<Mutex<Vec<Weak<EventQueue>>>>,
    ids: AtomicU64,
    stats: Option<PathBuf>,
    watcher: Mutex<Option<(Arc<AtomicBool>, JoinHandle<()>)>>,
    /// The TAP interface the stand-in created as the port's netdev (its carrier follows the
    /// model's link).
    tap: Option<Arc<File>>,
}

/// Verbs steering and what the model was told for it.
#[derive(Default)]
struct SteerState {
    verbs: Steering,
    /// Notes already logged.
    notes: Vec<String>,
    /// The model's flow rules and RSS contexts of the last plan.
    flows: Vec<u32>,
    contexts: Vec<u32>,
}

/// How long the netdev watcher sleeps without link messages before checking whether to stop.
const WATCH_TIMEOUT: Duration = Duration::from_millis(200);

impl Adapter {
    fn open(dev: &Device) -> Result<Arc<Adapter>, String> {
        let name = dev.sysfs.name.clone();
        let cfg = HcaConfig {
            wc: dev.conf.wc,
            bf_reg_size: dev.conf.bf_reg_size,
            busy_poll: dev.conf.busy_poll,
            name: dev.conf.name.clone(),
            threaded: true,
            // As on a card: a QP runs only in RTS, a WQ receives only in RDY.
            reset_on_create: true,
            pro: dev.sysfs.part_id == mlx4_hca::PART_CX3_PRO,
            ..HcaConfig::default()
        };
        let (bar, bar_fd) =
            Bar::in_memfd(&cfg).map_err(|e| format!("{name}: device memory: {e}"))?;
        let hca = Hca::open_on(cfg, bar).map_err(|e| format!("{name}: opening the model: {e}"))?;
        let wire: Wire = dev.conf.wire.parse().map_err(|e| format!("{name}: {e}"))?;
        hca.set_wire(wire)
            .map_err(|e| format!("{name}: wire {}: {e}", dev.conf.wire))?;
        let nd = dev.sysfs.netdev.clone();
        let tap = if netdev::exists(&nd) {
            None
        } else {
            Some(Arc::new(netdev::create_tap(&nd, dev.conf.mac).map_err(
                |e| format!("{name}: creating TAP interface {nd} as the port's netdev: {e}"),
            )?))
        };
        let a = Arc::new(Adapter {
            hca,
            bar_fd,
            name,
            part_id: dev.sysfs.part_id,
            steering: Mutex::new(SteerState::default()),
            events: Arc::new(Mutex::new(Vec::new())),
            ids: AtomicU64::new(1),
            stats: dev.conf.stats.clone(),
            watcher: Mutex::new(None),
            tap,
        });
        // As a verbs device: only flow rules deliver.
        a.hca.set_flows_only(true);
        a.apply_steering();
        let st = netdev::state(&nd).map_err(|e| format!("{}: netdev {nd}: {e}", a.name))?;
        follow(&a.hca, st, a.tap.is_some());
        let model_fd = a
            .hca
            .event_fd()
            .map_err(|e| format!("{}: the model's event fd: {e}", a.name))?;
        // Where the port starts: no event for it, the carrier set.
        while a.hca.next_event().is_some() {}
        if let Some(t) = &a.tap {
            carrier(&a.name, t, a.hca.link_up());
        }
        let links = netdev::LinkEvents::open(WATCH_TIMEOUT)
            .map_err(|e| format!("{}: rtnetlink socket: {e}", a.name))?;
        let stop = Arc::new(AtomicBool::new(false));
        let w = Watch {
            nd,
            name: a.name.clone(),
            hca: a.hca.clone(),
            events: a.events.clone(),
            tap: a.tap.clone(),
            model_fd,
        };
        let stop2 = stop.clone();
        let h = std::thread::Builder::new()
            .name("mlx4rs-netdev".into())
            .spawn(move || w.run(&links, &stop2, st))
            .map_err(|e| format!("spawning the netdev watcher: {e}"))?;
        *a.watcher.lock() = Some((stop, h));
        a.hca
            .start()
            .map_err(|e| format!("{}: starting the model: {e}", a.name))?;
        Ok(a)
    }

    /// A fresh id for hash QPs, indirection tables and flows.
    pub(crate) fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn subscribe(&self, q: &Arc<EventQueue>) {
        let mut v = self.events.lock();
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(q));
    }

    /// Change the steering state and tell the model the result.
    pub(crate) fn steer<R>(&self, f: impl FnOnce(&mut Steering) -> R) -> R {
        let r = f(&mut self.steering.lock().verbs);
        self.apply_steering();
        r
    }

    /// Tell the model the rules of the current plan: the new rules and contexts first, then
    /// the old ones go, so frames never meet a moment without rules (equal priorities go by
    /// age, so the old rules keep matching until they are destroyed).
    fn apply_steering(&self) {
        let mut s = self.steering.lock();
        let plan = s.verbs.plan();
        let mut ctxs = Vec::new();
        let mut ctx_of = Vec::new();
        for (hash, q) in &plan.contexts {
            let ctx = RssContext {
                key: q.key,
                fields: q.fields,
                rqs: q.rqs.clone(),
            };
            match self.hca.create_rss_context(&ctx) {
                Ok(id) => {
                    ctxs.push(id);
                    ctx_of.push((*hash, id));
                }
                Err(e) => log(format_args!("{}: RSS context: {e}", self.name)),
            }
        }
        let mut flows = Vec::new();
        for r in &plan.rules {
            let action = match r.hash {
                None => FlowAction::Drop,
                Some(h) => match ctx_of.iter().find(|(x, _)| *x == h) {
                    Some(&(_, id)) => FlowAction::Rss(id),
                    None => continue,
                },
            };
            let rule = FlowRule {
                priority: r.priority,
                pattern: r.pattern,
                action,
            };
            match self.hca.create_flow(&rule) {
                Ok(id) => flows.push(id),
                Err(e) => log(format_args!("{}: flow rule: {e}", self.name)),
            }
        }
        for id in std::mem::replace(&mut s.flows, flows) {
            let _ = self.hca.destroy_flow(id);
        }
        for id in std::mem::replace(&mut s.contexts, ctxs) {
            let _ = self.hca.destroy_rss_context(id);
        }
        if plan.notes != s.notes {
            for n in &plan.notes {
                log(format_args!(
                    "{}: steering not modelled exactly: {n}",
                    self.name
                ));
            }
            s.notes = plan.notes;
        }
    }

    fn shutdown(&self) {
        if let Some((stop, h)) = self.watcher.lock().take() {
            stop.store(true, Ordering::Release);
            let _ = h.join();
        }
        self.hca.stop();
        // The device is gone for the application: frames still in the port's receive buffer
        // are lost as when the port goes down, and counted so (`rx_drops_wire`) rather than
        // vanishing from the counters written below.
        self.hca.set_port_up(false);
        // Unplug the wire now (a pcap file is flushed, a TAP released) rather than when the last
        // handle goes: objects the application never destroyed still hold the adapter.
        let _ = self.hca.set_wire(Wire::Null);
        if let Some(path) = &self.stats {
            let mut text = String::new();
            for (k, v) in self.hca.counters().iter() {
                text.push_str(&format!("{k} {v}\n"));
            }
            let r = File::create(path).and_then(|mut f| f.write_all(text.as_bytes()));
            if let Err(e) = r {
                log(format_args!(
                    "{}: writing counters to {}: {e}",
                    self.name,
                    path.display()
                ));
            }
        }
    }
}

/// The model port follows the netdev: its MTU, and whether it is up. The stand-in's own TAP
/// is up when set up (its carrier is the model's to give); a netdev of the system also needs
/// its carrier.
fn follow(hca: &Hca, st: netdev::State, own: bool) {
    // Only a TAP wire can refuse an MTU; the port keeps it all the same.
    let _ = hca.set_mtu(st.mtu.min(u32::from(u16::MAX)) as u16);
    hca.set_port_up(if own { st.admin } else { st.up });
}

/// Set the TAP's carrier, saying once if the kernel cannot.
fn carrier(name: &str, tap: &File, on: bool) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if let Err(e) = netdev::set_carrier(tap, on) {
        if !SAID.swap(true, Ordering::Relaxed) {
            log(format_args!(
                "{name}: setting the netdev's carrier (TUNSETCARRIER): {e}; the netdev will \
                 not show the model's link"
            ));
        }
    }
}

/// The watcher thread's share of the adapter.
struct Watch {
    nd: String,
    name: String,
    hca: Hca,
    events: Arc<Mutex<Vec<Weak<EventQueue>>>>,
    tap: Option<Arc<File>>,
    model_fd: libc::c_int,
}

impl Watch {
    /// The netdev and the model, watched together: the port follows the netdev (up, MTU); the
    /// model's port events become async events on every open context, as mlx4_ib reports
    /// them (`PORT_ACTIVE`, `PORT_ERR`, `DEVICE_FATAL` for a removal), and the netdev's
    /// carrier follows the model's link, so a driver reading the netdev sees it too.
    fn run(&self, links: &netdev::LinkEvents, stop: &AtomicBool, mut last: netdev::State) {
        while !stop.load(Ordering::Acquire) {
            links.wait_with(self.model_fd, WATCH_TIMEOUT);
            if let Ok(st) = netdev::state(&self.nd) {
                if st != last {
                    follow(&self.hca, st, self.tap.is_some());
                    last = st;
                }
            }
            while let Some(ev) = self.hca.next_event() {
                let (event_type, link) = match ev {
                    PortEvent::LinkUp => (sys::IBV_EVENT_PORT_ACTIVE, Some(true)),
                    PortEvent::LinkDown => (sys::IBV_EVENT_PORT_ERR, Some(false)),
                    PortEvent::Removed => (sys::IBV_EVENT_DEVICE_FATAL, None),
                };
                if let (Some(t), Some(up)) = (&self.tap, link) {
                    carrier(&self.name, t, up);
                }
                let ev = AsyncEvent {
                    event_type,
                    port: 1,
                };
                for q in self.events.lock().iter().filter_map(Weak::upgrade) {
                    q.push(ev);
                }
            }
        }
    }
}
