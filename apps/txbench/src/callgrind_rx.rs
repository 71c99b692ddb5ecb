//! Instruction counts of `rx_burst` (`--callgrind --rx`): the driver's RX queue against the
//! software HCA in step mode on a looped wire, in this one thread, without EAL, the way
//! `callgrind.rs` counts `tx_burst`. A TX queue sends a burst of frames, the device loops
//! them back onto the receive ring, and only `measured_rx_burst` (the RX queue's burst, the
//! refill from the pool included) is collected. The pool is a stack of buffer indexes over
//! one registered arena: popping and pushing an index is about what a mempool's per-lcore
//! cache costs per buffer.

use std::cell::Cell;
use std::mem::MaybeUninit;

use mlx4rs::hca::{HcaConfig, Wire};
use mlx4rs::hw::Device;
use mlx4rs::mem::MemSource;
use mlx4rs::rxq::{RxBuf, RxConfig, RxMeta, RxQueue};
use mlx4rs::txq::{TxPath, TxQueue};

use crate::opts::Callgrind;
use mlx4rs_testkit::{tx_config, Plain, Scratch};

/// Bytes per buffer and the headroom before the data, as an mbuf pool would have them.
const BUF: usize = 2048;
const HEADROOM: usize = 128;

/// The buffers: an arena, a stack of free indexes, and what an mbuf would record.
struct Pool {
    /// Address of the arena, which only the device writes (registered whole).
    arena: usize,
    free: Vec<Cell<u32>>,
    top: Cell<usize>,
    meta: Vec<Cell<(u32, u32)>>,
}

#[derive(Clone, Copy)]
struct Buf(u32, &'static Pool);

// SAFETY: alloc_bulk writes every entry of `out` before it returns true.
unsafe impl RxBuf for Buf {
    type Pool = &'static Pool;

    #[inline]
    fn alloc_bulk(pool: &'static Pool, out: &mut [MaybeUninit<Self>]) -> bool {
        let (top, n) = (pool.top.get(), out.len());
        if top < n {
            return false;
        }
        for (o, f) in out.iter_mut().zip(&pool.free[top - n..top]) {
            o.write(Buf(f.get(), pool));
        }
        pool.top.set(top - n);
        true
    }

    unsafe fn free_bulk(bufs: &[Self]) {
        for b in bufs {
            let p = b.1;
            p.free[p.top.get()].set(b.0);
            p.top.set(p.top.get() + 1);
        }
    }

    #[inline]
    fn data_area(&self) -> (usize, u32) {
        (
            self.1.arena + self.0 as usize * BUF + HEADROOM,
            (BUF - HEADROOM) as u32,
        )
    }

    #[inline]
    fn set_segment(&mut self, len: u32, _next: Option<Self>) {
        let m = &self.1.meta[self.0 as usize];
        m.set((len, m.get().1));
    }

    #[inline]
    fn set_packet(&mut self, pkt_len: u32, _nb_segs: u16, _port: u16, _meta: &RxMeta) {
        let m = &self.1.meta[self.0 as usize];
        m.set((m.get().0, pkt_len));
    }

    /// Both lengths in one store, as an mbuf's are written from a template.
    #[inline]
    fn set_single(&mut self, len: u32, _port: u16, _meta: &RxMeta) {
        self.1.meta[self.0 as usize].set((len, len));
    }
}

/// The one function callgrind collects.
#[inline(never)]
fn measured_rx_burst(q: &mut RxQueue<Buf>, out: &mut [Buf]) -> usize {
    q.burst(out)
}

pub fn run(c: &Callgrind) -> Result<(), String> {
    let s = Scratch::open("txbench-callgrind-rx-", HcaConfig::default(), Wire::Loop)?;
    let nbufs = 4096usize;
    let arena: &'static mut [u8] = vec![0u8; nbufs * BUF].leak();
    let pool: &'static Pool = Box::leak(Box::new(Pool {
        arena: arena.as_ptr() as usize,
        free: (0..nbufs as u32).map(Cell::new).collect(),
        top: Cell::new(nbufs),
        meta: (0..nbufs).map(|_| Cell::new((0, 0))).collect(),
    }));
    let mr = s
        .dev
        .reg_mr(mlx4rs::mem::DmaRange::of_static(arena))
        .map_err(|e| e.to_string())?;
    let burst = usize::from(c.burst);
    let frames: &'static [u8] = (0..usize::from(c.size) * burst)
        .map(|i| (i * 7) as u8)
        .collect::<Vec<u8>>()
        .leak();
    let pkts: Vec<Plain> = frames.chunks(usize::from(c.size)).map(Plain).collect();
    // SAFETY: the scratch device outlives the queue, which is destroyed on it or leaked.
    let mut tx: TxQueue<Plain> =
        unsafe { s.txq("txbench-rx", 1024, tx_config(TxPath::Doorbell, 928), &[]) }?;
    // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
    let mut rx: RxQueue<Buf> = unsafe {
        RxQueue::new(
            &s.dev,
            0,
            1024,
            RxConfig {
                sges: 1,
                csum: true,
                rss: false,
                keep_crc: false,
                tunnel: false,
                port_id: 0,
                source: MemSource::Heap,
            },
            pool,
            &[mr],
        )
    }
    .map_err(|e| e.to_string())?;
    let mut out: Vec<Buf> = vec![Buf(0, pool); burst];
    let mut received = 0u64;
    while received < c.packets {
        let n = (c.packets - received).min(burst as u64) as usize;
        // SAFETY: `Plain` borrows a leaked frame and its release frees nothing.
        if unsafe { tx.burst(&pkts[..n]) } != n {
            return Err("the TX queue refused a burst".into());
        }
        s.step();
        let k = measured_rx_burst(&mut rx, &mut out[..n]);
        if k != n {
            return Err(format!("received {k} of {n} frames"));
        }
        for b in &out[..k] {
            let (len, pkt_len) = b.1.meta[b.0 as usize].get();
            if len != u32::from(c.size) || pkt_len != len {
                return Err(format!("a {len}-byte frame for {} bytes sent", c.size));
            }
        }
        // SAFETY: the frames just received are ours, each once.
        unsafe { Buf::free_bulk(&out[..k]) };
        received += k as u64;
    }
    let st = rx.stats();
    println!(
        "callgrind RX mode: size {} burst {} packets {received} rx errors {} nombuf {}",
        c.size, c.burst, st.errors, st.nombuf
    );
    rx.destroy(&s.dev);
    tx.destroy(&s.dev);
    Ok(())
}
