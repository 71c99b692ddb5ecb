//! Finding and opening a card: the verbs devices of a PCI function, a context per Ethernet
//! port with its protection domain, BlueFlame page and queue-memory allocator.
#![allow(unsafe_code)]

use super::*;

/// One verbs device of the list, with what the probe needs of it.
struct Candidate {
    dev: *mut sys::ibv_device,
    name: String,
    path: PathBuf,
}

/// Opens every Ethernet port of the ConnectX-3 at PCI address `pci` (`0000:05:00.0`), named as
/// DPDK's mlx4 names them (`mlx4_0 port 1`). The error is one line naming what is missing
/// and how to get it.
pub fn open_pci(pci: &str) -> Result<Vec<(String, Verbs)>, HwError> {
    let rdma = Rdma::get().map_err(HwError::Device)?;
    let mut n: c_int = 0;
    // SAFETY: rdma-core call with a valid out pointer.
    let list = unsafe { rdma.ibv.ibv_get_device_list(&mut n) };
    if list.is_null() {
        let e = errno();
        return Err(HwError::Device(if e == libc::ENOSYS {
            "cannot list verbs devices: the kernel's ib_uverbs is not loaded (modprobe ib_uverbs \
             mlx4_ib)"
                .to_owned()
        } else {
            format!("cannot list verbs devices: {}", strerror(e))
        }));
    }
    let mut seen = Vec::new();
    let mut found = None;
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` live devices.
        let dev = unsafe { *list.add(i) };
        // SAFETY: a live device's name and path are NUL-terminated arrays.
        let (name, path) = unsafe {
            (
                rdma::c_str(rdma.ibv.ibv_get_device_name(dev)),
                rdma::c_str((*dev).ibdev_path.as_ptr()),
            )
        };
        let path = PathBuf::from(path);
        let slot = netdev::pci_slot(&path);
        seen.push(format!(
            "{name} ({})",
            slot.as_deref().unwrap_or("no PCI address")
        ));
        if slot.as_deref() == Some(&pci.to_lowercase()) && found.is_none() {
            found = Some(Candidate { dev, name, path });
        }
    }
    let result = match found {
        None => Err(HwError::Device(format!(
            "no verbs device is PCI {pci} (rdma-core lists {}): load mlx4_core, mlx4_en and \
             mlx4_ib (modprobe mlx4_ib) and check that rdma-core sees it (ibv_devices)",
            if seen.is_empty() {
                "none".to_owned()
            } else {
                seen.join(", ")
            }
        ))),
        Some(c) => open_ports(rdma, &c),
    };
    // SAFETY: the list from ibv_get_device_list, freed once; opened contexts keep their
    // device.
    unsafe { rdma.ibv.ibv_free_device_list(list) };
    result
}

fn open_ctx(rdma: &Rdma, c: &Candidate) -> Result<*mut sys::ibv_context, HwError> {
    // SAFETY: a live device of the list.
    let ctx = unsafe { rdma.ibv.ibv_open_device(c.dev) };
    if !ctx.is_null() {
        return Ok(ctx);
    }
    let e = errno();
    Err(HwError::Device(match e {
        libc::EACCES | libc::EPERM => format!(
            "no permission to open verbs device {} (/dev/infiniband/uverbs*): run as root, or \
             give the user read-write access to /dev/infiniband and a memlock limit (ulimit -l)",
            c.name
        ),
        _ => format!("cannot open verbs device {}: {}", c.name, strerror(e)),
    }))
}

/// `ibv_device_attr::fw_ver` ("2.42.5000") in mlx4's encoding; 0 if it is not three numbers.
fn parse_fw_ver(raw: &[std::ffi::c_char]) -> u64 {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let text = String::from_utf8_lossy(&bytes);
    let parts: Vec<u64> = text
        .trim()
        .split('.')
        .map_while(|p| p.parse().ok())
        .collect();
    match parts[..] {
        [a, b, c] if b <= 0xffff && c <= 0xffff => a << 32 | b << 16 | c,
        _ => 0,
    }
}

fn open_ports(rdma: &'static Rdma, c: &Candidate) -> Result<Vec<(String, Verbs)>, HwError> {
    let ctx = open_ctx(rdma, c)?;
    let mut attr = sys::ibv_device_attr::default();
    // SAFETY: a live context and an out struct.
    let rc = unsafe { rdma.ibv.ibv_query_device(ctx, &mut attr) };
    // SAFETY: the probe's context, closed once.
    unsafe { rdma.ibv.ibv_close_device(ctx) };
    if rc != 0 {
        return Err(dev_err(format!("querying {}", c.name), rc));
    }
    let caps = Caps {
        max_sq_txbbs: pow2_floor((attr.max_qp_wr.max(0) as u32).saturating_add(SQ_SPARE)),
        max_rq_wqes: pow2_floor(attr.max_qp_wr.max(0) as u32),
        max_cqes: pow2_floor((attr.max_cqe.max(0) as u32).saturating_add(1)),
        max_rq_sges: pow2_floor(attr.max_sge.max(0) as u32),
        max_wqe_size: MAX_WQE_SIZE,
        bf_reg_size: 0,
        fw_ver: parse_fw_ver(&attr.fw_ver),
        // A flow rule per address on the RSS QP (mlx4's MAC table holds 128).
        max_mac_addrs: 128,
        keep_crc: false,
        vlan_filter: false,
        tunnel_offloads: false,
    };
    let mut ports = Vec::new();
    for port in 1..=attr.phys_port_cnt {
        let name = format!("{} port {port}", c.name);
        match Verbs::open(rdma, c, port, caps, &name) {
            Ok(Some(v)) => ports.push((name, v)),
            Ok(None) => {}
            Err(e) => return Err(e),
        }
    }
    if ports.is_empty() {
        return Err(HwError::Device(format!(
            "{}: no port is in Ethernet mode (set the port type: mlx4_core's port_type_array, or \
             /sys/bus/pci/devices/<pci>/mlx4_port<N>)",
            c.name
        )));
    }
    Ok(ports)
}

impl Verbs {
    /// Port `port` in a context of its own; `None` when the port is not an Ethernet port.
    fn open(
        rdma: &'static Rdma,
        c: &Candidate,
        port: u8,
        mut caps: Caps,
        name: &str,
    ) -> Result<Option<Verbs>, HwError> {
        let ctx = open_ctx(rdma, c)?;
        let close = |e: HwError| {
            // SAFETY: our context, closed once on this error path.
            unsafe { rdma.ibv.ibv_close_device(ctx) };
            e
        };
        // SAFETY: a live context.
        let pa = match unsafe { rdma::query_port(rdma, ctx, port) } {
            Ok(a) => a,
            Err(rc) => return Err(close(dev_err(format!("{name}: querying the port"), rc))),
        };
        if u32::from(pa.link_layer) != sys::IBV_LINK_LAYER_ETHERNET {
            pmd_log!(NOTICE, "{name}: not an Ethernet port (InfiniBand), skipped");
            // SAFETY: our context, closed once; nothing was made on it.
            unsafe { rdma.ibv.ibv_close_device(ctx) };
            return Ok(None);
        }
        // SAFETY: a live context.
        let pd = unsafe { rdma.ibv.ibv_alloc_pd(ctx) };
        if pd.is_null() {
            return Err(close(dev_err(format!("{name}: allocating a PD"), errno())));
        }
        let alloc = Box::new(AllocCtx {
            socket: AtomicI32::new(-1),
        });
        let mut allocators = sys::mlx4dv_ctx_allocators {
            alloc: Some(alloc_buf),
            free: Some(free_buf),
            data: (&*alloc as *const AllocCtx).cast_mut().cast(),
        };
        // Queue memory in DPDK memory (on each queue's node, and where other processes of the
        // application find it), as DPDK's mlx4 asks for it.
        // SAFETY: a live context; libmlx4 copies the allocator triple.
        let rc = unsafe {
            rdma.dv.mlx4dv_set_context_attr(
                ctx,
                sys::MLX4DV_SET_CTX_ATTR_BUF_ALLOCATORS,
                (&mut allocators as *mut sys::mlx4dv_ctx_allocators).cast(),
            )
        };
        if rc != 0 {
            pmd_log!(
                WARNING,
                "{name}: rdma-core keeps queue memory on its own heap ({}): other processes \
                 cannot reach the queues",
                strerror(rc)
            );
        }
        // SAFETY: a live context.
        let cmd_fd = unsafe { (*ctx).cmd_fd };
        let bf = match pages::BfPage::map(cmd_fd) {
            Ok(p) => {
                caps.bf_reg_size = pages::BF_REG_SIZE as u32;
                pmd_log!(
                    INFO,
                    "{name}: BlueFlame page mapped ({} registers of {} bytes)",
                    p.registers(),
                    pages::BF_REG_SIZE
                );
                Some(p)
            }
            Err(e) => {
                pmd_log!(NOTICE, "{name}: no BlueFlame page: {e}; bf_reg_size 0");
                None
            }
        };
        let netdev = match netdev::netdev_of(&c.path, u32::from(port)) {
            Some(n) => netdev::Netdev::open(&n).ok(),
            None => {
                pmd_log!(
                    WARNING,
                    "{name}: no netdev under {}/device/net (is mlx4_en loaded?): MTU and link \
                     cannot be set",
                    c.path.display()
                );
                None
            }
        };
        Ok(Some(Verbs {
            rdma,
            name: name.to_owned(),
            ctx,
            pd,
            port,
            caps,
            netdev,
            bf,
            alloc,
            st: Mutex::new(State::default()),
        }))
    }
}
