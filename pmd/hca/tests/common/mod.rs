//! A hand-rolled driver for tests: page-aligned memory, rings and WQEs written byte by byte from
//! the spec (doc/prm.md) with tiny big-endian helpers. Deliberately independent of `mlx4_prm`'s
//! encoders so the device model is checked against the spec, not against our own code.
#![allow(dead_code)]

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use mlx4_hca::{CqAttr, Hca, HcaConfig, RqAttr, SqAttr, SqInfo, Wire};
use parking_lot::Mutex;

/// Zeroed, page-aligned memory playing the driver's DMA memory.
pub struct Mem {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain owned memory; the device reaches it only through the pointers we hand it.
unsafe impl Send for Mem {}
// SAFETY: all access goes through volatile reads and writes of in-range bytes.
unsafe impl Sync for Mem {}

impl Mem {
    pub fn new(len: usize) -> Mem {
        let len = len.max(1).next_multiple_of(4096);
        let layout = Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Mem { ptr, len }
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn put(&self, off: usize, bytes: &[u8]) {
        assert!(off + bytes.len() <= self.len);
        for (i, b) in bytes.iter().enumerate() {
            // SAFETY: in range (asserted); volatile because the device thread may read it.
            unsafe { self.ptr.add(off + i).write_volatile(*b) };
        }
    }
    pub fn get(&self, off: usize, n: usize) -> Vec<u8> {
        assert!(off + n <= self.len);
        // SAFETY: in range (asserted); volatile because the device thread may write it.
        (0..n)
            .map(|i| unsafe { self.ptr.add(off + i).read_volatile() })
            .collect()
    }
    /// Store a big-endian dword in one aligned 32-bit store (ownership words, doorbells).
    pub fn put32(&self, off: usize, v: u32) {
        assert!(off % 4 == 0 && off + 4 <= self.len);
        fence(Ordering::Release);
        // SAFETY: in range and aligned (asserted).
        unsafe { (self.ptr.add(off) as *mut u32).write_volatile(v.to_be()) };
    }
    pub fn get32(&self, off: usize) -> u32 {
        assert!(off % 4 == 0 && off + 4 <= self.len);
        // SAFETY: in range and aligned (asserted).
        let v = unsafe { (self.ptr.add(off) as *const u32).read_volatile() };
        fence(Ordering::Acquire);
        u32::from_be(v)
    }
    pub fn fill(&self, v: u8) {
        self.put(0, &vec![v; self.len]);
    }
    /// Copy `bytes` in at `off` in one go, then a release fence (benchmarks restoring a ring
    /// image; not for words the device may be reading).
    pub fn put_bulk(&self, off: usize, bytes: &[u8]) {
        assert!(off + bytes.len() <= self.len);
        // SAFETY: in range (asserted); the caller knows the device is not reading these bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(off), bytes.len()) };
        fence(Ordering::Release);
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, Layout::from_size_align(self.len, 4096).unwrap()) };
    }
}

// ------------------------------------------------------------------ WQE bytes (doc/prm.md 1.2-1.4)

/// owner_opcode dword: OWNER bit 31, opcode bits 4:0.
pub const NOP: u8 = 0x00;
pub const SEND: u8 = 0x0a;
/// srcrb flags: C = 0b11 (bits 3:2) requests a CQE, bit 1 solicited, bit 4 IP csum, bit 5 L4.
pub const SIGNALED: u8 = 0x0e;
pub const UNSIGNALED: u8 = 0x02;
pub const IP_CSUM: u8 = 0x10;
pub const L4_CSUM: u8 = 0x20;

/// Bytes 4-15 of a control segment: vlan_tag, ins_vlan, fence_size (DS), srcrb_flags, imm.
pub fn ctrl_tail(ds: u8, srcrb: u8) -> Vec<u8> {
    vec![0, 0, 0, ds, 0, 0, 0, srcrb, 0, 0, 0, 0]
}

