//! Streaming: packets at burst 1 back to back over the looped wire, each frame carrying its
//! sequence number and the TSC at the `tx_burst` that took it, matched back on RX. Where the
//! ping-pong has one packet in flight (so the last doorbell has always been consumed before
//! the next send), here the ring is busy: this is where doorbell avoidance can leave a packet
//! published but unannounced until a later call rings for it.

use apps::eal::{self, FastPath, Mbufs, Pool};
use apps::progress;

use crate::opts::Opts;

/// Where the sequence number and the TX time sit in the frame: right after the Ethernet
/// header, inside the 60-byte minimum whatever the message size.
const SEQ: std::ops::Range<usize> = 14..22;
const TSC: std::ops::Range<usize> = 22..30;

/// What one stream measured.
#[derive(Debug, Default)]
pub struct Stream {
    /// TX-to-RX latency of each packet after the warm-up, in microseconds, in arrival order.
    pub us: Vec<f64>,
    /// Packets `tx_burst` took.
    pub sent: u64,
    /// Distinct packets that came back.
    pub received: u64,
    /// Packets that came back after one sent later than them (counted, still samples).
    pub reordered: u64,
    /// Packets that came back a second time (not samples).
    pub duplicates: u64,
    /// Frames that were none of ours (or named a packet not yet sent).
    pub foreign: u64,
    /// Received packets per second over the measured part: from the TX of the first packet
    /// after the warm-up to the last arrival.
    pub pps: f64,
}

impl Stream {
    /// Packets sent that never came back.
    pub fn lost(&self) -> u64 {
        self.sent - self.received
    }
}

/// Writes the sequence number and TX time into a frame built by [`crate::frame`].
fn stamp(buf: &mut [u8], seq: u64, tsc: u64) {
    buf[SEQ].copy_from_slice(&seq.to_le_bytes());
    buf[TSC].copy_from_slice(&tsc.to_le_bytes());
}

/// The sequence number and TX time of a frame of ours (`None`: not one of ours).
fn unstamp(frame: &[u8], template: &[u8]) -> Option<(u64, u64)> {
    // Ours: the template's length, header and bytes after the stamp.
    if frame.len() != template.len()
        || frame[..SEQ.start] != template[..SEQ.start]
        || frame[TSC.end..] != template[TSC.end..]
    {
        return None;
    }
    let seq = u64::from_le_bytes(frame[SEQ].try_into().ok()?);
    let tsc = u64::from_le_bytes(frame[TSC].try_into().ok()?);
    Some((seq, tsc))
}

/// One stream of `o.warmup + o.iters` frames of `size` message bytes on `fp`'s looped port.
pub fn stream(fp: FastPath, pool: Pool, o: &Opts, size: u16, hz: f64) -> Stream {
    let total = u64::from(o.warmup) + u64::from(o.iters);
    let warmup = u64::from(o.warmup);
    let mut s = Stream {
        us: Vec::with_capacity(o.iters as usize),
        ..Stream::default()
    };
    // Everything the loop needs is allocated here, before the first send.
    let mut seen = vec![0u64; total.div_ceil(64) as usize];
    let mut template = Vec::with_capacity(1100);
    crate::frame(size, 0, &mut template);
    let mut buf = template.clone();
    let (mut tx, mut rx, mut none) = (Mbufs::default(), Mbufs::default(), Mbufs::default());
    let gap = (o.gap_ns as f64 * hz / 1e9) as u64;
    let timeout = (hz * o.timeout_ms as f64 / 1e3) as u64;
    let window = if o.window == 0 {
        u64::MAX
    } else {
        u64::from(o.window)
    };
    let mut next_send = 0u64;
    let mut newest = None::<u64>;
    let (mut t_first, mut t_last) = (0u64, 0u64);
    let mut progress_at = eal::rdtsc();
    let mut kicked_at = None::<u64>;
    while !progress::interrupted() {
        let now = eal::rdtsc();
        if s.sent < total {
            if s.sent - s.received < window
                && now >= next_send
                && (!tx.is_empty() || tx.alloc(pool, 1))
            {
                // Stamped at each offer: a packet the full ring refused has not been sent.
                let t0 = eal::rdtsc();
                stamp(&mut buf, s.sent, t0);
                tx.fill(&buf);
                if fp.tx(&mut tx) == 1 {
                    if s.sent == warmup {
                        t_first = t0;
                    }
                    s.sent += 1;
                    next_send = t0.wrapping_add(gap);
                    progress_at = t0;
                }
            }
        } else if kicked_at.is_none_or(|k| now.wrapping_sub(k) > timeout / 16) {
            // The application has gone quiet: a burst of none rings for what doorbell
            // avoidance left waiting. Once, and again only after a long wait, since an empty
            // burst that sees no progress rings again for a lost doorbell.
            fp.tx(&mut none);
            kicked_at = Some(now);
        }
        let got = fp.rx(&mut rx);
        if got > 0 {
            let t1 = eal::rdtsc();
            for i in 0..got {
                let Some((seq, tsc)) = unstamp(rx.data(i), &template) else {
                    s.foreign += 1;
                    continue;
                };
                if seq >= s.sent {
                    s.foreign += 1;
                    continue;
                }
                let (word, bit) = ((seq / 64) as usize, 1u64 << (seq % 64));
                if seen[word] & bit != 0 {
                    s.duplicates += 1;
                    continue;
                }
                seen[word] |= bit;
                s.received += 1;
                if newest.is_some_and(|n| seq < n) {
                    s.reordered += 1;
                } else {
                    newest = Some(seq);
                }
                if seq >= warmup {
                    s.us.push(t1.wrapping_sub(tsc) as f64 / hz * 1e6);
                }
            }
            rx.free_all();
            t_last = t1;
            progress_at = t1;
        }
        if s.received == total {
            break;
        }
        // Nothing sent or received for a whole timeout: what is missing is lost.
        if eal::rdtsc().wrapping_sub(progress_at) > timeout {
            break;
        }
    }
    let n_measured = s.us.len() as f64;
    if n_measured > 0.0 && t_last > t_first {
        s.pps = n_measured / (t_last.wrapping_sub(t_first) as f64 / hz);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip_and_foreign_frames_are_told_apart() {
        let mut t = Vec::new();
        crate::frame(2, 0, &mut t);
        let mut f = t.clone();
        stamp(&mut f, 0x0102_0304_0506_0708, 0x1122_3344_5566_7788);
        assert_eq!(f.len(), 60);
        assert_eq!(&f[14..16], &[0x08, 0x07]);
        assert_eq!(
            unstamp(&f, &t),
            Some((0x0102_0304_0506_0708, 0x1122_3344_5566_7788))
        );
        let mut other = f.clone();
        other[12] = 0x08;
        assert_eq!(unstamp(&other, &t), None);
        let mut tail = f.clone();
        tail[59] ^= 1;
        assert_eq!(unstamp(&tail, &t), None);
        assert_eq!(unstamp(&f[..59], &t), None);
        // A large message keeps its bytes after the stamp.
        crate::frame(1024, 0, &mut t);
        let mut f = t.clone();
        stamp(&mut f, 9, 10);
        assert_eq!(unstamp(&f, &t), Some((9, 10)));
        assert_eq!(f[14 + 100], 100);
    }
}
