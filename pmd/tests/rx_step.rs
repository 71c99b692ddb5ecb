//! The RX path against the software HCA in step mode, without EAL: frames sent over a looped
//! wire come back byte for byte (scattered over small buffers when they must be), a dry pool
//! drops and counts frames without losing ring slots, and every buffer is accounted for.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU32, Ordering};

use mlx4rs::hca::{Hca, HcaConfig, Wire};
use mlx4rs::hw::soft::Soft;
use mlx4rs::hw::{Device, QueueState};
use mlx4rs::mem::{DmaRange, MemSource, Mr};
use mlx4rs::mmio::Copy64;
use mlx4rs::rxq::{RxBuf, RxConfig, RxQueue};
use mlx4rs::txq::{TxConfig, TxPath, TxQueue};

mod rx_buf;
use rx_buf::{arena_range, free_count, set_geometry, with_pool, Buf, Pkt, NBUFS};

const BUF: usize = 512;
const HEADROOM: usize = 64;

/// The bytes of a received chain, checking its bookkeeping.
fn bytes_of(head: Buf) -> Vec<u8> {
    let m0 = head.rec();
    let mut out = Vec::new();
    let mut cur = Some(head.0);
    let mut segs = 0;
    while let Some(i) = cur {
        out.extend_from_slice(&Buf(i).data());
        cur = Buf(i).rec().next;
        segs += 1;
    }
    assert_eq!(out.len() as u32, m0.pkt_len);
    assert_eq!(segs, m0.nb_segs);
    out
}

fn chain_ids(head: Buf) -> Vec<Buf> {
    let mut v = Vec::new();
    let mut cur = Some(head.0);
    while let Some(i) = cur {
        v.push(Buf(i));
        cur = Buf(i).rec().next;
    }
    v
}

static N: AtomicU32 = AtomicU32::new(0);

struct Rig {
    hca: Hca,
    /// The driver's view of `hca`: it owns the queues' memory.
    dev: Soft,
    tx: ManuallyDrop<TxQueue<Pkt>>,
    rx: ManuallyDrop<RxQueue<Buf>>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        // SAFETY: each queue is taken once, here, and never touched again.
        let (tx, rx) = unsafe {
            (
                ManuallyDrop::take(&mut self.tx),
                ManuallyDrop::take(&mut self.rx),
            )
        };
        tx.destroy(&self.dev);
        rx.destroy(&self.dev);
    }
}

fn rig(sges: u32) -> Rig {
    rig_with_mr(sges, NBUFS)
}

/// As `rig`, with only the first `registered` buffers of the arena registered.
fn rig_with_mr(sges: u32, registered: usize) -> Rig {
    set_geometry(BUF, HEADROOM);
    let hca = Hca::open(HcaConfig {
        threaded: false,
        name: format!("rx_step{}", N.fetch_add(1, Ordering::Relaxed)),
        ..HcaConfig::default()
    })
    .unwrap();
    hca.set_wire(Wire::Loop).unwrap();
    hca.start().unwrap();
    hca.set_port_up(true);
    hca.set_mtu(9000).unwrap();
    let (start, end) = arena_range(registered);
    let dev = Soft::new(hca.clone(), MemSource::Heap);
    // SAFETY: the pool's arena is a thread-local that outlives every queue of the thread.
    let mr: Mr = dev.reg_mr(unsafe { DmaRange::new(start, end) }).unwrap();
    // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
    let tx = unsafe {
        TxQueue::new(
            &dev,
            "rx_step",
            0,
            256,
            TxConfig {
                inline_max: 928,
                path: TxPath::Doorbell,
                copy: Copy64::best(),
                fast_free: false,
                source: MemSource::Heap,
            },
            &[],
        )
    }
    .unwrap();
    // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
    let rx = unsafe {
        RxQueue::new(
            &dev,
            0,
            256,
            RxConfig {
                sges,
                csum: true,
                rss: false,
                keep_crc: false,
                tunnel: false,
                port_id: 0,
                source: MemSource::Heap,
            },
            (),
            &[mr],
        )
    }
    .unwrap();
    Rig {
        hca,
        dev,
        tx: ManuallyDrop::new(tx),
        rx: ManuallyDrop::new(rx),
    }
}