/// Control segment tail with a VLAN insert (0x40 = C-VLAN).
pub fn ctrl_tail_vlan(ds: u8, srcrb: u8, tci: u16) -> Vec<u8> {
    let t = tci.to_be_bytes();
    vec![t[0], t[1], 0x40, ds, 0, 0, 0, srcrb, 0, 0, 0, 0]
}

/// Inline segment header: BE32(0x80000000 | len).
pub fn inline_hdr(len: usize) -> Vec<u8> {
    (0x8000_0000u32 | len as u32).to_be_bytes().to_vec()
}

/// Data segment: BE32 byte_count, BE32 lkey, BE64 addr.
pub fn dseg(len: u32, lkey: u32, addr: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&len.to_be_bytes());
    v.extend_from_slice(&lkey.to_be_bytes());
    v.extend_from_slice(&addr.to_be_bytes());
    v
}

pub fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
pub fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

// ------------------------------------------------------------------ a tiny driver

pub fn step_cfg() -> HcaConfig {
    HcaConfig {
        threaded: false,
        ..HcaConfig::default()
    }
}

pub type Frames = Arc<Mutex<Vec<Vec<u8>>>>;

/// Attach a sink wire and return where its frames land.
pub fn sink(hca: &Hca) -> Frames {
    let frames: Frames = Arc::default();
    let f = frames.clone();
    hca.set_wire(Wire::Sink(Box::new(move |b: &[u8]| {
        f.lock().push(b.to_vec())
    })))
    .unwrap();
    frames
}

/// A CQ on test memory with a software consumer.
pub struct TestCq {
    pub ring: Mem,
    pub db: Mem,
    pub cnt: u32,
    pub cqn: u32,
    pub cons: u32,
}

impl TestCq {
    pub fn new(hca: &Hca, cnt: u32) -> TestCq {
        let ring = Mem::new(cnt as usize * 32);
        let db = Mem::new(8);
        let attr = CqAttr {
            buf: ring.ptr(),
            cqe_cnt: cnt,
            set_ci_db: db.ptr() as *mut u32,
        };
        // SAFETY: the memory lives in the returned value, which tests keep past destroy/drop.
        let cqn = unsafe { hca.create_cq(&attr) }.unwrap();
        TestCq {
            ring,
            db,
            cnt,
            cqn,
            cons: 0,
        }
    }

    /// The next CQE if software owns it (owner bit == pass parity), consuming it.
    pub fn poll(&mut self) -> Option<Vec<u8>> {
        let off = (self.cons & (self.cnt - 1)) as usize * 32;
        let owner = self.ring.get(off + 31, 1)[0] & 0x80 != 0;
        if owner != (self.cons & self.cnt != 0) {
            return None;
        }
        fence(Ordering::Acquire);
        self.cons += 1;
        Some(self.ring.get(off, 32))
    }

    pub fn drain(&mut self) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| self.poll()).collect()
    }

    /// Tell the device how far we consumed (BE32, 24 bits).
    pub fn update_ci(&self) {
        self.db.put32(0, self.cons & 0xff_ffff);
    }
}

/// A send queue on test memory, posting hand-made WQEs.
pub struct TestSq {
    pub ring: Mem,
    pub cnt: u32,
    pub info: SqInfo,
    /// Producer in TXBBs.
    pub prod: u32,
    /// Next BlueFlame half (0 or 1).
    pub bf_half: usize,
}

impl TestSq {
    /// A queue whose every TXBB starts invalid for pass 0 (owner bit set, as rdma-core and our
    /// driver initialise SQ ownership): on a zeroed ring, a WQE being written in pass 0 would
    /// look owned (OWNER 0) as soon as its DS byte lands, before its opcode does.
    pub fn new(hca: &Hca, cnt: u32, cqn: u32) -> TestSq {
        let ring = Mem::new(cnt as usize * 64);
        for i in 0..cnt as usize {
            ring.put32(i * 64, u32::MAX);
        }
        TestSq::on(hca, ring, cnt, cqn)
    }

