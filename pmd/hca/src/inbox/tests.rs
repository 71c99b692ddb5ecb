use super::*;

#[test]
fn frames_come_out_in_order_across_the_wrap() {
    let r = FrameRing::on_heap(256, 100);
    let mut next = 0u8;
    let mut seen = 0u8;
    for _ in 0..50 {
        {
            let mut p = r.producer();
            for _ in 0..3 {
                let f = vec![next; 20 + usize::from(next % 7)];
                if p.push(&f) {
                    next = next.wrapping_add(1);
                }
            }
        }
        r.consume(usize::MAX, |f| {
            assert_eq!(f, vec![seen; 20 + usize::from(seen % 7)]);
            seen = seen.wrapping_add(1);
            true
        });
    }
    assert_eq!(seen, next);
    assert_eq!(r.pending(), 0);
}

/// A seeded, bounded fuzz of what a hostile peer can write into a shared ring:
/// random positions (unaligned, huge, behind or ahead), random
/// record lengths, a held lock. Frames may be lost, but every push and consume returns
/// at once (a consume handles at most cap / 8 records), nothing is written outside the
/// ring, and every frame handed on lies inside it.
#[test]
fn a_hostile_peer_costs_frames_never_memory_or_time() {
    const DATA: usize = 512;
    const GUARD: usize = 256;
    let region = Arc::new(Region::heap(region_len(DATA) + GUARD));
    let mut r = FrameRing::init(region.clone(), 0, DATA, 64);
    r.guard_reads();
    let guard = |v: Option<u8>| {
        let p = region.as_ptr().wrapping_add(region_len(DATA));
        for i in 0..GUARD {
            // SAFETY: inside the region, past the ring; only this test touches it.
            unsafe {
                let b = p.add(i);
                match v {
                    Some(v) => b.write_volatile(v),
                    None => assert_eq!(b.read_volatile(), 0xab, "byte {i} past the ring"),
                }
            }
        }
    };
    guard(Some(0xab));
    let mut x = 0x5afe_cab1e_u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let start = std::time::Instant::now();
    let (mut pushed, mut seen) = (0u64, 0u64);
    for round in 0..20_000 {
        match rnd() % 40 {
            0..=14 => {
                let mut p = r.producer();
                for _ in 0..1 + rnd() % 4 {
                    let len = (rnd() % 300) as usize;
                    pushed += u64::from(p.push(&vec![round as u8; len]));
                }
            }
            15..=29 => {
                r.consume((rnd() % 8) as usize, |f| {
                    assert!(f.len() <= r.max_frame());
                    seen += 1;
                    true
                });
            }
            30..=32 => {
                r.clear();
            }
            33..=36 => {
                // A position or count rewritten.
                let at = [hdr::HEAD, hdr::TAIL, hdr::PUSHED, hdr::POPPED][(rnd() % 4) as usize];
                let v = match rnd() % 4 {
                    0 => rnd(),
                    1 => r.word(at).load(Ordering::Relaxed).wrapping_add(rnd() % 17),
                    2 => r
                        .word(at)
                        .load(Ordering::Relaxed)
                        .wrapping_sub(rnd() % 1024),
                    _ => rnd() % 4096,
                };
                r.word(at).store(v, Ordering::Relaxed);
            }
            _ => {
                // A record length rewritten.
                let pos = (rnd() % (DATA as u64 / 4)) as usize * 4;
                let v = if rnd() % 4 == 0 { WRAP } else { rnd() as u32 };
                // SAFETY: a 4-aligned word inside the data area, written atomically.
                unsafe { AtomicU32::from_ptr(r.data().add(pos).cast()) }
                    .store(v, Ordering::Relaxed);
            }
        }
        if round % 200 == 199 {
            // A peer may also set things right again: the ring recovers.
            let h = r.word(hdr::HEAD).load(Ordering::Relaxed) & !7;
            r.word(hdr::HEAD).store(h, Ordering::Relaxed);
            r.word(hdr::TAIL).store(h, Ordering::Relaxed);
        }
    }
    guard(None);
    assert!(pushed > 0 && seen > 0, "{pushed} pushed, {seen} seen");
    // A lock the peer never gives back: the producer gives up after its deadline.
    r.half(hdr::LOCK).store(1, Ordering::Relaxed);
    let t = std::time::Instant::now();
    assert!(!r.producer().push(&[1; 10]));
    assert!(t.elapsed() >= LOCK_DEADLINE && t.elapsed() < 10 * LOCK_DEADLINE);
    assert_eq!(
        r.half(hdr::LOCK).load(Ordering::Relaxed),
        1,
        "not ours to release"
    );
    r.break_lock();
    let h = r.word(hdr::HEAD).load(Ordering::Relaxed) & !7;
    r.word(hdr::HEAD).store(h, Ordering::Relaxed);
    r.word(hdr::TAIL).store(h, Ordering::Relaxed);
    let n = r.word(hdr::PUSHED).load(Ordering::Relaxed);
    r.word(hdr::POPPED).store(n, Ordering::Relaxed);
    assert!(
        r.producer().push(&[2; 10]),
        "works again once the header is sound"
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(20));
}

#[test]
fn full_down_and_oversized_frames_are_counted() {
    let r = FrameRing::on_heap(256, 3);
    {
        let mut p = r.producer();
        assert!(p.push(&[1; 10]));
        assert!(p.push(&[2; 10]));
        assert!(p.push(&[3; 10]));
        assert!(!p.push(&[4; 10]), "frame limit");
        assert!(!p.push(&[5; 200]), "larger than half the ring");
    }
    assert_eq!((r.pending(), r.dropped()), (3, 2));
    // A refused frame stays for later.
    assert_eq!(r.consume(10, |f| f[0] != 2), 1);
    assert_eq!(r.pending(), 2);
    r.set_up(false);
    assert!(!r.producer().push(&[6; 10]));
    assert_eq!(r.dropped(), 3);
    r.clear();
    assert_eq!(r.pending(), 0);
    r.reset_dropped();
    assert_eq!(r.dropped(), 0);
    let again = FrameRing::attach(r.region.clone(), 0).expect("a ring");
    assert!(!again.up());
}