fn frame(seed: u32, len: usize) -> Vec<u8> {
    let mut f: Vec<u8> = (0..len).map(|i| (i as u32 * 7 + seed) as u8).collect();
    f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x88, 0xb5]);
    f
}

fn send(r: &mut Rig, frames: &[Vec<u8>]) {
    let pkts: Vec<Pkt> = frames.iter().map(|f| Pkt(f.as_ptr(), f.len())).collect();
    // SAFETY: test buffers; their release frees nothing.
    assert_eq!(unsafe { r.tx.burst(&pkts) }, pkts.len());
    r.hca.step();
}

fn receive_all(r: &mut Rig) -> Vec<Buf> {
    let mut got = Vec::new();
    // What the application passes in is overwritten; a value of its own for the slots.
    let mut out = [Buf(u32::MAX); 32];
    loop {
        let moved = r.hca.step();
        let n = r.rx.burst(&mut out);
        got.extend_from_slice(&out[..n]);
        if n == 0 && moved == 0 {
            return got;
        }
    }
}

fn free_chains(heads: &[Buf]) {
    for h in heads {
        // SAFETY: the test owns the chains it received and frees each once.
        unsafe { Buf::free_bulk(&chain_ids(*h)) };
    }
}

#[test]
fn frames_come_back_whole_and_scattered() {
    let before = free_count();
    {
        let mut r = rig(4);
        let ring = free_count();
        assert_eq!(before - ring, 256, "the ring holds nb_desc buffers");
        let mut sent = Vec::new();
        for round in 0..40u32 {
            let frames: Vec<Vec<u8>> = (0..16)
                .map(|i| frame(round * 16 + i, 60 + ((round * 16 + i) as usize * 37) % 868))
                .collect();
            send(&mut r, &frames);
            sent.extend(frames);
            let got = receive_all(&mut r);
            let expect = &sent[sent.len() - 16..];
            assert_eq!(got.len(), 16, "round {round}");
            for (g, e) in got.iter().zip(expect) {
                let b = bytes_of(*g);
                assert_eq!(&b, e);
                let segs = b.len().div_ceil(BUF - HEADROOM);
                assert_eq!(chain_ids(*g).len(), segs, "scattered over {segs} buffers");
            }
            free_chains(&got);
            assert_eq!(free_count(), ring, "every refill balanced by a free");
        }
        let st = r.rx.stats();
        assert_eq!((st.packets, st.errors, st.nombuf), (640, 0, 0));
    }
    assert_eq!(free_count(), before, "queue release returned every buffer");
}

#[test]
fn one_buffer_frames_come_back_whole_in_bursts_of_every_size() {
    let before = free_count();
    {
        let mut r = rig(1);
        let ring = free_count();
        let mut sizes = [1usize, 7, 32, 64, 300].into_iter().cycle();
        let mut received = 0u64;
        for round in 0..12u32 {
            // Up to a ring's worth at once, so that the CQ and RQ wrap mid-burst.
            let n = 40 + (round as usize * 53) % 200;
            let frames: Vec<Vec<u8>> = (0..n as u32)
                .map(|i| frame(round * 1000 + i, 60 + ((round * 7 + i) as usize * 37) % 380))
                .collect();
            send(&mut r, &frames);
            let mut got = Vec::new();
            loop {
                let mut out = vec![Buf(u32::MAX); sizes.next().unwrap()];
                let k = r.rx.burst(&mut out);
                got.extend_from_slice(&out[..k]);
                if k == 0 && r.hca.step() == 0 {
                    break;
                }
            }
            assert_eq!(got.len(), n, "round {round}");
            for (g, e) in got.iter().zip(&frames) {
                assert_eq!(&bytes_of(*g), e);
                assert_eq!(chain_ids(*g).len(), 1);
            }
            free_chains(&got);
            assert_eq!(free_count(), ring, "every refill balanced by a free");
            received += n as u64;
        }
        let st = r.rx.stats();
        assert_eq!((st.packets, st.errors, st.nombuf), (received, 0, 0));
    }
    assert_eq!(free_count(), before, "queue release returned every buffer");
}