    pub fn on(hca: &Hca, ring: Mem, cnt: u32, cqn: u32) -> TestSq {
        let attr = SqAttr {
            buf: ring.ptr(),
            txbb_cnt: cnt,
            cqn,
        };
        // SAFETY: the ring lives in the returned value.
        let info = unsafe { hca.create_sq(&attr) }.unwrap();
        TestSq {
            ring,
            cnt,
            info,
            prod: 0,
            bf_half: 0,
        }
    }

    pub fn owner(&self, counter: u32) -> u32 {
        if counter & self.cnt != 0 {
            0x8000_0000
        } else {
            0
        }
    }

    /// Write a WQE at the producer: `tail` is every byte after dword 0 (so `tail[3]` is the DS
    /// byte); dword 0 (owner | opcode) is written last. Returns its counter and advances.
    pub fn write(&mut self, opcode: u8, tail: &[u8]) -> u32 {
        let ds = tail[3] & 0x3f;
        let counter = self.prod;
        self.write_at(counter, self.owner(counter) | u32::from(opcode), tail);
        self.prod += (u32::from(ds) * 16).div_ceil(64).max(1);
        counter
    }

    /// Write raw WQE bytes at `counter` with the given dword 0.
    pub fn write_at(&self, counter: u32, dw0: u32, tail: &[u8]) {
        let size = self.cnt as usize * 64;
        let off = (counter & (self.cnt - 1)) as usize * 64;
        for (i, b) in tail.iter().enumerate() {
            self.ring.put((off + 4 + i) % size, &[*b]);
        }
        self.ring.put32(off, dw0);
    }

    /// Ring the UAR doorbell: BE32(qpn << 8) at offset 0x14, one 32-bit store.
    pub fn doorbell(&self) {
        let v = (self.info.qpn << 8).to_be();
        fence(Ordering::Release);
        // SAFETY: the UAR page is 4 KiB of device memory valid while the Hca lives; 0x14 is
        // 4-aligned.
        unsafe { (self.info.uar.add(0x14) as *mut u32).write_volatile(v) };
    }

    /// The WQE at `counter` as it sits in ring memory (ALIGN(ds*16, 64) bytes).
    pub fn wqe_bytes(&self, counter: u32) -> Vec<u8> {
        let off = (counter & (self.cnt - 1)) as usize * 64;
        let ds = self.ring.get(off + 7, 1)[0] & 0x3f;
        let n = (usize::from(ds) * 16).next_multiple_of(64);
        let size = self.cnt as usize * 64;
        (0..n)
            .map(|i| self.ring.get((off + i) % size, 1)[0])
            .collect()
    }

    /// `wqe` as a BlueFlame copy of the WQE at `counter`: counter in owner_opcode bits 23:8,
    /// QPN in bytes 4-6, DS in byte 7.
    pub fn bf_image(&self, counter: u32, mut wqe: Vec<u8>) -> Vec<u8> {
        let dw0 = be32(&wqe, 0) | ((counter & 0xffff) << 8);
        wqe[0..4].copy_from_slice(&dw0.to_be_bytes());
        let ds = wqe[7] & 0x3f;
        let q = self.info.qpn;
        wqe[4..8].copy_from_slice(&[(q >> 16) as u8, (q >> 8) as u8, q as u8, ds]);
        wqe
    }

    /// The next BlueFlame half.
    fn bf_dst(&self) -> *mut u8 {
        let bf = self.info.bf.expect("BlueFlame register");
        bf.reg.wrapping_add(self.bf_half * bf.half_size)
    }

    /// Copy `wqe` to the next BlueFlame half as the driver would (see `bf_image`), in 8-byte
    /// stores, then a fence.
    pub fn bf_copy(&mut self, counter: u32, wqe: Vec<u8>) {
        let image = self.bf_image(counter, wqe);
        let order: Vec<usize> = (0..image.len() / 8).collect();
        self.bf_copy_split(&image, &order, order.len(), || {});
    }

