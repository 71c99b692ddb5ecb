//! TX recovery against the software HCA in step mode: an error completion is counted and the
//! queue recovers in place, a restarted queue sends only what follows, unregistered memory is
//! dropped rather than posted, and an idle queue whose last completion was lost still drains.

mod bursts;
mod traffic;

use bursts::*;
use mlx4rs::hca::Faults;
use mlx4rs::hw::{Device, QueueState};
use mlx4rs::mem::DmaRange;
use mlx4rs::txq::{TxPath, TxQueue};
use mlx4rs::wqe::TxOffloads;
use traffic::*;

/// The completion of an idle queue's last request lost: a look without progress (here the
/// drain at port stop) asks for one more with a NOP, whose completion covers everything. With
/// only a doorbell rung again, the buffers stayed held and the drain timed out.
#[test]
fn an_idle_queue_recovers_from_losing_its_last_completion() {
    for path in [TxPath::Doorbell, TxPath::BlueFlame] {
        FREED.with(|f| f.borrow_mut().clear());
        let mut r = rig(true);
        // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
        let mut q: TxQueue<Pkt> = unsafe {
            TxQueue::new(
                &r.dev,
                "tx_lost_last",
                0,
                256,
                tx_config(path, 104),
                &[r.mr],
            )
        }
        .unwrap();
        let mut rng = Rng(0x1a57);
        // Gather packets, held until their completion: one burst of 64, which asks for a
        // completion at its last WQE (one per 64 packets on a ring of 256), and it is lost.
        let cases: Vec<Case> = (0..64).map(|_| plain_case(&mut rng, 300)).collect();
        r.hca.set_faults("cqe_drop:1".parse().unwrap());
        let pkts = send_all(&mut r, &mut q, &cases, cases.len(), 1);
        r.hca.set_faults(Faults::default());
        let lost = r.hca.counters().inj_cqe_drops;
        assert!(lost >= 1, "{path:?}: a completion was lost");
        FREED.with(|f| assert!(f.borrow().len() < pkts.len(), "{path:?}: buffers held"));
        assert!(
            q.drain(&r.dev, std::time::Duration::from_secs(5)),
            "{path:?}: drained"
        );
        FREED.with(|f| {
            let f = f.borrow();
            assert_eq!(f.len(), pkts.len(), "{path:?}: every buffer freed");
            assert!(f.values().all(|&c| c == 1), "{path:?}: once");
        });
        let st = q.stats();
        assert_eq!(st.cqe_mismatches, lost, "{path:?}: {st:?}");
        assert!(st.doorbell_rerings >= 1, "{path:?}: {st:?}");
        q.destroy(&r.dev);
    }
}

// ---- errors and recovery --------------------------------------------------------------

#[test]
fn error_cqe_is_counted_and_the_queue_recovers() {
    FREED.with(|f| f.borrow_mut().clear());
    let mut r = rig(true);
    // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
    let mut q: TxQueue<Pkt> = unsafe {
        TxQueue::new(
            &r.dev,
            "tx_err",
            0,
            64,
            tx_config(TxPath::Doorbell, 0),
            &[r.mr],
        )
    }
    .unwrap();
    let mut rng = Rng(5);
    let cases: Vec<Case> = (0..3)
        .map(|_| Case {
            bytes: (0..200).map(|_| rng.next() as u8).collect(),
            cuts: vec![],
            off: TxOffloads::default(),
        })
        .collect();
    let mut segtab = Vec::new();
    let mut arena = std::mem::take(&mut r.arena);
    let pkts = build(&mut arena, &cases, &mut segtab, 0);
    // SAFETY: test buffers; their release only records it.
    assert_eq!(unsafe { q.burst(&pkts[..1]) }, 1);
    r.hca.step();
    // The device forgets the memory the queue still believes registered: the next gather WQE
    // points at memory it may not touch.
    r.hca.dereg_mr(r.mr.lkey).unwrap();
    let qpn = q.qpn();
    // SAFETY: test buffers; their release only records it.
    assert_eq!(unsafe { q.burst(&pkts[1..2]) }, 1);
    r.hca.step();
    assert_eq!(r.dev.sq_state(qpn).unwrap(), QueueState::Error);
    // A call with nothing to send leaves at once, before even looking at completions.
    // SAFETY: test buffers; their release only records it.
    assert_eq!(unsafe { q.burst(&[]) }, 0);
    assert_eq!(q.stats().error_cqes, 0);
    // The next burst sees the error CQE and takes nothing; recovery (the control path's job,
    // with the device in hand) gives it a fresh queue.
    assert_eq!(
        // SAFETY: test buffers; their release only records it.
        unsafe { q.burst(&pkts[2..3]) },
        0,
        "a failed queue takes nothing"
    );
    assert!(q.failed());
    let st = q.stats();
    assert_eq!(st.error_cqes, 1, "{st:?}");
    let ring = q.sq_desc().buf();
    assert!(q.recover(&r.dev));
    assert!(!q.failed());
    assert_eq!(
        (q.qpn(), q.sq_desc().buf()),
        (qpn, ring),
        "the failed queue restarted in place, on its own ring"
    );
    assert_eq!(r.dev.sq_state(qpn).unwrap(), QueueState::Ready);
    assert_eq!(r.hca.counters().error_cqes, 1);
    // Memory back: traffic flows on the new queue.
    // SAFETY: the arena outlives the device (it is returned to the rig below).
    let range = unsafe {
        DmaRange::new(
            arena.as_ptr() as usize,
            arena.as_ptr() as usize + arena.len(),
        )
    };
    let mr = r.dev.reg_mr(range).unwrap();
    q.destroy(&r.dev);
    // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
    let mut q: TxQueue<Pkt> = unsafe {
        TxQueue::new(
            &r.dev,
            "tx_err",
            0,
            64,
            tx_config(TxPath::Doorbell, 0),
            &[mr],
        )
    }
    .unwrap();
    // SAFETY: test buffers; their release only records it.
    assert_eq!(unsafe { q.burst(&pkts[2..3]) }, 1);
    r.hca.step();
    let wire = r.wire.lock().unwrap().clone();
    assert_eq!(wire.first(), Some(&cases[0].bytes));
    assert_eq!(wire.last(), Some(&cases[2].bytes));
    assert_eq!(wire.len(), 2, "the failed packet never reached the wire");
    q.destroy(&r.dev);
    FREED.with(|f| {
        let f = f.borrow();
        assert_eq!(f.len(), 3);
        assert!(f.values().all(|&c| c == 1));
    });
    r.arena = arena;
}