#[test]
fn dry_pool_drops_and_counts_without_losing_slots() {
    let before = free_count();
    {
        let mut r = rig(1);
        with_pool(|p| p.dry = true);
        let frames: Vec<Vec<u8>> = (0..20).map(|i| frame(i, 100)).collect();
        send(&mut r, &frames);
        assert!(receive_all(&mut r).is_empty());
        assert_eq!(r.rx.stats().nombuf, 20);
        // Bursts of one (which take the CQE the entry check saw without counting): each drops
        // one frame; once none waits, a call takes nothing and looks no further.
        let frames: Vec<Vec<u8>> = (0..5).map(|i| frame(500 + i, 100)).collect();
        send(&mut r, &frames);
        let mut one = [Buf(u32::MAX)];
        for _ in 0..8 {
            assert_eq!(r.rx.burst(&mut one), 0);
            r.hca.step();
        }
        assert_eq!(r.rx.stats().nombuf, 25);
        with_pool(|p| p.dry = false);
        // The full ring is still posted: a whole ring's worth arrives without drops.
        for chunk in 0..8 {
            let frames: Vec<Vec<u8>> = (0..32).map(|i| frame(1000 + chunk * 32 + i, 100)).collect();
            send(&mut r, &frames);
            let got = receive_all(&mut r);
            assert_eq!(got.len(), 32);
            for (g, e) in got.iter().zip(&frames) {
                assert_eq!(&bytes_of(*g), e);
            }
            free_chains(&got);
        }
        assert_eq!(r.hca.counters().rx_drops_no_wqe, 0, "no slot was lost");
    }
    assert_eq!(free_count(), before);
}

#[test]
fn too_long_without_scatter_is_an_error_and_the_slot_survives() {
    let mut r = rig(1);
    send(&mut r, &[frame(1, 900), frame(2, 200)]);
    let got = receive_all(&mut r);
    assert_eq!(got.len(), 1);
    assert_eq!(bytes_of(got[0]), frame(2, 200));
    free_chains(&got);
    assert_eq!(r.rx.stats().errors, 1);
    assert_eq!(r.hca.counters().rx_drops_too_long, 1);
}

#[test]
fn buffer_outside_registered_memory_is_never_posted() {
    // Buffers are handed out in index order: the ring takes 0..256, refills come after. Only
    // 0..300 are registered, so from the 45th frame on the refills cannot be posted, and the
    // second pass over the ring finds those slots empty.
    let mut r = rig_with_mr(1, 300);
    let mut delivered = 0;
    // Held until the end, so that refills keep coming from fresh indexes.
    let mut held = Vec::new();
    for round in 0..24u32 {
        let frames: Vec<Vec<u8>> = (0..16).map(|i| frame(round * 16 + i, 100)).collect();
        send(&mut r, &frames);
        let got = receive_all(&mut r);
        for g in &got {
            let b = bytes_of(*g);
            assert!(
                frames.contains(&b),
                "a delivered frame is one that was sent, intact"
            );
            let (addr, _) = g.data_area();
            let base = arena_range(0).0;
            assert!(
                addr < base + 300 * BUF,
                "only registered buffers were ever written"
            );
        }
        delivered += got.len();
        held.extend(got);
    }
    free_chains(&held);
    let st = r.rx.stats();
    assert!(
        st.errors > 0,
        "refills outside registered memory are counted"
    );
    assert_eq!(delivered, 300, "one frame per registered buffer");
    // Refills that could not be posted (frames 45..=300), then frames that met empty slots.
    assert_eq!(st.errors, (300 - 44) + (384 - 300), "{st:?}");
    assert!(
        r.hca.counters().rx_drops_too_long > 0,
        "slots left empty refuse frames"
    );
}