    /// Store the 8-byte pieces of the BlueFlame copy `image` to the next half in `order` (piece
    /// indices), calling `between` once the first `landed` of them are stored, then a fence.
    pub fn bf_copy_split(
        &mut self,
        image: &[u8],
        order: &[usize],
        landed: usize,
        between: impl FnOnce(),
    ) {
        let dst = self.bf_dst();
        let mut between = Some(between);
        for (n, &i) in order.iter().enumerate() {
            if n == landed {
                fence(Ordering::SeqCst);
                between.take().expect("called once")();
            }
            let q = u64::from_ne_bytes(image[i * 8..i * 8 + 8].try_into().unwrap());
            // SAFETY: the half is `half_size` bytes of device memory and the WQE fits in it;
            // 8-aligned stores like __iowrite64_copy.
            unsafe { (dst.add(i * 8) as *mut u64).write_volatile(q) };
        }
        fence(Ordering::SeqCst);
        if let Some(f) = between {
            f();
        }
        self.bf_half ^= 1;
    }
}

/// How a BlueFlame copy reaches the register, as the driver chooses at init.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BfStore {
    /// 8-byte stores, ascending (rdma-core's `mmio_memcpy_x64`).
    Qwords,
    /// 8-byte stores, ascending except that the copy's first qword (its head) goes last, as
    /// the driver's 8-byte and SSE routines store (`Copy64::Qwords`, `Copy64::Sse`).
    QwordsHeadLast,
    /// One 64-byte AVX-512 store per block.
    Avx512,
    /// One `movdir64b` direct store per block.
    Movdir64b,
}

impl BfStore {
    /// The store the driver makes where it stores in the way of `self`: its 8-byte routine
    /// puts the head last, its 64-byte ones are as the CPU's.
    pub fn as_the_driver(self) -> BfStore {
        match self {
            BfStore::Qwords => BfStore::QwordsHeadLast,
            s => s,
        }
    }

    /// The ways this CPU can store.
    pub fn available() -> Vec<BfStore> {
        let mut v = vec![BfStore::Qwords];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                v.push(BfStore::Avx512);
            }
            // movdir64b: cpuid leaf 7, ECX bit 28.
            if core::arch::x86_64::__cpuid_count(7, 0).ecx & (1 << 28) != 0 {
                v.push(BfStore::Movdir64b);
            }
        }
        v
    }

    /// Store the 64-byte block `src` at `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for a 64-byte write and 64-byte aligned; the CPU must support the
    /// store (see `available`).
    unsafe fn store(self, dst: *mut u8, src: &[u8; 64]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            BfStore::Avx512 => {
                // SAFETY: the caller checked the CPU; both pointers valid for 64 bytes.
                unsafe { store_avx512(dst, src.as_ptr()) }
            }
            #[cfg(target_arch = "x86_64")]
            BfStore::Movdir64b => {
                let tmp = Aligned(*src);
                // SAFETY: the caller checked the CPU; `dst` 64-byte aligned as required.
                unsafe {
                    core::arch::asm!(
                        "movdir64b {dst}, [{src}]",
                        dst = in(reg) dst,
                        src = in(reg) tmp.0.as_ptr(),
                        options(nostack, preserves_flags)
                    )
                };
            }
            _ => {
                for (i, chunk) in src.chunks_exact(8).enumerate() {
                    let q = u64::from_ne_bytes(chunk.try_into().unwrap());
                    // SAFETY: inside the 64-byte block, 8-aligned.
                    unsafe { (dst.add(i * 8) as *mut u64).write_volatile(q) };
                }
            }
        }
    }
}