#[test]
fn a_restarted_queue_keeps_its_rings_and_sends_only_what_follows() {
    // Queue stop and start: the same SQ, ring and CQ come back from slot 0. WQEs the device
    // never reached before the stop, and completions nobody polled, belong to the run that
    // ended: neither may show after the restart (a doorbell walks until the first slot the
    // device does not own, so stale WQEs of pass 0 would go out again).
    for path in [TxPath::Doorbell, TxPath::BlueFlame] {
        FREED.with(|f| f.borrow_mut().clear());
        let mut r = rig(true);
        let mut q: TxQueue<Pkt> =
            // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
            unsafe { TxQueue::new(&r.dev, "tx_restart", 0, 64, tx_config(path, 0), &[r.mr]) }.unwrap();
        let mut rng = Rng(0x7e57);
        let cases: Vec<Case> = (0..20)
            .map(|_| Case {
                bytes: (0..60 + rng.below(400) as usize)
                    .map(|_| rng.next() as u8)
                    .collect(),
                cuts: vec![],
                off: TxOffloads::default(),
            })
            .collect();
        let mut segtab = Vec::new();
        let mut arena = std::mem::take(&mut r.arena);
        let pkts = build(&mut arena, &cases, &mut segtab, 0);
        let sq = q.sq_desc();
        let before = (q.qpn(), sq.buf(), sq.doorbell(), q.txbb_cnt());
        // Sent, their completions left in the CQ.
        // SAFETY: test buffers; their release only records it.
        assert_eq!(unsafe { q.burst(&pkts[..10]) }, 10);
        r.hca.step();
        // Posted, and the queue stops before the device reaches them.
        r.dev.set_sq_ready(before.0, false).unwrap();
        // SAFETY: test buffers; their release only records it.
        assert_eq!(unsafe { q.burst(&pkts[10..15]) }, 5);
        r.hca.step();
        assert_eq!(
            r.wire.lock().unwrap().len(),
            10,
            "{path:?}: a stopped SQ sends nothing"
        );
        q.reset(&r.dev).unwrap();
        let sq = q.sq_desc();
        assert_eq!(
            (q.qpn(), sq.buf(), sq.doorbell(), q.txbb_cnt()),
            before,
            "{path:?}: the same SQ and ring after the restart"
        );
        assert_eq!(r.dev.sq_state(before.0).unwrap(), QueueState::Ready);
        assert_eq!((q.producer(), q.outstanding()), (0, 0));
        FREED.with(|f| assert_eq!(f.borrow().len(), 15, "{path:?}: in flight, freed"));
        // SAFETY: test buffers; their release only records it.
        assert_eq!(unsafe { q.burst(&pkts[15..]) }, 5);
        r.hca.step();
        while q.outstanding() > 0 {
            assert!(
                q.drain(&r.dev, std::time::Duration::from_secs(5)),
                "{path:?}: drained"
            );
        }
        let wire = r.wire.lock().unwrap().clone();
        let want: Vec<&Vec<u8>> = cases[..10]
            .iter()
            .chain(&cases[15..])
            .map(|c| &c.bytes)
            .collect();
        assert_eq!(wire.len(), want.len(), "{path:?}: frames on the wire");
        for (i, (got, want)) in wire.iter().zip(&want).enumerate() {
            assert_eq!(got, *want, "{path:?}: frame {i}");
        }
        let st = q.stats();
        assert_eq!((st.errors, st.error_cqes), (0, 0), "{path:?}: {st:?}");
        q.destroy(&r.dev);
        FREED.with(|f| {
            let f = f.borrow();
            assert_eq!(f.len(), 20, "{path:?}: every packet freed");
            assert!(f.values().all(|&c| c == 1), "{path:?}: each once");
        });
        r.arena = arena;
    }
}

#[test]
fn unregistered_memory_is_dropped_not_posted() {
    FREED.with(|f| f.borrow_mut().clear());
    let r = rig(true);
    // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
    let mut q: TxQueue<Pkt> = unsafe {
        TxQueue::new(
            &r.dev,
            "tx_unreg",
            0,
            64,
            tx_config(TxPath::Doorbell, 0),
            &[],
        )
    }
    .unwrap();
    let data = vec![7u8; 300];
    let seg = [Seg {
        ptr: data.as_ptr(),
        len: data.len(),
    }];
    let p = Pkt {
        id: 1,
        segs: seg.as_ptr(),
        nsegs: 1,
        len: 300,
        off: TxOffloads::default(),
    };
    // SAFETY: test buffers; their release only records it.
    assert_eq!(unsafe { q.burst(&[p]) }, 1, "taken: it can never be sent");
    let st = q.stats();
    assert_eq!((st.errors, st.packets, st.doorbells), (1, 0, 0));
    FREED.with(|f| assert_eq!(f.borrow().get(&1), Some(&1)));
}