#[test]
fn receive_resumes_after_the_queue_is_reset() {
    // A port stop resets every RX queue onto fresh device queues with the same buffers. The CQ
    // consumer record must start over with the CQ, or the device sees the new CQ as full and
    // holds every frame back (stop/start killed receive once a frame had been received).
    let before = free_count();
    {
        let mut r = rig(1);
        for cycle in 0..5u32 {
            let frames: Vec<Vec<u8>> = (0..40).map(|i| frame(cycle * 40 + i, 90)).collect();
            send(&mut r, &frames);
            let got = receive_all(&mut r);
            assert_eq!(got.len(), 40, "cycle {cycle}: every frame received");
            for (g, e) in got.iter().zip(&frames) {
                assert_eq!(&bytes_of(*g), e);
            }
            free_chains(&got);
            r.rx.reset(&r.dev).unwrap();
            r.tx.reset(&r.dev).unwrap();
        }
        assert_eq!(r.hca.counters().cq_full_stalls, 0, "no CQ ever looked full");
    }
    assert_eq!(free_count(), before);
}

#[test]
fn a_restarted_queue_keeps_its_rings_and_drops_what_waited() {
    // Queue stop and start: the same RQ, ring and CQ come back from WQE 0 with the same
    // buffers. Frames delivered before the stop and never polled are dropped and counted;
    // frames after the start arrive byte for byte, whatever WQE the ring had reached.
    let before = free_count();
    {
        let mut r = rig(1);
        let qpn = r.rx.qpn();
        let rings = |r: &Rig| {
            (
                r.rx.qpn(),
                r.rx.rq_desc().buf(),
                r.rx.rq_desc().db_rec(),
                r.rx.cq_arm_point().0.buf(),
            )
        };
        let at_setup = rings(&r);
        let mut seed = 0;
        for cycle in 0..4u32 {
            // Received: the ring's consumer moves on by a different amount each cycle.
            let frames: Vec<Vec<u8>> = (0..30 + cycle * 7).map(|i| frame(seed + i, 90)).collect();
            seed += 1000;
            send(&mut r, &frames);
            let got = receive_all(&mut r);
            assert_eq!(
                got.len(),
                frames.len(),
                "cycle {cycle}: every frame received"
            );
            for (g, e) in got.iter().zip(&frames) {
                assert_eq!(&bytes_of(*g), e, "cycle {cycle}");
            }
            free_chains(&got);
            // Delivered, never polled: the queue stops with these in its CQ.
            let waiting: Vec<Vec<u8>> = (0..5).map(|i| frame(seed + i, 70)).collect();
            seed += 1000;
            send(&mut r, &waiting);
            while r.hca.step() > 0 {}
            r.dev.set_rq_ready(qpn, false).unwrap();
            let discarded = r.rx.stats().discarded;
            r.rx.reset(&r.dev).unwrap();
            assert_eq!(rings(&r), at_setup, "cycle {cycle}: the same RQ and rings");
            assert_eq!(r.dev.rq_state(qpn).unwrap(), QueueState::Ready);
            assert_eq!(
                r.rx.stats().discarded - discarded,
                5,
                "cycle {cycle}: what waited is dropped and counted"
            );
        }
        let frames: Vec<Vec<u8>> = (0..40).map(|i| frame(seed + i, 120)).collect();
        send(&mut r, &frames);
        let got = receive_all(&mut r);
        assert_eq!(got.len(), 40, "after the restarts, every frame received");
        for (g, e) in got.iter().zip(&frames) {
            assert_eq!(&bytes_of(*g), e);
        }
        free_chains(&got);
        assert_eq!(r.hca.counters().cq_full_stalls, 0);
    }
    assert_eq!(free_count(), before, "every buffer back in the pool");
}

