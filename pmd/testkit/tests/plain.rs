//! The plain buffer through a scratch queue on both TX paths: the frames on the wire.

use std::sync::{Arc, Mutex};

use mlx4rs::hca::{HcaConfig, Wire};
use mlx4rs::txq::{TxPath, TxQueue};
use mlx4rs_testkit::{tx_config, Plain, Scratch};

#[test]
fn plain_packets_reach_the_wire_byte_for_byte() {
    let wire = Arc::new(Mutex::new(Vec::new()));
    let w = wire.clone();
    let sink = Wire::Sink(Box::new(move |f: &[u8]| w.lock().unwrap().push(f.to_vec())));
    let s = Scratch::open("testkit", HcaConfig::default(), sink).unwrap();
    let bytes: Vec<u8> = (0..4 * 64).map(|i| (i * 7) as u8).collect();
    let (pkts, all) = Plain::leak(bytes.clone(), 64);
    assert_eq!(pkts.len(), 4);
    let mr = s.reg_mr(all).unwrap();
    for path in [TxPath::Doorbell, TxPath::BlueFlame] {
        wire.lock().unwrap().clear();
        // SAFETY: `s` outlives the queue, which is destroyed on it below.
        let mut q: TxQueue<Plain> =
            unsafe { s.txq("testkit", 256, tx_config(path, 0), &[mr]) }.unwrap();
        // SAFETY: `Plain` borrows leaked memory and its release frees nothing.
        #[allow(unsafe_code)]
        let taken = unsafe { q.burst(&pkts) };
        assert_eq!(taken, pkts.len());
        s.step();
        q.complete();
        let st = q.stats();
        assert_eq!((st.packets, st.gather_packets), (4, 4), "{path:?}: {st:?}");
        let got = wire.lock().unwrap().concat();
        assert_eq!(got, bytes, "{path:?}: the frames, in order");
        q.destroy(&s.dev);
    }
}
