//! What the RX path records in each buffer it hands up, against the software HCA in step mode:
//! the same frames received by a queue with RSS reports and by a plain one (which runs a burst
//! compiled without the RSS and tunnel tests) come back with the same bytes, lengths, port,
//! packet types and checksum verdicts, and differ only in the RSS flag.

use std::sync::atomic::{AtomicU32, Ordering};

use mlx4rs::hca::{Hca, HcaConfig, Wire};
use mlx4rs::hw::soft::Soft;
use mlx4rs::hw::Device;
use mlx4rs::mem::{DmaRange, MemSource};
use mlx4rs::mmio::Copy64;
use mlx4rs::rxq::{
    RxBuf, RxConfig, RxQueue, PTYPE_L2_ETHER, PTYPE_L3_IPV4_EXT_UNKNOWN, PTYPE_L4_UDP,
    RX_IP_CKSUM_GOOD, RX_RSS_HASH,
};
use mlx4rs::txq::{TxConfig, TxPath, TxQueue};

mod rx_buf;
use rx_buf::{arena_range, free_count, set_geometry, Buf, Pkt, Rec, NBUFS};

/// Buffers a whole frame fits in (the queue does not scatter).
const BUF: usize = 2048;
const HEADROOM: usize = 128;

static N: AtomicU32 = AtomicU32::new(0);

/// An IPv4/UDP frame of `len` bytes with a correct header checksum and no UDP checksum.
fn udp_frame(seed: u8, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((len - 14) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&[198, 18, 0, seed]);
    ip[16..20].copy_from_slice(&[198, 18, 1, 1]);
    let sum: u32 = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = !((sum & 0xffff) + (sum >> 16)) as u16;
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let udp = &mut f[34..42];
    udp[0..2].copy_from_slice(&(1000 + u16::from(seed)).to_be_bytes());
    udp[2..4].copy_from_slice(&9u16.to_be_bytes());
    udp[4..6].copy_from_slice(&((len - 34) as u16).to_be_bytes());
    for (i, b) in f[42..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(7).wrapping_add(seed);
    }
    f
}

/// Sends `frames` over a looped wire to a queue with `rss` as given and receives them all,
/// returning each frame's record and bytes; every buffer goes back to the pool.
fn round_trip(rss: bool, frames: &[Vec<u8>]) -> Vec<(Rec, Vec<u8>)> {
    set_geometry(BUF, HEADROOM);
    let hca = Hca::open(HcaConfig {
        threaded: false,
        name: format!("rx_meta_step{}", N.fetch_add(1, Ordering::Relaxed)),
        ..HcaConfig::default()
    })
    .unwrap();
    hca.set_wire(Wire::Loop).unwrap();
    hca.start().unwrap();
    hca.set_port_up(true);
    let (start, end) = arena_range(NBUFS);
    let dev = Soft::new(hca.clone(), MemSource::Heap);
    // SAFETY: the pool's arena is a thread-local that outlives every queue of the thread.
    let mr = dev.reg_mr(unsafe { DmaRange::new(start, end) }).unwrap();
    let tx_cfg = TxConfig {
        inline_max: 928,
        path: TxPath::Doorbell,
        copy: Copy64::best(),
        fast_free: false,
        source: MemSource::Heap,
    };
    // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
    let mut tx: TxQueue<Pkt> =
        unsafe { TxQueue::new(&dev, "rx_meta_step", 0, 256, tx_cfg, &[]) }.unwrap();
    let rx_cfg = RxConfig {
        sges: 1,
        csum: true,
        rss,
        keep_crc: false,
        tunnel: false,
        port_id: 3,
        source: MemSource::Heap,
    };
    // SAFETY: the device outlives the queue, which is destroyed on it or leaked.
    let mut rx: RxQueue<Buf> = unsafe { RxQueue::new(&dev, 0, 256, rx_cfg, (), &[mr]) }.unwrap();
    let free_before = free_count();
    let pkts: Vec<Pkt> = frames.iter().map(|f| Pkt(f.as_ptr(), f.len())).collect();
    let mut got = Vec::new();
    let mut out = [Buf(u32::MAX); 32];
    for chunk in pkts.chunks(32) {
        // SAFETY: test buffers; their release frees nothing.
        assert_eq!(unsafe { tx.burst(chunk) }, chunk.len());
        loop {
            let moved = hca.step();
            let n = rx.burst(&mut out);
            got.extend_from_slice(&out[..n]);
            if n == 0 && moved == 0 {
                break;
            }
        }
    }
    assert_eq!(got.len(), frames.len(), "every frame received");
    let st = rx.stats();
    assert_eq!(st.packets, frames.len() as u64);
    let sent: u64 = frames.iter().map(|f| f.len() as u64).sum();
    assert_eq!(st.bytes, sent);
    assert_eq!((st.errors, st.nombuf, st.error_cqes), (0, 0, 0));
    let recs: Vec<(Rec, Vec<u8>)> = got.iter().map(|b| (b.rec(), b.data())).collect();
    // SAFETY: the test owns what it received and frees each buffer once.
    unsafe { Buf::free_bulk(&got) };
    // Each frame handed up took a fresh buffer in its place: the pool is where it was.
    assert_eq!(free_count(), free_before);
    rx.destroy(&dev);
    tx.destroy(&dev);
    hca.stop();
    recs
}

#[test]
fn a_plain_queue_and_an_rss_queue_record_the_same_but_the_rss_flag() {
    // More than a ring's worth, in bursts that wrap the CQ and the RQ; every frame inline on
    // the TX side (up to 928 bytes), whose buffers are not registered.
    let frames: Vec<Vec<u8>> = (0..600u32)
        .map(|i| udp_frame(i as u8, 60 + (i as usize * 13) % 860))
        .collect();
    let plain = round_trip(false, &frames);
    let rss = round_trip(true, &frames);
    for (i, (f, ((p, pb), (r, rb)))) in frames.iter().zip(plain.iter().zip(&rss)).enumerate() {
        assert_eq!(pb, f, "frame {i}: bytes, plain queue");
        assert_eq!(rb, f, "frame {i}: bytes, RSS queue");
        let want = (f.len() as u32, f.len() as u32, 1, 3);
        assert_eq!((p.len, p.pkt_len, p.nb_segs, p.port), want, "frame {i}");
        assert_eq!((r.len, r.pkt_len, r.nb_segs, r.port), want, "frame {i}");
        assert_eq!(
            p.meta.packet_type,
            PTYPE_L2_ETHER | PTYPE_L3_IPV4_EXT_UNKNOWN | PTYPE_L4_UDP,
            "frame {i}"
        );
        assert_ne!(
            p.meta.ol_flags & RX_IP_CKSUM_GOOD,
            0,
            "frame {i}: header verdict"
        );
        assert_eq!(
            p.meta.ol_flags & RX_RSS_HASH,
            0,
            "frame {i}: plain has no hash"
        );
        assert_eq!(p.meta.rss_hash, 0, "frame {i}");
        assert_ne!(
            r.meta.ol_flags & RX_RSS_HASH,
            0,
            "frame {i}: the RSS queue's flag"
        );
        assert_eq!(r.meta.packet_type, p.meta.packet_type, "frame {i}");
        assert_eq!(r.meta.ol_flags & !RX_RSS_HASH, p.meta.ol_flags, "frame {i}");
    }
}