#[test]
fn error_cqes_inside_a_ready_burst_keep_order_and_buffers() {
    let before = free_count();
    {
        let mut r = rig(1);
        let ring = free_count();
        let mut sizes = [32usize, 64, 5, 17].into_iter().cycle();
        let (mut good, mut bad) = (0u64, 0u64);
        for round in 0..6u32 {
            // Every 13th frame (shifted each round) is too long for a buffer: an error CQE in
            // the middle of a burst whose CQEs are all ready.
            let frames: Vec<Vec<u8>> = (0..96u32)
                .map(|i| {
                    let long = (i + round) % 13 == 5;
                    frame(
                        round * 1000 + i,
                        if long {
                            900
                        } else {
                            60 + (i as usize * 29) % 380
                        },
                    )
                })
                .collect();
            let want: Vec<&Vec<u8>> = frames.iter().filter(|f| f.len() < 900).collect();
            send(&mut r, &frames);
            let mut got = Vec::new();
            loop {
                let mut out = vec![Buf(u32::MAX); sizes.next().unwrap()];
                let k = r.rx.burst(&mut out);
                got.extend_from_slice(&out[..k]);
                if k == 0 && r.hca.step() == 0 {
                    break;
                }
            }
            assert_eq!(got.len(), want.len(), "round {round}");
            for (g, e) in got.iter().zip(&want) {
                assert_eq!(&bytes_of(*g), *e);
            }
            free_chains(&got);
            assert_eq!(free_count(), ring, "every refill balanced by a free");
            good += want.len() as u64;
            bad += (frames.len() - want.len()) as u64;
        }
        let st = r.rx.stats();
        assert_eq!((st.packets, st.errors, st.nombuf), (good, bad, 0));
        assert_eq!(r.hca.counters().rx_drops_too_long, bad);
        assert_eq!(r.hca.counters().rx_drops_no_wqe, 0, "no slot was lost");
    }
    assert_eq!(free_count(), before);
}

#[test]
fn a_pool_short_of_a_ready_burst_drops_it_whole() {
    let before = free_count();
    {
        let mut r = rig(1);
        // The pool keeps 10 buffers: fewer than the 32 CQEs a burst finds ready.
        let spare = free_count() - 10;
        let mut held = vec![std::mem::MaybeUninit::uninit(); spare];
        assert!(Buf::alloc_bulk((), &mut held));
        // SAFETY: alloc_bulk returned true, so every entry is a buffer the test owns.
        let held: Vec<Buf> = held
            .into_iter()
            .map(|b| unsafe { b.assume_init() })
            .collect();
        let frames: Vec<Vec<u8>> = (0..32).map(|i| frame(i, 100)).collect();
        send(&mut r, &frames);
        assert!(receive_all(&mut r).is_empty());
        assert_eq!(
            r.rx.stats().nombuf,
            32,
            "each frame of the burst counted once"
        );
        assert_eq!(free_count(), 10, "nothing taken from the pool");
        // SAFETY: the test's own buffers, each freed once.
        unsafe { Buf::free_bulk(&held) };
        // The ring is still whole: the next burst arrives without drops.
        let frames: Vec<Vec<u8>> = (0..32).map(|i| frame(100 + i, 100)).collect();
        send(&mut r, &frames);
        let got = receive_all(&mut r);
        assert_eq!(got.len(), 32);
        for (g, e) in got.iter().zip(&frames) {
            assert_eq!(&bytes_of(*g), e);
        }
        free_chains(&got);
        let st = r.rx.stats();
        assert_eq!((st.packets, st.errors, st.nombuf), (32, 0, 32));
        assert_eq!(r.hca.counters().rx_drops_no_wqe, 0, "no slot was lost");
    }
    assert_eq!(free_count(), before);
}