#[repr(C, align(64))]
struct Aligned([u8; 64]);

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn store_avx512(dst: *mut u8, src: *const u8) {
    // SAFETY: the caller guarantees AVX-512F and 64 valid bytes on both sides.
    unsafe {
        core::arch::asm!(
            "vmovdqu64 {z}, [{src}]",
            "vmovdqu64 [{dst}], {z}",
            src = in(reg) src,
            dst = in(reg) dst,
            z = out(zmm_reg) _,
            options(nostack, preserves_flags)
        )
    };
}

impl TestSq {
    /// Copy `wqe` to the next BlueFlame half as the driver does, with `how`: counter and QPN
    /// in the copy, whole 64-byte blocks in order, then a store fence.
    pub fn bf_copy_with(&mut self, how: BfStore, counter: u32, wqe: Vec<u8>) {
        let wqe = self.bf_image(counter, wqe);
        let dst = self.bf_dst();
        fence(Ordering::SeqCst);
        if how == BfStore::QwordsHeadLast {
            let order: Vec<usize> = (1..wqe.len() / 8).chain([0]).collect();
            return self.bf_copy_split(&wqe, &order, order.len(), || {});
        }
        for (i, block) in wqe.chunks_exact(64).enumerate() {
            // SAFETY: the half is `half_size` bytes of 4 KiB-aligned device memory and the WQE
            // fits in it; the caller picked a store this CPU has.
            unsafe { how.store(dst.add(i * 64), block.try_into().unwrap()) };
        }
        fence(Ordering::SeqCst);
        self.bf_half ^= 1;
    }
}

/// A receive queue on test memory with `sges` entries per WQE.
pub struct TestRq {
    pub ring: Mem,
    pub db: Mem,
    pub cnt: u32,
    pub sges: u32,
    pub qpn: u32,
    pub prod: u32,
}

impl TestRq {
    pub fn new(hca: &Hca, cnt: u32, sges: u32, cqn: u32) -> TestRq {
        let ring = Mem::new(cnt as usize * sges as usize * 16);
        let db = Mem::new(4);
        let attr = RqAttr {
            buf: ring.ptr(),
            wqe_cnt: cnt,
            sges,
            cqn,
            db_rec: db.ptr() as *mut u32,
        };
        // SAFETY: ring and record live in the returned value.
        let qpn = unsafe { hca.create_rq(&attr) }.unwrap();
        TestRq {
            ring,
            db,
            cnt,
            sges,
            qpn,
            prod: 0,
        }
    }

    /// Post one WQE whose entries are `(size, lkey, addr)`; unused entries get lkey 0x100.
    pub fn post(&mut self, entries: &[(u32, u32, u64)]) {
        let base = (self.prod & (self.cnt - 1)) as usize * self.sges as usize * 16;
        for i in 0..self.sges as usize {
            let e = match entries.get(i) {
                Some(&(n, k, a)) => dseg(n, k, a),
                None => dseg(0, 0x100, 0),
            };
            self.ring.put(base + i * 16, &e);
        }
        self.prod += 1;
        self.db.put32(0, self.prod & 0xffff);
    }
}

/// Packet memory registered with the device.
pub struct Pkts {
    pub mem: Mem,
    pub lkey: u32,
}

impl Pkts {
    pub fn new(hca: &Hca, len: usize) -> Pkts {
        let mem = Mem::new(len);
        // SAFETY: the memory lives in the returned value; tests deregister or drop the Hca first.
        let lkey = unsafe { hca.reg_mr(mem.ptr(), mem.len()) }.unwrap();
        Pkts { mem, lkey }
    }
}

/// A TCP/IPv4 frame with correct IPv4 (0x1490) and TCP (0x6d20) checksums, computed
/// independently of this crate.
pub const TCP4: &str = "02000000000202000000000108004500003212344000400614900a0000010a00000204d2005000000001000000005002ffff6d20000068656c6c6f206d6c7834";
/// A VLAN 100 tagged UDP/IPv6 frame with a correct UDP checksum (0x0d23), computed independently.
pub const UDP6_VLAN: &str = "0200000000020200000000018100006486dd6000000000111140fe800000000000000000000000000001fe8000000000000000000000000000021388177000110d23636865636b73756d21";

