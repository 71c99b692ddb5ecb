//! The apps' only bridge to DPDK: EAL start-up, port and pool set-up, extended statistics, and
//! the per-packet calls, which go straight through ethdev's exported function table
//! (`rte_eth_fp_ops`) because `rte_eth_tx_burst`/`rte_eth_rx_burst` are `static inline` and a C
//! shim per burst would add a call that a real DPDK application does not pay.

use std::ffi::{c_void, CStr, CString};
use std::ptr;

use dpdk_sys as sys;

extern "C" {
    // Declared here because the bindings allowlist only `rte_eth_devices` among ethdev's
    // variables; its length (RTE_MAX_ETHPORTS) is left out so that indexing is checked against
    // the port id range DPDK itself guarantees.
    static mut rte_eth_fp_ops: [sys::rte_eth_fp_ops; 0];
}

/// Starts EAL with `args` (without the program name). Once per process.
/// EAL arguments for these 2-core machines without hugepages, with a per-process file prefix
/// so that runs never share EAL state.
pub fn base_args(app: &str) -> Vec<String> {
    let mut v: Vec<String> = [
        "-l",
        "0-1",
        "--no-huge",
        "-m",
        "512",
        "--no-pci",
        "--log-level=pmd.net.mlx4rs:warning",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push(format!("--file-prefix={app}-{}", std::process::id()));
    v
}

pub fn init(prog: &str, args: &[String]) -> Result<(), String> {
    let mut owned: Vec<CString> = Vec::with_capacity(args.len() + 1);
    for a in std::iter::once(prog).chain(args.iter().map(String::as_str)) {
        owned.push(CString::new(a).map_err(|_| format!("EAL argument with a NUL: {a:?}"))?);
    }
    // EAL keeps pointers into argv (for example for `rte_eal_get_...` and the plugin paths),
    // so the strings live for the rest of the process.
    let owned: &'static mut [CString] = owned.leak();
    let argv: Vec<*mut std::ffi::c_char> = owned.iter().map(|c| c.as_ptr() as *mut _).collect();
    let argv: &'static mut [*mut std::ffi::c_char] = argv.leak();
    // SAFETY: argc/argv describe NUL-terminated strings that outlive EAL.
    let rc = unsafe { sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
    if rc < 0 {
        return Err(format!(
            "rte_eal_init failed (rte_errno {}); EAL arguments: {}",
            // SAFETY: reads the calling thread's rte_errno.
            unsafe { sys::mlx4rs_errno() },
            args.join(" ")
        ));
    }
    Ok(())
}

/// Stops and closes every port, then releases EAL and removes its runtime directory, which
/// EAL leaves behind (`/var/run/dpdk/<file-prefix>`, one per run of an app).
pub fn shutdown() {
    // SAFETY: EAL's runtime directory, a NUL-terminated string it owns until cleanup; copied.
    let dir = unsafe { CStr::from_ptr(sys::rte_eal_get_runtime_dir()) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: plain control-path calls on ports EAL knows; errors are irrelevant at exit.
    unsafe {
        for p in 0..sys::RTE_MAX_ETHPORTS as u16 {
            if sys::rte_eth_dev_is_valid_port(p) != 0 {
                sys::rte_eth_dev_stop(p);
                sys::rte_eth_dev_close(p);
            }
        }
        sys::rte_eal_cleanup();
    }
    // Only a per-prefix directory under EAL's `dpdk` one, never anything else.
    let path = std::path::Path::new(&dir);
    if path.parent().and_then(|p| p.file_name()) == Some(std::ffi::OsStr::new("dpdk")) {
        let _ = std::fs::remove_dir_all(path);
    }
}

pub fn port_by_name(name: &str) -> Result<u16, String> {
    let c = CString::new(name).map_err(|_| "port name with a NUL".to_owned())?;
    let mut id = 0u16;
    // SAFETY: `c` is a valid string, `id` a valid out-pointer.
    let rc = unsafe { sys::rte_eth_dev_get_port_by_name(c.as_ptr(), &mut id) };
    if rc != 0 {
        return Err(format!("no port named {name} (was its --vdev given?)"));
    }
    Ok(id)
}

pub fn tsc_hz() -> u64 {
    // SAFETY: a plain getter, valid after EAL init.
    unsafe { sys::rte_get_tsc_hz() }
}

#[inline(always)]
pub fn rdtsc() -> u64 {
    // SAFETY: RDTSC exists on every x86-64 CPU and has no memory effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// An mbuf pool for the whole run; never freed (the ports keep pointers to it).
#[derive(Clone, Copy)]
pub struct Pool(*mut sys::rte_mempool);

// SAFETY: a mempool is made for use from every lcore (per-lcore caches, lock-free ring).
unsafe impl Send for Pool {}
// SAFETY: as above; the handle itself is never written.
unsafe impl Sync for Pool {}

/// Runs `f` on the first worker lcore and waits for it, sleeping: the software HCA's device
/// threads inherit the affinity of whoever starts a port (the main lcore), so measuring on
/// the worker keeps the benchmark and the device on different cores, as testpmd does. Runs
/// `f` here when EAL has no worker.
pub fn on_worker<R: Send, F: FnOnce() -> R + Send>(f: F) -> R {
    struct Job<F, R> {
        f: Option<F>,
        r: Option<R>,
    }
    unsafe extern "C" fn trampoline<R, F: FnOnce() -> R>(arg: *mut c_void) -> i32 {
        // SAFETY: `arg` is the Job that on_worker keeps alive until the lcore is done.
        let job = unsafe { &mut *(arg as *mut Job<F, R>) };
        if let Some(f) = job.f.take() {
            job.r = Some(f());
        }
        0
    }
    // SAFETY: plain lcore queries.
    let worker = unsafe { sys::rte_get_next_lcore(u32::MAX, 1, 0) };
    let mut job = Job {
        f: Some(f),
        r: None,
    };
    if worker < sys::RTE_MAX_LCORE {
        // SAFETY: the trampoline matches the Job type; `job` outlives the launch because we
        // wait for the lcore below before touching or dropping it.
        let rc = unsafe {
            sys::rte_eal_remote_launch(
                Some(trampoline::<R, F>),
                (&mut job as *mut Job<F, R>).cast(),
                worker,
            )
        };
        if rc == 0 {
            // SAFETY: state queries and the final wait on the lcore we launched.
            unsafe {
                while sys::rte_eal_get_lcore_state(worker) == sys::rte_lcore_state_t_RUNNING {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                sys::rte_eal_wait_lcore(worker);
            }
        }
    }
    if let Some(f) = job.f.take() {
        job.r = Some(f());
    }
    job.r.take().expect("the job ran")
}

impl Pool {
    /// The mempool, for DPDK calls the apps make themselves.
    pub fn raw(self) -> *mut sys::rte_mempool {
        self.0
    }

    pub fn create(name: &str, n: u32) -> Result<Pool, String> {
        let c = CString::new(name).map_err(|_| "pool name with a NUL".to_owned())?;
        // 2 KiB of data after the default headroom: a 1500-byte frame fits one segment.
        let room = (sys::RTE_MBUF_DEFAULT_DATAROOM + sys::RTE_PKTMBUF_HEADROOM) as u16;
        // SAFETY: valid name; EAL is up.
        let mp = unsafe {
            sys::rte_pktmbuf_pool_create(c.as_ptr(), n, 256, 0, room, sys::rte_socket_id() as i32)
        };
        if mp.is_null() {
            return Err(format!("rte_pktmbuf_pool_create({name}, {n}) failed"));
        }
        Ok(Pool(mp))
    }
}

/// Configures one RX and one TX queue of `nb_desc` descriptors with default settings.
pub fn setup_port(port: u16, pool: Pool, nb_desc: u16) -> Result<(), String> {
    // SAFETY: a zeroed rte_eth_conf is the documented "all defaults"; the pointers passed
    // are valid for the calls.
    unsafe {
        let conf: sys::rte_eth_conf = std::mem::zeroed();
        let rc = sys::rte_eth_dev_configure(port, 1, 1, &conf);
        if rc != 0 {
            return Err(format!("port {port}: configure failed ({rc})"));
        }
        let socket = sys::rte_socket_id();
        let rc = sys::rte_eth_rx_queue_setup(port, 0, nb_desc, socket, ptr::null(), pool.0);
        if rc != 0 {
            return Err(format!("port {port}: RX queue setup failed ({rc})"));
        }
        let rc = sys::rte_eth_tx_queue_setup(port, 0, nb_desc, socket, ptr::null());
        if rc != 0 {
            return Err(format!("port {port}: TX queue setup failed ({rc})"));
        }
    }
    Ok(())
}

pub fn start(port: u16) -> Result<(), String> {
    // SAFETY: control-path call on a configured port.
    let rc = unsafe { sys::rte_eth_dev_start(port) };
    if rc != 0 {
        return Err(format!("port {port}: start failed ({rc})"));
    }
    Ok(())
}

pub fn stop(port: u16) {
    // SAFETY: control-path call; stopping a stopped port is harmless.
    unsafe { sys::rte_eth_dev_stop(port) };
}

/// Every extended statistic of a port, by name.
pub fn xstats(port: u16) -> Vec<(String, u64)> {
    // SAFETY: the first calls ask for the count; the buffers passed next hold that many.
    unsafe {
        let n = sys::rte_eth_xstats_get_names(port, ptr::null_mut(), 0);
        if n <= 0 {
            return Vec::new();
        }
        let mut names = vec![std::mem::zeroed::<sys::rte_eth_xstat_name>(); n as usize];
        let mut vals = vec![std::mem::zeroed::<sys::rte_eth_xstat>(); n as usize];
        let got = sys::rte_eth_xstats_get_names(port, names.as_mut_ptr(), n as u32);
        let got_v = sys::rte_eth_xstats_get(port, vals.as_mut_ptr(), n as u32);
        if got != n || got_v != n {
            return Vec::new();
        }
        names
            .iter()
            .zip(&vals)
            .map(|(nm, v)| {
                let s = CStr::from_ptr(nm.name.as_ptr())
                    .to_string_lossy()
                    .into_owned();
                (s, v.value)
            })
            .collect()
    }
}

/// Largest burst the apps use.
pub const MAX_BURST: usize = 64;

/// mbufs this side owns. Whatever is left at drop goes back to the pool.
pub struct Mbufs {
    v: [*mut sys::rte_mbuf; MAX_BURST],
    n: usize,
}

impl Default for Mbufs {
    fn default() -> Self {
        Mbufs {
            v: [ptr::null_mut(); MAX_BURST],
            n: 0,
        }
    }
}

impl Mbufs {
    /// `n` fresh mbufs (all or nothing: false when the pool is short).
    pub fn alloc(&mut self, pool: Pool, n: usize) -> bool {
        self.free_all();
        let n = n.min(MAX_BURST);
        // SAFETY: `v` has room for `n` pointers; the glue calls the inline bulk allocator, once
        // per burst, not per packet.
        let rc = unsafe { sys::mlx4rs_pktmbuf_alloc_bulk(pool.0, self.v.as_mut_ptr(), n as u32) };
        if rc != 0 {
            return false;
        }
        self.n = n;
        true
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Gives every mbuf a single-segment copy of `frame` (truncated to the buffer).
    pub fn fill(&mut self, frame: &[u8]) {
        for &m in &self.v[..self.n] {
            // SAFETY: `m` is a fresh mbuf we own; its data area starts at `buf_addr + data_off`
            // and holds `buf_len - data_off` bytes.
            unsafe {
                let room = usize::from((*m).buf_len - (*m).data_off);
                let len = frame.len().min(room);
                let dst = ((*m).buf_addr as *mut u8).add(usize::from((*m).data_off));
                ptr::copy_nonoverlapping(frame.as_ptr(), dst, len);
                (*m).data_len = len as u16;
                (*m).pkt_len = len as u32;
            }
        }
    }

    /// Makes every mbuf a single-segment packet of `len` bytes that starts with `hdr`; the rest
    /// of the data area keeps whatever it held (throughput runs need lengths, not contents).
    pub fn prepare(&mut self, hdr: &[u8], len: u16) {
        for &m in &self.v[..self.n] {
            // SAFETY: as in `fill`; `len` is clamped to the data room.
            unsafe {
                let room = (*m).buf_len - (*m).data_off;
                let len = len.min(room);
                let h = hdr.len().min(usize::from(len));
                let dst = ((*m).buf_addr as *mut u8).add(usize::from((*m).data_off));
                ptr::copy_nonoverlapping(hdr.as_ptr(), dst, h);
                (*m).data_len = len;
                (*m).pkt_len = u32::from(len);
            }
        }
    }

    /// The first segment's bytes of mbuf `i`.
    pub fn data(&self, i: usize) -> &[u8] {
        assert!(i < self.n);
        let m = self.v[i];
        // SAFETY: `m` is an mbuf we own; data_len bytes from the data offset are initialized.
        unsafe {
            std::slice::from_raw_parts(
                ((*m).buf_addr as *const u8).add(usize::from((*m).data_off)),
                usize::from((*m).data_len),
            )
        }
    }

    pub fn free_all(&mut self) {
        if self.n > 0 {
            // SAFETY: the first `n` pointers are mbufs we own; afterwards we own none.
            unsafe { sys::rte_pktmbuf_free_bulk(self.v.as_mut_ptr(), self.n as u32) };
            self.n = 0;
        }
    }

    /// Forgets the first `k` (the driver took them) and keeps the rest at the front.
    fn consumed(&mut self, k: usize) {
        if k < self.n {
            self.v.copy_within(k..self.n, 0);
        }
        self.n -= k;
    }
}

impl Drop for Mbufs {
    fn drop(&mut self) {
        self.free_all();
    }
}

/// A started port's queue 0 as its burst functions see it. Re-read after every start: ethdev
/// points the table at dummies while a port is stopped (which then send and receive nothing).
#[derive(Clone, Copy)]
pub struct FastPath {
    tx: unsafe extern "C" fn(*mut c_void, *mut *mut sys::rte_mbuf, u16) -> u16,
    rx: unsafe extern "C" fn(*mut c_void, *mut *mut sys::rte_mbuf, u16) -> u16,
    txq: *mut c_void,
    rxq: *mut c_void,
}

// SAFETY: the queues behind a FastPath are used by one lcore at a time (the caller hands the
// whole FastPath to the worker for a turn and takes it back after).
unsafe impl Send for FastPath {}
// SAFETY: as above.
unsafe impl Sync for FastPath {}

impl FastPath {
    pub fn of(port: u16) -> Result<FastPath, String> {
        if u32::from(port) >= sys::RTE_MAX_ETHPORTS {
            return Err(format!("port {port} out of range"));
        }
        // SAFETY: `port` < RTE_MAX_ETHPORTS, the length of the exported array; entries are
        // written only by port start/stop on this thread.
        unsafe {
            let ops = &*(ptr::addr_of!(rte_eth_fp_ops) as *const sys::rte_eth_fp_ops)
                .add(usize::from(port));
            let (Some(tx), Some(rx)) = (ops.tx_pkt_burst, ops.rx_pkt_burst) else {
                return Err(format!("port {port}: no burst functions"));
            };
            Ok(FastPath {
                tx,
                rx,
                txq: *ops.txq.data,
                rxq: *ops.rxq.data,
            })
        }
    }

    /// Offers every owned mbuf; returns how many the driver took and the TSC cycles spent
    /// inside its `tx_burst`.
    #[inline(always)]
    pub fn tx_timed(&self, m: &mut Mbufs) -> (usize, u64) {
        let t0 = rdtsc();
        // SAFETY: the queue pointer and function come from the port's table, used by this one
        // thread; the first `n` pointers are mbufs we own, and ownership of the first `k`
        // passes to the driver.
        let k = unsafe { (self.tx)(self.txq, m.v.as_mut_ptr(), m.n as u16) } as usize;
        let t1 = rdtsc();
        m.consumed(k);
        (k, t1.wrapping_sub(t0))
    }

    /// Offers every owned mbuf; returns how many the driver took (now the driver's).
    #[inline(always)]
    pub fn tx(&self, m: &mut Mbufs) -> usize {
        // SAFETY: as for tx_timed.
        let k = unsafe { (self.tx)(self.txq, m.v.as_mut_ptr(), m.n as u16) } as usize;
        m.consumed(k);
        k
    }

    /// Receives up to `MAX_BURST` mbufs into an empty `m`.
    #[inline(always)]
    pub fn rx(&self, m: &mut Mbufs) -> usize {
        m.free_all();
        // SAFETY: as for tx; the driver writes at most MAX_BURST pointers to mbufs we then own.
        let k = unsafe { (self.rx)(self.rxq, m.v.as_mut_ptr(), MAX_BURST as u16) } as usize;
        m.n = k;
        k
    }
}
