//! Device memory the opener provides (as DPDK shared memory would be): the adapter carves its
//! UAR pages, BlueFlame registers, counters and receive buffer from it, and another process
//! with nothing but that memory reads the counters and rings the doorbells.

mod common;

use std::ffi::CString;
use std::time::{Duration, Instant};

use common::*;
use mlx4_hca::{Bar, Counters, Hca, HcaConfig, Wire};

/// A file in /dev/shm mapped shared: memory two processes can both map.
struct Shm {
    ptr: *mut u8,
    len: usize,
    path: String,
    owner: bool,
}

impl Shm {
    fn create(len: usize) -> Shm {
        let path = format!(
            "/dev/shm/mlx4_hca_bar_{}_{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        );
        let f = std::fs::File::create(&path).expect("a file in /dev/shm");
        f.set_len(len as u64).unwrap();
        drop(f);
        Shm::map(&path, len, true)
    }

    fn map(path: &str, len: usize, owner: bool) -> Shm {
        let c = CString::new(path).unwrap();
        // SAFETY: a valid C string; the fd is closed below and the mapping kept until drop.
        let ptr = unsafe {
            let fd = libc::open(c.as_ptr(), libc::O_RDWR);
            assert!(fd >= 0, "open {path}");
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            libc::close(fd);
            assert_ne!(p, libc::MAP_FAILED, "mmap {path}");
            p.cast::<u8>()
        };
        Shm {
            ptr,
            len,
            path: path.to_owned(),
            owner,
        }
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: mapped in `map` with this length.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
        if self.owner {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn cfg() -> HcaConfig {
    HcaConfig {
        uars: 4,
        rx_inbox_frames: 16,
        ..step_cfg()
    }
}

#[test]
fn an_adapter_runs_on_device_memory_its_opener_provides() {
    let cfg = cfg();
    let len = Bar::required_len(&cfg);
    assert_eq!(len % 4096, 0);
    let mem = Mem::new(len);
    // SAFETY: `mem` outlives the adapter (dropped at the end of the test, after `hca`).
    let bar = unsafe { Bar::from_raw(mem.ptr(), len) }.unwrap();
    let hca = Hca::open_on(cfg.clone(), bar).unwrap();
    let bar = hca.bar();
    assert_eq!((bar.base(), bar.len()), (mem.ptr(), len));
    hca.set_wire(Wire::Loop).unwrap();
    let mut cq = TestCq::new(&hca, 16);
    let mut sq = TestSq::new(&hca, 64, cq.cqn);
    // The queue's device pages are in the memory given.
    let uar = bar.offset_of(sq.info.uar).expect("UAR page inside");
    let bf = bar
        .offset_of(sq.info.bf.unwrap().reg)
        .expect("BF register inside");
    assert_eq!((uar % 4096, bf % 256), (0, 0));
    assert_eq!(bar.at(uar), Some(sq.info.uar));
    // Four UAR pages: four send queues at most.
    let more: Vec<TestSq> = (0..3).map(|_| TestSq::new(&hca, 4, cq.cqn)).collect();
    let ring = Mem::new(4096);
    let attr = mlx4_hca::SqAttr {
        buf: ring.ptr(),
        txbb_cnt: 4,
        cqn: cq.cqn,
    };
    // SAFETY: refused, so nothing is kept.
    let refused = unsafe { hca.create_sq(&attr) };
    assert!(matches!(refused, Err(mlx4_hca::HcaError::NoResources(_))));
    drop(more);
    // 20 frames looped back to a port with no RX queue: its 16-frame receive buffer refuses
    // 4, the other 16 find no RX WQE. The counters in the memory say so.
    for i in 0..20 {
        sq.write(SEND, &{
            let mut t = ctrl_tail(4, if i == 19 { SIGNALED } else { UNSIGNALED });
            t.extend(inline_hdr(40));
            t.extend([0xab; 40]);
            t.resize(60, 0);
            t
        });
    }
    sq.doorbell();
    hca.step();
    assert_eq!(cq.drain().len(), 1);
    let live = hca.counters();
    assert_eq!(
        (live.tx_frames, live.rx_drops_wire, live.rx_drops_no_wqe),
        (20, 4, 16)
    );
    assert_eq!(bar.counters(), live);
    // Too little memory, or misaligned, is refused.
    // SAFETY: refused before anything is kept.
    let small = unsafe { Bar::from_raw(mem.ptr(), len - 4096) }.unwrap();
    assert!(Hca::open_on(cfg.clone(), small).is_err());
    // SAFETY: refused.
    assert!(unsafe { Bar::from_raw(mem.ptr().wrapping_add(8), len) }.is_err());
    // Memory that holds no adapter is no BAR.
    let blank = Mem::new(8192);
    // SAFETY: only read.
    assert!(unsafe { Bar::attach(blank.ptr(), 8192) }.is_err());
    drop(hca);
    drop(bar);
}

/// Where the child finds things in the shared file (byte offsets), passed in the environment.
const ENV: &str = "MLX4_HCA_BAR_CHILD";

/// Run in a second process by `another_process_...`: with only the shared file, read the
/// counters and post NOPs on the SQ whose ring lives in the file too.
#[test]
#[ignore = "run by another_process_reads_counters_and_rings_doorbells_from_device_memory"]
fn bar_child() {
    let spec = std::env::var(ENV).expect("MLX4_HCA_BAR_CHILD: run by the parent test only");
    let v: Vec<String> = spec.split(',').map(str::to_owned).collect();
    let (path, len) = (&v[0], v[1].parse::<usize>().unwrap());
    let n: Vec<usize> = v[2..].iter().map(|x| x.parse().unwrap()).collect();
    let (bar_len, ring_off, uar_off, qpn, posts) = (n[0], n[1], n[2], n[3] as u32, n[4]);
    let shm = Shm::map(path, len, false);
    // SAFETY: the file stays mapped until `shm` drops, after `bar`.
    let bar = unsafe { Bar::attach(shm.ptr, bar_len) }.expect("a BAR in the file");
    for (name, value) in bar.counters().iter() {
        println!("counter {name}={value}");
    }
    // Post NOPs, the second half of a 64-TXBB ring's first pass, and ring the doorbell at
    // the same offset in this mapping.
    let ring = shm.ptr.wrapping_add(ring_off);
    for i in 0..posts {
        let slot = 32 + i;
        let wqe = ring.wrapping_add(slot * 64);
        let tail = ctrl_tail(1, SIGNALED);
        for (k, b) in tail.iter().enumerate() {
            // SAFETY: inside the ring in the mapped file.
            unsafe { wqe.add(4 + k).write_volatile(*b) };
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        // SAFETY: the owner word, 4-aligned; pass 0, opcode NOP.
        unsafe { wqe.cast::<u32>().write_volatile(0) };
    }
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
    let db = bar.at(uar_off + 0x14).expect("the UAR page");
    // SAFETY: the send doorbell word of the SQ's UAR page, in the mapping.
    unsafe { db.cast::<u32>().write_volatile((qpn << 8).to_be()) };
    drop(bar);
}

#[test]
fn another_process_reads_counters_and_rings_doorbells_from_device_memory() {
    let cfg = HcaConfig {
        threaded: true,
        ..cfg()
    };
    let bar_len = Bar::required_len(&cfg);
    // The file: the device memory, then an SQ ring of 64 TXBBs, then its CQ and CI record.
    let ring_off = bar_len;
    let cq_off = ring_off + 64 * 64;
    let db_off = cq_off + 64 * 32;
    let len = db_off + 4096;
    let shm = Shm::create(len);
    // SAFETY: the file stays mapped until `shm` drops, after the adapter.
    let bar = unsafe { Bar::from_raw(shm.ptr, bar_len) }.unwrap();
    let hca = Hca::open_on(cfg, bar).unwrap();
    hca.set_wire(Wire::Loop).unwrap();
    let cq_attr = mlx4_hca::CqAttr {
        buf: shm.ptr.wrapping_add(cq_off),
        cqe_cnt: 64,
        set_ci_db: shm.ptr.wrapping_add(db_off).cast(),
    };
    // SAFETY: inside the mapping, which outlives the adapter.
    let cqn = unsafe { hca.create_cq(&cq_attr) }.unwrap();
    let ring = shm.ptr.wrapping_add(ring_off);
    for i in 0..64 {
        // SAFETY: every TXBB's owner word starts invalid for pass 0.
        unsafe { ring.add(i * 64).cast::<u32>().write_volatile(u32::MAX) };
    }
    let sq_attr = mlx4_hca::SqAttr {
        buf: ring,
        txbb_cnt: 64,
        cqn,
    };
    // SAFETY: as above.
    let info = unsafe { hca.create_sq(&sq_attr) }.unwrap();
    hca.start().unwrap();
    // Some traffic of our own first: 32 NOPs (slots 0-31) and some frames with nowhere to go.
    for i in 0..32usize {
        let wqe = ring.wrapping_add(i * 64);
        for (k, b) in ctrl_tail(1, UNSIGNALED).iter().enumerate() {
            // SAFETY: inside the ring.
            unsafe { wqe.add(4 + k).write_volatile(*b) };
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        // SAFETY: owner word of pass 0, NOP.
        unsafe { wqe.cast::<u32>().write_volatile(0) };
    }
    // SAFETY: the doorbell word of the SQ's UAR page.
    unsafe {
        info.uar
            .add(0x14)
            .cast::<u32>()
            .write_volatile((info.qpn << 8).to_be())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while hca.counters().txbbs < 32 {
        assert!(Instant::now() < deadline, "the device ran nothing");
        std::thread::yield_now();
    }
    let ours = hca.counters();
    let uar_off = hca.bar().offset_of(info.uar).unwrap();
    let spec = format!(
        "{},{len},{bar_len},{ring_off},{uar_off},{},{}",
        shm.path, info.qpn, 8
    );
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "bar_child", "--nocapture"])
        .env(ENV, spec)
        .output()
        .expect("the test binary runs again as the other process");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It read the same counters from the memory alone.
    let values: Vec<u64> = Counters::NAMES
        .iter()
        .map(|n| {
            let key = format!("counter {n}=");
            let line = text
                .lines()
                .find_map(|l| l.find(&key).map(|at| &l[at + key.len()..]))
                .unwrap_or_else(|| panic!("no {n} in the child's output: {text}"));
            line.trim().parse().unwrap()
        })
        .collect();
    assert_eq!(Counters::from_values(&values), ours);
    // Its doorbell, on its own mapping of the UAR page, ran its 8 signaled NOPs here.
    let cq = shm.ptr.wrapping_add(cq_off);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = 0;
    while seen < 8 {
        assert!(
            Instant::now() < deadline,
            "the other process's WQEs did not run"
        );
        // SAFETY: CQE owner bytes inside the mapped CQ.
        let owner = unsafe { cq.add(seen * 32 + 31).read_volatile() };
        if owner & 0x80 == 0 {
            // SAFETY: as above; pass-0 CQEs are software-owned with OWNER 0.
            let idx = unsafe {
                u16::from_be_bytes([
                    cq.add(seen * 32 + 24).read_volatile(),
                    cq.add(seen * 32 + 25).read_volatile(),
                ])
            };
            assert_eq!(usize::from(idx), 32 + seen);
            seen += 1;
        } else {
            std::thread::yield_now();
        }
    }
    let after = hca.counters();
    assert_eq!((after.doorbells, after.txbbs), (2, 40));
    hca.stop();
    drop(hca);
}