pub fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

// ---- send queues -----------------------------------------------------------------------

/// A device opened with `cfg`, with one CQ of `cqes` entries and one SQ of `txbbs` TXBBs on it.
pub fn sq_rig(cfg: HcaConfig, txbbs: u32, cqes: u32) -> (Hca, TestCq, TestSq) {
    let hca = Hca::open(cfg).unwrap();
    let cq = TestCq::new(&hca, cqes);
    let sq = TestSq::new(&hca, txbbs, cq.cqn);
    (hca, cq, sq)
}

/// Check a TX CQE: S/R set, opcode, WQE counter and QPN.
pub fn assert_tx_cqe(cqe: &[u8], qpn: u32, opcode: u8, wqe_index: u16) {
    assert_eq!(be32(cqe, 0) & 0xff_ffff, qpn, "qpn");
    assert_eq!(cqe[31] & 0x40, 0x40, "S/R bit");
    assert_eq!(cqe[31] & 0x1f, opcode, "opcode");
    assert_eq!(be16(cqe, 24), wqe_index, "wqe_index");
}

/// A frame as an inline WQE split at the 64-byte boundary: 44 bytes after the control segment,
/// the rest behind a second header at offset 64.
pub fn inline_wqe(frame: &[u8], srcrb: u8) -> Vec<u8> {
    let first = frame.len().min(44);
    let mut size = 16 + 4 + first;
    if frame.len() > 44 {
        size = 64 + 4 + (frame.len() - 44);
    }
    let ds = size.div_ceil(16) as u8;
    let mut t = ctrl_tail(ds, srcrb);
    t.extend(inline_hdr(first));
    t.extend(&frame[..first]);
    if frame.len() > 44 {
        assert!(frame.len() - 44 <= 60);
        t.extend(inline_hdr(frame.len() - 44));
        t.extend(&frame[44..]);
    }
    t.resize(usize::from(ds) * 16 - 4, 0);
    t
}

/// A VXLAN frame: outer IPv4/UDP to 4789 (UDP checksum 0), VXLAN VNI 42, inner Ethernet/IPv4/
/// TCP with both inner checksums and the outer IP checksum left zero.
pub fn vxlan_frame() -> Vec<u8> {
    let payload = b"inner payload!";
    let mut tcp = vec![0u8; 20];
    tcp[0..2].copy_from_slice(&1234u16.to_be_bytes());
    tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
    tcp[12] = 0x50;
    tcp[13] = 0x18;
    tcp.extend_from_slice(payload);
    let ip = |proto: u8, src: [u8; 4], dst: [u8; 4], len: usize| {
        let mut h = vec![0u8; 20];
        h[0] = 0x45;
        h[2..4].copy_from_slice(&((20 + len) as u16).to_be_bytes());
        h[8] = 64;
        h[9] = proto;
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&dst);
        h
    };
    let mut inner = vec![2, 0, 0, 0, 0, 0xb, 2, 0, 0, 0, 0, 0xa, 0x08, 0x00];
    inner.extend(ip(6, [192, 168, 0, 1], [192, 168, 0, 2], tcp.len()));
    inner.extend(&tcp);
    let mut vx = vec![0x08, 0, 0, 0, 0, 0, 42, 0];
    vx.extend(&inner);
    let mut udp = vec![0u8; 8];
    udp[0..2].copy_from_slice(&40000u16.to_be_bytes());
    udp[2..4].copy_from_slice(&4789u16.to_be_bytes());
    udp[4..6].copy_from_slice(&((8 + vx.len()) as u16).to_be_bytes());
    udp.extend(&vx);
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    f.extend(ip(17, [10, 0, 0, 1], [10, 0, 0, 2], udp.len()));
    f.extend(&udp);
    f
}
